#!/usr/bin/env bash
# Session 6, call 1: explore16 (issue 3: register-resident GEMVs with no split-K for the 8-21 MB launches, their
# pure-read floors; issue 5: the TMA greedy launch without logits stores), then the production attention
# prologue in the same run for comparison. Results: bench/results/session6/call1/.
cd "$(dirname "$0")/../.."
source bench/device/common.sh
cd bench/explore && timeout 430 python3 explore16.py --out "$OUT/explore16.json" --budget-s 330; echo "explore16 rc $?"
cd ../.. && timeout 120 python3 bench/bench_attn_prologue.py --models Llama-3.2-1B Qwen3-30B-A3B --rows 1 6 \
  --budget-s 30 --out "$OUT/prologue.json" > "$OUT/prologue.log" 2>&1; echo "prologue rc $?"
