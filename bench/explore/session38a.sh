#!/usr/bin/env bash
# Session 38, call 1 (one GPU, no carry, ends by END, default 240 s): explore51, the structure of a PDL chain of
# launches holding their weights across the wait (registers / shared memory / both / an L2 prefetch, 1.4 to 4.1
# launches' programs resident, released after the wait or at the start), timed per launch and stamped per program,
# at Llama-3.2-1B's and Qwen3-30B-A3B's packed QKV shapes, beside the production held prologue at 1 row; then the
# production bench's held_pdl line on the same card.
cd "$(dirname "$0")/../.."
source bench/device/common.sh
exec > >(tee "$OUT/all.log") 2>&1
END=${END:-240}
echo "== explore51 (${SECONDS}s)"
timeout "$(cap 180)" python3 bench/explore/explore51.py --rounds 2 --out "$OUT/explore51.json" \
  2>&1 | grep -v -i warn; echo "rc $?"
echo "== bench_attn_prologue Llama held (${SECONDS}s)"
timeout "$(cap 40)" python3 bench/bench_attn_prologue.py --models Llama-3.2-1B --rows 1 6 --budget-s 0 \
  --out "$OUT/prologue.json" 2>&1 | grep -E "held_pdl|rror" | cut -c1-200; echo "rc $?"
echo "done at ${SECONDS}s"
