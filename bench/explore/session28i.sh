#!/usr/bin/env bash
# Session 28's eleventh call (about 60 s): explore44's one-wave form (folded weights, maxnreg 168) with 4 and 16 K
# slices against the split-K prologue, Qwen3-30B-A3B per kernel at 1 and 6 rows, A B C C B A.
cd "$(dirname "$0")/../.."
source bench/device/common.sh
exec > >(tee "$OUT/all.log") 2>&1
echo "== explore44 (${SECONDS}s)"
timeout 200 python3 bench/explore/explore44.py --rows 1,6 \
  --variants split_k,held_cluster_folded_r168,held_cluster_folded_r168_s16 --out "$OUT/explore44.json" 2>&1 \
  | grep -v -i warn | tail -6
echo "done at ${SECONDS}s"
