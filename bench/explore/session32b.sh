#!/usr/bin/env bash
# Session 32: DraftSample.probs as one launch (`_dense_q_kernel`; the torch form of session 30 took ~8 elementwise
# launches: +20-24 us on fused+q at 1 / 8 rows in session32a's A B A). (1) test_draft_sampling.py whole (GPU-marked
# and unmarked) on the GPU; (2) the draft sampler
# before session 30 / now / folded (`bench/bench_draft_sampling.py`; fused+q: the dense q;
# fused: `folded` = the tile's NaN id folded into best_id's reduction, 131 registers against 113 at 8 rows, k_cap 64,
# noise). Run with carry [".stage/draft_sampling_before30.py", ".stage/draft_sampling_folded.py"]
# (`git show 4b998be:lowlat/kernels/draft_sampling.py`; the tree's file with `_best_or_nan_id`).
cd "$(dirname "$0")/../.."
source bench/device/common.sh
exec > >(tee "$OUT/all.log") 2>&1
echo "== test_draft_sampling.py whole (${SECONDS}s)"
timeout 200 python3 -m pytest -q -n 8 -p no:cacheprovider --timeout 150 -rf tests/unit/test_draft_sampling.py \
  > "$OUT/draft_tests.log" 2>&1
echo "pytest rc $?"
grep -E "FAILED|ERROR|[0-9]+ passed|[0-9]+ failed" "$OUT/draft_tests.log" | cut -c1-300 | tail -12
source bench/explore/draft_aba.sh before now folded
echo "done at ${SECONDS}s"
