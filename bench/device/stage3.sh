#!/usr/bin/env bash
# Device call 3 (optionally carrying .stage/a and .stage/olmo, to park them for a stage2.sh call made at once
# after): the down-projection tile-plan tuning round and one Qwen3-30B-A3B layer
# (fused vs the plain-PyTorch layer under a CUDA graph and under torch.compile + a CUDA graph).
#   run(command="bash bench/device/stage3.sh")
cd "$(dirname "$0")/../.."
source bench/device/common.sh
if [ -d .stage/a ]; then mkdir -p /root/stage && cp .stage/a/part-aa /root/stage/ && cp -r .stage/olmo /root/stage/ && echo "staged half A + task data"; fi
timeout 300 python3 -m lowlat.bench --sections copy,tune,moe,compiled --models Llama-3.2-1B \
  --tune-shapes residual:2048x8192 --tune-budget-s 100 --rows 1,6,8,16,48 --budget-s 280 \
  --out "$OUT/tune_moe_h200.json" 2>&1 | grep -v "^\\s*$" | tail -40
