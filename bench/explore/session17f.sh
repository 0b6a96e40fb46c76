#!/usr/bin/env bash
# Session 17 call 6. Call 5's per-kernel candidates for Llama-3.2-1B in the step (explore26, widths 1-48,
# alternated): down (residual 2048x8192) with 6 stages (per kernel 11.0 / 12.4 / 14.1 against 11.3 / 13.9 / 15.4 us
# at 1 / 24 / 48 rows); out_proj (residual 2048x2048) as bn 32 at 2 row blocks and streamed (4 stages, pf_k 256) at
# 3 (6.7 against 7.6 us at 24 rows, 8.9 against 9.7 at 48); gate/up with 6 stages at 2-3 row blocks (25.0 / 30.0
# against 25.9 / 30.7 us). Same bits as the committed plans (call 5 --bits).
cd "$(dirname "$0")/../.."
source bench/device/common.sh
exec > >(tee "$OUT/all.log") 2>&1
T=/tmp/plans; mkdir -p $T
python3 bench/explore/plan_table.py $T/C.json > /dev/null
python3 bench/explore/plan_table.py $T/D6.json 'residual:2048:8192=stages=6'
python3 bench/explore/plan_table.py $T/O.json 'residual:2048:2048=bn=64@2:bn=32@3:preload=0,stages=4,pf_k=256'
python3 bench/explore/plan_table.py $T/G.json 'gate_up:8192:2048=stages=4@2:stages=6@3:stages=6'
e26() {  # table
  (( SECONDS > 300 )) && { echo "skip e26 $*: ${SECONDS}s used"; return; }
  echo "== e26 table $1 (${SECONDS}s)"
  if LOWLAT_GEMV_PLANS=$T/$1.json timeout 60 python3 bench/explore/explore26.py --model Llama-3.2-1B \
      --order 1,6,16,24,32,48 > /tmp/e26.log 2>&1; then grep -v -i warn /tmp/e26.log
  else echo "e26 $1 failed"; tail -4 /tmp/e26.log; fi
}
e26 C; e26 D6; e26 O; e26 G; e26 C; e26 D6; e26 O; e26 G
echo "done at ${SECONDS}s"
