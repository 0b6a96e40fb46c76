#!/usr/bin/env bash
# Session 18 call 4: every single-GPU test with the committed default (WIDE_GRID 6144 -> 4 split groups; an explicit
# pre_kv=True keeps one program per split; call 3's three failures were explicit pre_kv=True launches that the
# then-default grouped).
cd "$(dirname "$0")/../.."
source bench/device/common.sh
exec > >(tee "$OUT/all.log") 2>&1
echo "== GPU tests (${SECONDS}s)"
gpu_tests 300
echo "done at ${SECONDS}s"
