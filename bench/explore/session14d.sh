#!/usr/bin/env bash
# Session 14 call 4, the final code: the combine loads COMBINE_CHUNK (4) splits' partials per round trip and folds
# them one at a time (bitwise the sums of session 13's kernel; registers 80 / 126 at D 64 / 128, as then), and the
# early KV path's table says 6 programs an SM at D 64. GPU tests of the attention and the fused step; production
# steps pre_kv auto (default) against off at a server's widths; `lowlat bench` (step, compiled, profile).
cd "$(dirname "$0")/../.."
source bench/device/common.sh
exec > >(tee "$OUT/all.log") 2>&1
t0=$SECONDS
timeout 120 python3 -m pytest -q -n 8 -m "gpu and not real_model and not eval" -p no:cacheprovider --timeout 110 \
  tests/unit/test_decode_attention.py tests/unit/test_fused_model.py > "$OUT/gpu-tests.log" 2>&1
echo "gpu tests rc $? in $((SECONDS - t0))s: $(tail -1 "$OUT/gpu-tests.log")"
grep -E "^(FAILED|ERROR)" "$OUT/gpu-tests.log" | head -20
e26() {  # model order [explore26 options]; explore26 prints the summary
  (( SECONDS > 330 )) && { echo "skip e26 $*: ${SECONDS}s used"; return; }
  if timeout 60 python3 bench/explore/explore26.py --model "$1" --order "$2" "${@:3}" \
      --out "$OUT/e26.json" > "$OUT/e26.log" 2>&1; then grep -v -i warn "$OUT/e26.log"
  else echo "e26 $* failed"; tail -4 "$OUT/e26.log"; fi
}
W=1,2,4,6,8,12,16,24,32,48
for M in SmolLM2-135M Llama-3.2-1B; do
  e26 $M $W --pre-kv auto
  e26 $M $W --pre-kv off
done
left=$(( 310 - SECONDS ))
(( left > 50 )) && timeout $left python3 -m lowlat.bench --sections copy,step,compiled,profile \
  --models SmolLM2-135M,Llama-3.2-1B --rows 1,6,8,16,48 --budget-s $((left - 15)) --out "$OUT/step_s14.json" \
  > "$OUT/bench.log" 2>&1; echo "bench rc $?"; grep -E "section=step" "$OUT/bench.log" | grep -E "variant=(fused|reference_compile_graph) " | cut -c1-150
e26 Qwen3-30B-A3B 1,2,4,6,8,16,48 --layers 4 --pre-kv auto
echo "done at ${SECONDS}s"
