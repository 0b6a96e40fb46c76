#!/usr/bin/env bash
# Session 16 call 5. Llama-3.2-1B's preload GEMVs with narrower tiles: the attention prologue as bn 32 (one rotary
# half a tile, mma.sync), split 8, 384 programs of 32 KB (124 registers: all 16 loads a thread in flight before the
# wait, against ~9 of 32 for the tuned bn 64 plan, whose loads alternate with shared-memory stores); the same for the
# out_proj (residual 2048x2048: bn 32 split 8, 512 programs of 16 KB). Per kernel (the prologue) and in the step.
cd "$(dirname "$0")/../.."
source bench/device/common.sh
exec > >(tee "$OUT/all.log") 2>&1
T=/tmp/plans; mkdir -p $T
python3 bench/explore/plan_table.py $T/N.json > /dev/null
python3 bench/explore/plan_table.py $T/P32.json 'qkv:1536:2048=bn=32,split=8,preload=1,stages=1,pf_k=0'
python3 bench/explore/plan_table.py $T/P32O32.json 'qkv:1536:2048=bn=32,split=8,preload=1,stages=1,pf_k=0' \
  'residual:2048:2048=bn=32,split=8,preload=1,stages=1,pf_k=0'
for t in N P32; do
  echo "== prologue per kernel, table $t (${SECONDS}s)"
  LOWLAT_GEMV_PLANS=$T/$t.json timeout 60 python3 bench/bench_attn_prologue.py --models Llama-3.2-1B --rows 1 6 48 \
    --budget-s 0 2>&1 | grep -v -i warn | grep "M=" 
done
e26() {  # table
  (( SECONDS > 480 )) && { echo "skip e26 $*: ${SECONDS}s used"; return; }
  echo "== e26 table $1 (${SECONDS}s)"
  if LOWLAT_GEMV_PLANS=$T/$1.json timeout 60 python3 bench/explore/explore26.py --model Llama-3.2-1B \
      --order 1,6,16,48 > /tmp/e26.log 2>&1; then grep -v -i warn /tmp/e26.log
  else echo "e26 $* failed"; tail -4 /tmp/e26.log; fi
}
e26 N; e26 P32; e26 P32O32; e26 N; e26 P32; e26 P32O32
echo "done at ${SECONDS}s"
