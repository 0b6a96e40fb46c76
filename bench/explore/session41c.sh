#!/usr/bin/env bash
# Session 41 (one GPU, no carry, ends by END, default 420 s): every single-GPU test at this tree (the cluster
# prologue's included), then, on an H200 (issue 3's card), the production prologue bench at Qwen3-30B-A3B's 1 row
# three times (cluster_pdl against 70% of copy bandwidth: <= 7.20 us) and Llama-3.2-1B's once.
cd "$(dirname "$0")/../.."
source bench/device/common.sh
exec > >(tee "$OUT/all.log") 2>&1
END=${END:-420}
gpu_tests_verbose "$(cap 300)"
on_h200 || { echo "not an H200: no bench; done at ${SECONDS}s"; exit 0; }
prologue_bench_1row Qwen3-30B-A3B qwen3_1row 3
prologue_bench_1row Llama-3.2-1B llama 1
echo "done at ${SECONDS}s"
