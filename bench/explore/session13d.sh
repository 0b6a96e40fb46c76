#!/usr/bin/env bash
# Session 13 call 4: the decode attention's PDL trigger, after_kv (default) against start, where call 2 did not look:
# Qwen3-30B-A3B cut to 4 layers (attention + MoE; out_proj with its RMSNorm epilogue follows the attention) at
# widths 1,6 twice and a server's widths 1..48; Llama-3.2-1B at a server's widths 1..48 (explore26.py, production
# kernels, fresh process each).
cd "$(dirname "$0")/../.."
source bench/device/common.sh
e26() {  # trigger model order [explore26 options]; explore26 prints the summary
  (( SECONDS > 450 )) && { echo "skip e26 $*: ${SECONDS}s used"; return; }
  if timeout 120 python3 bench/explore/explore26.py --attn-trigger "$1" --model "$2" --order "$3" "${@:4}" \
      --out "$OUT/e26.json" > "$OUT/e26.log" 2>&1; then cat "$OUT/e26.log"
  else echo "e26 $* failed"; tail -4 "$OUT/e26.log"; fi
}
Q=Qwen3-30B-A3B
W=1,2,4,6,8,12,16,24,32,48
for rep in 1 2; do
  e26 start $Q 1,6 --layers 4
  e26 after_kv $Q 1,6 --layers 4
done
e26 start $Q $W --layers 4
e26 after_kv $Q $W --layers 4
e26 start Llama-3.2-1B $W
e26 after_kv Llama-3.2-1B $W
echo "done at ${SECONDS}s"
