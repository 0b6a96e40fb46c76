#!/usr/bin/env bash
# Session 38, call 11 (one GPU, no carry, ends by END, default 150 s): explore55, the production held Llama prologue
# chained by a ready flag (release-add after the stores, an acquire spin instead of griddepcontrol.wait), released
# after the flag wait or at the start, against production: bitwise, every element written, timed at 1 / 6 rows.
cd "$(dirname "$0")/../.."
source bench/device/common.sh
exec > >(tee "$OUT/all.log") 2>&1
END=${END:-150}
echo "== explore55 (${SECONDS}s)"
timeout "$(cap 120)" python3 bench/explore/explore55.py --rows 1,6 --rounds 2 --out "$OUT/explore55.json" \
  2>&1 | grep -v -i warn; echo "rc $?"
echo "done at ${SECONDS}s"
