#!/usr/bin/env bash
# Session 39, call 6 (one GPU, no carry): the decode step of Llama-3.2-1B (16 layers, random weights, explore26) with
# FusedModel's default (g multiplied in registers, the prologue released after its wait) against folded weights with
# the prologue's early release, i.e. the paced prologue at 1 / 6 rows (`attn_prologue_held`'s pace), A B; then
# explore57 (Qwen3's paced cluster prologue).
cd "$(dirname "$0")/../.."
source bench/device/common.sh
exec > >(tee "$OUT/all.log") 2>&1
END=${END:-300}
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,power.draw --format=csv,noheader
for round in 1; do
  echo "== step default, round $round (${SECONDS}s)"
  timeout "$(cap 90)" python3 bench/explore/explore26.py --model Llama-3.2-1B --order 1,6,16 \
    --out "$OUT/step_default_$round.json" 2>&1 | grep -v -i warn | cut -c1-400
  echo "== step paced (folded, prologue early), round $round (${SECONDS}s)"
  timeout "$(cap 90)" python3 bench/explore/explore26.py --model Llama-3.2-1B --order 1,6,16 --held-fold build \
    --early-release out_proj,down,attn_prologue --out "$OUT/step_paced_$round.json" 2>&1 | grep -v -i warn | cut -c1-400
done
echo "== explore57 (${SECONDS}s)"
timeout "$(cap 100)" python3 bench/explore/explore57.py --rows 1,6 --rounds 2 --out "$OUT/explore57.json" \
  --variants split_k,cluster,cluster_c16w4_late,cluster_c16w2_late,cluster_c16w6_late \
  2>&1 | grep -v -i warn | cut -c1-1500
echo "done at ${SECONDS}s"
