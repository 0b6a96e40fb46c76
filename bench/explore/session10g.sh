#!/usr/bin/env bash
# Session 10, call 7 (issue 3): SmolLM2's out_proj in the step at 6 rows (7.9 us vs 2.2 at 1 row, call6):
# launch variants of the attention -> out_proj -> gate_up hand-offs profiled in the step (explore21.py).
# Results: bench/results/session10/call7/.
cd "$(dirname "$0")/../.."
source bench/device/common.sh
(cd bench/explore && timeout 200 python3 explore21.py --rows 1 6 --out "$OUT/explore21.json" > "$OUT/explore21.log" 2>&1; \
  echo "explore21 rc $?")
python3 - "$OUT/explore21.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for e in d["results"]:
    r = e["roles"]
    print(e["model"][:8], e["rows"], f"{e['variant']:20s} step {e['step_us']:7.1f}", " | ".join(
        f"{k[:10]} c{v['cost']:.2f} s{v['start']:.2f} d{v['dur']:.2f}" for k, v in r.items() if not k.startswith("other")))
[print("error", x["where"], str(x.get("error", x))[:400]) for x in d.get("errors", [])]
PY
