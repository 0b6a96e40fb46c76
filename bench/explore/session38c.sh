#!/usr/bin/env bash
# Session 38, call 3 (one GPU, no carry, ends by END, default 200 s): explore52 again with the x chunks' loads all
# issued before the first mma (call 2's loop paid one L2 round trip a chunk), x's statistic from the chunks (tma,
# tma_late) or production's (tma_pssw: production's bits), at 1 / 6 / 16 / 48 rows.
cd "$(dirname "$0")/../.."
source bench/device/common.sh
exec > >(tee "$OUT/all.log") 2>&1
END=${END:-200}
echo "== explore52 (${SECONDS}s)"
timeout "$(cap 180)" python3 bench/explore/explore52.py --rows 1,6,16,48 --rounds 2 --out "$OUT/explore52.json" \
  2>&1 | grep -v -i warn; echo "rc $?"
echo "done at ${SECONDS}s"
