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
echo "== lowlat bench step SmolLM2 (${SECONDS}s)"
timeout 120 python3 -m lowlat.bench --sections copy,step,profile --models SmolLM2-135M --rows 1,6,8,16,24,32,48 \
  --out "$OUT/step_smol_s19.json" 2>&1 | grep -v -i warn | grep -E 'copy|decode_step|op=(lm_head|out_proj) ' \
  | cut -c1-110
for spec in "SmolLM2-135M residual:576x1536 smol" "Llama-3.2-1B residual:2048x8192 llama"; do
  set -- $spec
  (( SECONDS > 430 )) && { echo "skip tune $1: ${SECONDS}s used"; continue; }
  tune_shape $1 $2 $3
done
echo "done at ${SECONDS}s"
