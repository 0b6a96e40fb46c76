#!/usr/bin/env bash
# Session 26's first call (about 480 s): every single-GPU test, verbose (session 25's changes after its call 6 had run
# on the CPU only; new this session: the held residual GEMV `kernels/residual_gemv_held.py`, the MoE router launch
# computing the RMSNorm `moe_forward(norm_weight=...)`, FusedModel(moe_out_proj=...), the held-prologue early-exit /
# draft-position tests, the shared bitwise test helpers of test_attn_prologue.py); then the per-kernel out_proj of
# Qwen3-30B-A3B and Llama-3.2-1B (`lowlat bench --sections copy,kernels`: fused = split-K residual GEMV, fused_held,
# fused_write_h = with the RMSNorm epilogue) at 1 / 6 / 16 / 48 rows.
cd "$(dirname "$0")/../.."
source bench/device/common.sh
exec > >(tee "$OUT/all.log") 2>&1
gpu_tests_verbose 400
grep -c PASSED /tmp/gpu-tests.log
for model in Qwen3-30B-A3B Llama-3.2-1B; do
  (( SECONDS > 520 )) && { echo "skip bench $model: ${SECONDS}s used"; continue; }
  echo "== lowlat bench copy,kernels $model (${SECONDS}s)"
  timeout 70 python3 -m lowlat.bench --sections copy,kernels --models $model --rows 1,6,16,48 --budget-s 40 \
    --out "$OUT/kernels_$model.json" > /tmp/bench.log 2>&1; echo "bench rc $?"
  grep -E "op=(out_proj|copy)|ERROR" /tmp/bench.log | cut -c1-260
done
echo "done at ${SECONDS}s"
