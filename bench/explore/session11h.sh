#!/usr/bin/env bash
# Session 11, call 8 (issue 3): are the 6-row step's logits the same bits after the old 1-row breakdown (fast
# out_proj) as without it (slow)? Results: bench/results/session11/call8/.
cd "$(dirname "$0")/../.."
source bench/device/common.sh
for warm in none breakdown; do
  timeout 40 python3 bench/explore/explore24.py --warm $warm --out "$OUT/explore24_$warm.json" > /dev/null 2>&1
done
python3 - "$OUT" <<'PY'
import json, sys
for w in ("none", "breakdown"):
    d = json.load(open(f"{sys.argv[1]}/explore24_{w}.json"))
    print(w, d["out_proj_median"], d["step_us_r6"], d["logits_check"])
PY
