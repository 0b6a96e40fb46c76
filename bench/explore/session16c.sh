#!/usr/bin/env bash
# Session 16 call 3. (1) The preload GEMVs with their weight tiles held in registers across the PDL wait
# ($LOWLAT_PRELOAD_HOLD=1, `_gemv.hold_tiles`: all 32 loads a thread in flight before the wait instead of ~9, the
# shared-memory staging after it), with 4 or 8 warps: the attention prologue per kernel (Llama, Qwen3), the
# out_proj shapes in the tuner, Llama's step. (2) The width-dependent weight streams now in TUNED_PLANS
# (`by_row_blocks`) against the flat table, in the step: SmolLM2 at a server's widths, Qwen3 (4 layers) with
# out_proj preloaded at every width (Q) as a third table.
cd "$(dirname "$0")/../.."
source bench/device/common.sh
exec > >(tee "$OUT/all.log") 2>&1
T=/tmp/plans; mkdir -p $T
python3 bench/explore/plan_table.py $T/N.json > /dev/null
python3 bench/explore/plan_table.py --flat $T/F.json > /dev/null
python3 bench/explore/plan_table.py $T/W8.json 'qkv:1536:2048=warps=8' 'qkv:2560:2048=warps=8'
python3 bench/explore/plan_table.py $T/Q.json 'out_proj:2048:4096=preload=1,stages=1,pf_k=0'
pro() {  # table hold
  echo "== prologue per kernel, table $1, hold $2 (${SECONDS}s)"
  LOWLAT_PRELOAD_HOLD=$2 LOWLAT_GEMV_PLANS=$T/$1.json timeout 90 python3 bench/bench_attn_prologue.py \
    --models Llama-3.2-1B Qwen3-30B-A3B --rows 1 6 --budget-s 0 2>&1 | grep -v -i warn | grep fused
}
pro N 0; pro N 1; pro W8 1; pro W8 0
echo "== tune out_proj shapes, hold 1 (${SECONDS}s)"
LOWLAT_PRELOAD_HOLD=1 timeout 120 python3 -m lowlat.bench --sections tune --models Llama-3.2-1B,Qwen3-30B-A3B \
  --tune-budget-s 100 --tune-shapes residual:2048x2048,out_proj:2048x4096 --out /tmp/tune_hold.json > /tmp/tune.log 2>&1
echo "tune rc $?"; grep -E "residual|out_proj" /tmp/tune.log | grep -E "default|preload|tuned" | tail -12
e26() {  # model order table hold
  (( SECONDS > 520 )) && { echo "skip e26 $*: ${SECONDS}s used"; return; }
  echo "== e26 $1 table $3 hold $4 (${SECONDS}s)"
  local extra=(); [ "$1" = Qwen3-30B-A3B ] && extra=(--layers 4)
  if LOWLAT_PRELOAD_HOLD=$4 LOWLAT_GEMV_PLANS=$T/$3.json timeout 70 python3 bench/explore/explore26.py --model "$1" \
      --order "$2" "${extra[@]}" > /tmp/e26.log 2>&1; then grep -v -i warn /tmp/e26.log
  else echo "e26 $* failed"; tail -4 /tmp/e26.log; fi
}
L=1,6,16,48; S=1,2,4,6,8,12,16,24,32,48; Q=1,6,24,32,48
e26 Llama-3.2-1B $L N 0; e26 Llama-3.2-1B $L N 1; e26 Llama-3.2-1B $L W8 1
e26 SmolLM2-135M $S N 0; e26 SmolLM2-135M $S F 0; e26 SmolLM2-135M $S F 0; e26 SmolLM2-135M $S N 0
e26 Qwen3-30B-A3B $Q N 0; e26 Qwen3-30B-A3B $Q F 0; e26 Qwen3-30B-A3B $Q Q 0
echo "done at ${SECONDS}s"
