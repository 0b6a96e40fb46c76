#!/usr/bin/env bash
# Session 20, call 5: the deferred out_proj reduction with its gate/up pre-pass in one round trip at 1 row
# (`mlp._reduce_deferred` in [RB, KC] pieces, `deferred_pieces`; call 4's chunk-by-chunk pre-pass made gate/up +5.5 us
# against out_proj's -2.15). (1) The GPU tests of the deferral and the fused model. (2) Llama-3.2-1B's step
# (explore26, widths 1 / 6 / 16) defer on / off, and on with gate/up prefetching 256 / 1024 columns of its weights
# into L2 before its wait at 1 row block (so its stream does not wait for the pre-pass), alternated twice.
cd "$(dirname "$0")/../.."
source bench/device/common.sh
exec > >(tee "$OUT/all.log") 2>&1
echo "== GPU tests (${SECONDS}s)"
timeout 150 python3 -m pytest -q -n 8 -m "gpu and not real_model and not eval" -p no:cacheprovider --timeout 120 \
  tests/unit/test_deferred_reduction.py tests/unit/test_mlp_kernel.py tests/unit/test_fused_model.py \
  -k "deferred or mlp" > /tmp/gpu-tests.log 2>&1; echo "pytest rc $?"
grep -E "passed|failed|FAILED|Error" /tmp/gpu-tests.log | cut -c1-300 | tail -8; cp /tmp/gpu-tests.log "$OUT/gpu-tests.log"
T=/tmp/plans; mkdir -p $T
python3 bench/explore/plan_table.py $T/P256.json 'gate_up:8192:2048=@1:pf_k=256@2:stages=6@3:stages=6' > /dev/null
python3 bench/explore/plan_table.py $T/P1024.json 'gate_up:8192:2048=@1:pf_k=1024@2:stages=6@3:stages=6' > /dev/null
e26() {  # label defer [plan table]
  (( SECONDS > 400 )) && { echo "skip e26 $*: ${SECONDS}s used"; return; }
  echo "== e26 Llama $1 (${SECONDS}s)"
  if LOWLAT_GEMV_PLANS=${3:-} timeout 50 python3 bench/explore/explore26.py --model Llama-3.2-1B --order 1,6,16 \
      --defer $2 > /tmp/e26.log 2>&1
  then grep -v -i warn /tmp/e26.log | grep -E 'r(1|6|16) |logits' | cut -c1-400; else echo "e26 $1 failed"; tail -4 /tmp/e26.log; fi
}
for rep in 1 2; do
  e26 on on; e26 off off; e26 on_pf256 on $T/P256.json; e26 on_pf1024 on $T/P1024.json; e26 off_pf256 off $T/P256.json
done
echo "done at ${SECONDS}s"
