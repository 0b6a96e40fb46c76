#!/usr/bin/env bash
# Session 19 call 1. (1) Every single-GPU test with SmolLM2's out_proj on bn 64 at 3 row blocks (TUNED_PLANS
# ('residual', 576, 576) by_row_blocks={3: bn 64}, session 18 call 7: -87 us a step at 48 rows). (2) `lowlat bench
# --sections copy,step,profile` for SmolLM2 at a server's widths. (3) The tuner's wide stage, which may now propose bn
# by width for residual GEMVs (session 18's review), on the two residual shapes never tried with another bn at 2-3
# row blocks: SmolLM2's down (576x1536) and Llama-3.2-1B's down (2048x8192).
cd "$(dirname "$0")/../.."
source bench/device/common.sh
exec > >(tee "$OUT/all.log") 2>&1
echo "== every single-GPU test (${SECONDS}s)"
gpu_tests 300
cp /tmp/gpu-tests.log "$OUT/gpu-tests.log"
echo "== lowlat bench step SmolLM2 (${SECONDS}s)"
timeout 120 python3 -m lowlat.bench --sections copy,step,profile --models SmolLM2-135M --rows 1,6,8,16,24,32,48 \
  --out "$OUT/step_smol_s19.json" 2>&1 | grep -v -i warn | grep -E 'copy|decode_step|op=(lm_head|out_proj) ' \
  | cut -c1-110
for spec in "SmolLM2-135M residual:576x1536 smol" "Llama-3.2-1B residual:2048x8192 llama"; do
  set -- $spec
  (( SECONDS > 430 )) && { echo "skip tune $1: ${SECONDS}s used"; continue; }
  echo "== tune $1 $2 (${SECONDS}s)"
  timeout 120 python3 -m lowlat.bench --sections tune --models $1 --tune-shapes $2 --tune-budget-s 90 --budget-s 100 \
    --out "$OUT/tune_$3.json" --plans-out "$OUT/plans_$3.json" > /tmp/tune.log 2>&1; echo "tune rc $?"
  grep -v -i warn /tmp/tune.log | grep -E "\[tune\]|rror" | cut -c1-600 | tail -6
  python3 -c "import json; print([e for e in json.load(open('$OUT/plans_$3.json')) if e['kind']+':'+str(e['n'])+'x'+str(e['k'])=='$2'])"
done
echo "done at ${SECONDS}s"
