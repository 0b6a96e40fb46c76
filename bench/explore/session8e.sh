#!/usr/bin/env bash
# Session 8, calls 5 and 6 (issue 3, the MoE block): GPU tests of the MoE kernels, the fused model and the
# benchmarking helpers; per-launch profile; bench_moe; one Qwen3-30B-A3B layer through FusedModel
# (`lowlat bench --sections moe`). Call 5 ran it on a variant that was then reverted (the plan kernel also
# writing each active expert's row word and a slot table; the down launch loading its first weight chunk
# before its PDL wait); to run that variant again, first
#   git show 486bd3c:bench/explore/moe_words_preload.py > lowlat/kernels/moe.py
# Call 6 ran it on the final code. Both calls' profiles carry the label "call5" (LABEL sets it now).
# Results: bench/results/session8/call5/, call6/.
cd "$(dirname "$0")/../.."
source bench/device/common.sh
timeout 170 python3 -m pytest -q -n 8 -m "gpu and not real_model and not eval" -p no:cacheprovider --timeout 160 \
  tests/unit/test_moe.py tests/unit/test_fused_model.py tests/unit/test_benchmarking.py > "$OUT/gpu-tests.log" 2>&1
echo "tests rc $?"; tail -3 "$OUT/gpu-tests.log"
timeout 100 python3 bench/explore/moe_profile.py --out "$OUT/moe_profile.json" --rows 1,6 --label "${LABEL:-session8e}" \
  > "$OUT/profile.log" 2>&1; echo "profile rc $?"
cut -c1-260 "$OUT/profile.log"
timeout 150 python3 bench/bench_moe.py --out "$OUT/moe_h200.json" > "$OUT/moe.log" 2>&1; echo "moe rc $?"
tail -7 "$OUT/moe.log"
timeout 120 python3 -m lowlat.bench --out "$OUT/qwen3_layer_h200.json" --sections moe --models Qwen3-30B-A3B \
  --rows 1,6 > "$OUT/layer.log" 2>&1; echo "layer rc $?"
tail -6 "$OUT/layer.log"
