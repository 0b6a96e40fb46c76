#!/usr/bin/env bash
# Session-3 final device call: GPU tests of every kernel changed this session, the draft-sampling bench, and
# the per-kernel section (the MLP's down projection alone, with the committed plan table) for Llama-3.2-1B.
cd "$(dirname "$0")/../.."
source bench/device/common.sh
timeout 200 python3 -m pytest -q -n 8 -m "gpu and not real_model and not eval" -p no:cacheprovider --timeout 190 \
  tests/unit/test_out_proj.py tests/unit/test_mlp_kernel.py tests/unit/test_lm_head.py tests/unit/test_fused_model.py \
  tests/unit/test_moe.py tests/unit/test_gemv_plans.py tests/unit/test_draft_sampling.py \
  tests/multi_gpu/test_tp_fused_layer.py 2>&1 | tee "$OUT/gpu-tests.log" | tail -4
timeout 120 python3 bench/bench_draft_sampling.py --out "$OUT/draft_sampling_h200.json" --rows 1 2 4 6 8 2>&1 \
  | python3 -c "import sys, json
for l in sys.stdin:
    if l.startswith('{'):
        d = json.loads(l); print(d['config'], d['rows'], d['fused_us'], d.get('fused_pdl_us'), d['torch_us'], d['speedup'])"
timeout 120 python3 -m lowlat.bench --sections copy,kernels --models Llama-3.2-1B --rows 1,6 --budget-s 100 \
  --out "$OUT/kernels_llama_h200.json" 2>&1 | grep -E "^Llama" | head -30
