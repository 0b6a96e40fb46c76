#!/usr/bin/env bash
# Session 38, call 5 (one GPU, no carry, ends by END, default 260 s): explore52 with 8 warps (8 K slices, 80
# registers) beside the 4-warp TMA forms and production at 1 / 6 / 16 rows, the 1-row chains stamped; then explore51
# (both shapes) on this card.
cd "$(dirname "$0")/../.."
source bench/device/common.sh
exec > >(tee "$OUT/all.log") 2>&1
END=${END:-260}
echo "== explore52 (${SECONDS}s)"
timeout "$(cap 150)" python3 bench/explore/explore52.py --rows 1,6,16 --rounds 2 --out "$OUT/explore52.json" \
  2>&1 | grep -v -i warn; echo "rc $?"
echo "== explore51 (${SECONDS}s)"
timeout "$(cap 90)" python3 bench/explore/explore51.py --rounds 2 --out "$OUT/explore51.json" \
  2>&1 | grep -v -i warn | grep -v "stamps .*_early\|stamps hyb\|stamps reg \|stamps pf"; echo "rc $?"
echo "done at ${SECONDS}s"
