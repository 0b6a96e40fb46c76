#!/usr/bin/env bash
# Session 13 call 3: lowlat bench's whole-step table (fused vs the reference under CUDA graphs and under torch.compile
# + CUDA graphs, with the in-step profile) with the decode attention releasing out_proj after its KV loop (default).
cd "$(dirname "$0")/../.."
source bench/device/common.sh
timeout 560 python3 -m lowlat.bench --sections copy,step,compiled,profile --models SmolLM2-135M,Llama-3.2-1B \
  --rows 1,6,8,16,48 --budget-s 420 --out "$OUT/step_s13.json" > "$OUT/bench.log" 2>&1
echo "rc $? at ${SECONDS}s"
grep -v "^\[bench\]" "$OUT/bench.log" | tail -80
