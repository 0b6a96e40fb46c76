#!/usr/bin/env bash
# Session 38, call 15 (one GPU, no carry, ends by END, default 150 s): explore54's xissue2 (the next launch released
# right after x's loads are issued, x's uses ordered after the release by an OR with its 0: sm_90 SASS on folded
# weights = the wait, x's 16 loads, the release, the 32 mma) against production on the same weights and production
# as the bench runs it, 1 / 6 / 16 rows, cold then warm x.
cd "$(dirname "$0")/../.."
source bench/device/common.sh
exec > >(tee "$OUT/all.log") 2>&1
END=${END:-150}
for warm in "" "--warm-x"; do
  echo "== explore54 xissue2 $warm (${SECONDS}s)"
  timeout "$(cap 60)" python3 bench/explore/explore54.py --rows 1,6,16 --variants prod_f,xissue2_f,prod $warm \
    --out "$OUT/explore54_xissue2${warm:+_warm}.json" 2>&1 | grep -v -i warn; echo "rc $?"
done
echo "done at ${SECONDS}s"
