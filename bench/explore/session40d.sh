#!/usr/bin/env bash
# Session 40, call 5 (one GPU, no carry, ends by END, default 300 s), for an H200 (issue 3's card): the production
# prologue bench at Llama-3.2-1B's 1 row three times (held_pdl / held_paced_pdl against 70% of copy bandwidth), then
# explore57's paced Qwen3 cluster forms at 1 / 6 rows. On another card nothing (calls 1-4 measured these on the H100).
cd "$(dirname "$0")/../.."
source bench/device/common.sh
exec > >(tee "$OUT/all.log") 2>&1
END=${END:-300}
on_h200 || { echo "not an H200: nothing run"; exit 0; }
prologue_bench_1row Llama-3.2-1B llama 3
explore57_paced 150
echo "done at ${SECONDS}s"
