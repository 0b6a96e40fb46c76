#!/usr/bin/env bash
# Prepared in session 30: (1) the draft sampler before / after session 30's non-finite-row handling (cb9d03d: a
# per-tile NaN id reduction, the greedy keys' NaN rule), A B A, `bench/bench_draft_sampling.py` at 1 / 8 rows without
# the in-step spans; the before form travels as the git-ignored .stage/draft_sampling_before30.py (`git show
# 4b998be:lowlat/kernels/draft_sampling.py`, sha256 3c689e49...): run with carry [".stage/draft_sampling_before30.py"].
# (2) explore46's bisection of the ~0.6 us between the plain held prologue and the QK-norm one without an exchange
# (session30a.sh's second half).
cd "$(dirname "$0")/../.."
source bench/device/common.sh
exec > >(tee "$OUT/all.log") 2>&1
source bench/explore/draft_aba.sh before after before
echo "== explore46 (${SECONDS}s)"
timeout 240 python3 bench/explore/explore46.py --rows 1,6 \
  --variants plain,qk_own_nosum,nosum_rope_late,nosum_const,nosum_nobranch,nosum_lean \
  --out "$OUT/explore46.json" 2>&1 | grep -v -i warn | tail -6
echo "done at ${SECONDS}s"
