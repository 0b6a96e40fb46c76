#!/usr/bin/env bash
# Session 32: DraftSample.probs as one launch (`_dense_q_kernel`; the torch form of session 30 took ~8 elementwise
# launches: +20-24 us on fused+q at 1 / 8 rows in session32a's A B A). (1) test_draft_sampling.py whole (GPU-marked
# and unmarked) and test_speculative.py on the GPU, then the GPU tests of test_fused_model.py; (2) the draft sampler
# before session 30 / now / before, A B A (`bench/bench_draft_sampling.py`, fused+q column). Run with carry
# [".stage/draft_sampling_before30.py"] (`git show 4b998be:lowlat/kernels/draft_sampling.py`).
cd "$(dirname "$0")/../.."
source bench/device/common.sh
exec > >(tee "$OUT/all.log") 2>&1
echo "== test_draft_sampling / test_speculative, every test (${SECONDS}s)"
timeout 200 python3 -m pytest -q -n 8 -p no:cacheprovider --timeout 150 -rf tests/unit/test_draft_sampling.py \
  tests/unit/test_speculative.py > "$OUT/draft_tests.log" 2>&1
echo "pytest rc $?"
grep -E "FAILED|ERROR|[0-9]+ passed|[0-9]+ failed" "$OUT/draft_tests.log" | cut -c1-300 | tail -12
echo "== GPU tests of test_fused_model.py (${SECONDS}s)"
timeout 200 python3 -m pytest -q -n 8 -p no:cacheprovider --timeout 150 -rf -m gpu tests/unit/test_fused_model.py \
  > "$OUT/fused_tests.log" 2>&1
echo "pytest rc $?"
grep -E "FAILED|ERROR|[0-9]+ passed|[0-9]+ failed" "$OUT/fused_tests.log" | cut -c1-300 | tail -12
cp lowlat/kernels/draft_sampling.py /tmp/ds.tree
i=0
for form in before now before; do
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
echo "done at ${SECONDS}s"
