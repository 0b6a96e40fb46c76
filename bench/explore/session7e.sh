#!/usr/bin/env bash
# Session 7, call 5: explore18 with version t3 (version 3 in plain Triton: pipelined TMA loop of NG + 1 stages,
# gdc_wait and the activations in its first iteration) beside Gluon version 3, boxes of 16 / 8 chunks, 1 and 6
# rows; GPU test of every version. Results: bench/results/session7/call5/.
cd "$(dirname "$0")/../.."
source bench/device/common.sh
timeout 150 python3 -m pytest -q -n 4 -m gpu -p no:cacheprovider --timeout 140 tests/unit/test_explore_kernels.py \
  -k smem 2>&1 | tee "$OUT/gpu-tests.log" | tail -4
cd bench/explore && timeout 300 python3 explore18.py --out "$OUT/explore18.json" --budget-s 200 --reps 2 \
  --groups 16 8 --rows 1 6 --versions t3 3 --skip floor production > "$OUT/explore18.log" 2>&1; echo "explore18 rc $?"
python3 - "$OUT/explore18.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for e in d["results"]:
    print(e.get("shape", e["op"]), e["rows"], e["rep"], "v", e.get("version"), "bn", e.get("bn"), "g", e.get("group"),
          e["us"], e["pct_of_copy"], e.get("ok"))
for e in d.get("errors", []):
    print("ERROR", str(e)[:300])
PY
