#!/usr/bin/env bash
# Session 38, call 9 (one GPU, no carry, ends by END, default 120 s): explore54 --stamps, the production held Llama
# prologue's own 1-row chain stamped (lag, x, mma, epilogue), x cold then warm; then production timed beside it.
cd "$(dirname "$0")/../.."
source bench/device/common.sh
exec > >(tee "$OUT/all.log") 2>&1
END=${END:-120}
for warm in "" "--warm-x"; do
  echo "== explore54 --stamps $warm (${SECONDS}s)"
  timeout "$(cap 40)" python3 bench/explore/explore54.py --stamps $warm \
    --out "$OUT/explore54_stamps${warm:+_warm}.json" \
    2>&1 | grep -v -i warn; echo "rc $?"
done
echo "== bench_attn_prologue Llama held (${SECONDS}s)"
timeout "$(cap 40)" python3 bench/bench_attn_prologue.py --models Llama-3.2-1B --rows 1 --budget-s 0 \
  --out "$OUT/prologue.json" 2>&1 | grep -E "held_pdl|rror" | cut -c1-200; echo "rc $?"
echo "done at ${SECONDS}s"
