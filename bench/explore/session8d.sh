#!/usr/bin/env bash
# Session 8, call 4 (issue 3, the MoE block): top-k with packed (logit, index) keys (one max per pick);
# per-launch profile with plan warps 8 / 4 / 2 at 1 and 6 rows; the MoE GPU tests; bench_moe at every
# row count (read and write flush). Results: bench/results/session8/call4/.
cd "$(dirname "$0")/../.."
source bench/device/common.sh
timeout 150 python3 bench/explore/moe_profile.py --out "$OUT/moe_profile.json" --rows 1,6 --label call4 \
  --variants default plan_w4 plan_w2 > "$OUT/profile.log" 2>&1; echo "profile rc $?"
cut -c1-260 "$OUT/profile.log"
timeout 120 python3 -m pytest -q -n 4 -m "gpu and not real_model and not eval" -p no:cacheprovider --timeout 110 \
  tests/unit/test_moe.py > "$OUT/gpu-tests.log" 2>&1; echo "tests rc $?"
tail -3 "$OUT/gpu-tests.log"
timeout 200 python3 bench/bench_moe.py --out "$OUT/moe_h200.json" > "$OUT/moe.log" 2>&1; echo "moe rc $?"
tail -7 "$OUT/moe.log"
