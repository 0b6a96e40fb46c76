#!/usr/bin/env bash
# Session-5 device call 1: the attention prologue as a pair GEMV of _gemv (kind "qkv"): plan sweep against the
# session-4 kernel (explore12), then the GPU tests of the prologue and of what shares its code (gate/up MLP,
# fused model, TP layer).
cd "$(dirname "$0")/../.."
source bench/device/common.sh
timeout 260 python3 bench/explore/explore12.py --out "$OUT/explore12.json" --budget-s 200 --reps 2 2>&1 \
  | tee "$OUT/explore12.log" | grep -v "^  skipped" | tail -150
timeout 300 python3 -m pytest -q -n 8 -m "gpu and not real_model and not eval" -p no:cacheprovider --timeout 280 \
  tests/unit/test_attn_prologue.py tests/unit/test_mlp_kernel.py tests/unit/test_fused_model.py \
  tests/multi_gpu/test_tp_fused_layer.py 2>&1 | tee "$OUT/gpu-tests.log" | tail -15
