#!/usr/bin/env bash
# Session 39, call 5 (one GPU, no carry): the paced held prologue in production (`attn_prologue_held(..., pace=True)`):
# its GPU tests and FusedModel's held-prologue / early-release tests, the per-kernel bench at Llama-3.2-1B's shapes
# (held_pdl / held_folded_pdl / held_paced_pdl), and explore56's production-paced variant beside its prototype.
cd "$(dirname "$0")/../.."
source bench/device/common.sh
exec > >(tee "$OUT/all.log") 2>&1
END=${END:-420}
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,power.draw --format=csv,noheader
echo "== GPU tests (${SECONDS}s)"
timeout "$(cap 220)" python3 -m pytest -q -n 6 -p no:cacheprovider -rf -m gpu tests/unit/test_attn_prologue.py \
  tests/unit/test_fused_model.py -k "held or early_release_same_bits" > "$OUT/gpu-tests.log" 2>&1
echo "pytest rc $?"; grep -E "passed|failed|FAILED|Error" "$OUT/gpu-tests.log" | cut -c1-300 | tail -12
echo "== bench_attn_prologue Llama-3.2-1B (${SECONDS}s)"
timeout "$(cap 120)" python3 bench/bench_attn_prologue.py --models Llama-3.2-1B --rows 1 6 8 16 48 --budget-s 0 \
  --out "$OUT/attn_prologue_llama.json" 2>&1 | grep -v -i warn | cut -c1-200
echo "== explore56 (${SECONDS}s)"
timeout "$(cap 60)" python3 bench/explore/explore56.py --rows 1,8 --rounds 2 --out "$OUT/explore56.json" \
  --variants prod,prod_paced,c8w2_early_x2 2>&1 | grep -v -i warn | cut -c1-900
echo "done at ${SECONDS}s"
