#!/usr/bin/env bash
# Session-3 device call: the residual GEMV's flagged split-K finisher (relaxed arrival, self-validating
# partials): GPU tests of every kernel on GemvWorkspace, the down-projection tuning round, the fused step.
cd "$(dirname "$0")/../.."
source bench/device/common.sh
timeout 200 python3 -m pytest -q -n 8 -m "gpu and not real_model and not eval" -p no:cacheprovider --timeout 190 \
  tests/unit/test_out_proj.py tests/unit/test_mlp_kernel.py tests/unit/test_lm_head.py tests/unit/test_fused_model.py \
  tests/unit/test_moe.py tests/unit/test_gemv_plans.py tests/multi_gpu/test_tp_fused_layer.py 2>&1 | tee "$OUT/gpu-tests.log" | tail -4
timeout 150 python3 -m lowlat.bench --sections copy,tune --models Llama-3.2-1B --tune-shapes residual:2048x8192 \
  --tune-budget-s 120 --rows 1,6 --budget-s 140 --out "$OUT/tune5c_down_h200.json" 2>&1 | grep -E "^Llama" | sort -k5 -n | head -12
export LOWLAT_GEMV_PLANS="$OUT/tune5c_down_h200.json.plans.json"
timeout 150 python3 -m lowlat.bench --sections copy,step --models SmolLM2-135M,Llama-3.2-1B --rows 1,6 \
  --budget-s 140 --out "$OUT/step5c_h200.json" 2>&1 | grep -E "decode_step " | tail -12
