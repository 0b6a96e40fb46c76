#!/usr/bin/env bash
# Session 29's first call: where the held prologue releases the next launch. explore45 (Llama-3.2-1B: after the
# wait / when its weights have landed / at its start, with two or three programs an SM) and explore44 (Qwen3-30B-A3B's
# one-wave cluster form released late / landed / early, and the plain held prologue at Qwen3's shapes: the GEMV's
# share of the one-wave form's time).
cd "$(dirname "$0")/../.."
source bench/device/common.sh
exec > >(tee "$OUT/all.log") 2>&1
echo "== explore45 (${SECONDS}s)"
timeout 200 python3 bench/explore/explore45.py --rows "${ROWS45:-1,6,16}" --out "$OUT/explore45.json" 2>&1 \
  | grep -v -i warn | tail -8
echo "== explore44 (${SECONDS}s)"
timeout 200 python3 bench/explore/explore44.py --rows "${ROWS44:-1,6,16}" --out "$OUT/explore44.json" \
  --variants split_k,held_cluster_folded_r168,held_cluster_folded_r168_landed,held_cluster_folded_r168_early,plain_folded_r168,plain_folded_r168_landed \
  2>&1 | grep -v -i warn | tail -8
echo "done at ${SECONDS}s"
