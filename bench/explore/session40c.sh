#!/usr/bin/env bash
# Session 40, call 4 (one GPU, no carry, ends by END, default 400 s): explore58, the K-split cluster prologue (a
# head's programs split K, x read once a cluster), for Qwen3-30B-A3B (QK-norm) against the split-K prologue and
# explore44's cluster form, and for Llama-3.2-1B against production's held prologue, at 1 / 6 / 16 / 48 rows. On an
# H200, first the production prologue bench at Llama's 1 row three times (held_pdl / held_paced_pdl).
cd "$(dirname "$0")/../.."
source bench/device/common.sh
exec > >(tee "$OUT/all.log") 2>&1
END=${END:-400}
if on_h200; then
  prologue_bench_1row Llama-3.2-1B llama 3
fi
echo "== explore58 qwen3 (${SECONDS}s)"
timeout "$(cap 150)" python3 bench/explore/explore58.py --model qwen3 --rows 1,6,16,48 --rounds 2 \
  --variants split_k,cluster,ksplit,ksplit_nocap --out "$OUT/explore58_qwen3.json" 2>&1 | grep -v -i warn | cut -c1-1500
echo "== explore58 llama (${SECONDS}s)"
timeout "$(cap 120)" python3 bench/explore/explore58.py --model llama --rows 1,6,16,48 --rounds 2 \
  --variants prod,ksplit,ksplit_nocap,ksplit_early --out "$OUT/explore58_llama.json" 2>&1 | grep -v -i warn \
  | cut -c1-1500
echo "done at ${SECONDS}s"
