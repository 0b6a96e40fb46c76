#!/usr/bin/env bash
# Session 39, call 3 (one GPU, no carry): explore56's paced forms on production's weights (g loaded and multiplied
# after the wait: _gl), by family: 64-column chunks (production's bits, baseline prod) and 32-column chunks (their own
# bits, baseline c16w4_early), with the unpaced chunked forms that would serve 9-48 rows.
cd "$(dirname "$0")/../.."
source bench/device/common.sh
exec > >(tee "$OUT/all.log") 2>&1
END=${END:-300}
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,power.draw --format=csv,noheader
echo "== explore56, 64-column chunks (${SECONDS}s)"
timeout "$(cap 100)" python3 bench/explore/explore56.py --rows 1,6,16 --rounds 2 --out "$OUT/explore56_c8.json" \
  --variants prod,c8w2_early_x2,c8w2_early_x2_gl,c8w8_late_x2_g_nocap 2>&1 | grep -v -i warn | cut -c1-1200
echo "== explore56, 32-column chunks (${SECONDS}s)"
timeout "$(cap 120)" python3 bench/explore/explore56.py --rows 1,6,16 --rounds 2 --out "$OUT/explore56_c16.json" \
  --variants c16w4_early,prod,c16w4_early_gl,c16w16_late_g_nocap,c16w16_late_gl_nocap,c16w4_early_g_nocap 2>&1 \
  | grep -v -i warn | cut -c1-1200
echo "done at ${SECONDS}s"
