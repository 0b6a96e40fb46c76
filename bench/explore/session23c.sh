#!/usr/bin/env bash
# Session 23, call 4: the production residual GEMV (out_proj, down) and attention prologue with their dependents
# released at the kernel's start (bench/explore/early_release.py; explore31's EARLY took its Llama out_proj from 59% to
# 71% per kernel). (1) Applied: the GPU tests of the fused step and of both kernels (bits unchanged, NaN-filled replays:
# a successor reading a predecessor's output too early would fail them). (2) Per kernel, applied / reverted:
# `lowlat bench` kernels (Llama out_proj, deferred out_proj, down) and bench_attn_prologue (Llama, Qwen3-30B-A3B).
# (3) In the step: explore26 Llama / SmolLM2 at 1 / 6 / 16 rows, applied / reverted, alternated twice.
# (A record: after this call the residual edit became the kernel's EARLY_RELEASE, and early_release.py keeps only the
# prologue edit, so this script no longer runs as written; session23d.sh measures the kernel's own switch.)
cd "$(dirname "$0")/../.."
source bench/device/common.sh
exec > >(tee "$OUT/all.log") 2>&1
trap 'python3 bench/explore/early_release.py revert' EXIT
state() {
  if [ "$1" = early ]; then python3 bench/explore/early_release.py apply residual prologue
  else python3 bench/explore/early_release.py revert; fi
}
kernels() {  # state
  echo "== per kernel, $1 (${SECONDS}s)"
  timeout 90 python3 -m lowlat.bench --sections copy,kernels --models Llama-3.2-1B --rows 1,6,16 --budget-s 60 \
    --out "$OUT/kernels_$1.json" > /tmp/k.log 2>&1; echo "bench rc $?"
  python3 - "$OUT/kernels_$1.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for r in d["results"]:
    if r.get("section") == "kernels" and r["variant"] in ("fused", "fused_deferred") and r["op"] in ("out_proj", "down"):
        print(r["op"], r["variant"], "rows", r["rows"], round(r["us"], 2), "us", round(100 * r["floor_us"] / r["us"], 1), "%")
PY
  timeout 90 python3 bench/bench_attn_prologue.py --models Llama-3.2-1B Qwen3-30B-A3B --rows 1 6 16 --budget-s 1 \
    --out /tmp/prologue_$1.json > /tmp/p.log 2>&1; echo "prologue bench rc $?"
  grep -v -i warn /tmp/p.log | grep -iE "fused|rows" | cut -c1-200 | head -12
}
e26() {  # model order state
  (( SECONDS > 530 )) && { echo "skip e26 $*: ${SECONDS}s used"; return; }
  echo "== e26 $1 $2 $3 (${SECONDS}s)"
  if timeout 60 python3 bench/explore/explore26.py --model $1 --order $2 > /tmp/e26.log 2>&1
  then grep -v -i warn /tmp/e26.log | grep -E 'r[0-9]+ |logits' | cut -c1-400; else echo "e26 $1 failed"; tail -4 /tmp/e26.log; fi
}
state early
echo "== GPU tests, early release (${SECONDS}s)"
timeout 200 python3 -m pytest -q -n 8 -m "gpu and not real_model and not eval" -p no:cacheprovider --timeout 180 -rf \
  tests/unit/test_fused_model.py tests/unit/test_out_proj.py tests/unit/test_attn_prologue.py \
  tests/unit/test_deferred_reduction.py tests/unit/test_deferred_prologue.py tests/unit/test_mlp_kernel.py \
  > /tmp/gpu-tests.log 2>&1; echo "pytest rc $?"
grep -E "passed|failed|FAILED|Error" /tmp/gpu-tests.log | cut -c1-300 | tail -12; cp /tmp/gpu-tests.log "$OUT/gpu-tests.log"
kernels early
state base
kernels base
for rep in 1 2; do
  state early; e26 Llama-3.2-1B 1,6,16 early; e26 SmolLM2-135M 1,6,16 early
  state base; e26 Llama-3.2-1B 1,6,16 base; e26 SmolLM2-135M 1,6,16 base
done
echo "done at ${SECONDS}s"
