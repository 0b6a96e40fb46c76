#!/usr/bin/env bash
# Session-5 device call 7: two GPU-only mutations of the prologue's split-K arrival (the first arriver finishes; counters
# of different row blocks collide), each against the GPU tests of tests/unit/test_attn_prologue.py: both must fail.
cd "$(dirname "$0")/../.."
source bench/device/common.sh >/dev/null
for m in first_arriver counter_collide; do
  rm -rf /tmp/m && mkdir -p /tmp/m && cp -r lowlat tests pyproject.toml /tmp/m/ 2>/dev/null; cp -r conftest.py /tmp/m/ 2>/dev/null
  if [ $m = first_arriver ]; then
    sed -i 's/        finished = arrived == SPLIT - 1/        finished = arrived == 0/' /tmp/m/lowlat/kernels/attn_prologue.py
  else
    sed -i 's/        cnt = cnt_ptr + pid_n \* NUM_MB + pid_m/        cnt = cnt_ptr + pid_n + pid_m/' /tmp/m/lowlat/kernels/attn_prologue.py
  fi
  (cd /tmp/m && diff -q lowlat/kernels/attn_prologue.py $OLDPWD/lowlat/kernels/attn_prologue.py; \
   PYTHONPATH=/tmp/m timeout 150 python3 -m pytest -q -n 8 -m "gpu and not real_model and not eval" -p no:cacheprovider \
     --timeout 140 tests/unit/test_attn_prologue.py 2>&1 | tail -3 | sed "s/^/[$m] /")
done
