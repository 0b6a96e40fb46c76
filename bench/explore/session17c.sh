#!/usr/bin/env bash
# Session 17 call 3. (1) The early-KV mutation (no re-load of the step's own slots) against each FusedModel early-KV
# case ALONE (call 2 ran three tests at once on the GPU, -n 3, and the tuned case failed too, unlike session 16's
# -n 2 run), twice each; then both unmutated. (2) The tuner's wide stage (24 / 48 rows -> by_row_blocks) on the two
# shapes whose width-dependent streams were found by hand: SmolLM2's down (residual 576x1536: preload at 2 row
# blocks) and Qwen3-30B-A3B's out_proj (2048x4096: preload at 1 row block only); then the out_proj / MLP GPU tests
# with the SmolLM2 table it wrote.
cd "$(dirname "$0")/../.."
source bench/device/common.sh
exec > >(tee "$OUT/all.log") 2>&1
PYT="python3 -m pytest -q -p no:cacheprovider --timeout 200"
EARLY=tests/unit/test_fused_model.py::test_gpu_default_early_kv_step_equals_the_plain_attention_bitwise
mutate lowlat/kernels/decode_attention.py "axis=1) > 0)" "axis=1) > 1)"
for rep in 1 2; do for case in late_writer tuned; do
  echo "== mutated, $case alone, rep $rep (${SECONDS}s)"
  timeout 100 $PYT "$EARLY[$case]" 2>&1 | tail -1
done; done
unmutate
echo "== unmutated (${SECONDS}s)"
timeout 100 $PYT "$EARLY" 2>&1 | tail -1
for spec in "SmolLM2-135M residual:576x1536 smol" "Qwen3-30B-A3B out_proj:2048x4096 qwen"; do
  set -- $spec
  (( SECONDS > 430 )) && { echo "skip tune $1: ${SECONDS}s used"; continue; }
  tune_shape $1 $2 $3
done
echo "== GPU tests with the tuned SmolLM2 table (${SECONDS}s)"
(( SECONDS < 500 )) && LOWLAT_GEMV_PLANS=$OUT/plans_smol.json timeout 90 $PYT -n 4 -m gpu tests/unit/test_out_proj.py \
  tests/unit/test_mlp_kernel.py 2>&1 | tail -1
echo "done at ${SECONDS}s"
