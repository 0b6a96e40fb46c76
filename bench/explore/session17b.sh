#!/usr/bin/env bash
# Session 17 call 2: the code with Llama-3.2-1B's prologue on bn 32 at 1 row block and bn 64 at 2-3 (session 17's
# `by_row_blocks` bn, call 1 showed the same bits). (1) Every single-GPU test (new: the prologue's 6 / 17 / 33-row
# invariance, the residual GEMV with bn 16 / 64 / 128 by width, the FusedModel early-KV test with a late-writing
# prologue). (2) Mutation: the early-KV attention without its re-load of the step's own slots must fail the
# late-writer FusedModel case and the race test. (3) `lowlat bench` (copy, step, compiled, profile) for SmolLM2 and
# Llama at 1-48 rows.
cd "$(dirname "$0")/../.."
source bench/device/common.sh
exec > >(tee "$OUT/all.log") 2>&1
echo "== GPU tests (${SECONDS}s)"
gpu_tests 300
grep -E "^FAILED|^ERROR" /tmp/gpu-tests.log | cut -c1-300 | head -20
PYT="python3 -m pytest -q -p no:cacheprovider --timeout 200"
EARLY=tests/unit/test_fused_model.py::test_gpu_default_early_kv_step_equals_the_plain_attention_bitwise
RACE=tests/unit/test_decode_attention.py::test_decode_attention_pre_kv_under_pdl_reads_a_late_writers_slots
echo "== mutation no_fresh_reload (${SECONDS}s)"
mutate lowlat/kernels/decode_attention.py "axis=1) > 0)" "axis=1) > 1)"
timeout 150 $PYT -n 3 -rA $EARLY $RACE 2>&1 | grep -E "^(PASSED|FAILED|ERROR)|passed|failed" | cut -c1-200 | tail -8
unmutate
echo "== lowlat bench (${SECONDS}s)"
(( SECONDS < 450 )) && { timeout 130 python3 -m lowlat.bench --sections copy,step,compiled,profile \
  --models SmolLM2-135M,Llama-3.2-1B --rows 1,6,8,16,24,32,48 --out "$OUT/step_s17.json" > /tmp/bench.log 2>&1
  echo "bench rc $?"; grep -v -i warn /tmp/bench.log | grep -E "decode_step|attn_prolog|copy|speedup|x " | tail -40; }
echo "done at ${SECONDS}s"
