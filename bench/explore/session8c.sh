#!/usr/bin/env bash
# Session 8, call 3 (issue 3, the MoE block): the same profile with a READ flush before each replay (a
# 512 MB zeroing write leaves ~50 MB of dirty lines in the L2 that the replay then writes back), beside
# the write flush; bench_moe at every row count with both flushes. Results: bench/results/session8/call3/.
cd "$(dirname "$0")/../.."
source bench/device/common.sh
timeout 200 python3 bench/explore/moe_profile.py --out "$OUT/moe_profile.json" --rows 1,6 --label call3 \
  --variants default bn32_bk128_s5 plan_w2 > "$OUT/profile.log" 2>&1; echo "profile rc $?"
cut -c1-260 "$OUT/profile.log"
timeout 240 python3 bench/bench_moe.py --out "$OUT/moe_h200.json" > "$OUT/moe.log" 2>&1; echo "moe rc $?"
tail -7 "$OUT/moe.log"
