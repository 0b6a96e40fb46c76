#!/usr/bin/env bash
# Session 18 call 6: the committed Llama-3.2-1B LM head on bn 128 (call 5: bitwise bn 64's, faster at every width).
# The GPU tests of the LM head, the GEMV plans and the fused model; then `lowlat bench --sections copy,step,profile`
# for Llama-3.2-1B at a server's widths.
cd "$(dirname "$0")/../.."
source bench/device/common.sh
exec > >(tee "$OUT/all.log") 2>&1
echo "== GPU tests (${SECONDS}s)"
timeout 240 python3 -m pytest -q -n 4 -m gpu -p no:cacheprovider tests/unit/test_lm_head.py tests/unit/test_gemv_plans.py \
  tests/unit/test_fused_model.py tests/unit/test_draft_sampling.py > /tmp/t.log 2>&1; echo "pytest rc $?"
grep -E "passed|failed|FAILED|Error" /tmp/t.log | cut -c1-300 | tail -15
echo "== lowlat bench step Llama (${SECONDS}s)"
timeout 120 python3 -m lowlat.bench --sections copy,step,profile --models Llama-3.2-1B --rows 1,6,8,16,24,32,48 \
  --out "$OUT/step_llama_s18.json" 2>&1 | grep -v -i warn | grep -E 'decode_step|op=(lm_head|decode_attention) ' \
  | cut -c1-110
echo "done at ${SECONDS}s"
