#!/usr/bin/env bash
# Session 39, call 1 (one GPU, no carry): explore56, the held Llama prologue with its weight stream paced, against
# production and explore45's folded / maxnreg 168 / early form, at 1 / 6 / 16 rows.
cd "$(dirname "$0")/../.."
source bench/device/common.sh
exec > >(tee "$OUT/all.log") 2>&1
END=${END:-300}
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,power.draw --format=csv,noheader
echo "== explore56 (${SECONDS}s)"
timeout "$(cap 200)" python3 bench/explore/explore56.py --rows 1,6,16 --rounds 2 --out "$OUT/explore56.json" 2>&1 \
  | grep -v -i warn | cut -c1-900
echo "== explore56, 1 row again, windows (${SECONDS}s)"
timeout "$(cap 80)" python3 bench/explore/explore56.py --rows 1 --rounds 3 \
  --variants prod,c8w2_early,c8w1_early,c16w2_early,c16w3_early,c4w1_early --out "$OUT/explore56b.json" 2>&1 \
  | grep -v -i warn | cut -c1-900
echo "done at ${SECONDS}s"
