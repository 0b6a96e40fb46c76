#!/usr/bin/env bash
# explore49 (one GPU, ends by END, default 420 s; no carry): Qwen3-30B-A3B's QK-norm and RoPE moved from the attention
# prologue into the decode attention (raw q / new K in, transformed as loaded) plus a K write-back launch after it.
# (a) its CPU test on the GPU (tests/unit/test_explore_attn_qknorm.py: within the numerics policy of the float64
#     chain, the write-back's slots too, every other slot untouched);
# (b) per kernel at Qwen3's heads, rows 1 / 6 / 16, contexts 512 / 4096, with the fused model's options:
#     production (final q / cache) / qknorm (raw) / qknorm_wb (+ the write-back), A B C C B A, JSON in $OUT.
# (c) (session 36) the two prologues on the same card: production's for Qwen3 (split-K, with QK-norm: fused_pdl of
#     bench_attn_prologue.py) and the plain held one at Qwen3's shapes (explore46's `plain`, no QK-norm).
#     (--budget-s 0: its reference variants, a torch.compile among them, are skipped; only fused_pdl is kept.)
# Compare (explore49's docstring): (c)'s split-K minus plain held, against (qknorm - production) + (qknorm_wb -
# qknorm), at each width.
cd "$(dirname "$0")/../.."
source bench/device/common.sh
exec > >(tee "$OUT/all.log") 2>&1
END=${END:-420}
echo "== (a) explore49's test on the GPU (${SECONDS}s)"
timeout "$(cap 100)" python3 -m pytest -q -n 4 -p no:cacheprovider --timeout 90 -rf \
  tests/unit/test_explore_attn_qknorm.py > "$OUT/qknorm_test.log" 2>&1; echo "pytest rc $?"
tail -3 "$OUT/qknorm_test.log"
echo "== (b) explore49 timing (${SECONDS}s)"
timeout "$(cap 190)" python3 bench/explore/explore49.py --out "$OUT/explore49.json" 2>&1 | grep -v -i warn; echo "rc $?"
echo "== (c) the prologues at Qwen3's shapes: split-K (production) and plain held (${SECONDS}s)"
timeout "$(cap 80)" python3 bench/bench_attn_prologue.py --models Qwen3-30B-A3B --rows 1 6 16 --budget-s 0 \
  --out "$OUT/prologue.json" 2>&1 | grep -E "fused_pdl|rror" | cut -c1-200; echo "rc $?"
timeout "$(cap 80)" python3 bench/explore/explore46.py --variants plain --rows 1,6,16 --out "$OUT/e46_plain.json" \
  2>&1 | grep -v -i warn | tail -8; echo "rc $?"
echo "done at ${SECONDS}s"
