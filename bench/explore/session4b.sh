#!/usr/bin/env bash
# Session-4 device call 2: explore7.py (late gdc_launch_dependents with L2 prefetch depths: down projection,
# SmolLM2 LM head, greedy draft launch).
cd "$(dirname "$0")/../.."
source bench/device/common.sh
cd bench/explore && timeout 260 python3 explore7.py --out "$OUT/explore7_h200.json" --budget-s 240 2>&1 | tail -3
python3 - "$OUT/explore7_h200.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for e in d["results"]:
    print(e.get("op"), e.get("rows"), e.get("rep"), e.get("variant"), e.get("us"), e.get("pct_of_copy", e.get("speedup")),
          e.get("same_tokens", ""))
for e in d.get("errors", []):
    print("ERROR", str(e)[:300])
PY
