#!/usr/bin/env bash
# Session 25's fifth call (about 420 s): every single-GPU test again with the held prologue as the default, verbose so
# that a failure is named as it happens (call 4's run, session25d.sh, reached its last test with one failure, F, and
# was cut at 300 s before pytest's summary named it). Since call 4 the held prologue takes H >= 256 only.
cd "$(dirname "$0")/../.."
source bench/device/common.sh
exec > >(tee "$OUT/all.log") 2>&1
timeout 430 python3 -m pytest -v -n 8 -m "gpu and not real_model and not eval" -p no:cacheprovider --timeout 200 -rf \
  --tb=short tests > /tmp/gpu-tests.log 2>&1; echo "pytest rc $?"
grep -E "FAILED|ERROR|[0-9]+ passed|[0-9]+ failed" /tmp/gpu-tests.log | grep -v "^FAILED.*PASSED" | cut -c1-300 | tail -12
grep -c PASSED /tmp/gpu-tests.log
cp /tmp/gpu-tests.log "$OUT/gpu-tests.log"
echo "done at ${SECONDS}s"
