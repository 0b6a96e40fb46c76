#!/usr/bin/env bash
# Session 17 call 4. (1) The FusedModel early-KV test rewritten to compare a PURE graph replay with the step's own KV
# slots set to NaN first (call 3: its earlier form, whose compared run followed an eager run on the same cache,
# passed the no-re-load mutation when run alone): the mutation against each case alone, twice; then the test file's
# GPU tests unmutated. (2) The tuner's SmolLM2 down proposal of call 3 (stream with pf_k 1024 at 2 row blocks)
# against the committed table (preload at 2 row blocks) in the step at a server's widths, alternated.
cd "$(dirname "$0")/../.."
source bench/device/common.sh
exec > >(tee "$OUT/all.log") 2>&1
PYT="python3 -m pytest -q -p no:cacheprovider --timeout 200"
EARLY=tests/unit/test_fused_model.py::test_gpu_default_early_kv_step_equals_the_plain_attention_bitwise
mutate lowlat/kernels/decode_attention.py "axis=1) > 0)" "axis=1) > 1)"
for rep in 1 2; do for case in late_writer tuned; do
  echo "== mutated, $case alone, rep $rep (${SECONDS}s)"
  timeout 100 $PYT "$EARLY[$case]" 2>&1 | grep -E "AssertionError|passed|failed" | cut -c1-250 | tail -2
done; done
unmutate
echo "== unmutated: test_fused_model GPU tests (${SECONDS}s)"
timeout 200 $PYT -n 4 -m "gpu and not real_model" tests/unit/test_fused_model.py 2>&1 | tail -1
T=/tmp/plans; mkdir -p $T
python3 bench/explore/plan_table.py $T/C.json > /dev/null
python3 bench/explore/plan_table.py $T/U.json 'residual:576:1536=preload=0,stages=4,pf_k=256@2:pf_k=1024'
e26() {  # table
  (( SECONDS > 500 )) && { echo "skip e26 $*: ${SECONDS}s used"; return; }
  echo "== e26 SmolLM2 table $1 (${SECONDS}s)"
  if LOWLAT_GEMV_PLANS=$T/$1.json timeout 60 python3 bench/explore/explore26.py --model SmolLM2-135M \
      --order 1,2,4,6,8,12,16,24,32,48 > /tmp/e26.log 2>&1; then grep -v -i warn /tmp/e26.log
  else echo "e26 $1 failed"; tail -4 /tmp/e26.log; fi
}
e26 C; e26 U; e26 C; e26 U
echo "done at ${SECONDS}s"
