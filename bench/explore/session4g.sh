#!/usr/bin/env bash
# Session-4 device call 7: the per-kernel section for Llama-3.2-1B three more times (each run measures its own copy
# bandwidth), to see whether the down projection's >= 70% of copy bandwidth at 1 row (pf 128 plan) holds run to run.
cd "$(dirname "$0")/../.."
source bench/device/common.sh
for i in 1 2 3; do
  timeout 150 python3 -m lowlat.bench --sections copy,kernels --models Llama-3.2-1B --rows 1,6 --budget-s 130 \
    --out "$OUT/kernels_llama_rep$i.json" > "$OUT/kernels_llama_rep$i.log" 2>&1
  grep -E "copy bandwidth|^Llama-3.2-1B +(down|gate_up|lm_head) " "$OUT/kernels_llama_rep$i.log" | head -8
done
