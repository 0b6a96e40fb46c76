#!/usr/bin/env bash
# Session 40, call 2 (one GPU, no carry, ends by END, default 570 s). On an H200 (the card issue 3's targets name):
# the production prologue bench at Llama-3.2-1B's 1 row three times (held_pdl / held_paced_pdl against 70% of copy
# bandwidth), explore57's paced Qwen3 cluster forms at 1 / 6 rows, explore56's windows beside production, then every
# single-GPU test with the time left. On an H100: every single-GPU test (the tree since session 36's last full run),
# then session38q.sh's explore device paths with the time left.
cd "$(dirname "$0")/../.."
source bench/device/common.sh
exec > >(tee "$OUT/all.log") 2>&1
END=${END:-570}
if on_h200; then
  prologue_bench_1row Llama-3.2-1B llama 3
  explore57_paced 150
  echo "== explore56 (${SECONDS}s)"
  timeout "$(cap 90)" python3 bench/explore/explore56.py --rows 1 --rounds 3 --out "$OUT/explore56.json" \
    --variants prod,prod_paced,c8w2_early_x2,c8w1_early_x2,c8w3_early_x2,c16w4_early 2>&1 | grep -v -i warn \
    | cut -c1-1200
  echo "== every single-GPU test (${SECONDS}s)"
  gpu_tests "$(cap 400)"
else
  echo "== every single-GPU test (${SECONDS}s)"
  gpu_tests "$(cap 440)"
  END=$(( END - SECONDS )) OUT=$OUT/q bash bench/explore/session38q.sh 2>&1 | grep -v "^NVIDIA\|^torch"
fi
echo "done at ${SECONDS}s"
