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
cp lowlat/kernels/draft_sampling.py /tmp/ds.tree
i=0
for form in before after before; do
  i=$((i + 1))
  if [ $form = before ]; then cp .stage/draft_sampling_before30.py lowlat/kernels/draft_sampling.py
  else cp /tmp/ds.tree lowlat/kernels/draft_sampling.py; fi
  echo "== draft sampling $form (${SECONDS}s)"
  timeout 100 python3 bench/bench_draft_sampling.py --rows 1 8 --iters 100 --no-in-step \
    --out "$OUT/ds_${i}_${form}.json" > /tmp/ds.log 2>&1; echo "bench rc $?"
  python3 - "$OUT/ds_${i}_${form}.json" <<'PY'
import json, sys
for e in json.load(open(sys.argv[1]))["results"]:
    print(f"  r{e['rows']} {e['config']:14} fused {e['fused_us']:7.2f} pdl {e.get('fused_pdl_us', 0):7.2f} "
          f"+q {e['fused_plus_dense_q_us']:7.2f} torch {e['torch_us']:7.2f} us")
PY
done
cp /tmp/ds.tree lowlat/kernels/draft_sampling.py
echo "== explore46 (${SECONDS}s)"
timeout 240 python3 bench/explore/explore46.py --rows 1,6 \
  --variants plain,qk_own_nosum,nosum_rope_late,nosum_const,nosum_nobranch,nosum_lean \
  --out "$OUT/explore46.json" 2>&1 | grep -v -i warn | tail -6
echo "done at ${SECONDS}s"
