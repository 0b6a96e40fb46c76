#!/usr/bin/env bash
# Session 20, call 4: out_proj's split-K reduction deferred to the gate/up launch (`residual_gemv_deferred`,
# `gate_up_act(DeferredX)`, `FusedModel.defers`: dense models at 1-16 rows when out_proj's plan splits K; the same
# bits). (1) The GPU tests of test_deferred_reduction, the MLP, out_proj, plans and the fused model. (2) Llama-3.2-1B's
# step, explore26 --defer on / off alternated twice (SmolLM2's out_proj has split 1: nothing deferred, once as a control).
# (3) `lowlat bench --sections copy,kernels,step,profile` for Llama-3.2-1B (per kernel: out_proj fused / fused_deferred).
cd "$(dirname "$0")/../.."
source bench/device/common.sh
exec > >(tee "$OUT/all.log") 2>&1
echo "== the GPU tests of the changed kernels and the fused model (${SECONDS}s)"
timeout 240 python3 -m pytest -q -n 8 -m "gpu and not real_model and not eval" -p no:cacheprovider --timeout 200 \
  tests/unit/test_deferred_reduction.py tests/unit/test_mlp_kernel.py tests/unit/test_out_proj.py \
  tests/unit/test_fused_model.py tests/unit/test_gemv_plans.py > /tmp/gpu-tests.log 2>&1; echo "pytest rc $?"
grep -E "passed|failed|FAILED|Error" /tmp/gpu-tests.log | cut -c1-300 | tail -15; cp /tmp/gpu-tests.log "$OUT/gpu-tests.log"
e26() {  # model defer
  (( SECONDS > 470 )) && { echo "skip e26 $*: ${SECONDS}s used"; return; }
  echo "== e26 $1 defer $2 (${SECONDS}s)"
  if timeout 60 python3 bench/explore/explore26.py --model $1 --order 1,6,16,24 --defer $2 > /tmp/e26.log 2>&1
  then grep -v -i warn /tmp/e26.log | grep -E 'r(1|6|16|24) |logits'; else echo "e26 $1 $2 failed"; tail -4 /tmp/e26.log; fi
}
for rep in 1 2; do e26 Llama-3.2-1B on; e26 Llama-3.2-1B off; done
e26 SmolLM2-135M on
echo "== lowlat bench Llama (${SECONDS}s)"
timeout 100 python3 -m lowlat.bench --sections copy,kernels,step,profile --models Llama-3.2-1B --rows 1,6,16 \
  --budget-s 80 --out "$OUT/bench_llama_s20.json" 2>&1 | grep -v -i warn | grep -E 'copy|out_proj|gate_up|decode_step' \
  | cut -c1-160 | head -40
echo "done at ${SECONDS}s"
