#!/usr/bin/env bash
# Session 36's fourth call (one GPU; ends by END, default 420 s; carry [".stage"] with .stage/draft_sampling_prev.py =
# `git show 9c4c9f8:lowlat/kernels/draft_sampling.py`, the sampler before the late NaN marking):
# (a) the preload test on the worker's device (it built a CPU group and was refused on the GPU machine in call 1),
#     then test_draft_sampling.py whole (GPU and unmarked tests) with the late NaN marking in production;
# (b) the draft sampler before / after / before / after at 1 and 8 rows (bench/explore/draft_aba.sh).
cd "$(dirname "$0")/../.."
source bench/device/common.sh
exec > >(tee "$OUT/all.log") 2>&1
END=${END:-420}
echo "== (a) the preload test; test_draft_sampling.py whole (${SECONDS}s)"
PRELOAD=tests/multi_gpu/test_peer_rank_agreement.py::test_preload_takes_each_row_count_once
PRELOAD+=_and_refuses_what_is_not_a_sequence_of_row_counts
timeout "$(cap 150)" python3 -m pytest -v -n 8 -p no:cacheprovider --timeout 120 -rfE --tb=short \
  "$PRELOAD" tests/unit/test_draft_sampling.py > "$OUT/tests.log" 2>&1
echo "pytest rc $?"
grep -E "FAILED|ERROR|[0-9]+ passed|[0-9]+ failed" "$OUT/tests.log" | grep -v " PASSED " | cut -c1-300 | tail -12
echo "== (b) the draft sampler, before (prev) / after the late NaN marking (${SECONDS}s)"
source bench/explore/draft_aba.sh prev after prev after
echo "done at ${SECONDS}s"
