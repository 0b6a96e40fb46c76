#!/usr/bin/env bash
# Session 22, call 3: the fold's second form (the first CHUNK splits' partials loaded with the maxima, one round trip;
# CHUNK up to 8: a 512-token context's 8 splits at once where 16 KB allows) against no fold: explore26 fold 16 / 0
# alternated twice (Llama / SmolLM2 at 1 / 2 / 6 rows, Qwen3-0.6B / Qwen2.5-0.5B at 1 row); then every single-GPU
# test (the down deferral's new default rule, the fold's tests). JSONs stay in /tmp.
cd "$(dirname "$0")/../.."
source bench/device/common.sh
exec > >(tee "$OUT/all.log") 2>&1
e26() {  # model order fold
  (( SECONDS > 200 )) && { echo "skip e26 $*: ${SECONDS}s used"; return; }
  echo "== e26 $1 $2 fold $3 (${SECONDS}s)"
  if timeout 60 python3 bench/explore/explore26.py --model $1 --order $2 --fold $3 > /tmp/e26.log 2>&1
  then grep -v -i warn /tmp/e26.log | grep -E 'r[0-9]+ |logits' | cut -c1-400; else echo "e26 $1 failed"; tail -4 /tmp/e26.log; fi
}
for rep in 1 2; do
  e26 Llama-3.2-1B 1,2,6 16; e26 Llama-3.2-1B 1,2,6 0
  e26 SmolLM2-135M 1,2,6 16; e26 SmolLM2-135M 1,2,6 0
  e26 Qwen3-0.6B 1 16; e26 Qwen3-0.6B 1 0
  e26 Qwen2.5-0.5B 1 16; e26 Qwen2.5-0.5B 1 0
done
echo "== every single-GPU test (${SECONDS}s)"
gpu_tests 330
echo "done at ${SECONDS}s"
