#!/usr/bin/env bash
# Session 6, call 3: the greedy draft launch on TMA without logits (lowlat.kernels.draft_sampling._greedy_tma_kernel):
# GPU tests of draft sampling / speculation / the explore kernels, then the draft-sampling bench (rows 1-8, greedy
# sweep at 1 and 8 rows). Results: bench/results/session6/call3/.
cd "$(dirname "$0")/../.."
source bench/device/common.sh
timeout 200 python3 -m pytest -q -n 8 -m "gpu and not real_model and not eval" -p no:cacheprovider --timeout 180 \
  tests/unit/test_draft_sampling.py tests/unit/test_speculative.py tests/unit/test_explore_kernels.py \
  tests/unit/test_rejection_sampling.py 2>&1 | tee "$OUT/gpu-tests.log" | tail -6
timeout 300 python3 bench/bench_draft_sampling.py --rows 1 2 4 6 8 --sweep --sweep-configs greedy --sweep-rows 1 8 \
  --out "$OUT/draft_sampling_h200.json" > "$OUT/draft_sampling.log" 2>&1; echo "bench rc $?"
grep -v sweep "$OUT/draft_sampling.log" | python3 -c "
import sys, json
for line in sys.stdin:
    try: d = json.loads(line)
    except Exception: continue
    print(d['config'], d['rows'], 'fused', d['fused_us'], 'pdl', d.get('fused_pdl_us'), 'torch', d['torch_us'], 'x', d['speedup'], 'one_hot', d.get('one_hot'))
"
grep sweep "$OUT/draft_sampling.log" | cut -c1-200
