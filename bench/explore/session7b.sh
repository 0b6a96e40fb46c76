#!/usr/bin/env bash
# Session 7, call 2: explore18 with smem_gemv's version 2 (activations staged in shared memory in one step after
# the wait, one weight-tile load serving every row), version 1 beside it; GPU test of both. Results:
# bench/results/session7/call2/.
cd "$(dirname "$0")/../.."
source bench/device/common.sh
timeout 150 python3 -m pytest -q -n 4 -m gpu -p no:cacheprovider --timeout 140 tests/unit/test_explore_kernels.py \
  -k smem 2>&1 | tee "$OUT/gpu-tests.log" | tail -4
cd bench/explore && timeout 400 python3 explore18.py --out "$OUT/explore18.json" --budget-s 300 --skip floor production \
  > "$OUT/explore18.log" 2>&1; echo "explore18 rc $?"
python3 - "$OUT/explore18.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for e in d["results"]:
    print(e["shape"], e["rows"], e["rep"], "bn", e["bn"], "m", e["mode"], "v", e["version"], e["us"], e["pct_of_copy"], e["ok"])
for e in d.get("errors", []):
    print("ERROR", str(e)[:300])
PY
