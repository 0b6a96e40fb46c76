#!/usr/bin/env bash
# Session 29's fourth call: explore46 again at 1 / 6 rows (the QK-norm weights loaded after the mma; the norm without
# its cross-warp sum), then every single-GPU test on the tree (the route / plan programs).
cd "$(dirname "$0")/../.."
source bench/device/common.sh
exec > >(tee "$OUT/all.log") 2>&1
echo "== explore46 (${SECONDS}s)"
timeout 150 python3 bench/explore/explore46.py --rows 1,6 --variants plain,qk_cluster,qk_late,qk_own,qk_own_nosum \
  --out "$OUT/explore46.json" 2>&1 | grep -v -i warn | tail -6
echo "== every single-GPU test (${SECONDS}s)"
gpu_tests_verbose 360
echo "done at ${SECONDS}s"
