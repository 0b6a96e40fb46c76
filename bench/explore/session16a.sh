#!/usr/bin/env bash
# Session 16 call 1 (issue 3). (1) The GEMV tuner on Llama-3.2-1B's out_proj (residual 2048x2048: never tuned, it is
# 8 MiB) and Qwen3's (out_proj 2048x4096) with two new candidates: the whole slice prefetched into L2 before the wait,
# bn 16, split 1 or 2 (`stream_bn16_split{1,2}_pfall`). (2) Llama's attention prologue per kernel with stream plans
# of the same kind (bn 32 = one rotary half a tile, split 2 / 4, the whole span into L2 before the wait), against
# the tuned preload plan (bn 64 split 8). (3) The same plans in the step (explore26 with $LOWLAT_GEMV_PLANS), alternated
# with the committed table and with the prologue launched without PDL (session 15's ready experiment, session15d.sh).
cd "$(dirname "$0")/../.."
source bench/device/common.sh
exec > >(tee "$OUT/all.log") 2>&1
T=/tmp/plans; mkdir -p $T
python3 bench/explore/plan_table.py $T/A.json
python3 bench/explore/plan_table.py $T/BD.json 'residual:2048:2048=bn=16,split=1,stages=8,pf_k=2048,preload=0' \
  'qkv:1536:2048=bn=32,split=2,stages=4,pf_k=1024,preload=0'
python3 bench/explore/plan_table.py $T/CE.json 'residual:2048:2048=bn=16,split=2,stages=8,pf_k=2048,preload=0' \
  'qkv:1536:2048=bn=32,split=4,stages=4,pf_k=512,preload=0'
echo "== tune (${SECONDS}s)"
timeout 150 python3 -m lowlat.bench --sections tune --models Llama-3.2-1B,Qwen3-30B-A3B --tune-budget-s 120 \
  --tune-shapes residual:2048x2048,out_proj:2048x4096 --plans-out "$OUT/plans_o.json" --out "$OUT/tune_o.json" \
  > /tmp/tune.log 2>&1; echo "tune rc $?"; grep -v -i warn /tmp/tune.log | tail -30
for t in A BD CE; do
  echo "== prologue per kernel, table $t (${SECONDS}s)"
  LOWLAT_GEMV_PLANS=$T/$t.json timeout 60 python3 bench/bench_attn_prologue.py --models Llama-3.2-1B --rows 1 6 \
    --budget-s 0 --out "$OUT/prologue_$t.json" 2>&1 | grep -v -i warn | tail -6
done
e26() {  # table [explore26 options]
  (( SECONDS > 500 )) && { echo "skip e26 $*: ${SECONDS}s used"; return; }
  echo "== e26 table $1 ${*:2} (${SECONDS}s)"
  if LOWLAT_GEMV_PLANS=$T/$1.json timeout 60 python3 bench/explore/explore26.py --model Llama-3.2-1B \
      --order 1,6,16,48 "${@:2}" > /tmp/e26.log 2>&1; then grep -v -i warn /tmp/e26.log
  else echo "e26 $* failed"; tail -4 /tmp/e26.log; fi
}
e26 A; e26 A --prologue-pdl off; e26 BD; e26 CE; e26 CE; e26 BD; e26 A --prologue-pdl off; e26 A
echo "done at ${SECONDS}s"
