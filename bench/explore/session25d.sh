#!/usr/bin/env bash
# Session 25's fourth call (about 500 s): the held prologue in production (lowlat/kernels/attn_prologue_held.py,
# FusedModel(held_prologue="auto"): Llama-3.2-1B's prologue). Every single-GPU test with it as the default (the
# new GPU tests of the kernel and of the step included); the prologue per kernel (bench_attn_prologue.py: split-K
# with PDL, held with g multiplied in registers, held on folded weights) at 1 / 6 / 16 / 48 rows; then explore26's
# step at 1 / 6 / 16 / 48 rows, held against split-K, alternated twice (ABBA).
cd "$(dirname "$0")/../.."
source bench/device/common.sh
exec > >(tee "$OUT/all.log") 2>&1
gpu_tests 300
echo "== bench_attn_prologue (${SECONDS}s)"
timeout 90 python3 bench/bench_attn_prologue.py --models Llama-3.2-1B --rows 1 6 16 48 --budget-s 0 \
  --out "$OUT/attn_prologue_llama.json" > /tmp/bap.log 2>&1; echo "bench rc $?"
grep -v -i warn /tmp/bap.log | grep -E "fused_pdl|held" | cut -c1-200
e26() {  # held_prologue
  (( SECONDS > 540 )) && { echo "skip e26 $*: ${SECONDS}s used"; return; }
  echo "== e26 Llama-3.2-1B held_prologue $1 (${SECONDS}s)"
  if timeout 60 python3 bench/explore/explore26.py --model Llama-3.2-1B --order 1,6,16,48 --held-prologue $1 \
       --out "$OUT/e26_$1_$2.json" > /tmp/e26.log 2>&1
  then grep -v -i warn /tmp/e26.log | grep -E '^  r[0-9]+ |logits' | cut -c1-400; else echo "e26 failed"; tail -4 /tmp/e26.log; fi
}
e26 on 1; e26 off 1; e26 off 2; e26 on 2
echo "done at ${SECONDS}s"
