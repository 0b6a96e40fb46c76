#!/usr/bin/env bash
# Prepared in session 38, NOT run (no device time left; one GPU, no carry, ends by END, default 240 s): the explores'
# host code after the final review's refactor (`_common.run_checked`, `_common.stamp_chain`, `gluon_asm`, explore52's
# dropped read-ahead parameter; every kernel's sm_90 SASS unchanged on the CPU): each device path once, short, and
# the explores' GPU tests.
cd "$(dirname "$0")/../.."
source bench/device/common.sh
exec > >(tee "$OUT/all.log") 2>&1
END=${END:-240}
echo "== test_explore_held_chain (${SECONDS}s)"
timeout "$(cap 90)" python3 -m pytest -q -n 4 -p no:cacheprovider -rf tests/unit/test_explore_held_chain.py -m gpu \
  2>&1 | tail -3
for cmd in "explore51.py --shapes llama --rounds 1" "explore52.py --rows 1 --rounds 1" \
    "explore53.py --rows 1 --rounds 1" "explore54.py --rows 1 --rounds 1 --variants prod,xissue2_f,prod_f" \
    "explore54.py --stamps" \
    "explore55.py --rows 1 --rounds 1" "explore50.py --rows 1 --rounds 1"; do
  echo "== $cmd (${SECONDS}s)"
  timeout "$(cap 40)" python3 bench/explore/$cmd 2>&1 | grep -v -i warn | grep -v "stamps .*_early" | cut -c1-400
done
echo "done at ${SECONDS}s"
