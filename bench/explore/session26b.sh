#!/usr/bin/env bash
# Session 26's second call (about 420 s): Qwen3-30B-A3B's step (explore26, 4 layers, ctx 512, 1 / 6 / 16 / 48 rows)
# with each form of the MoE layers' output projection (FusedModel(moe_out_proj=...): held = the default now,
# split_k, norm_epilogue = the form before this session), alternated (A B C C B A); then Llama-3.2-1B's attention
# prologue per kernel twice (bench_attn_prologue.py: split-K, held with g multiplied in registers, held on folded
# weights), to repeat session 25's one-run 6-row gap between the two held forms (4.67 against 5.64 us).
cd "$(dirname "$0")/../.."
source bench/device/common.sh
exec > >(tee "$OUT/all.log") 2>&1
e26() {  # moe_out_proj tag
  explore26_once 420 90 "$1_$2" --model Qwen3-30B-A3B --layers 4 --order 1,6,16,48 --moe-out-proj "$1"
}
e26 held 1; e26 split_k 1; e26 norm_epilogue 1; e26 norm_epilogue 2; e26 split_k 2; e26 held 2
for rep in 1 2; do
  (( SECONDS > 500 )) && { echo "skip bench_attn_prologue $rep: ${SECONDS}s used"; continue; }
  echo "== bench_attn_prologue Llama-3.2-1B run $rep (${SECONDS}s)"
  timeout 90 python3 bench/bench_attn_prologue.py --models Llama-3.2-1B --rows 1 6 16 48 --budget-s 0 \
    --out "$OUT/attn_prologue_llama_$rep.json" > /tmp/bap.log 2>&1; echo "bench rc $?"
  grep -v -i warn /tmp/bap.log | grep -E "fused_pdl|held" | cut -c1-200
done
echo "done at ${SECONDS}s"
