#!/usr/bin/env bash
# Session 23, call 5: FusedModel(early_release=...) (out_proj and down, dense layers, release the next launch at their
# start; call 4 measured it together with the prologue's, which lost). (1) The GPU tests of the changed files (the
# fused model's early-release test: bits against the release after the wait, NaN-filled replays). (2) `lowlat bench`
# kernels, Llama-3.2-1B (out_proj fused / fused_deferred, gate/up after a deferred out_proj, down). (3) explore26
# --early-release on / off alternated twice: Llama / SmolLM2 at 1 / 6 / 16 rows, Qwen3-0.6B / Qwen2.5-0.5B at 1 / 6.
# (A record: explore26's flag then took on / off; it now takes launch names, so "on" is "out_proj,down" today.)
cd "$(dirname "$0")/../.."
source bench/device/common.sh
exec > >(tee "$OUT/all.log") 2>&1
echo "== GPU tests (${SECONDS}s)"
timeout 220 python3 -m pytest -q -n 8 -m "gpu and not real_model and not eval" -p no:cacheprovider --timeout 200 -rf \
  tests/unit/test_fused_model.py tests/unit/test_out_proj.py tests/unit/test_deferred_reduction.py \
  tests/unit/test_deferred_prologue.py tests/unit/test_mlp_kernel.py tests/unit/test_benchmarking.py \
  > /tmp/gpu-tests.log 2>&1; echo "pytest rc $?"
grep -E "passed|failed|FAILED|Error" /tmp/gpu-tests.log | cut -c1-300 | tail -12; cp /tmp/gpu-tests.log "$OUT/gpu-tests.log"
echo "== lowlat bench kernels, Llama (${SECONDS}s)"
timeout 120 python3 -m lowlat.bench --sections copy,kernels --models Llama-3.2-1B --rows 1,6,16 --budget-s 80 \
  --out "$OUT/kernels_llama.json" > /tmp/k.log 2>&1; echo "bench rc $?"
python3 - "$OUT/kernels_llama.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for r in d["results"]:
    if r.get("section") == "kernels" and r["variant"].startswith("fused"):
        print(r["op"], r["variant"], "rows", r["rows"], round(r["us"], 2), "us", round(100 * r["floor_us"] / r["us"], 1), "%")
for e in d.get("errors", []):
    print("ERROR", str(e)[:300])
PY
e26() {  # model order state
  (( SECONDS > 500 )) && { echo "skip e26 $*: ${SECONDS}s used"; return; }
  echo "== e26 $1 $2 early_release $3 (${SECONDS}s)"
  if timeout 60 python3 bench/explore/explore26.py --model $1 --order $2 --early-release $3 > /tmp/e26.log 2>&1
  then grep -v -i warn /tmp/e26.log | grep -E 'r[0-9]+ |logits' | cut -c1-400; else echo "e26 $1 failed"; tail -4 /tmp/e26.log; fi
}
for rep in 1 2; do
  e26 Llama-3.2-1B 1,6,16 on; e26 Llama-3.2-1B 1,6,16 off
  e26 SmolLM2-135M 1,6,16 on; e26 SmolLM2-135M 1,6,16 off
done
for rep in 1 2; do
  e26 Qwen3-0.6B 1,6 on; e26 Qwen3-0.6B 1,6 off
  e26 Qwen2.5-0.5B 1,6 on; e26 Qwen2.5-0.5B 1,6 off
done
echo "done at ${SECONDS}s"
