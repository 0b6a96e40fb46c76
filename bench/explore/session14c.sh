#!/usr/bin/env bash
# Session 14 call 3: COMBINE_CHUNK 4 (sm_90 compile: 72 registers with PRE_KV at D 64, against 111 at chunk 8) and
# the grid rule (`pre_kv_fits`). Production steps at a server's widths: pre_kv auto (lowlat's default) / on (every
# width) / off, per model; then every single-GPU test on this code; then `lowlat bench` (step, compiled, profile).
cd "$(dirname "$0")/../.."
source bench/device/common.sh
exec > >(tee "$OUT/all.log") 2>&1
e26() {  # model order [explore26 options]; explore26 prints the summary
  (( SECONDS > 200 )) && { echo "skip e26 $*: ${SECONDS}s used"; return; }
  if timeout 100 python3 bench/explore/explore26.py --model "$1" --order "$2" "${@:3}" \
      --out "$OUT/e26.json" > "$OUT/e26.log" 2>&1; then grep -v -i warn "$OUT/e26.log"
  else echo "e26 $* failed"; tail -4 "$OUT/e26.log"; fi
}
W=1,2,4,6,8,12,16,24,32,48
for M in SmolLM2-135M Llama-3.2-1B; do
  e26 $M $W --pre-kv on
  e26 $M $W --pre-kv off
done
e26 Qwen3-30B-A3B 1,2,4,6,8,16,48 --layers 4 --pre-kv on
e26 Qwen3-30B-A3B 1,2,4,6,8,16,48 --layers 4 --pre-kv off
t0=$SECONDS
timeout 230 python3 -m pytest -q -n 8 -m "gpu and not real_model and not eval" -p no:cacheprovider --timeout 200 \
  tests/ > "$OUT/gpu-tests.log" 2>&1
echo "gpu tests rc $? in $((SECONDS - t0))s: $(tail -1 "$OUT/gpu-tests.log")"
grep -E "^(FAILED|ERROR)" "$OUT/gpu-tests.log" | head -20
left=$(( 560 - SECONDS ))
(( left > 60 )) && timeout $left python3 -m lowlat.bench --sections copy,step,compiled,profile \
  --models SmolLM2-135M,Llama-3.2-1B --rows 1,6,8,16,48 --budget-s $((left - 20)) --out "$OUT/step_s14.json" \
  > "$OUT/bench.log" 2>&1; echo "bench rc $?"; grep -E "section=(step|compiled)" "$OUT/bench.log" | cut -c1-200
echo "done at ${SECONDS}s"
