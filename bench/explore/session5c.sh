#!/usr/bin/env bash
# Session-5 device call 3: explore14 (row-block grid; "late" vs "early" epilogue loads; v1), then the GPU tests of
# the prologue (production = "early").
cd "$(dirname "$0")/../.."
source bench/device/common.sh
timeout 300 python3 bench/explore/explore14.py --out "$OUT/explore14.json" --budget-s 230 2>&1 \
  | tee "$OUT/explore14.log" | grep -E "us  diff|ERROR|Error" | tail -150
timeout 200 python3 -m pytest -q -n 8 -m "gpu and not real_model and not eval" -p no:cacheprovider --timeout 190 \
  tests/unit/test_attn_prologue.py 2>&1 | tee "$OUT/gpu-tests.log" | tail -5
