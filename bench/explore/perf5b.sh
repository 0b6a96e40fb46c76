#!/usr/bin/env bash
# Session-3 device call 2: down-projection tuning round five (split-4 plans), then the fused decode step of
# both dense models with the tuned table (the LM-head / finisher tail changes), rows 1 and 6.
cd "$(dirname "$0")/../.."
source bench/device/common.sh
timeout 200 python3 -m lowlat.bench --sections copy,tune --models Llama-3.2-1B --tune-shapes residual:2048x8192 \
  --tune-budget-s 170 --rows 1,6 --budget-s 190 --out "$OUT/tune5b_down_h200.json" 2>&1 | grep -E "tune\]|s4_|default|tuned" | tail -40
export LOWLAT_GEMV_PLANS="$OUT/tune5b_down_h200.json.plans.json"
timeout 200 python3 -m lowlat.bench --sections copy,step --models SmolLM2-135M,Llama-3.2-1B --rows 1,6 \
  --budget-s 180 --out "$OUT/step5_h200.json" 2>&1 | grep -v "^\s*$" | tail -30
