#!/usr/bin/env bash
# Session 29's sixth call: explore46 at 1 / 6 rows, the QK-norm variants without spills (the first row block's RoPE
# inputs loaded after the wait; also the norm weights after the mma) against qk_cluster and the plain held prologue.
cd "$(dirname "$0")/../.."
source bench/device/common.sh
exec > >(tee "$OUT/all.log") 2>&1
echo "== explore46 (${SECONDS}s)"
timeout 200 python3 bench/explore/explore46.py --rows 1,6 --variants plain,qk_cluster,qk_rope_late,qk_rope_norm_late \
  --out "$OUT/explore46.json" 2>&1 | grep -v -i warn | tail -6
echo "done at ${SECONDS}s"
