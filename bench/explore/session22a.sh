#!/usr/bin/env bash
# Session 22, call 1: (1) session21d.sh's GPU tests (the fused model's deferral test on the final rule with its
# NaN-filled replays, the deferred prologue / reduction tests); (2) the down deferral where it was not measured:
# Qwen2.5-0.5B at 8 / 12 rows (the rule defers 1-12) and Qwen3-0.6B at 1 / 2 / 4 / 6 rows (the rule defers 1-2),
# explore26 with defer_down 48 / 0, alternated twice. JSONs stay in /tmp (a call brings back 8 files).
cd "$(dirname "$0")/../.."
source bench/device/common.sh
exec > >(tee "$OUT/all.log") 2>&1
echo "== GPU tests (${SECONDS}s)"
timeout 200 python3 -m pytest -q -n 8 -m "gpu and not real_model and not eval" -p no:cacheprovider --timeout 150 \
  tests/unit/test_deferred_prologue.py tests/unit/test_deferred_reduction.py tests/unit/test_fused_model.py \
  -k "deferred or default_down" > /tmp/gpu-tests.log 2>&1; echo "pytest rc $?"
grep -E "passed|failed|FAILED|Error" /tmp/gpu-tests.log | cut -c1-300 | tail -12; cp /tmp/gpu-tests.log "$OUT/gpu-tests.log"
e26() {  # model order defer_down
  (( SECONDS > 420 )) && { echo "skip e26 $*: ${SECONDS}s used"; return; }
  echo "== e26 $1 $2 defer_down $3 (${SECONDS}s)"
  if timeout 60 python3 bench/explore/explore26.py --model $1 --order $2 --defer-down $3 > /tmp/e26.log 2>&1
  then grep -v -i warn /tmp/e26.log | grep -E 'r[0-9]+ |logits' | cut -c1-400; else echo "e26 $1 failed"; tail -4 /tmp/e26.log; fi
}
for rep in 1 2; do
  e26 Qwen2.5-0.5B 8,12 48; e26 Qwen2.5-0.5B 8,12 0
  e26 Qwen3-0.6B 1,2,4,6 48; e26 Qwen3-0.6B 1,2,4,6 0
done
echo "done at ${SECONDS}s"
