#!/usr/bin/env bash
# Session 21, call 2 (the last: three start-ups were refused): (1) where the down projection's deferred reduction
# (FusedModel(defer_down=N)) stops paying. Call 1: SmolLM2-135M -35 / -30 / -9 us a step at 1 / 6 / 16 rows,
# Llama-3.2-1B -14 / +12 / +61; the consumer's pre-pass re-reads the partials once per prologue column tile (Llama 48
# tiles, SmolLM2 8): explore26 at SmolLM2's wider widths (16 / 24 / 32 / 48) and Llama's narrow ones (1 / 2 / 4),
# defer_down 48 / 0, alternated twice. (2) Every single-GPU test on the final code (the default rule,
# DEFER_DOWN_MAX_BYTES). (3) `lowlat bench --sections copy,step,profile` for SmolLM2-135M and Llama-3.2-1B at 1 / 6
# rows.
cd "$(dirname "$0")/../.."
source bench/device/common.sh
exec > >(tee "$OUT/all.log") 2>&1
e26() {  # model order defer_down rep
  (( SECONDS > 150 )) && { echo "skip e26 $*: ${SECONDS}s used"; return; }
  echo "== e26 $1 $2 defer_down $3 (${SECONDS}s)"
  if timeout 60 python3 bench/explore/explore26.py --model $1 --order $2 --defer-down $3 \
      --out "$OUT/e26_${1}_dd$3_$4.json" > /tmp/e26.log 2>&1
  then grep -v -i warn /tmp/e26.log | grep -E 'r[0-9]+ |logits' | cut -c1-400; else echo "e26 $1 failed"; tail -4 /tmp/e26.log; fi
}
for rep in 1 2; do
  e26 SmolLM2-135M 16,24,32,48 48 $rep; e26 SmolLM2-135M 16,24,32,48 0 $rep
  e26 Llama-3.2-1B 1,2,4 48 $rep; e26 Llama-3.2-1B 1,2,4 0 $rep
done
echo "== every single-GPU test (${SECONDS}s)"
gpu_tests 260
for m in SmolLM2-135M Llama-3.2-1B; do
  (( SECONDS > 500 )) && { echo "skip bench $m: ${SECONDS}s used"; continue; }
  echo "== lowlat bench $m (${SECONDS}s)"
  timeout $(( 580 - SECONDS )) python3 -m lowlat.bench --sections copy,step,profile --models $m --rows 1,6 \
    --budget-s $(( 540 - SECONDS )) --out "$OUT/step_${m}_s21.json" 2>&1 | grep -v -i warn \
    | grep -E 'copy|decode_step|op=(attn_prologue|decode_attention|out_proj|gate_up|down) ' | cut -c1-220
done
echo "done at ${SECONDS}s"
