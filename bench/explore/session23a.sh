#!/usr/bin/env bash
# Session 23, call 2: explore31 (explore16's no-split-K GEMV with its weights held in registers across the wait,
# rewritten so that after the wait it pays one round trip: x loaded in the weight tile's layout, one reduction),
# Llama / Qwen3 out_proj and QKV shapes at 1 / 6 / 16 rows beside the production residual GEMV; its GPU tests first.
cd "$(dirname "$0")/../.."
source bench/device/common.sh
exec > >(tee "$OUT/all.log") 2>&1
timeout 120 python3 -m pytest -q -m gpu -p no:cacheprovider -rf tests/unit/test_explore_kernels.py -k held 2>&1 | tail -4
timeout 420 python3 bench/explore/explore31.py --budget-s 330 --rows 1 6 16 --reps 2 --out "$OUT/explore31.json" \
  > /tmp/e31.log 2>&1; echo "explore31 rc $?"
python3 - "$OUT/explore31.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for e in d.get("results", []):
    if e.get("op") == "residual":
        print("production", e["n"], e["k"], e["rows"], e["rep"], e["us"], e["pct_of_copy"], e.get("plan"))
for e in d.get("results", []):
    if e.get("op") == "held":
        print(e["shape"], "r", e["rows"], "rep", e["rep"], "bn", e["bn"], "w", e["warps"], "mr", e["maxnreg"], "mode",
              e["mode"], "early", e["early"], e["us"], "us", e["pct_of_copy"], "%", "ok" if e["ok"] else "WRONG")
for e in d.get("errors", []):
    print("ERROR", str(e)[:300])
PY
tail -3 /tmp/e31.log
echo "done at ${SECONDS}s"
