#!/usr/bin/env bash
# Session-4 device call 9: explore10.py, the prologue A/B (preload before the PDL wait vs the session-3 stream).
cd "$(dirname "$0")/../.."
source bench/device/common.sh
(cd bench/explore && timeout 400 python3 explore10.py --out-dir "$OUT" > "$OUT/explore10.log" 2>&1)
python3 - "$OUT" <<'PY'
import json, sys, glob, os
for f in sorted(glob.glob(sys.argv[1] + "/prologue_*.json")):
    for e in json.load(open(f))["results"]:
        if e["variant"].startswith("fused"):
            print(os.path.basename(f), e["model"], e["rows"], e["variant"], round(e["us_median"], 2))
for f in sorted(glob.glob(sys.argv[1] + "/step_moe_*.json")):
    for e in json.load(open(f))["results"]:
        if e.get("variant") == "fused" and e.get("op") in ("decode_step", "layer"):
            print(os.path.basename(f), e["model"], e["op"], e["rows"], e["us"])
PY
tail -3 "$OUT/explore10.log"
