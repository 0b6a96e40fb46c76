#!/usr/bin/env bash
# Session 38, call 2 (one GPU, no carry, ends by END, default 300 s): explore52, Llama-3.2-1B's held prologue with its
# weights in shared memory by TMA (released at the start / after the wait) against production: bitwise, every element
# written, the numerics policy, then per kernel A B C C B A twice at 1 / 6 / 16 / 48 rows; explore51 on this card
# (llama shape); the production bench's held_pdl line.
cd "$(dirname "$0")/../.."
source bench/device/common.sh
exec > >(tee "$OUT/all.log") 2>&1
END=${END:-300}
echo "== explore52 (${SECONDS}s)"
timeout "$(cap 150)" python3 bench/explore/explore52.py --rows 1,6,16,48 --rounds 2 --out "$OUT/explore52.json" \
  2>&1 | grep -v -i warn; echo "rc $?"
echo "== explore51 llama (${SECONDS}s)"
timeout "$(cap 60)" python3 bench/explore/explore51.py --shapes llama --rounds 2 --out "$OUT/explore51.json" \
  2>&1 | grep -v -i warn | grep -v stamps; echo "rc $?"
echo "== bench_attn_prologue Llama held (${SECONDS}s)"
timeout "$(cap 40)" python3 bench/bench_attn_prologue.py --models Llama-3.2-1B --rows 1 6 --budget-s 0 \
  --out "$OUT/prologue.json" 2>&1 | grep -E "held_pdl|rror" | cut -c1-200; echo "rc $?"
echo "done at ${SECONDS}s"
