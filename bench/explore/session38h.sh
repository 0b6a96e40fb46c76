#!/usr/bin/env bash
# Session 38, call 8 (one GPU, no carry, ends by END, default 200 s): explore54, the production held Llama prologue
# with the next launch released once x has landed / after the mma, against production, cold then warm x, 1 / 6 / 16
# rows (bitwise against production, every element written, timed).
cd "$(dirname "$0")/../.."
source bench/device/common.sh
exec > >(tee "$OUT/all.log") 2>&1
END=${END:-200}
echo "== explore54 cold (${SECONDS}s)"
timeout "$(cap 90)" python3 bench/explore/explore54.py --rows 1,6,16 --rounds 2 --out "$OUT/explore54_cold.json" \
  2>&1 | grep -v -i warn; echo "rc $?"
echo "== explore54 warm x (${SECONDS}s)"
timeout "$(cap 90)" python3 bench/explore/explore54.py --rows 1,6,16 --rounds 2 --warm-x \
  --out "$OUT/explore54_warm.json" 2>&1 | grep -v -i warn; echo "rc $?"
echo "done at ${SECONDS}s"
