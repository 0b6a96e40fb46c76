#!/usr/bin/env bash
# Session-4 device call 4: explore8.py (greedy tail cost split in the TMA copy; down-projection prefetch below
# pf 256), and the exploration kernels' GPU tests (EPI 7 is GPU only).
cd "$(dirname "$0")/../.."
source bench/device/common.sh
timeout 100 python3 -m pytest -q -n 4 -m gpu -p no:cacheprovider --timeout 90 tests/unit/test_explore_kernels.py 2>&1 | tail -2
cd bench/explore && timeout 200 python3 explore8.py --out "$OUT/explore8_h200.json" --budget-s 170 2>&1 | tail -2
python3 - "$OUT/explore8_h200.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for e in d["results"]:
    print(e.get("op"), e.get("rows"), e.get("rep"), e.get("variant"), e.get("us"), e.get("pct_of_copy", e.get("speedup")),
          e.get("same_tokens", ""))
for e in d.get("errors", []):
    print("ERROR", str(e)[:400])
PY
