#!/usr/bin/env bash
# Session 37, call 5 (one GPU, no carry, ends by END, default 200 s): explore50, Llama-3.2-1B's held prologue with
# each warp's K slice cut into 2 / 4 independent mma chains (and x's statistic into as many partial sums), against
# production: accuracy against the float64 reference (the numerics policy), every element written, then per kernel
# A B C C B A twice at 1 / 6 / 16 rows; then the production bench's held_pdl line on the same card.
cd "$(dirname "$0")/../.."
source bench/device/common.sh
exec > >(tee "$OUT/all.log") 2>&1
END=${END:-200}
echo "== explore50 (${SECONDS}s)"
timeout "$(cap 150)" python3 bench/explore/explore50.py --rows 1,6,16 --rounds 2 --out "$OUT/explore50.json" \
  2>&1 | grep -v -i warn; echo "rc $?"
echo "== bench_attn_prologue Llama held (${SECONDS}s)"
timeout "$(cap 40)" python3 bench/bench_attn_prologue.py --models Llama-3.2-1B --rows 1 6 16 --budget-s 0 \
  --out "$OUT/prologue.json" 2>&1 | grep -E "held_pdl|rror" | cut -c1-200; echo "rc $?"
echo "done at ${SECONDS}s"
