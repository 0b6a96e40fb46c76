#!/usr/bin/env bash
# Session 39, call 2 (one GPU, no carry): explore56 with x also loaded whole (production's statistic, so production's
# bits), the window / chunk sweep, and the uncapped chunked forms at 16 rows (what the paced form would hand over to).
cd "$(dirname "$0")/../.."
source bench/device/common.sh
exec > >(tee "$OUT/all.log") 2>&1
END=${END:-300}
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,power.draw --format=csv,noheader
echo "== explore56 (${SECONDS}s)"
timeout "$(cap 150)" python3 bench/explore/explore56.py --rows 1,6,16 --rounds 2 --out "$OUT/explore56.json" \
  --variants prod,prod_f,c8w2_early_x2,c16w4_early_x2,c8w1_early_x2,c8w2_early,c8w2_late_x2_nocap,c8w8_late_x2_nocap \
  2>&1 | grep -v -i warn | cut -c1-1200
echo "== explore56, 1 row, 3 rounds (${SECONDS}s)"
timeout "$(cap 80)" python3 bench/explore/explore56.py --rows 1,8 --rounds 3 \
  --variants prod,c16w4_early_x2,c16w2_early_x2,c16w6_early_x2,c8w2_early_x2 --out "$OUT/explore56b.json" 2>&1 \
  | grep -v -i warn | cut -c1-1200
echo "done at ${SECONDS}s"
