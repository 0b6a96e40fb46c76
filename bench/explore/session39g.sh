#!/usr/bin/env bash
# Prepared in session 39, NOT run (no device could be started after call 4; one GPU, no carry, ~450 s): the paced held
# prologue in production (`attn_prologue_held(..., pace=True)`): its GPU tests and FusedModel's held-prologue /
# early-release tests; the per-kernel bench at Llama-3.2-1B's shapes (held_pdl / held_folded_pdl / held_paced_pdl);
# the decode step (explore26, 16 layers) with FusedModel's default against folded weights with the prologue's early
# release (the paced prologue at width 1); explore57 (Qwen3's paced cluster prologue) while time is left.
cd "$(dirname "$0")/../.."
source bench/device/common.sh
exec > >(tee "$OUT/all.log") 2>&1
END=${END:-540}
echo "== bench_attn_prologue Llama-3.2-1B (${SECONDS}s)"
timeout "$(cap 100)" python3 bench/bench_attn_prologue.py --models Llama-3.2-1B --rows 1 6 8 16 48 --budget-s 0 \
  --out "$OUT/attn_prologue_llama.json" 2>&1 | grep -v -i warn | grep -v "M=.*  fused" | cut -c1-200
echo "== GPU tests (${SECONDS}s)"
timeout "$(cap 200)" python3 -m pytest -q -n 6 -p no:cacheprovider -rf -m gpu tests/unit/test_attn_prologue.py \
  tests/unit/test_fused_model.py -k "held or early_release_same_bits" > "$OUT/gpu-tests.log" 2>&1
echo "pytest rc $?"; grep -E "passed|failed|FAILED|Error" "$OUT/gpu-tests.log" | cut -c1-300 | tail -12
echo "== step default (${SECONDS}s)"
timeout "$(cap 80)" python3 bench/explore/explore26.py --model Llama-3.2-1B --order 1,6,16 \
  --out "$OUT/step_default.json" 2>&1 | grep -v -i warn | cut -c1-400
echo "== step paced (folded, prologue early) (${SECONDS}s)"
timeout "$(cap 80)" python3 bench/explore/explore26.py --model Llama-3.2-1B --order 1,6,16 --held-fold build \
  --early-release out_proj,down,attn_prologue --out "$OUT/step_paced.json" 2>&1 | grep -v -i warn | cut -c1-400
echo "== explore57 (${SECONDS}s)"
timeout "$(cap 80)" python3 bench/explore/explore57.py --rows 1 --rounds 2 --out "$OUT/explore57.json" \
  --variants split_k,cluster,cluster_c16w4_late,cluster_c16w2_late 2>&1 | grep -v -i warn | cut -c1-1200
echo "done at ${SECONDS}s"
