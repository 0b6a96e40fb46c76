#!/usr/bin/env bash
# Session 19 call 4: the final rule (call 3's grouping and 5 stages only at head_dim <= 64: Qwen3-30B-A3B's D 128
# heads lost with them). The GPU tests of the decode attention and the fused model; per kernel the default at Qwen3's
# heads (now one program per split, 3 stages) and Llama's at 48 rows.
cd "$(dirname "$0")/../.."
source bench/device/common.sh
exec > >(tee "$OUT/all.log") 2>&1
echo "== GPU tests: decode attention, fused model (${SECONDS}s)"
timeout 200 python3 -m pytest -q -n 4 -m gpu -p no:cacheprovider tests/unit/test_decode_attention.py \
  tests/unit/test_fused_model.py > /tmp/t.log 2>&1; echo "pytest rc $?"
grep -E "passed|failed|FAILED|Error" /tmp/t.log | cut -c1-300 | tail -8
echo "== per kernel (${SECONDS}s)"
timeout 60 python3 bench/bench_decode_attention.py --variants fused_pdl --models Qwen3-30B-A3B Llama-3.2-1B --rows 48 \
  --ctxs 512 4096 --split-groups 0 --out "$OUT/da_final.json" 2>&1 | grep -v -i warn | cut -c1-100
echo "done at ${SECONDS}s"
