#!/usr/bin/env bash
# Session 23, call 6: which of the two launches' early release pays in the step (call 5: both together won Llama /
# Qwen3-0.6B at 1 row by 3.5 us and lost SmolLM2 / Qwen2.5-0.5B by 12-13): explore26 --early-release out_proj / down /
# off, SmolLM2 / Qwen2.5-0.5B / Llama / Qwen3-0.6B at 1 / 6 rows, once each (call 5's repeats agreed within ~2 us).
cd "$(dirname "$0")/../.."
source bench/device/common.sh
exec > >(tee "$OUT/all.log") 2>&1
e26() {  # model order state
  (( SECONDS > 230 )) && { echo "skip e26 $*: ${SECONDS}s used"; return; }
  echo "== e26 $1 $2 early_release $3 (${SECONDS}s)"
  if timeout 40 python3 bench/explore/explore26.py --model $1 --order $2 --early-release $3 > /tmp/e26.log 2>&1
  then grep -v -i warn /tmp/e26.log | grep -E 'r[0-9]+ |logits' | cut -c1-400; else echo "e26 $1 failed"; tail -4 /tmp/e26.log; fi
}
for m in SmolLM2-135M Qwen2.5-0.5B Llama-3.2-1B Qwen3-0.6B; do
  e26 $m 1,6 out_proj; e26 $m 1,6 down; e26 $m 1,6 off
done
echo "done at ${SECONDS}s"
