#!/usr/bin/env bash
# Session 15 call 4: is Llama-3.2-1B's down projection slower in the step (58% of copy bandwidth at 1 row, 13.98 us)
# than self-chained (71%, 11.2 us) because the next attention prologue, launched early by PDL, loads its weights
# while down streams? explore26 with the prologue launched without PDL against with it, alternated.
cd "$(dirname "$0")/../.."
source bench/device/common.sh
exec > >(tee "$OUT/all.log") 2>&1
e26() {  # model order [explore26 options]; explore26 prints the summary
  (( SECONDS > 150 )) && { echo "skip e26 $*: ${SECONDS}s used"; return; }
  if timeout 60 python3 bench/explore/explore26.py --model "$1" --order "$2" "${@:3}" > /tmp/e26.log 2>&1; then
    grep -v -i warn /tmp/e26.log
  else echo "e26 $* failed"; tail -4 /tmp/e26.log; fi
}
W=1,6,48
for round in 1 2; do
  e26 Llama-3.2-1B $W --prologue-pdl off
  e26 Llama-3.2-1B $W
done
echo "done at ${SECONDS}s"
