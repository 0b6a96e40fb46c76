#!/usr/bin/env bash
# Session 16 call 4: the final code (width-dependent weight streams in TUNED_PLANS; the register-hold experiment
# reverted). Every single-GPU test, then `lowlat bench` (copy, step, compiled, profile) for SmolLM2 and Llama, and
# the per-kernel section for Qwen3-30B-A3B (its out_proj with the RMSNorm epilogue now preloads at 1 row block).
cd "$(dirname "$0")/../.."
source bench/device/common.sh
exec > >(tee "$OUT/all.log") 2>&1
echo "== GPU tests (${SECONDS}s)"
gpu_tests 300
echo "== lowlat bench step (${SECONDS}s)"
timeout 150 python3 -m lowlat.bench --sections copy,step,compiled,profile --models SmolLM2-135M,Llama-3.2-1B \
  --rows 1,6,8,16,48 --out "$OUT/step_s16.json" > /tmp/bench.log 2>&1; echo "bench rc $?"
grep -v -i warn /tmp/bench.log | tail -45
echo "== lowlat bench kernels Qwen3 (${SECONDS}s)"
timeout 120 python3 -m lowlat.bench --sections copy,kernels --models Qwen3-30B-A3B --rows 1,6,48 --budget-s 80 \
  --out "$OUT/qwen3_kernels_s16.json" > /tmp/bq.log 2>&1; echo "bench rc $?"
grep -v -i warn /tmp/bq.log | grep -E "out_proj|copy" | tail -12
echo "done at ${SECONDS}s"
