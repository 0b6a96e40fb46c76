#!/usr/bin/env bash
# Session 15 call 2: call 1's L2 prefetch (issued BEFORE the attention's PDL wait) slowed the prologue it overlapped
# (Llama-3.2-1B 7.4 -> 9.0 us at 16 MB) and left out_proj unchanged. Here the prefetch is issued right AFTER the wait
# (the prologue complete): production steps (explore26.py, a server's widths) at budgets 0 / 16 / 32 MB from wo and
# 16 MB from gate/up, alternated, then the attention / fused-step GPU tests of this placement.
# Ran on commit aed0b5d's tree; the explore26 options it uses exist only there.
cd "$(dirname "$0")/../.."
source bench/device/common.sh
exec > >(tee "$OUT/all.log") 2>&1
n=0
e26() {  # model order [explore26 options]; explore26 prints the summary (the JSON files are not fetched: 8 files)
  (( SECONDS > 400 )) && { echo "skip e26 $*: ${SECONDS}s used"; return; }
  n=$((n + 1))
  if timeout 120 python3 bench/explore/explore26.py --model "$1" --order "$2" "${@:3}" \
      > "/tmp/e26_$n.log" 2>&1; then grep -v "Warning\|_warn_once" "/tmp/e26_$n.log"
  else echo "e26 $* failed"; tail -4 "/tmp/e26_$n.log"; fi
}
W=1,2,4,6,8,12,16,24,32,48
S=SmolLM2-135M
L=Llama-3.2-1B
for round in 1 2; do
  e26 $L $W --l2-prefetch 16
  e26 $L $W --l2-prefetch 0
  e26 $S $W --l2-prefetch 6
  e26 $S $W --l2-prefetch 0
done
e26 $L $W --l2-prefetch 32
e26 $L $W --l2-prefetch 16 --l2-prefetch-from gate_up
e26 $S $W --l2-prefetch 16
e26 Qwen3-30B-A3B 1,6,48 --layers 4 --l2-prefetch 16
e26 Qwen3-30B-A3B 1,6,48 --layers 4 --l2-prefetch 0
t0=$SECONDS
timeout 150 python3 -m pytest -q -n 8 -m "gpu and not real_model and not eval" -p no:cacheprovider --timeout 140 \
  tests/unit/test_decode_attention.py tests/unit/test_fused_model.py > "$OUT/gpu-tests.log" 2>&1
echo "gpu tests rc $? in $((SECONDS - t0))s: $(tail -1 "$OUT/gpu-tests.log")"
grep -E "^(FAILED|ERROR)" "$OUT/gpu-tests.log" | head -20
echo "done at ${SECONDS}s"
