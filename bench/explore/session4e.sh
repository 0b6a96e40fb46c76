#!/usr/bin/env bash
# Session-4 device call 5: explore9.py (greedy draft launch without logits stores / with the overlapped arrival).
cd "$(dirname "$0")/../.."
source bench/device/common.sh
(cd bench/explore && timeout 300 python3 explore9.py --out "$OUT/explore9_h200.json" 2>&1 | python3 -c "import sys, json
for l in sys.stdin:
    if l.startswith('{'):
        d = json.loads(l)
        if d['config'] == 'greedy': print(d['config'], d['rows'], d['fused_us'], d['torch_us'], d['speedup'])
    elif 'sweep' in l or 'Error' in l:
        print(l.strip())")
