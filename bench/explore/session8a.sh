#!/usr/bin/env bash
# Session 8, call 1 (issue 3, the MoE block): per-launch profile of the Qwen3-30B-A3B MoE block with the
# kernels of commit a1063c9 (carried as .stage/base: `mkdir -p .stage/base && git archive a1063c9 lowlat |
# tar -x -C .stage/base`) and with this tree's, plus block-size variants; then the MoE GPU tests.
# As run in call 1, this tree's down kernel also prefetched its weights to L2 before its wait (default on;
# the variant "no_prefetch" turned it off) and both profiles flushed the L2 by zeroing ("cold"); that
# prefetch was removed after call 1 and the profile now flushes by reading. Results:
# bench/results/session8/call1/.
cd "$(dirname "$0")/../.."
source bench/device/common.sh
PYTHONPATH=$PWD/.stage/base:$PYTHONPATH timeout 150 python3 bench/explore/moe_profile.py --out "$OUT/moe_profile_base.json" \
  --rows 1,6 --label base > "$OUT/profile_base.log" 2>&1; echo "base rc $?"
cat "$OUT/profile_base.log"
timeout 240 python3 bench/explore/moe_profile.py --out "$OUT/moe_profile.json" --rows 1,6 --label new \
  --variants default bn16_bnh64_s3_w4 bn32_bnh32_s3_w4 bn16_bnh32_s4_w4 bn32_bnh64_s4_w4 bn64_bnh64_s4_w8 \
  > "$OUT/profile.log" 2>&1; echo "new rc $?"
cat "$OUT/profile.log"
timeout 150 python3 -m pytest -q -n 4 -m "gpu and not real_model and not eval" -p no:cacheprovider --timeout 140 \
  tests/unit/test_moe.py > "$OUT/gpu-tests.log" 2>&1; echo "tests rc $?"
tail -5 "$OUT/gpu-tests.log"
