#!/usr/bin/env bash
# Session 9, calls 1 and 2 (issue 5; call 1 ran `explore19.py --call1`, call 2 the default configs): the persistent greedy draft launch (explore19.py) beside the torch ops, the
# production launch and the per-tile stream alone. Results: bench/results/session9/call1/, call2/.
cd "$(dirname "$0")/../.."
source bench/device/common.sh
cd bench/explore
timeout 330 python3 explore19.py --out "$OUT/explore19.json" --budget-s 280 --reps 2 > "$OUT/explore19.log" 2>&1
echo "explore19 rc $?"
python3 - "$OUT/explore19.json" <<'PY'
import json, sys, collections
d = json.load(open(sys.argv[1]))
rows = collections.defaultdict(list)
for e in d.get("entries", d.get("results", [])):
    if "us" in e:
        rows[(e["variant"], e["rows"])].append(e["us"])
for (v, r), us in sorted(rows.items()):
    print(f"{v:48s} r{r} {' '.join(f'{u:6.2f}' for u in us)}")
[print("error", x["where"], x["error"][:300]) for x in d.get("errors", [])]
PY
