#!/usr/bin/env bash
# Session 35's second call (one GPU; ends by END, default 570 s): every single-GPU test, verbose
# (bench/device/common.sh's gpu_tests_verbose; ~280-330 s of pytest on an H200, more on an H100). It also saved the
# Triton cache for a later call to carry (session 36: 1505 entries, 118 MB gzipped, over what a call may return or
# carry, so that was removed).
cd "$(dirname "$0")/../.."
source bench/device/common.sh
exec > >(tee "$OUT/all.log") 2>&1
END=${END:-570}
echo "== every single-GPU test (${SECONDS}s)"
gpu_tests_verbose "$(cap 540)"
echo "done at ${SECONDS}s"
