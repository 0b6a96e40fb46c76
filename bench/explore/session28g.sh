#!/usr/bin/env bash
# Session 28's seventh call (about 420 s): every single-GPU test on the final tree (the held prologue's early_release
# option, FusedModel's "attn_prologue" early-release name and their tests), verbose; then one GPU mutation the early
# release tests must catch: the held prologue's early-release form skipping its PDL wait (x read before the previous
# launch wrote it).
cd "$(dirname "$0")/../.."
source bench/device/common.sh
exec > >(tee "$OUT/all.log") 2>&1
gpu_tests_verbose 420
grep -c PASSED /tmp/gpu-tests.log
echo "== mutation: the early-release form skips its wait (${SECONDS}s)"
mutate lowlat/kernels/_attn_common.py "    if USE_PDL:
        gdc_wait()
        if not EARLY_RELEASE:" "    if USE_PDL and not EARLY_RELEASE:
        gdc_wait()
        if not EARLY_RELEASE:"
timeout 150 python3 -m pytest -q -n 4 -m "gpu and not real_model and not eval" -p no:cacheprovider --timeout 120 \
  tests/unit/test_fused_model.py tests/unit/test_attn_prologue.py -k "early_release_same_bits or held_prologue_bitwise" \
  > /tmp/mut.log 2>&1; echo "mutation: pytest rc $? (must be 1)"
grep -E "[0-9]+ passed|[0-9]+ failed|^FAILED" /tmp/mut.log | cut -c1-200 | tail -5
unmutate
echo "done at ${SECONDS}s"
