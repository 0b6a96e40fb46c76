#!/usr/bin/env bash
# Session 15 call 1: the decode attention asks the L2 for the weights read after it (out_proj, gate/up, down, then
# on into the next layer: every layer's streamed weights sit in one buffer in read order; FusedModel(
# l2_prefetch_bytes=)) before its PDL wait. First the GPU tests of the attention
# and the fused step (prefetch / default early KV bitwise against neither); then production steps (explore26.py,
# a server's widths, fresh process each) at L2 budgets 0 / out_proj only / 16 / 32 / 64 MB, alternated; the plain
# path's cost (prefetch only at the early-KV widths); SmolLM2's stream down plan with the prefetch.
# Ran on a tree that is commit aed0b5d with the prefetch issued BEFORE the wait (aed0b5d issues it after); the
# explore26 options it uses exist only there.
cd "$(dirname "$0")/../.."
source bench/device/common.sh
exec > >(tee "$OUT/all.log") 2>&1
t0=$SECONDS
timeout 220 python3 -m pytest -q -n 8 -m "gpu and not real_model and not eval" -p no:cacheprovider --timeout 200 \
  tests/unit/test_decode_attention.py tests/unit/test_fused_model.py > "$OUT/gpu-tests.log" 2>&1
echo "gpu tests rc $? in $((SECONDS - t0))s: $(tail -1 "$OUT/gpu-tests.log")"
grep -E "^(FAILED|ERROR)|Error|assert" "$OUT/gpu-tests.log" | head -30
n=0
e26() {  # model order [explore26 options]; explore26 prints the summary
  (( SECONDS > 540 )) && { echo "skip e26 $*: ${SECONDS}s used"; return; }
  n=$((n + 1))
  if timeout 120 python3 bench/explore/explore26.py --model "$1" --order "$2" "${@:3}" \
      --out "$OUT/e26_$n.json" > "$OUT/e26_$n.log" 2>&1; then cat "$OUT/e26_$n.log"
  else echo "e26 $* failed"; tail -4 "$OUT/e26_$n.log"; fi
}
W=1,2,4,6,8,12,16,24,32,48
S=SmolLM2-135M
L=Llama-3.2-1B
for round in 1 2; do
  e26 $S $W --l2-prefetch 0
  e26 $S $W --l2-prefetch 16
  e26 $L $W --l2-prefetch 16
  e26 $L $W --l2-prefetch 0
done
e26 $L $W --l2-prefetch 8
e26 $L $W --l2-prefetch 32
e26 Qwen3-30B-A3B 1,6,48 --layers 4 --l2-prefetch 0
e26 Qwen3-30B-A3B 1,6,48 --layers 4 --l2-prefetch 16
e26 $S $W --l2-prefetch 4
e26 $S $W --l2-prefetch 48
e26 $S $W --l2-prefetch 16 --l2-prefetch-max-rows 8
e26 $S $W --l2-prefetch 16 --plan-d '{"preload": false, "stages": 4, "pf_k": 256}'
e26 $L $W --l2-prefetch 64
echo "done at ${SECONDS}s"
