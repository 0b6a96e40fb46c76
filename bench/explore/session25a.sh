#!/usr/bin/env bash
# Written in session 24 for the next session's first call (about 200 s): explore33's production-bits candidates
# (k_width 2, slices = the production plan's split 8, production's summation order) beside version 2's best tilings
# and production, Llama-3.2-1B / Qwen3-30B-A3B out_proj at 1 / 6 / 16 / 48 rows, each run's output compared bit for
# bit with production's residual GEMV (held_mma_bits, same_bits_as_production); first the GPU tests of explore33
# (the k_width 2 / production-order tilings have not run yet).
cd "$(dirname "$0")/../.."
source bench/device/common.sh
exec > >(tee "$OUT/all.log") 2>&1
timeout 120 python3 -m pytest -q -m gpu -p no:cacheprovider -rf tests/unit/test_explore_kernels.py -k register_mma \
  > /tmp/gpu-tests.log 2>&1; echo "pytest rc $?"
grep -E "passed|failed|FAILED|Error" /tmp/gpu-tests.log | cut -c1-300 | tail -8; cp /tmp/gpu-tests.log "$OUT/gpu-tests.log"
left=$(( ${TOTAL:-300} - SECONDS )); echo "== explore33, budget ${left}s (${SECONDS}s)"
timeout $(( left + 30 )) python3 bench/explore/explore33.py --out "$OUT/explore33.json" --budget-s $(( left - 10 )) \
  --rows 1 6 16 48 > /tmp/e33.log 2>&1; echo "explore33 rc $?"; grep -v -i warn /tmp/e33.log | tail -3
python3 - "$OUT/explore33.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
best, bits = {}, {}
for r in d["results"]:
    key = (r.get("shape"), r.get("rows"), r.get("warps"), r.get("slices"), r.get("rb"), r.get("k_width"), r.get("prod"),
           r.get("mode"), r.get("early"))
    if r.get("op") == "held_mma":
        best[key] = min(best.get(key, 1e9), r["us"])
        if not r["ok"]:
            print("NOT OK", r)
    elif r.get("op") == "held_mma_bits":
        bits.setdefault(key, set()).add(r["same_bits_as_production"])
    elif r.get("variant") == "production":
        print("production", r["n"], r["k"], r["rows"], r["rep"], r["us"], r["pct_of_copy"])
for key, us in sorted(best.items(), key=str):
    print(key, us, "same bits as production:", bits.get(key))
for e in d.get("errors", []):
    print("ERROR", str(e)[:300])
PY
echo "done at ${SECONDS}s"
