#!/usr/bin/env bash
# Session 19 call 2. The decode attention's KV loop is pipelined only one block deep at Triton's default num_stages
# 3 (sm_90 compile: K / V issued at the end of an iteration, waited for at the top of the next), so a program pays a
# round trip a block (session 18: 1.5-1.75 us). `kv_stages` (Triton num_stages of the launch) moves no arithmetic.
# (1) The GPU bitwise test (kv_stages 1 / 2 / 5 / 7 at split_groups 32 / 4 / 1 == the default). (2) Per kernel
# (bench_decode_attention, PDL-chained): kv_stages 3 / 5 / 7 x split_groups 32 / 8 / 2 / 1 at SmolLM2 / Llama heads,
# ctx 512 / 4096, rows 1 / 6 / 16 / 48. (3) In the step (explore26, widths 1-48, alternated twice): kv_stages 3 / 5
# with the default split groups, and kv_stages 5 with more grouping (--attn-target 1024 / 512).
cd "$(dirname "$0")/../.."
source bench/device/common.sh
exec > >(tee "$OUT/all.log") 2>&1
echo "== GPU test: decode attention bitwise (${SECONDS}s)"
timeout 150 python3 -m pytest -q -m gpu -p no:cacheprovider tests/unit/test_decode_attention.py \
  -k "bitwise_deterministic" > /tmp/t.log 2>&1; echo "pytest rc $?"
grep -E "passed|failed|FAILED|Error" /tmp/t.log | cut -c1-300 | tail -8
echo "== per kernel (${SECONDS}s)"
timeout 220 python3 bench/bench_decode_attention.py --variants fused_pdl --models SmolLM2-135M Llama-3.2-1B \
  --rows 1 6 16 48 --ctxs 512 4096 --split-groups 32 8 2 1 --kv-stages 3 5 7 --out "$OUT/da_stages.json" 2>&1 \
  | grep -v -i warn | cut -c1-100
e26() {  # model kv_stages [attn_target]
  (( SECONDS > 540 )) && { echo "skip e26 $*: ${SECONDS}s used"; return; }
  echo "== e26 $1 kv_stages $2 attn_target ${3:-default} (${SECONDS}s)"
  if timeout 60 python3 bench/explore/explore26.py --model $1 --order 1,6,16,24,32,48 --kv-stages $2 \
      ${3:+--attn-target $3} > /tmp/e26.log 2>&1; then grep -v -i warn /tmp/e26.log | grep -E 'r(1|6|16|24|32|48) |logits'
  else echo "e26 $* failed"; tail -4 /tmp/e26.log; fi
}
for rep in 1 2; do for m in Llama-3.2-1B SmolLM2-135M; do
  e26 $m 3; e26 $m 5; e26 $m 5 1024; e26 $m 5 512
done; done
echo "done at ${SECONDS}s"
