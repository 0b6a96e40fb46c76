#!/usr/bin/env bash
# Session-5 device call 6: greedy draft logits stored from the accumulator layout (explore15).
cd "$(dirname "$0")/../.."
source bench/device/common.sh
timeout 300 python3 bench/explore/explore15.py --out "$OUT/explore15.json" --reps 3 2>&1 | tee "$OUT/explore15.log" \
  | grep -E "rows|ERROR|Error" | tail -60
