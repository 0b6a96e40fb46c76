#!/usr/bin/env bash
# Session 40, call 6 (one GPU, no carry, ends by END, default 200 s): explore57's Qwen3 cluster forms at 16 / 48 rows
# (2 and 6 row blocks), the 32-column chunks paced (c16w4) and not (c16w16) beside explore44's form and the split-K
# prologue: what the 32-column chunks' arithmetic (the 1-row form under 7.20 us on the H200) costs at the widths where
# the cluster forms lose to split-K.
cd "$(dirname "$0")/../.."
source bench/device/common.sh
exec > >(tee "$OUT/all.log") 2>&1
END=${END:-200}
echo "== explore57 16 / 48 rows (${SECONDS}s)"
timeout "$(cap 180)" python3 bench/explore/explore57.py --rows 16,48 --rounds 2 --out "$OUT/explore57_wide.json" \
  --variants split_k,cluster,cluster_c16w4_late,cluster_c16w16_late 2>&1 | grep -v -i warn | cut -c1-1500
echo "done at ${SECONDS}s"
