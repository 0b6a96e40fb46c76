#!/usr/bin/env bash
# Session 10, call 2 (issue 5): the persistent greedy launch's stream: tile order (interleaved / contiguous per
# program), 128 programs, and the loop without the GEMV (read only), back to back with and without PDL
# (explore20.py --stream). Results: bench/results/session10/call2/.
cd "$(dirname "$0")/../.."
source bench/device/common.sh
(cd bench/explore && timeout 300 python3 explore20.py --stream --rows 1 4 8 --reps 2 --budget-s 270 \
  --out "$OUT/explore20_stream.json" > "$OUT/explore20_stream.log" 2>&1; echo "explore20 rc $?")
python3 - "$OUT/explore20_stream.json" <<'PY'
import json, sys, collections
d = json.load(open(sys.argv[1]))
rows = collections.defaultdict(list)
for e in d["results"]:
    if "us" in e:
        rows[(e["variant"], e["rows"])].append(f"{e['us']:6.2f}" + ("!" if e.get("same_tokens") is False else ""))
for (v, r), us in sorted(rows.items()):
    print(f"{v:40s} r{r} {' '.join(us)}")
[print("error", x["where"], x["error"][:300]) for x in d.get("errors", [])]
PY
