#!/usr/bin/env bash
# Session 18 call 7 (the session's last ~260 s of device time). SmolLM2's out_proj (residual 576x576, bn 16: every
# program re-reads the rows' x tiles per 16 columns, 3x the weight bytes at 3 row blocks) with a wider bn at 2-3 row
# blocks (residual plans may change bn with the width: session 17): the GPU out_proj / plan tests with that table,
# then SmolLM2's step (explore26) with the committed table, bn 32 at 2-3 row blocks, bn 32 / 64 at 2 / 3, alternated.
cd "$(dirname "$0")/../.."
source bench/device/common.sh
exec > >(tee "$OUT/all.log") 2>&1
T=/tmp/plans; mkdir -p $T
python3 bench/explore/plan_table.py $T/C.json > /dev/null
python3 bench/explore/plan_table.py $T/O32.json 'residual:576:576=bn=16@2:bn=32@3:bn=32' > /dev/null
python3 bench/explore/plan_table.py $T/O64.json 'residual:576:576=bn=16@2:bn=32@3:bn=64' > /dev/null
e26() {  # table
  (( SECONDS > 150 )) && { echo "skip e26 $*: ${SECONDS}s used"; return; }
  echo "== e26 SmolLM2 table $1 (${SECONDS}s)"
  if LOWLAT_GEMV_PLANS=$T/$1.json timeout 40 python3 bench/explore/explore26.py --model SmolLM2-135M \
      --order 1,6,16,24,32,48 > /tmp/e26.log 2>&1; then grep -v -i warn /tmp/e26.log | grep -E 'r(1|6|16|24|32|48) '
  else echo "e26 $1 failed"; tail -4 /tmp/e26.log; fi
}
e26 C; e26 O32; e26 O64; e26 C; e26 O32; e26 O64
echo "== GPU tests out_proj / plans with O32 (${SECONDS}s)"
LOWLAT_GEMV_PLANS=$T/O32.json timeout 60 python3 -m pytest -q -n 4 -m gpu -p no:cacheprovider tests/unit/test_out_proj.py \
  tests/unit/test_gemv_plans.py > /tmp/t.log 2>&1; echo "pytest rc $?"
grep -E "passed|failed|FAILED|Error" /tmp/t.log | cut -c1-300 | tail -8
echo "done at ${SECONDS}s"
