#!/usr/bin/env bash
# Session 27's first call (about 500 s): the GPU tests of what changed (the held residual GEMV's partial sums of
# squares `residual_gemv_held(sum_sq_out=)`, the MoE router taking them `moe_forward(sum_sq_parts=)`, FusedModel's
# "held" MoE out_proj passing them), verbose; the per-kernel out_proj of Qwen3-30B-A3B (`lowlat bench --sections
# copy,kernels`: fused_held now writes the sums) at 1 / 6 / 16 / 48 rows; then Qwen3-30B-A3B's step (explore26, 4
# layers) with moe_out_proj held against norm_epilogue, alternated (A B B A), to decide FusedModel's default.
cd "$(dirname "$0")/../.."
source bench/device/common.sh
exec > >(tee "$OUT/all.log") 2>&1
timeout 200 python3 -m pytest -v -n 8 -m "gpu and not real_model and not eval" -p no:cacheprovider --timeout 150 \
  -rf --tb=short tests/unit/test_residual_gemv_held.py tests/unit/test_moe.py \
  tests/unit/test_fused_model.py -k "held or moe or qwen3" > /tmp/gpu-tests.log 2>&1; echo "pytest rc $?"
grep -E "FAILED|ERROR|[0-9]+ passed|[0-9]+ failed" /tmp/gpu-tests.log | grep -v "^FAILED.*PASSED" | cut -c1-300 | tail -14
grep -A30 "^E " /tmp/gpu-tests.log | head -60 | cut -c1-300
cp /tmp/gpu-tests.log "$OUT/gpu-tests.log"
echo "== lowlat bench copy,kernels Qwen3-30B-A3B (${SECONDS}s)"
timeout 70 python3 -m lowlat.bench --sections copy,kernels --models Qwen3-30B-A3B --rows 1,6,16,48 --budget-s 40 \
  --out "$OUT/kernels_Qwen3-30B-A3B.json" > /tmp/bench.log 2>&1; echo "bench rc $?"
grep -E "op=(out_proj|copy)|ERROR" /tmp/bench.log | cut -c1-260
e26() {  # moe_out_proj tag
  explore26_once 520 60 "$1_$2" --model Qwen3-30B-A3B --layers 4 --order 1,6,16,48 --moe-out-proj "$1"
}
e26 held 1; e26 norm_epilogue 1; e26 norm_epilogue 2; e26 held 2
echo "done at ${SECONDS}s"
