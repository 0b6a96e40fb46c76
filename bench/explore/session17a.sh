#!/usr/bin/env bash
# Session 17 call 1. (1) Do plans that differ only in bn (mma.sync for bn 16 / 32, wgmma for bn 64 / 128) give the
# same bits? The Llama prologue (bn 32 / 64 / 128, preload and stream) and the residual GEMV (Llama out_proj and down)
# at 1 / 6 / 17 / 48 rows, three seeds (explore27 --bits). (2) The prologue per kernel under register caps (maxnreg:
# more of the next launch's programs resident during this one's chain). (3) The Llama step at 1-48 rows with the
# prologue's bn 32 plan (now), bn 64 everywhere (before session 16), bn 32 streaming at 3 row blocks / at 2 and 3,
# and bn 32 capped at 80 registers.
cd "$(dirname "$0")/../.."
source bench/device/common.sh
exec > >(tee "$OUT/all.log") 2>&1
T=/tmp/plans; mkdir -p $T
python3 bench/explore/plan_table.py $T/N.json > /dev/null
python3 bench/explore/plan_table.py $T/F64.json 'qkv:1536:2048=bn=64,split=8,preload=1,stages=1,pf_k=0'
python3 bench/explore/plan_table.py $T/S3.json 'qkv:1536:2048=bn=32@3:preload=0,stages=2,pf_k=256'
python3 bench/explore/plan_table.py $T/S23.json 'qkv:1536:2048=bn=32@2:preload=0,stages=2,pf_k=256@3:preload=0,stages=2,pf_k=256'
echo "== bits (${SECONDS}s)"
timeout 200 python3 bench/explore/explore27.py --bits --rows 1 6 17 48 2>&1 | grep -v -i warn
echo "== chain (${SECONDS}s)"
timeout 150 python3 bench/explore/explore27.py --chain --chain-rows 1 48 --caps 0 96 80 64 2>&1 | grep -v -i warn
e26() {  # table [extra args]
  (( SECONDS > 520 )) && { echo "skip e26 $*: ${SECONDS}s used"; return; }
  echo "== e26 table $* (${SECONDS}s)"
  local t=$1; shift
  if LOWLAT_GEMV_PLANS=$T/$t.json timeout 70 python3 bench/explore/explore26.py --model Llama-3.2-1B \
      --order 1,6,16,24,32,48 "$@" > /tmp/e26.log 2>&1; then grep -v -i warn /tmp/e26.log
  else echo "e26 $t $* failed"; tail -4 /tmp/e26.log; fi
}
e26 N; e26 F64; e26 S3; e26 S23; e26 N --prologue-maxnreg 80
echo "done at ${SECONDS}s"
