#!/usr/bin/env bash
# Session 9, call 3: GPU tests of the persistent greedy draft launch (issue 5) and of the MoE layer whose
# RMSNorm moved into the MoE's router launch (issue 3); bench_draft_sampling twice (plain; then PDL + the
# greedy sweep); one Qwen3-30B-A3B layer through FusedModel on this tree and on the tree in _head (the
# previous commit, exported there by hand: `git archive HEAD | tar -x -C _head`), if present.
# Results: bench/results/session9/call3/.
cd "$(dirname "$0")/../.."
source bench/device/common.sh
timeout 200 python3 -m pytest -q -n 8 -m "gpu and not real_model and not eval" -p no:cacheprovider --timeout 190 \
  tests/unit/test_draft_sampling.py tests/unit/test_speculative.py tests/unit/test_rejection_sampling.py \
  tests/unit/test_moe.py tests/unit/test_fused_model.py tests/unit/test_out_proj.py > "$OUT/gpu-tests.log" 2>&1
echo "tests rc $?"; tail -4 "$OUT/gpu-tests.log"
for i in 1 2; do
  extra=(--no-pdl); [ "$i" = 2 ] && extra=(--sweep --sweep-configs greedy --sweep-rows 1 8)
  timeout 150 python3 bench/bench_draft_sampling.py --rows 1 2 4 6 8 "${extra[@]}" --out "$OUT/draft_sampling_$i.json" \
    > "$OUT/draft_sampling_$i.log" 2>&1; echo "draft bench $i rc $?"
  grep '"config": "greedy"' "$OUT/draft_sampling_$i.log" | cut -c1-400
done
grep sweep "$OUT/draft_sampling_2.log" | cut -c1-200
timeout 100 python3 -m lowlat.bench --out "$OUT/qwen3_layer_h200.json" --sections moe --models Qwen3-30B-A3B \
  --rows 1,6 > "$OUT/layer.log" 2>&1; echo "layer rc $?"; tail -4 "$OUT/layer.log"
if [ -d _head ]; then
  (cd _head && PYTHONPATH=$PWD:/tmp/site timeout 100 python3 -m lowlat.bench --out "$OUT/qwen3_layer_head_h200.json" \
    --sections moe --models Qwen3-30B-A3B --rows 1,6 > "$OUT/layer_head.log" 2>&1; echo "layer head rc $?"
   tail -4 "$OUT/layer_head.log")
fi
