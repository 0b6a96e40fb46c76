#!/usr/bin/env bash
# Session 7, call 9 (issue 3 bookkeeping): the MoE block of one Qwen3-30B-A3B layer at 1 and 6 rows against its
# HBM floor (bench/bench_moe.py), last measured in session 1. Results: bench/results/session7/call9/.
cd "$(dirname "$0")/../.."
source bench/device/common.sh
timeout 200 python3 bench/bench_moe.py --out "$OUT/moe_h200.json" --rows 1,6 > "$OUT/moe.log" 2>&1; echo "moe rc $?"
tail -12 "$OUT/moe.log"
