#!/usr/bin/env bash
# Session 7, call 1: explore18 (issue 3: GEMVs holding their weight slice in shared memory across the PDL wait,
# Gluon; pure-read floors and the production residual GEMV in the same run), the GPU test of that kernel, then
# the draft-sampling bench twice (issue 5: run-to-run spread of the greedy cells). Results:
# bench/results/session7/call1/.
cd "$(dirname "$0")/../.."
source bench/device/common.sh
timeout 150 python3 -m pytest -q -n 4 -m gpu -p no:cacheprovider --timeout 140 tests/unit/test_explore_kernels.py \
  -k smem 2>&1 | tee "$OUT/gpu-tests.log" | tail -4
cd bench/explore && timeout 400 python3 explore18.py --out "$OUT/explore18.json" --budget-s 280 \
  > "$OUT/explore18.log" 2>&1; echo "explore18 rc $?"
python3 - "$OUT/explore18.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for e in d["results"]:
    print({k: e[k] for k in ("op", "shape", "rows", "rep", "bn", "mode", "programs", "variant", "us", "pct_of_copy", "ok")
           if k in e})
for e in d.get("errors", []):
    print("ERROR", str(e)[:300])
PY
cd ../..
for i in 1 2; do
  timeout 150 python3 bench/bench_draft_sampling.py --rows 1 2 4 6 8 --no-pdl --out "$OUT/draft_sampling_$i.json" \
    > "$OUT/draft_sampling_$i.log" 2>&1; echo "draft bench $i rc $?"
  grep '"config": "greedy"' "$OUT/draft_sampling_$i.log" | python3 -c "
import sys, json
for line in sys.stdin:
    d = json.loads(line); print('greedy', d['rows'], d['fused_us'], d['torch_us'], d['speedup'])"
done
