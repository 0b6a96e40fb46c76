#!/usr/bin/env bash
# Session-4 device call 3: the persistent greedy draft launch (now the default for greedy-only launches): the
# draft-sampling bench at 1-8 rows with its greedy sweep (persistent vs one tile per program, depth, warps,
# tiles per program, PDL) at 1 and 8 rows, then the greedy GPU tests.
cd "$(dirname "$0")/../.."
source bench/device/common.sh
timeout 400 python3 bench/bench_draft_sampling.py --out "$OUT/draft_sampling_persistent_h200.json" --rows 1 2 4 6 8 \
  --sweep --sweep-configs greedy --sweep-rows 1 8 2>&1 | python3 -c "import sys, json
for l in sys.stdin:
    if l.startswith('{'):
        d = json.loads(l); print(d['config'], d['rows'], d['fused_us'], d.get('fused_pdl_us'), d['torch_us'], d['speedup'])
    elif 'sweep' in l:
        print(l.strip())"
timeout 150 python3 -m pytest -q -n 8 -m "gpu and not real_model and not eval" -p no:cacheprovider --timeout 140 \
  tests/unit/test_draft_sampling.py 2>&1 | tee "$OUT/gpu-tests-draft.log" | tail -3
