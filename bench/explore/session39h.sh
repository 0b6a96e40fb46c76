#!/usr/bin/env bash
# Prepared in session 39, NOT run (one GPU, no carry, ~200 s; after session39g.sh): on the card the issue's target
# names (H200), explore56's windows at 1 row beside production and its own paced form, and explore57's Qwen3 paced
# cluster forms at 1 / 6 rows (70% of copy bandwidth needs 7.20 us there at 1 row).
cd "$(dirname "$0")/../.."
source bench/device/common.sh
exec > >(tee "$OUT/all.log") 2>&1
END=${END:-280}
echo "== explore56 (${SECONDS}s)"
timeout "$(cap 90)" python3 bench/explore/explore56.py --rows 1 --rounds 3 --out "$OUT/explore56.json" \
  --variants prod,prod_paced,c8w2_early_x2,c8w1_early_x2,c8w3_early_x2,c16w4_early 2>&1 | grep -v -i warn | cut -c1-1200
echo "== explore57 (${SECONDS}s)"
timeout "$(cap 150)" python3 bench/explore/explore57.py --rows 1,6 --rounds 2 --out "$OUT/explore57.json" \
  --variants split_k,cluster,cluster_c16w4_late,cluster_c16w2_late,cluster_c16w6_late,cluster_c8w2_late \
  2>&1 | grep -v -i warn | cut -c1-1500
echo "done at ${SECONDS}s"
