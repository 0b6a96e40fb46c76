#!/usr/bin/env bash
# Session-3 device call: GPU tests of the kernels whose reduction tails changed, the greedy-tail exploration,
# the draft-sampling bench and the down-projection tuning section.
cd "$(dirname "$0")/../.."
source bench/device/common.sh
timeout 170 python3 -m pytest -q -n 8 -m "gpu and not real_model and not eval" -p no:cacheprovider --timeout 160 \
  tests/unit/test_out_proj.py tests/unit/test_mlp_kernel.py tests/unit/test_lm_head.py tests/unit/test_draft_sampling.py \
  tests/unit/test_fused_model.py tests/unit/test_gemv_plans.py 2>&1 | tee "$OUT/gpu-tests.log" | tail -15
timeout 90 python3 bench/explore/explore5c.py --out "$OUT/explore5c_h200.json" 2>&1 | tail -50
timeout 120 python3 bench/bench_draft_sampling.py --out "$OUT/draft_sampling_h200.json" --rows 1 2 4 6 8 2>&1 | grep greedy
timeout 120 python3 -m lowlat.bench --sections copy,tune --models Llama-3.2-1B --tune-shapes residual:2048x8192 \
  --tune-budget-s 90 --rows 1,6 --budget-s 110 --out "$OUT/tune5_down_h200.json" 2>&1 | grep -v "^\s*$" | tail -30
