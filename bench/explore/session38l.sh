#!/usr/bin/env bash
# Session 38, call 12 (one GPU, no carry, ends by END, default 200 s): the GPU tests of the session's explores
# (tests/unit/test_explore_held_chain.py -m gpu), and the file's CPU-compile tests on the device's Triton.
cd "$(dirname "$0")/../.."
source bench/device/common.sh
exec > >(tee "$OUT/all.log") 2>&1
END=${END:-200}
echo "== test_explore_held_chain (${SECONDS}s)"
timeout "$(cap 180)" python3 -m pytest -q -n 4 -p no:cacheprovider -rf tests/unit/test_explore_held_chain.py \
  2>&1 | tail -15; echo "rc $?"
echo "done at ${SECONDS}s"
