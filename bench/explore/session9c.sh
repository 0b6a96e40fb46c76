#!/usr/bin/env bash
# Session 9, call 3 (issue 5): GPU tests of the persistent greedy draft launch (draft sampling, speculation,
# rejection sampling, the exploration kernels); bench_draft_sampling twice (plain; then PDL + the greedy
# sweep). Ran from an export of commit 9d342a7 (`git archive 9d342a7 | tar -x -C _h9; cd _h9`).
# Results: bench/results/session9/call3/.
cd "$(dirname "$0")/../.."
source bench/device/common.sh
timeout 200 python3 -m pytest -q -n 8 -m "gpu and not real_model and not eval" -p no:cacheprovider --timeout 190 \
  tests/unit/test_draft_sampling.py tests/unit/test_speculative.py tests/unit/test_rejection_sampling.py \
  tests/unit/test_explore_kernels.py > "$OUT/gpu-tests.log" 2>&1
echo "tests rc $?"; tail -4 "$OUT/gpu-tests.log"
for i in 1 2; do
  extra=(--no-pdl); [ "$i" = 2 ] && extra=(--sweep --sweep-configs greedy --sweep-rows 1 8)
  timeout 170 python3 bench/bench_draft_sampling.py --rows 1 2 4 6 8 "${extra[@]}" --out "$OUT/draft_sampling_$i.json" \
    > "$OUT/draft_sampling_$i.log" 2>&1; echo "draft bench $i rc $?"
  grep '"config": "greedy"' "$OUT/draft_sampling_$i.log" | cut -c1-330
done
grep sweep "$OUT/draft_sampling_2.log" | cut -c1-200
