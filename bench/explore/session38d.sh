#!/usr/bin/env bash
# Session 38, call 4 (one GPU, no carry, ends by END, default 200 s): explore52 with the next launch released at the
# start (tma0), after the wait (tma1), once x has landed (tma2), after the mma (tma3), and tma1p (production's
# statistic: production's bits), against production at 1 / 6 / 16 rows; then each TMA variant's 1-row chain stamped
# (lag, x, mma, epilogue spans).
cd "$(dirname "$0")/../.."
source bench/device/common.sh
exec > >(tee "$OUT/all.log") 2>&1
END=${END:-200}
echo "== explore52 (${SECONDS}s)"
timeout "$(cap 180)" python3 bench/explore/explore52.py --rows 1,6,16 --rounds 2 --out "$OUT/explore52.json" \
  2>&1 | grep -v -i warn; echo "rc $?"
echo "done at ${SECONDS}s"
