#!/usr/bin/env bash
# Session 12 call 2: where inside out_proj the slow state's time goes (explore25: %globaltimer stamps in a traced
# copy of the kernel; warm none = slow, capture1 = fast, two fresh processes each), the 6-row step graph as DOT in
# both states (explore24 --dot, keep_graph=True), then the tensor-core smem GEMV v2 check (mma2_check.sh).
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
for warm in none capture1; do
  timeout 90 python3 bench/explore/explore24.py --warm $warm --dot "$OUT/graph_$warm" --out "$OUT/e24dot_$warm.json" > "$OUT/e24dot_$warm.log" 2>&1 \
    || { echo "dot $warm failed"; tail -3 "$OUT/e24dot_$warm.log"; }
  python3 -c "
import json; d=json.load(open('$OUT/e24dot_$warm.json')); print('$warm', d['out_proj_median'], d['step_us_r6'], d.get('dot'))" || true
done
python3 - "$OUT" <<'PY'
import re, sys, collections
for w in ("none", "capture1"):
    try:
        t = open(f"{sys.argv[1]}/graph_{w}_r6.dot").read()
    except OSError as e:
        print(w, e); continue
    edges = re.findall(r'"?(\w+)"?\s*->\s*"?(\w+)"?([^\n]*)', t)
    kinds = collections.Counter(re.sub(r'\s+', ' ', e[2])[:80] for e in edges)
    print(w, "edges", len(edges), kinds.most_common(6))
PY
bash bench/explore/mma2_check.sh
