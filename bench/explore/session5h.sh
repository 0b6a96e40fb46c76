#!/usr/bin/env bash
# Session-5 device call 8, after the final review's clean-up (one finisher path and one head-weights helper in the
# prologue, rstd_of shared, workspace counters per row block in GemvWorkspace): GPU tests of every kernel touched,
# then the prologue's per-kernel bench (references skipped by the budget).
cd "$(dirname "$0")/../.."
source bench/device/common.sh
timeout 220 python3 -m pytest -q -n 8 -m "gpu and not real_model and not eval" -p no:cacheprovider --timeout 200 \
  tests/unit/test_attn_prologue.py tests/unit/test_out_proj.py tests/unit/test_lm_head.py tests/unit/test_mlp_kernel.py \
  tests/unit/test_fused_model.py tests/unit/test_gemv_plans.py tests/multi_gpu/test_tp_fused_layer.py \
  2>&1 | tee "$OUT/gpu-tests.log" | tail -6
timeout 100 python3 bench/bench_attn_prologue.py --models SmolLM2-135M Llama-3.2-1B Qwen3-30B-A3B --rows 1 6 48 \
  --budget-s 1 --out "$OUT/attn_prologue_h200.json" 2>&1 | grep fused_pdl
