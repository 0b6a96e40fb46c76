#!/usr/bin/env bash
# The draft sampler in the forms named by the arguments, in order (`before`: .stage/draft_sampling_before30.py, i.e.
# `git show 4b998be:lowlat/kernels/draft_sampling.py`, carried; NAME: .stage/draft_sampling_NAME.py where carried;
# any other name: the tree's; `nanlate`, explore48's edit, ran at 9c4c9f8 and is production since session 36), each
# timed by `bench/bench_draft_sampling.py --rows 1 8 --iters 100 --no-in-step` into $OUT/ds_<i>_<form>.json; the
# tree's file is restored at the end. Sourced by session31b.sh / session32b.sh after bench/device/common.sh.
cp lowlat/kernels/draft_sampling.py /tmp/ds.tree
i=0
for form in "$@"; do
  i=$((i + 1))
  if [ "$form" = before ]; then cp .stage/draft_sampling_before30.py lowlat/kernels/draft_sampling.py
  elif [ -f ".stage/draft_sampling_$form.py" ]; then
    cp ".stage/draft_sampling_$form.py" lowlat/kernels/draft_sampling.py
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
