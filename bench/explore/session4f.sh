#!/usr/bin/env bash
# Session-4 device call 6 (final): GPU tests of the GEMV kernels with the committed plan table (SmolLM2 LM head
# pf 64, Llama-3.2-1B down projection pf 128), then the per-kernel section for Llama-3.2-1B (its down projection)
# and the fused step of both dense models, rows 1 and 6.
cd "$(dirname "$0")/../.."
source bench/device/common.sh
timeout 200 python3 -m pytest -q -n 8 -m "gpu and not real_model and not eval" -p no:cacheprovider --timeout 190 \
  tests/unit/test_out_proj.py tests/unit/test_mlp_kernel.py tests/unit/test_lm_head.py tests/unit/test_fused_model.py \
  tests/unit/test_gemv_plans.py 2>&1 | tee "$OUT/gpu-tests-plans.log" | tail -3
timeout 130 python3 -m lowlat.bench --sections copy,kernels --models Llama-3.2-1B --rows 1,6 --budget-s 110 \
  --out "$OUT/kernels_llama_h200.json" > "$OUT/kernels_llama.log" 2>&1
grep -E "^Llama-3.2-1B +(down|mlp|lm_head|gate_up|out_proj) " "$OUT/kernels_llama.log" | head -20
timeout 200 python3 -m lowlat.bench --sections copy,step --models SmolLM2-135M,Llama-3.2-1B --rows 1,6 --budget-s 180 \
  --out "$OUT/step_h200.json" > "$OUT/step.log" 2>&1
grep -E "decode_step +[16] " "$OUT/step.log" | head -12
