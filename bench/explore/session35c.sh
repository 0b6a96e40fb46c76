#!/usr/bin/env bash
# Session 35's third call, if budget is left after session35a.sh / session35b.sh (one GPU, 200-420 s, no carry):
# explore48, the draft sampler's final with its NaN-row marking late (`nan_late`): first its bitwise test against
# production on the GPU (finite and non-finite rows, every mode), then production / nan_late / production / nan_late
# by bench/bench_draft_sampling.py at 1 and 8 rows (bench/explore/draft_aba.sh). The question: does nan_late take back
# session 30's +1.4 us at 8 temperature rows (session 32: 29.96 -> 31.37 us on an H200)? Same bits, so if it wins,
# apply EDITS to lowlat/kernels/draft_sampling.py and delete the explore.
cd "$(dirname "$0")/../.."
source bench/device/common.sh
exec > >(tee "$OUT/all.log") 2>&1
END=${END:-420}
echo "== explore48's bitwise test on the GPU (${SECONDS}s)"
timeout "$(cap 90)" python3 -m pytest -q -n 4 -p no:cacheprovider --timeout 80 -rf \
  tests/unit/test_explore_draft_nanlate.py > "$OUT/nanlate_test.log" 2>&1; echo "pytest rc $?"
tail -3 "$OUT/nanlate_test.log"
source bench/explore/draft_aba.sh after nanlate after nanlate
echo "done at ${SECONDS}s"
