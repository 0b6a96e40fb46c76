#!/usr/bin/env bash
# Session 10, call 1 (issue 5): the persistent greedy draft launch under PDL with an L2 prefetch of its first
# tile(s) before gdc_wait and / or a late trigger, in a draft -> draft chain and in a norm -> draft chain (as the
# fused draft step runs it), beside production and the torch ops (explore20.py).
# Results: bench/results/session10/call1/.
cd "$(dirname "$0")/../.."
source bench/device/common.sh
(cd bench/explore && timeout 330 python3 explore20.py --rows 1 2 4 6 8 --reps 2 --budget-s 300 \
  --out "$OUT/explore20.json" > "$OUT/explore20.log" 2>&1; echo "explore20 rc $?")
python3 - "$OUT/explore20.json" <<'PY'
import json, sys, collections
d = json.load(open(sys.argv[1]))
rows = collections.defaultdict(list)
for e in d["results"]:
    if "us" in e:
        v = e["variant"] + ("/" + e["chain"] if "chain" in e else "")
        val = e.get("span_us", e["us"])
        rows[(v, e["rows"])].append(f"{val:6.2f}" + ("" if e.get("same_tokens", True) else "!"))
for (v, r), us in sorted(rows.items()):
    print(f"{v:40s} r{r} {' '.join(us)}")
[print("error", x["where"], x["error"][:300]) for x in d.get("errors", [])]
PY
