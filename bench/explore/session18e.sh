#!/usr/bin/env bash
# Session 18 call 5. (1) `lowlat bench --sections copy,step,profile` for Llama-3.2-1B with the committed default split
# groups (call 2 timed that grouping through explore26 only). (2) The LM heads at 2-3 row blocks, where
# `stages_for` runs one stage fewer (Llama's 132 us at 1 row, 160 / 227 at 24 / 48 in the step): per kernel
# (explore28, 1 / 24 / 48 rows, --bits: is bn 128 bitwise bn 64's?), then in the steps (explore26 with plan_table
# tables, alternated twice): Llama stages 8 at 2-3 row blocks (7 in flight) and bn 128 at every width; SmolLM2
# stages 5 at 2-3 row blocks.
cd "$(dirname "$0")/../.."
source bench/device/common.sh
exec > >(tee "$OUT/all.log") 2>&1
echo "== lowlat bench step Llama (${SECONDS}s)"
timeout 120 python3 -m lowlat.bench --sections copy,step,profile --models Llama-3.2-1B --rows 1,6,8,16,24,32,48 \
  --out "$OUT/step_llama_s18.json" 2>&1 | grep -v -i warn | grep -E 'decode_step|in_step' | cut -c1-100
echo "== e28 lm_head (${SECONDS}s)"
timeout 150 python3 bench/explore/explore28.py --kind lm_head --n 128256 --k 2048 --rows 1 24 48 --bits \
  --plans 'bn=128' 'stages=8' 'bn=128,stages=8' 2>&1 | grep -v -i warn
T=/tmp/plans; mkdir -p $T
python3 bench/explore/plan_table.py $T/C.json > /dev/null
python3 bench/explore/plan_table.py $T/S8.json 'lm_head:128256:2048=bn=64@2:stages=8@3:stages=8'
python3 bench/explore/plan_table.py $T/B128.json 'lm_head:128256:2048=bn=128'
python3 bench/explore/plan_table.py $T/SS5.json 'lm_head:49152:576=bn=128@2:stages=5@3:stages=5'
e26() {  # model table
  (( SECONDS > 480 )) && { echo "skip e26 $*: ${SECONDS}s used"; return; }
  echo "== e26 $1 table $2 (${SECONDS}s)"
  if LOWLAT_GEMV_PLANS=$T/$2.json timeout 60 python3 bench/explore/explore26.py --model "$1" \
      --order 1,6,16,24,32,48 > /tmp/e26.log 2>&1; then grep -v -i warn /tmp/e26.log
  else echo "e26 $1 $2 failed"; tail -4 /tmp/e26.log; fi
}
L=Llama-3.2-1B; S=SmolLM2-135M
e26 $L C; e26 $L S8; e26 $L B128; e26 $S C; e26 $S SS5; e26 $L C; e26 $L S8; e26 $L B128; e26 $S C; e26 $S SS5
echo "done at ${SECONDS}s"
