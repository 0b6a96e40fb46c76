#!/usr/bin/env bash
# Session 27's fifth call (about 420 s): every single-GPU test on the final tree (a6feb5a), verbose; the held prologue
# per kernel (`bench/bench_attn_prologue.py --models Llama-3.2-1B`, the launcher FusedModel runs); then the default
# steps of Llama-3.2-1B (16 layers) and Qwen3-30B-A3B (4 layers) once each (explore26, the tree's defaults).
cd "$(dirname "$0")/../.."
source bench/device/common.sh
exec > >(tee "$OUT/all.log") 2>&1
gpu_tests_verbose 400
grep -c PASSED /tmp/gpu-tests.log
echo "== bench_attn_prologue Llama-3.2-1B (${SECONDS}s)"
timeout 90 python3 bench/bench_attn_prologue.py --models Llama-3.2-1B --rows 1 6 16 48 --budget-s 0 \
  --out "$OUT/attn_prologue_llama.json" 2>&1 | grep -E "held_pdl|rror" | cut -c1-200
explore26_once 540 60 llama --model Llama-3.2-1B --layers 16 --order 1,6,16,48
explore26_once 560 60 qwen3 --model Qwen3-30B-A3B --layers 4 --order 1,6,16,48
echo "done at ${SECONDS}s"
