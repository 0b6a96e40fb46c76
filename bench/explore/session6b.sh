#!/usr/bin/env bash
# Session 6, call 2: explore17 (tile / pipeline configs of the TMA greedy launch without logits stores).
# Results: bench/results/session6/call2/.
cd "$(dirname "$0")/../.."
source bench/device/common.sh
cd bench/explore && timeout 280 python3 explore17.py --out "$OUT/explore17.json" --budget-s 220 --reps 2; echo "rc $?"
