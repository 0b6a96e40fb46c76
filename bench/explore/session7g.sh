#!/usr/bin/env bash
# Session 7, call 7: the kept smem_gemv kernel after the clean-up (GPU test of the Gluon kernel; `-m gpu` leaves out
# the Triton twin, which CI tests under the interpreter),
# then explore18 at 1 row with register caps 48 / 64 on the Gluon launch (more programs per SM, so the next PDL
# launch can be resident sooner) beside the uncapped launch. Results: bench/results/session7/call7/.
cd "$(dirname "$0")/../.."
source bench/device/common.sh
timeout 150 python3 -m pytest -q -n 4 -m gpu -p no:cacheprovider --timeout 140 tests/unit/test_explore_kernels.py \
  -k smem 2>&1 | tee "$OUT/gpu-tests.log" | tail -4
cd bench/explore && timeout 300 python3 explore18.py --out "$OUT/explore18.json" --budget-s 200 --reps 2 \
  --groups 16 8 --rows 1 --maxnreg 48 64 --skip floor production > "$OUT/explore18.log" 2>&1; echo "explore18 rc $?"
python3 - "$OUT/explore18.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for e in d["results"]:
    print(e["shape"], e["rows"], e["rep"], e["kernel"], "bn", e["bn"], "m", e["mode"], "g", e["group"], "nreg", e["maxnreg"],
          e["us"], e["pct_of_copy"], e["ok"])
for e in d.get("errors", []):
    print("ERROR", str(e)[:300])
PY
