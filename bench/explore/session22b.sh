#!/usr/bin/env bash
# Session 22, call 2: the decode attention's split combine folded into the output projection
# (`decode_attention(fold_combine=True)` + out_proj given the DeferredAttention; FusedModel(fold=N)). (1) Its GPU
# tests (bitwise against the attention's own combine at four presets' production plans, the fused model's graphed
# steps and NaN-filled replays) beside the attention / out_proj / deferral GPU tests. (2) explore26 with fold 16 / 0,
# alternated twice: SmolLM2 / Llama / Qwen3-0.6B / Qwen2.5-0.5B at 1-16 rows. JSONs stay in /tmp.
cd "$(dirname "$0")/../.."
source bench/device/common.sh
exec > >(tee "$OUT/all.log") 2>&1
echo "== GPU tests (${SECONDS}s)"
timeout 230 python3 -m pytest -q -n 8 -m "gpu and not real_model and not eval" -p no:cacheprovider --timeout 200 \
  tests/unit/test_attn_fold.py tests/unit/test_fused_model.py tests/unit/test_decode_attention.py \
  tests/unit/test_out_proj.py tests/unit/test_deferred_reduction.py tests/unit/test_deferred_prologue.py \
  > /tmp/gpu-tests.log 2>&1; echo "pytest rc $?"
grep -E "passed|failed|FAILED|Error" /tmp/gpu-tests.log | cut -c1-300 | tail -12; cp /tmp/gpu-tests.log "$OUT/gpu-tests.log"
e26() {  # model order fold
  (( SECONDS > 520 )) && { echo "skip e26 $*: ${SECONDS}s used"; return; }
  echo "== e26 $1 $2 fold $3 (${SECONDS}s)"
  if timeout 60 python3 bench/explore/explore26.py --model $1 --order $2 --fold $3 > /tmp/e26.log 2>&1
  then grep -v -i warn /tmp/e26.log | grep -E 'r[0-9]+ |logits' | cut -c1-400; else echo "e26 $1 failed"; tail -4 /tmp/e26.log; fi
}
for rep in 1 2; do
  e26 Llama-3.2-1B 1,2,6,16 16; e26 Llama-3.2-1B 1,2,6,16 0
  e26 SmolLM2-135M 1,6,16 16; e26 SmolLM2-135M 1,6,16 0
done
for rep in 1 2; do
  e26 Qwen3-0.6B 1,6 16; e26 Qwen3-0.6B 1,6 0
  e26 Qwen2.5-0.5B 1,6 16; e26 Qwen2.5-0.5B 1,6 0
done
echo "done at ${SECONDS}s"
