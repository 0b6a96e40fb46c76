#!/usr/bin/env bash
# Session 11, call 7 (issue 3): explore24 with and without the old 1-row breakdown, printing the addresses of
# FusedModel's workspaces and 6-row buffers. Results: bench/results/session11/call7/.
cd "$(dirname "$0")/../.."
source bench/device/common.sh
for warm in none breakdown; do
  timeout 40 python3 bench/explore/explore24.py --warm $warm --out "$OUT/explore24_$warm.json" > /dev/null 2>&1
done
python3 - "$OUT" <<'PY'
import json, sys
a, b = (json.load(open(f"{sys.argv[1]}/explore24_{w}.json")) for w in ("none", "breakdown"))
print("out_proj", a["out_proj_median"], b["out_proj_median"])
for k in a["workspace_ptrs"]:
    x, y = a["workspace_ptrs"][k], b["workspace_ptrs"].get(k)
    print(("SAME " if x == y else "DIFF ") + k, x, y)
PY
