#!/usr/bin/env bash
# Session 38, call 6 (one GPU, no carry, ends by END, default 200 s): explore52 with x warm in L2 (one x for every
# copy, as the previous launch of a step leaves it; weights still rotated cold) at 1 / 6 / 16 rows, stamped at 1 row,
# then the same cold at 1 row for the pairing on this card.
cd "$(dirname "$0")/../.."
source bench/device/common.sh
exec > >(tee "$OUT/all.log") 2>&1
END=${END:-200}
echo "== explore52 --warm-x (${SECONDS}s)"
timeout "$(cap 120)" python3 bench/explore/explore52.py --rows 1,6,16 --rounds 2 --warm-x \
  --out "$OUT/explore52_warm.json" \
  2>&1 | grep -v -i warn; echo "rc $?"
echo "== explore52 cold (${SECONDS}s)"
timeout "$(cap 60)" python3 bench/explore/explore52.py --rows 1 --rounds 2 --out "$OUT/explore52_cold.json" \
  2>&1 | grep -v -i warn | grep -v stamps; echo "rc $?"
echo "done at ${SECONDS}s"
