#!/usr/bin/env bash
# Session 18 call 2 (call 1 ran a first version whose grouped programs ran their splits in a while loop, one
# split after another with no overlap). The decode attention's split groups (`split_groups`: a program runs several
# splits of its (row, KV head) in ONE loop over all their blocks, which Triton pipelines across split ends; same
# bits): its GPU tests, then per kernel (bench_decode_attention, PDL-chained,
# every split_groups value at Llama-3.2-1B / SmolLM2 heads, ctx 512 / 4096), then in the Llama step (explore26,
# widths 1-48) with TARGET_PROGRAMS 1000000 (one program per split: the kernel until session 17), 512, 1024, 2048,
# alternated twice.
cd "$(dirname "$0")/../.."
source bench/device/common.sh
exec > >(tee "$OUT/all.log") 2>&1
echo "== GPU tests: decode attention, fused model (${SECONDS}s)"
timeout 240 python3 -m pytest -q -n 4 -m gpu -p no:cacheprovider tests/unit/test_decode_attention.py \
  tests/unit/test_fused_model.py > /tmp/t.log 2>&1; echo "pytest rc $?"
grep -E "passed|failed|FAILED|Error" /tmp/t.log | cut -c1-300 | tail -15
echo "== per kernel (${SECONDS}s)"
timeout 200 python3 bench/bench_decode_attention.py --variants fused_pdl --models Llama-3.2-1B --rows 1 6 16 24 48 \
  --ctxs 512 4096 --split-groups 32 8 4 2 1 --out "$OUT/da_llama.json" 2>&1 | grep -v -i warn
timeout 100 python3 bench/bench_decode_attention.py --variants fused_pdl --models SmolLM2-135M --rows 16 48 \
  --ctxs 512 --split-groups 32 8 4 2 1 --out "$OUT/da_smollm2.json" 2>&1 | grep -v -i warn
e26() {  # TARGET_PROGRAMS
  (( SECONDS > 520 )) && { echo "skip e26 $*: ${SECONDS}s used"; return; }
  echo "== e26 attn_target $1 (${SECONDS}s)"
  if timeout 60 python3 bench/explore/explore26.py --model Llama-3.2-1B --order 1,6,16,24,32,48 \
      --attn-target "$1" > /tmp/e26.log 2>&1; then grep -v -i warn /tmp/e26.log
  else echo "e26 $1 failed"; tail -4 /tmp/e26.log; fi
}
e26 1000000; e26 1024; e26 512; e26 2048; e26 1000000; e26 1024; e26 512; e26 2048
echo "done at ${SECONDS}s"
