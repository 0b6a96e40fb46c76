#!/usr/bin/env bash
# Session-5 device call 2: explore13 (prologue plans at 1 / 6 / 48 rows; the fused step with the session-4 prologue
# vs the pair-GEMV one), then the GPU tests of the prologue, MLP, fused model and TP layer.
cd "$(dirname "$0")/../.."
source bench/device/common.sh
timeout 560 python3 bench/explore/explore13.py --out "$OUT/explore13.json" --budget-s 120 --step-out "$OUT" 2>&1 \
  | tee "$OUT/explore13.log" | grep -E "us  diff|decode_step |ERROR|Error" | tail -120
