#!/usr/bin/env bash
# Session 16 call 2. (1) Qwen3-30B-A3B's out_proj (with its RMSNorm epilogue, 2048x4096) on the tuner's winner of
# session 12 and of call 1 (preload bn 64, split 8: 8.97 against 10.74 us per kernel at 1 row) in the step: explore26,
# 4 layers, against the committed table, alternated. (2) Mutation checks of the two GPU-only tests that session 15
# added or changed: with the early-KV attention's re-load of the step's own slots disabled (`fresh` never true), both
# must fail; with `pre_kv_fits` always false, the FusedModel test must fail ("the early path really ran").
cd "$(dirname "$0")/../.."
source bench/device/common.sh
exec > >(tee "$OUT/all.log") 2>&1
T=/tmp/plans; mkdir -p $T
python3 bench/explore/plan_table.py $T/A.json
python3 bench/explore/plan_table.py $T/Q.json 'out_proj:2048:4096=bn=64,split=8,preload=1,stages=1,pf_k=0'
e26() {  # table [explore26 options]
  echo "== e26 table $1 ${*:2} (${SECONDS}s)"
  if LOWLAT_GEMV_PLANS=$T/$1.json timeout 90 python3 bench/explore/explore26.py --model Qwen3-30B-A3B --layers 4 \
      --order 1,6,16,48 "${@:2}" > /tmp/e26.log 2>&1; then grep -v -i warn /tmp/e26.log
  else echo "e26 $* failed"; tail -4 /tmp/e26.log; fi
}
e26 A; e26 Q; e26 Q; e26 A
PYT="python3 -m pytest -q -p no:cacheprovider --timeout 200"
EARLY=tests/unit/test_fused_model.py::test_gpu_default_early_kv_step_equals_the_plain_attention_bitwise
RACE=tests/unit/test_decode_attention.py::test_decode_attention_pre_kv_under_pdl_reads_a_late_writers_slots
cp lowlat/kernels/decode_attention.py /tmp/da.py
mutate() {  # name python-replacement-old python-replacement-new tests...
  echo "== mutation $1 (${SECONDS}s)"
  python3 - "$2" "$3" <<'PY'
import sys
p = "lowlat/kernels/decode_attention.py"; s = open(p).read(); old, new = sys.argv[1], sys.argv[2]
assert s.count(old) == 1, old
open(p, "w").write(s.replace(old, new))
PY
  $PYT -n 2 "${@:4}" 2>&1 | grep -E "passed|failed|FAILED|Error" | cut -c1-300 | tail -8
  cp /tmp/da.py lowlat/kernels/decode_attention.py
}
mutate no_fresh_reload "axis=1) > 0)" "axis=1) > 1)" $EARLY $RACE
mutate fits_never "    per_sm = next(" "    return False
    per_sm = next(" $EARLY
echo "== unmutated (${SECONDS}s)"
$PYT -n 2 $EARLY $RACE 2>&1 | tail -2
echo "done at ${SECONDS}s"
