#!/usr/bin/env bash
# Session 21, call 1: the down projection's split-K reduction deferred to the next layer's attention prologue
# (`FusedModel(defer_down=N)`, the prologue given a `DeferredX`: its pre-pass runs after its wait, beside its
# preloaded weights). (1) The GPU tests of both deferrals, the prologue, out_proj, MLP and the fused model (the first
# GPU run of session 20's fd5296b / 8432dc7 host and test changes too). (2) The step (explore26) of Llama-3.2-1B and
# SmolLM2-135M at 1 / 6 / 16 rows with defer_down 16 / 0 (out_proj's deferral at its default, 1 row), alternated twice.
cd "$(dirname "$0")/../.."
source bench/device/common.sh
exec > >(tee "$OUT/all.log") 2>&1
echo "== GPU tests (${SECONDS}s)"
timeout 240 python3 -m pytest -q -n 8 -m "gpu and not real_model and not eval" -p no:cacheprovider --timeout 200 \
  tests/unit/test_deferred_prologue.py tests/unit/test_deferred_reduction.py tests/unit/test_attn_prologue.py \
  tests/unit/test_out_proj.py tests/unit/test_mlp_kernel.py tests/unit/test_fused_model.py \
  > /tmp/gpu-tests.log 2>&1; echo "pytest rc $?"
grep -E "passed|failed|FAILED|Error" /tmp/gpu-tests.log | cut -c1-300 | tail -12; cp /tmp/gpu-tests.log "$OUT/gpu-tests.log"
e26() {  # model label defer_down
  (( SECONDS > 520 )) && { echo "skip e26 $*: ${SECONDS}s used"; return; }
  echo "== e26 $1 defer_down $2 (${SECONDS}s)"
  if timeout 60 python3 bench/explore/explore26.py --model $1 --order 1,6,16 --defer-down $2 \
      --out "$OUT/e26_${1}_dd$2_$3.json" > /tmp/e26.log 2>&1
  then grep -v -i warn /tmp/e26.log | grep -E 'r(1|6|16) |logits' | cut -c1-400; else echo "e26 $1 failed"; tail -4 /tmp/e26.log; fi
}
for rep in 1 2; do
  e26 Llama-3.2-1B on $rep; e26 Llama-3.2-1B off $rep; e26 SmolLM2-135M on $rep; e26 SmolLM2-135M off $rep
done
echo "done at ${SECONDS}s"
