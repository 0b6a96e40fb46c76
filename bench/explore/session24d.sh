#!/usr/bin/env bash
# Session 24, call 4: explore33 version 2 (K cut into S slices, S / Q independent mma chains a warp; 8- or 16-row
# blocks): its GPU tests (row invariance across rb and widths), then Llama-3.2-1B / Qwen3-30B-A3B out_proj at
# 1 / 6 / 16 / 48 rows beside the production residual GEMV (call 3: version 1 beat production at 1-6 rows, lost at
# 16-48).
cd "$(dirname "$0")/../.."
source bench/device/common.sh
exec > >(tee "$OUT/all.log") 2>&1
timeout 90 python3 -m pytest -q -m gpu -p no:cacheprovider -rf tests/unit/test_explore_kernels.py -k register_mma \
  > /tmp/gpu-tests.log 2>&1; echo "pytest rc $?"
grep -E "passed|failed|FAILED|Error" /tmp/gpu-tests.log | cut -c1-300 | tail -8; cp /tmp/gpu-tests.log "$OUT/gpu-tests.log"
left=$(( ${TOTAL:-250} - SECONDS )); echo "== explore33, budget ${left}s (${SECONDS}s)"
timeout $(( left + 30 )) python3 bench/explore/explore33.py --out "$OUT/explore33.json" --budget-s $(( left - 10 )) \
  --rows 1 6 16 48 > /tmp/e33.log 2>&1; echo "explore33 rc $?"; grep -v -i warn /tmp/e33.log | tail -3
python3 - "$OUT/explore33.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
best = {}
for r in d["results"]:
    if r.get("op") == "held_mma":
        key = (r["shape"], r["rows"], r["warps"], r["slices"], r["rb"], r["mode"], r["early"])
        best[key] = min(best.get(key, 1e9), r["us"])
        if not r["ok"]:
            print("NOT OK", r)
    elif r.get("variant") == "production":
        print("production", r["n"], r["k"], r["rows"], r["rep"], r["us"], r["pct_of_copy"])
for key, us in sorted(best.items()):
    print(key, us)
for e in d.get("errors", []):
    print("ERROR", str(e)[:300])
PY
echo "done at ${SECONDS}s"
