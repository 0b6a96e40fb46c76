#!/usr/bin/env bash
# Session 17 call 7: the final code (Llama-3.2-1B's prologue bn 32 / 64 by width, out_proj bn 32 at 2 row blocks and
# streamed at 3, down with 6 stages, gate/up with 6 stages at 2-3 row blocks). Every single-GPU test, then
# `lowlat bench` (copy, step, profile) for Llama-3.2-1B at 1-48 rows (its torch.compile baseline: call 2's; the
# reference did not change, nor did any SmolLM2 plan).
cd "$(dirname "$0")/../.."
source bench/device/common.sh
exec > >(tee "$OUT/all.log") 2>&1
echo "== GPU tests (${SECONDS}s)"
gpu_tests 300
grep -E "^FAILED|^ERROR" /tmp/gpu-tests.log | cut -c1-300 | head -20
echo "== lowlat bench step Llama (${SECONDS}s)"
timeout 100 python3 -m lowlat.bench --sections copy,step,profile --models Llama-3.2-1B --rows 1,6,8,16,24,32,48 \
  --out "$OUT/step_llama_s17.json" > /tmp/bench.log 2>&1; echo "bench rc $?"
grep -v -i warn /tmp/bench.log | grep -E "decode_step|fused_in_step|copy" | tail -60
echo "done at ${SECONDS}s"
