#!/usr/bin/env bash
# Prepared in session 40; in session 41 its parts ran as calls 1-3 (bench/results/session41), not as this script
# (one GPU, no carry, ends by END, default 560 s): the first GPU
# run of `attn_prologue_cluster` (Qwen3's QK-norm held prologue, a head's programs one cluster, 32-column paced
# chunks at every width): its GPU tests, the Llama held prologue's GPU tests (the kernel gained the QK_NORM path; its
# Llama builds' sm_90 SASS is unchanged on the CPU), the per-kernel bench at Qwen3-30B-A3B's widths (cluster_pdl
# against the split-K fused_pdl FusedModel runs; 70% of copy bandwidth at 1 row needs <= 7.20 us on the H200), the
# decode step (explore26, Qwen3-30B-A3B at 4 layers) with the split-K prologue and with FusedModel(cluster_prologue=
# True) at 1 / 6 / 16 / 48 rows, and explore57's cluster forms at 16 / 48 rows (session40e.sh) with the time left.
cd "$(dirname "$0")/../.."
source bench/device/common.sh
exec > >(tee "$OUT/all.log") 2>&1
END=${END:-560}
echo "== GPU tests: the cluster prologue (kernel, FusedModel's option), the held prologue (${SECONDS}s)"
timeout "$(cap 240)" python3 -m pytest -q -n 6 -p no:cacheprovider -rf -m gpu tests/unit/test_attn_prologue.py \
  tests/unit/test_fused_model.py -k "cluster or held" > "$OUT/gpu-tests.log" 2>&1
echo "pytest rc $?"; grep -E "passed|failed|FAILED|Error" "$OUT/gpu-tests.log" | cut -c1-300 | tail -12
echo "== bench_attn_prologue Qwen3-30B-A3B (${SECONDS}s)"
timeout "$(cap 120)" python3 bench/bench_attn_prologue.py --models Qwen3-30B-A3B --rows 1 6 16 48 --budget-s 0 \
  --out "$OUT/attn_prologue_qwen3.json" 2>&1 | grep -v -i warn | cut -c1-200
on_h200 && prologue_bench_1row Qwen3-30B-A3B qwen3_1row 2
explore26_once 400 100 qwen3_split --model Qwen3-30B-A3B --layers 4 --order 1,6,16,48
explore26_once 420 100 qwen3_cluster --model Qwen3-30B-A3B --layers 4 --order 1,6,16,48 --cluster-prologue
END=$(( END - SECONDS )) OUT=$OUT/e bash bench/explore/session40e.sh 2>&1 | grep -v "^NVIDIA\|^torch"
echo "done at ${SECONDS}s"
