#!/usr/bin/env bash
# Session 14 call 1: the decode attention loads its first block's K / V before the PDL wait (out_cache_loc given,
# PRE_KV) and its combining program folds COMBINE_CHUNK splits per round trip. First the GPU tests of the kernel
# (the late-writer race included) and of the fused step; then production steps (explore26.py, a server's widths)
# pre_kv on / off x chunk 8 / 4 / 1 (off + chunk 1 = session 13's kernel, as near as the code gets), alternated;
# the SmolLM2 down plan repeat (session 13's candidate); the per-kernel attention bench.
cd "$(dirname "$0")/../.."
source bench/device/common.sh
t0=$SECONDS
timeout 200 python3 -m pytest -q -n 8 -m "gpu and not real_model and not eval" -p no:cacheprovider --timeout 190 \
  tests/unit/test_decode_attention.py tests/unit/test_fused_model.py > "$OUT/gpu-tests.log" 2>&1
echo "gpu tests rc $? in $((SECONDS - t0))s: $(tail -1 "$OUT/gpu-tests.log")"
grep -E "^(FAILED|ERROR)" "$OUT/gpu-tests.log" | head -20
e26() {  # model order [explore26 options]; explore26 prints the summary
  (( SECONDS > 480 )) && { echo "skip e26 $*: ${SECONDS}s used"; return; }
  if timeout 120 python3 bench/explore/explore26.py --model "$1" --order "$2" "${@:3}" \
      --out "$OUT/e26.json" > "$OUT/e26.log" 2>&1; then cat "$OUT/e26.log"
  else echo "e26 $* failed"; tail -4 "$OUT/e26.log"; fi
}
W=1,2,4,6,8,12,16,24,32,48
S=SmolLM2-135M
L=Llama-3.2-1B
for round in 1 2; do
  e26 $S $W --pre-kv on --chunk 8
  e26 $S $W --pre-kv off --chunk 1
  e26 $S $W --pre-kv off --chunk 8
  e26 $S $W --pre-kv on --chunk 4
done
e26 $L $W --pre-kv on --chunk 8
e26 $L $W --pre-kv off --chunk 1
e26 $L $W --pre-kv on --chunk 4
e26 Qwen3-30B-A3B 1,6,48 --layers 4 --pre-kv on --chunk 8
e26 Qwen3-30B-A3B 1,6,48 --layers 4 --pre-kv off --chunk 1
for round in 1 2; do
  e26 $S $W --plan-d '{"preload": false, "stages": 4, "pf_k": 256}'
  e26 $S $W
done
(( SECONDS < 500 )) && timeout 90 python3 bench/bench_decode_attention.py --rows 1 6 48 --ctxs 512 4096 \
  --variants fused_pdl fused_pdl_pre_kv --out "$OUT/decode_attention_h200.json" 2>&1 | grep -v Warning | tail -30
echo "done at ${SECONDS}s"
