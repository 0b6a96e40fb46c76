#!/usr/bin/env bash
# Session 40, call 3 (one GPU, no carry, ends by END, default 560 s). On an H200 (issue 3's card): the production
# prologue bench at Llama-3.2-1B's 1 row three times (held_pdl / held_paced_pdl against 70% of copy bandwidth) and
# Qwen3-30B-A3B's (split-K) once, explore57's paced Qwen3 cluster forms at 1 / 6 rows, explore56's windows at 1 row
# and the paced form at 2-4 rows beside production. On an H100: only the paced form at 2-4 rows (PACE_MAX_ROWS is 1:
# 6 / 8 rows measured slower in session 39, 2-5 not measured).
cd "$(dirname "$0")/../.."
source bench/device/common.sh
exec > >(tee "$OUT/all.log") 2>&1
END=${END:-560}
few_rows() {
  echo "== explore56 rows 2-4 (${SECONDS}s)"
  timeout "$(cap 100)" python3 bench/explore/explore56.py --rows 2,3,4 --rounds 3 --out "$OUT/explore56_rows.json" \
    --variants prod,prod_paced,c8w2_early_x2,c8w2_late_x2 2>&1 | grep -v -i warn | cut -c1-1200
}
if on_h200; then
  prologue_bench_1row Llama-3.2-1B llama 3
  echo "== bench_attn_prologue Qwen3-30B-A3B 1 row (${SECONDS}s)"
  timeout "$(cap 60)" python3 bench/bench_attn_prologue.py --models Qwen3-30B-A3B --rows 1 --budget-s 0 \
    --out "$OUT/attn_prologue_qwen3.json" 2>&1 | grep -v -i warn | cut -c1-200
  explore57_paced 150
  echo "== explore56 (${SECONDS}s)"
  timeout "$(cap 90)" python3 bench/explore/explore56.py --rows 1 --rounds 3 --out "$OUT/explore56.json" \
    --variants prod,prod_paced,c8w2_early_x2,c8w1_early_x2,c8w3_early_x2,c16w4_early 2>&1 | grep -v -i warn \
    | cut -c1-1200
  few_rows
else
  few_rows
fi
echo "done at ${SECONDS}s"
