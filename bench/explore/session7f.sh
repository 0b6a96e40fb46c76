#!/usr/bin/env bash
# Session 7, call 6: explore18 with version 4 (activations and norm weight by TMA into shared memory, 4 and 8
# warps) beside version 3, boxes of 16 chunks, 1 row, two rounds; GPU test of every version.
# Results: bench/results/session7/call6/.
cd "$(dirname "$0")/../.."
source bench/device/common.sh
timeout 150 python3 -m pytest -q -n 4 -m gpu -p no:cacheprovider --timeout 140 tests/unit/test_explore_kernels.py \
  -k smem 2>&1 | tee "$OUT/gpu-tests.log" | tail -4
cd bench/explore && timeout 300 python3 explore18.py --out "$OUT/explore18.json" --budget-s 200 --reps 2 \
  --groups 16 --rows 1 --versions 4 3 --skip floor production > "$OUT/explore18.log" 2>&1; echo "explore18 rc $?"
python3 - "$OUT/explore18.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for e in d["results"]:
    print(e.get("shape", e["op"]), e["rows"], e["rep"], "v", e.get("version"), "bn", e.get("bn"), "g", e.get("group"), "w", e.get("warps"),
          e["us"], e["pct_of_copy"], e.get("ok"))
for e in d.get("errors", []):
    print("ERROR", str(e)[:300])
PY
