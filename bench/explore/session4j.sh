#!/usr/bin/env bash
# Session-4 device call 10: the software-pipelined attention prologue (bench/explore/prologue_pipelined.py): the
# prologue GPU tests with it swapped in, then explore11.py (A/B against the production kernel in one run).
cd "$(dirname "$0")/../.."
source bench/device/common.sh
timeout 120 python3 - <<'PY' 2>&1 | tail -3
import sys
sys.path[:0] = ["bench/explore", "bench"]
import prologue_pipelined
import lowlat.kernels.attn_prologue as ap
ap._attn_prologue_kernel = prologue_pipelined.launcher(3)
import pytest
sys.exit(pytest.main(["-q", "-m", "gpu", "-p", "no:cacheprovider", "tests/unit/test_attn_prologue.py"]))
PY
(cd bench/explore && timeout 330 python3 explore11.py --out-dir "$OUT" > "$OUT/explore11.log" 2>&1)
python3 - "$OUT" <<'PY'
import json, sys, glob, os
for f in sorted(glob.glob(sys.argv[1] + "/prologue_*.json")):
    for e in json.load(open(f))["results"]:
        if e["variant"].startswith("fused"):
            print(os.path.basename(f), e["model"], e["rows"], e["variant"], round(e["us_median"], 2), round(e["pct_of_floor"], 1))
for f in sorted(glob.glob(sys.argv[1] + "/step_moe_*.json")):
    for e in json.load(open(f))["results"]:
        if e.get("variant") == "fused" and e.get("op") in ("decode_step", "layer"):
            print(os.path.basename(f), e["model"], e["op"], e["rows"], e["us"])
PY
tail -2 "$OUT/explore11.log"
