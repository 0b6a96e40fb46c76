#!/usr/bin/env bash
# Session 20, call 6: the final rule (FusedModel defers out_proj's reduction at 1 row only, DEFER_MAX_WIDTH): the GPU
# tests of the deferral and the fused model; `lowlat bench --sections copy,step,profile` for Llama-3.2-1B at 1 / 6 rows.
cd "$(dirname "$0")/../.."
source bench/device/common.sh
exec > >(tee "$OUT/all.log") 2>&1
echo "== GPU tests (${SECONDS}s)"
timeout 120 python3 -m pytest -q -n 8 -m "gpu and not real_model and not eval" -p no:cacheprovider --timeout 100 \
  tests/unit/test_deferred_reduction.py tests/unit/test_fused_model.py > /tmp/gpu-tests.log 2>&1; echo "pytest rc $?"
grep -E "passed|failed|FAILED|Error" /tmp/gpu-tests.log | cut -c1-300 | tail -8; cp /tmp/gpu-tests.log "$OUT/gpu-tests.log"
echo "== lowlat bench Llama (${SECONDS}s)"
timeout 90 python3 -m lowlat.bench --sections copy,step,profile --models Llama-3.2-1B --rows 1,6 --budget-s 70 \
  --out "$OUT/step_llama_s20.json" 2>&1 | grep -v -i warn | grep -E 'copy|decode_step|op=(attn_prologue|out_proj|gate_up|down) ' \
  | cut -c1-200
echo "done at ${SECONDS}s"
