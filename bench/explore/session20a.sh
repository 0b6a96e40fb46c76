#!/usr/bin/env bash
# Written in session 19, NOT yet run (no device time was left): the next session's first experiments.
# (1) D-128 heads (Qwen3-30B-A3B) lost with 2 groups x 5 stages (77 KB of shared memory, 2 programs an SM): per kernel
# with BLOCK_N 32 blocks (half the K / V tile, a different split partition) at 3 / 5 stages and 32 / 4 / 2 / 1 groups,
# against the default (BLOCK_N 64, one program per split, 3 stages). (2) The tuner's SmolLM2 down proposal (pf_k 1024
# at 2-3 row blocks, call 1 of session 19) against the table's (preload at 2 row blocks) in the step, alternated.
# (3) explore29: the decode attention's in-kernel timeline in the step (where its 4.35 / 6.5 us at 1 row go).
cd "$(dirname "$0")/../.."
source bench/device/common.sh
exec > >(tee "$OUT/all.log") 2>&1
echo "== per kernel, Qwen3 heads (${SECONDS}s)"
timeout 150 python3 bench/bench_decode_attention.py --variants fused_pdl --models Qwen3-30B-A3B --rows 16 37 48 \
  --ctxs 512 4096 --split-groups 0 --out "$OUT/da_qwen3_bn64.json" 2>&1 | grep -v -i warn | cut -c1-100
timeout 200 python3 bench/bench_decode_attention.py --variants fused_pdl --models Qwen3-30B-A3B --rows 16 37 48 \
  --ctxs 512 4096 --split-groups 32 4 2 1 --kv-stages 3 5 --block-n 32 --out "$OUT/da_qwen3_bn32.json" 2>&1 \
  | grep -v -i warn | cut -c1-100
T=/tmp/plans; mkdir -p $T
python3 bench/explore/plan_table.py $T/C.json > /dev/null
python3 bench/explore/plan_table.py $T/D.json 'residual:576:1536=pf_k=256@2:pf_k=1024@3:pf_k=1024' > /dev/null
e26() {  # table
  (( SECONDS > 500 )) && { echo "skip e26 $*: ${SECONDS}s used"; return; }
  echo "== e26 SmolLM2 table $1 (${SECONDS}s)"
  if LOWLAT_GEMV_PLANS=$T/$1.json timeout 40 python3 bench/explore/explore26.py --model SmolLM2-135M \
      --order 1,6,16,24,32,48 > /tmp/e26.log 2>&1; then grep -v -i warn /tmp/e26.log | grep -E 'r(1|6|16|24|32|48) '
  else echo "e26 $1 failed"; tail -4 /tmp/e26.log; fi
}
e26 C; e26 D; e26 C; e26 D
for m in SmolLM2-135M Llama-3.2-1B; do
  (( SECONDS > 520 )) && { echo "skip explore29 $m: ${SECONDS}s used"; continue; }
  echo "== explore29 $m (${SECONDS}s)"
  timeout 60 python3 bench/explore/explore29.py --model $m --rows 1,6,48 --out "$OUT/explore29_$m.json" 2>&1 \
    | grep -v -i warn | cut -c1-300
done
echo "done at ${SECONDS}s"
