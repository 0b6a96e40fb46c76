#!/usr/bin/env bash
# Session 35's second call (one GPU; ends by END, default 570 s): every single-GPU test, verbose
# (bench/device/common.sh's gpu_tests_verbose; ~280-330 s of pytest on an H200, more on an H100), with the Triton
# cache restored from .tcache/ when carried and saved back as $OUT/tcache.tar.gz: put that file in .tcache/ (ignored)
# and carry [".tcache"] in the next call of the same code to see how much of the suite's time is compiling.
cd "$(dirname "$0")/../.."
source bench/device/common.sh
exec > >(tee "$OUT/all.log") 2>&1
END=${END:-570}
tcache_restore
echo "== every single-GPU test (${SECONDS}s)"
gpu_tests_verbose "$(cap 540)"
tcache_save
echo "done at ${SECONDS}s"
