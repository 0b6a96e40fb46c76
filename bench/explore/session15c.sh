#!/usr/bin/env bash
# Session 15 call 3, the final code: the L2-prefetch experiment reverted (commit aed0b5d keeps it), SmolLM2's down
# projection on the stream plan (preload false, stages 4, pf_k 256). Every single-GPU test (the late-writer race now
# spins 20 ms; the default early-KV step against the plain attention, bitwise); `lowlat bench` (copy, step,
# compiled, profile); the SmolLM2 step at a server's widths (explore26.py).
cd "$(dirname "$0")/../.."
source bench/device/common.sh
exec > >(tee "$OUT/all.log") 2>&1
t0=$SECONDS
timeout 230 python3 -m pytest -q -n 8 -m "gpu and not real_model and not eval" -p no:cacheprovider --timeout 200 \
  tests > "$OUT/gpu-tests.log" 2>&1
echo "gpu tests rc $? in $((SECONDS - t0))s: $(tail -1 "$OUT/gpu-tests.log")"
grep -E "^(FAILED|ERROR)" "$OUT/gpu-tests.log" | head -20
left=$(( 420 - SECONDS ))
(( left > 60 )) && timeout $left python3 -m lowlat.bench --sections copy,step,compiled,profile \
  --models SmolLM2-135M,Llama-3.2-1B --rows 1,6,8,16,48 --budget-s $((left - 15)) --out "$OUT/step_s15.json" \
  > "$OUT/bench.log" 2>&1; echo "bench rc $?"; grep -E "section=(step|profile)" "$OUT/bench.log" | \
  grep -E "variant=(fused|reference_compile_graph|fused_in_step) " | cut -c1-190
(( SECONDS < 450 )) && timeout 60 python3 bench/explore/explore26.py --model SmolLM2-135M --order 1,2,4,6,8,12,16,24,32,48 \
  --out "$OUT/e26.json" 2>&1 | grep -v -i warn
echo "done at ${SECONDS}s"
