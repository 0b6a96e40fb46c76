#!/usr/bin/env bash
# Session 38, call 10 (one GPU, no carry, ends by END, default 150 s): explore54's xissue (the next launch released
# right after x's loads are issued) on folded weights against production on the same weights and production as the
# bench runs it (g in registers), 1 / 6 rows, cold then warm x.
cd "$(dirname "$0")/../.."
source bench/device/common.sh
exec > >(tee "$OUT/all.log") 2>&1
END=${END:-150}
for warm in "" "--warm-x"; do
  echo "== explore54 xissue $warm (${SECONDS}s)"
  timeout "$(cap 60)" python3 bench/explore/explore54.py --rows 1,6 --variants prod_f,xissue_f,prod $warm \
    --out "$OUT/explore54_xissue${warm:+_warm}.json" 2>&1 | grep -v -i warn; echo "rc $?"
done
echo "done at ${SECONDS}s"
