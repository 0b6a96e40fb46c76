#!/usr/bin/env bash
# Session 12 call 2: where inside out_proj the slow state's time goes (explore25: %globaltimer stamps in a traced
# copy of the kernel; warm none = slow, capture1 = fast, two fresh processes each), the 6-row step graph as DOT in
# both states (explore24 --dot, keep_graph=True: removed after, see below), then the tensor-core smem GEMV v2 check (mma2_check.sh).
cd "$(dirname "$0")/../.."
source bench/device/common.sh
for warm in none capture1 none capture1; do
  timeout 90 python3 bench/explore/explore25.py --warm $warm > "$OUT/e25_$warm.log" 2>&1 || { echo "e25 $warm failed"; tail -5 "$OUT/e25_$warm.log"; }
  grep '^{' "$OUT/e25_$warm.log" | python3 -c "
import json,sys
for l in sys.stdin:
    d=json.loads(l); print(d['warm'], 'r1', d['step_us_r1'], 'r6', d['step_us_r6'])
    for r in d['reps']: print('  out_proj', r['out_proj']); print('  down    ', r['down'])"
done
# (call2 also ran explore24 --warm none / capture1 --dot here: no file written; --dot was removed after)
bash bench/explore/mma2_check.sh
