#!/usr/bin/env bash
# Session 16 call 6: the final code (Llama-3.2-1B's attention prologue on the bn 32 plan, call 5). Every single-GPU
# test, then `lowlat bench` (copy, step, profile) for Llama-3.2-1B (its torch.compile baseline is call 4's: the
# reference did not change).
cd "$(dirname "$0")/../.."
source bench/device/common.sh
exec > >(tee "$OUT/all.log") 2>&1
echo "== GPU tests (${SECONDS}s)"
gpu_tests 240
echo "== lowlat bench step Llama (${SECONDS}s)"
timeout 80 python3 -m lowlat.bench --sections copy,step,profile --models Llama-3.2-1B --rows 1,6,8,16,48 \
  --out "$OUT/step_llama_s16.json" > /tmp/bench.log 2>&1; echo "bench rc $?"
grep -v -i warn /tmp/bench.log | grep -E "decode_step|attn_prolog|copy" | tail -12
echo "done at ${SECONDS}s"
