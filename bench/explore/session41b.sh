#!/usr/bin/env bash
# Session 41 (one GPU, no carry, ends by END, default 200 s), for an H200 only (issue 3's card), when session41a.sh
# ran on an H100: the production prologue bench at Qwen3-30B-A3B's 1 row three times (cluster_pdl, the opt-in
# `attn_prologue_cluster`, against 70% of copy bandwidth: <= 7.20 us), then Llama-3.2-1B's once (the card's day).
cd "$(dirname "$0")/../.."
source bench/device/common.sh
exec > >(tee "$OUT/all.log") 2>&1
END=${END:-200}
on_h200 || { echo "not an H200: nothing run"; exit 0; }
qwen3_prologue_bench 3
llama_prologue_bench 1
echo "done at ${SECONDS}s"
