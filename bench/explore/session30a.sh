#!/usr/bin/env bash
# Prepared in session 29 for session 30's first call (the device lent no machine after session 29's call 6):
# (1) every test of test_moe.py on the GPU and the plan's in-step cost (the route / plan programs' post-review form,
# bench/explore/session29g.sh); (2) explore46's bisection of the ~0.6 us between the plain held prologue and the
# QK-norm one without an exchange (qk_own_nosum) at Qwen3-30B-A3B's shapes, 1 / 6 rows.
cd "$(dirname "$0")/../.."
source bench/device/common.sh
exec > >(tee "$OUT/all.log") 2>&1
OUT="$OUT/plan" bash bench/explore/session29g.sh
echo "== explore46 (${SECONDS}s)"
timeout 240 python3 bench/explore/explore46.py --rows 1,6 \
  --variants plain,qk_own_nosum,nosum_rope_late,nosum_const,nosum_nobranch,nosum_lean \
  --out "$OUT/explore46.json" 2>&1 | grep -v -i warn | tail -6
echo "done at ${SECONDS}s"
