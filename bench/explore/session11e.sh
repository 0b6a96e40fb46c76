#!/usr/bin/env bash
# Session 11, call 5 (issue 3): how often the SmolLM2 step's out_proj at 6 rows is slow (7.9 vs 2.2 us a layer)
# and whether the addresses decide it: explore24.py in fresh processes with 0-64 MB of padding allocated first,
# then `lowlat bench --sections step,profile,kernels` (the step first, as in call 4). Results:
# bench/results/session11/call5/ (stdout_tail.txt: all ten processes).
cd "$(dirname "$0")/../.."
source bench/device/common.sh
for pad in 0 1 3 7 16 33 64 0 5 12; do
  timeout 40 python3 bench/explore/explore24.py --pad-mb $pad --out "$OUT/explore24_pad$pad.$RANDOM.json" 2>&1 | tail -2
done
timeout 120 python3 -m lowlat.bench --sections step,profile,kernels --models SmolLM2-135M --rows 1,6 --budget-s 90 \
  --out "$OUT/bench.json" > "$OUT/bench.log" 2>&1; echo "bench rc $?"
python3 - "$OUT/bench.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for e in d["results"]:
    if e.get("section") == "profile" and e["op"] in ("out_proj", "gate_up"):
        print(f"profile r{e['rows']} {e['op']} {e['us']:.2f} us")
    elif e.get("section") == "step":
        print("step", e.get("rows"), e.get("variant"), e.get("us"))
PY
