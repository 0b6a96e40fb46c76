#!/usr/bin/env bash
# Session 27's fourth call (about 200 s): explore36 (the held prologue's sum of squares stored beside its mma partials,
# one cross-warp pass after the wait instead of two; Llama-3.2-1B per kernel, A B B A), then the same change applied to
# the kernel in this checkout and the GPU tests of the held prologue run on it (so it can be adopted without
# another call if it wins), verbose.
cd "$(dirname "$0")/../.."
source bench/device/common.sh
exec > >(tee "$OUT/all.log") 2>&1
echo "== explore36 (${SECONDS}s)"
timeout 120 python3 bench/explore/explore36.py --out "$OUT/explore36.json" 2>&1 | grep -v -i warn | tail -6
python3 -c "
import sys; sys.path.insert(0, 'bench/explore')
import explore36
p = 'lowlat/kernels/attn_prologue_held.py'
src = explore36.ss_smem_source(open(p).read())
open(p, 'w').write(src)
print('applied ss_smem to', p)"
timeout 240 python3 -m pytest -v -n 8 -m "gpu and not real_model and not eval" -p no:cacheprovider --timeout 150 \
  -rf --tb=short tests/unit/test_attn_prologue.py tests/unit/test_fused_model.py -k "held or prologue or early_exit or draft" \
  > /tmp/gpu-tests.log 2>&1; echo "pytest rc $?"
grep -E "FAILED|ERROR|[0-9]+ passed|[0-9]+ failed" /tmp/gpu-tests.log | grep -v "^FAILED.*PASSED" | cut -c1-300 | tail -14
cp /tmp/gpu-tests.log "$OUT/gpu-tests.log"
echo "done at ${SECONDS}s"
