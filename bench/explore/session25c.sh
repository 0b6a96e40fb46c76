#!/usr/bin/env bash
# Session 25's third call (about 200 s): explore34 (Llama-3.2-1B's attention prologue on explore33's register-held
# mma GEMV) version 2 -- its GPU tests, four mutations of its kernel that those tests must catch (RoPE's sign, the KV
# write's valid-row mask, the upper-half weight rows, the pre-wait cos / sin swapped), then its timing beside the
# production prologue at 1 / 6 / 16 / 48 rows (TOTAL= shortens the timing budget). Call 2 (session25b.sh) lost its
# production rows to a bug of the timing loop and the third mutation's result to a sed.
cd "$(dirname "$0")/../.."
source bench/device/common.sh
exec > >(tee "$OUT/all.log") 2>&1
timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider -rf tests/unit/test_explore_kernels.py \
  -k register_mma_prologue > /tmp/gpu-tests.log 2>&1; echo "pytest rc $?"
grep -E "passed|failed|FAILED|Error" /tmp/gpu-tests.log | cut -c1-300 | tail -8; cp /tmp/gpu-tests.log "$OUT/gpu-tests.log"
K=bench/explore/explore34.py
ONE="register_mma_prologue_matches_reference and 64-4-8-8-0-1-1-2-0"
for m in "lo * cos - hi * sin|lo * cos + hi * sin" "gl.expand_dims(erow < nvr, 0) & (hd >= Hq)|(hd >= Hq)" \
         "(at // 8) * HALF|(at // 8) * 8" "loc, cos, sin = loc0, cos0, sin0|loc, cos, sin = loc0, sin0, cos0"; do
  mutate $K "${m%%|*}" "${m##*|}"
  timeout 60 python3 -m pytest -q -m gpu -p no:cacheprovider tests/unit/test_explore_kernels.py -k "$ONE" 2>&1 \
    | tail -1 | while read -r l; do echo "mutation '${m##*|}': $l"; done
  unmutate
done
left=$(( ${TOTAL:-300} - SECONDS )); echo "== explore34, budget ${left}s (${SECONDS}s)"
timeout $(( left + 30 )) python3 bench/explore/explore34.py --out "$OUT/explore34.json" --budget-s $(( left - 10 )) \
  --rows 1 6 16 48 > /tmp/e34.log 2>&1; echo "explore34 rc $?"; grep -v -i warn /tmp/e34.log | tail -3
python3 - "$OUT/explore34.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
best = {}
for r in d["results"]:
    key = (r["rows"], r["variant"], r.get("warps"), r.get("slices"), r.get("rb"), r.get("fold"), r.get("inp"),
           r.get("epi"))
    if not r["ok"]:
        print("NOT OK", r)
    if key not in best or r["us"] < best[key]["us"]:
        best[key] = r
for key, r in sorted(best.items(), key=str):
    print(key, r["us"], f"{r['pct_of_copy']}% floor {r['floor_us']}", "err", r["max_err"],
          "diff from production q", r.get("max_diff_from_production_q"))
for e in d.get("errors", []):
    print("ERROR", str(e)[:300])
PY
echo "done at ${SECONDS}s"
