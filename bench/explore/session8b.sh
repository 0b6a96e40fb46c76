#!/usr/bin/env bash
# Session 8, call 2 (issue 3, the MoE block; ran before the packed top-k keys and the read flush): per-launch
# profile of config variants (plan warps; gate/up stream depth: BN / BK / stages; down BKI / BNH) at 1 and
# 6 rows, after call 1 showed the L2 prefetch of the down weights no better (removed).
# Results: bench/results/session8/call2/.
cd "$(dirname "$0")/../.."
source bench/device/common.sh
timeout 420 python3 bench/explore/moe_profile.py --out "$OUT/moe_profile.json" --rows 1,6 --label call2 \
  --variants default plan_w4 plan_w2 plan_w1 bn32_bk128_s5 bn16_bk128_s6 bn16_bk128_s5 bn32_bk64_s8 bn32_bk256_s3 \
  bn32_s4_bki256 bn32_s5_bnh32 > "$OUT/profile.log" 2>&1; echo "profile rc $?"
cut -c1-125 "$OUT/profile.log"
timeout 120 python3 -m pytest -q -n 4 -m "gpu and not real_model and not eval" -p no:cacheprovider --timeout 110 \
  tests/unit/test_moe.py > "$OUT/gpu-tests.log" 2>&1; echo "tests rc $?"
tail -3 "$OUT/gpu-tests.log"
