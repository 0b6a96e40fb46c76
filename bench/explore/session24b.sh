#!/usr/bin/env bash
# Session 24, call 2: does the "> 8 MB of weights" early-release rule hold in the step (session 23's call 6 ran each
# launch once at 1 / 6 rows)? The rule enables Llama-3.2-1B's out_proj (8.39 MB) and down (33.6 MB) and
# Qwen2.5-0.5B's down (8.7 MB); SmolLM2-135M and Qwen3-0.6B have no launch over 8 MB (nothing changes there).
# explore26 at 1 / 6 / 16 / 48 rows, the rule's names against off, four rounds alternated (ABBA).
cd "$(dirname "$0")/../.."
source bench/device/common.sh
exec > >(tee "$OUT/all.log") 2>&1
e26() {  # model early_release
  (( SECONDS > 470 )) && { echo "skip e26 $*: ${SECONDS}s used"; return; }
  echo "== e26 $1 early_release $2 (${SECONDS}s)"
  if timeout 60 python3 bench/explore/explore26.py --model $1 --order 1,6,16,48 --early-release $2 > /tmp/e26.log 2>&1
  then grep -v -i warn /tmp/e26.log | grep -E '^  r[0-9]+ ' | cut -c1-400; else echo "e26 $1 failed"; tail -4 /tmp/e26.log; fi
}
for round in 1 2 3 4; do
  if (( round % 2 )); then
    e26 Llama-3.2-1B out_proj,down; e26 Llama-3.2-1B off; e26 Qwen2.5-0.5B down; e26 Qwen2.5-0.5B off
  else
    e26 Llama-3.2-1B off; e26 Llama-3.2-1B out_proj,down; e26 Qwen2.5-0.5B off; e26 Qwen2.5-0.5B down
  fi
done
echo "done at ${SECONDS}s"
