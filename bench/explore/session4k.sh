#!/usr/bin/env bash
# Session-4 device call 11 (after the review pass): GPU tests of the draft sampler (greedy launch constexprs
# pinned across row counts, new tie / top-p / multi-chunk / row-chunk determinism cases), the fused model and
# the LM head.
cd "$(dirname "$0")/../.."
source bench/device/common.sh
timeout 190 python3 -m pytest -q -n 8 -m "gpu and not real_model and not eval" -p no:cacheprovider --timeout 180 \
  tests/unit/test_draft_sampling.py tests/unit/test_fused_model.py tests/unit/test_lm_head.py tests/unit/test_attn_prologue.py \
  2>&1 | tee "$OUT/gpu-tests-review.log" | tail -4
