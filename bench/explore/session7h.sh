#!/usr/bin/env bash
# Session 7, call 8 (issue 5): the draft-sampling bench with the greedy sweep at 1 / 2 / 4 / 8 rows, which now
# includes block_h 128 (H 576 in 5 TMA steps, 2 / 3 stages, block_v 128 / 64), then the plain bench once more.
# Results: bench/results/session7/call8/.
cd "$(dirname "$0")/../.."
source bench/device/common.sh
timeout 330 python3 bench/bench_draft_sampling.py --rows 1 2 4 6 8 --no-pdl --sweep --sweep-configs greedy \
  --sweep-rows 1 2 4 8 --out "$OUT/draft_sampling_sweep.json" > "$OUT/draft_sampling_sweep.log" 2>&1
echo "sweep rc $?"
grep '"config": "greedy"' "$OUT/draft_sampling_sweep.log" | python3 -c "
import sys, json
for line in sys.stdin:
    d = json.loads(line); print('greedy', d['rows'], d['fused_us'], d['torch_us'], d['speedup'])"
grep sweep "$OUT/draft_sampling_sweep.log" | grep greedy | cut -c1-220
