#!/usr/bin/env bash
# Session 14 call 2 (call 1 lost most of its printed output to the tool's tail; everything goes to $OUT/all.log
# now): the decode attention with out_cache_loc (PRE_KV; out_cache_loc compared against the slots BEFORE the
# wait now) against without, x COMBINE_CHUNK 8 / 1, at a server's widths, per model; the GPU tests (the late
# writer now spins 2 ms: call 1's 40 us ended before the host had launched the attention); the per-kernel bench.
cd "$(dirname "$0")/../.."
source bench/device/common.sh
exec > >(tee "$OUT/all.log") 2>&1
t0=$SECONDS
timeout 150 python3 -m pytest -q -n 8 -m "gpu and not real_model and not eval" -p no:cacheprovider --timeout 140 \
  tests/unit/test_decode_attention.py > "$OUT/gpu-tests.log" 2>&1
echo "gpu tests rc $? in $((SECONDS - t0))s: $(tail -1 "$OUT/gpu-tests.log")"
grep -E "^(FAILED|ERROR)|^E  " "$OUT/gpu-tests.log" | head -10
e26() {  # model order [explore26 options]; explore26 prints the summary
  (( SECONDS > 470 )) && { echo "skip e26 $*: ${SECONDS}s used"; return; }
  if timeout 100 python3 bench/explore/explore26.py --model "$1" --order "$2" "${@:3}" \
      --out "$OUT/e26.json" > "$OUT/e26.log" 2>&1; then grep -v -i warn "$OUT/e26.log"
  else echo "e26 $* failed"; tail -4 "$OUT/e26.log"; fi
}
W=1,2,4,6,8,12,16,24,32,48
for M in SmolLM2-135M Llama-3.2-1B; do
  e26 $M $W --pre-kv on --chunk 8
  e26 $M $W --pre-kv off --chunk 8
  e26 $M $W --pre-kv off --chunk 1
done
e26 Qwen3-30B-A3B 1,2,4,6,8,16,48 --layers 4 --pre-kv on --chunk 8
e26 Qwen3-30B-A3B 1,2,4,6,8,16,48 --layers 4 --pre-kv off --chunk 8
e26 Qwen3-30B-A3B 1,2,4,6,8,16,48 --layers 4 --pre-kv off --chunk 1
(( SECONDS < 480 )) && timeout 100 python3 bench/bench_decode_attention.py --rows 1 2 4 6 8 16 48 --ctxs 512 \
  --variants fused_pdl fused_pdl_pre_kv --out "$OUT/decode_attention_h200.json" 2>&1 | grep -v -i warn | tail -30
echo "done at ${SECONDS}s"
