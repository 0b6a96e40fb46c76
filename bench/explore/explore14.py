"""Session-5 exploration, third round: the pair-GEMV prologue with one 16-row block per program (grid over row
blocks, as the session-4 kernel), in two epilogue layouts side by side: "late" (each epilogue input loaded where
it is used: positions -> cos/sin -> ... one round trip after another behind the partial sums; 68-72 registers,
QK-norm 184) and "early" (positions and slots loaded with the activations, cos/sin, bias and norm weights issued
with the partial tiles' loads; 128-165 registers, QK-norm 205), each against the session-4 kernel (v1), at 1, 6
and 48 rows.

    python bench/explore/explore14.py --out $OUT/explore14.json [--budget-s 200]
"""
from __future__ import annotations

import argparse

import explore12
import prologue_early
import prologue_late

P = dict(preload=True)
S = dict(preload=False)
explore12.KERNELS = {"late": prologue_late, "early": prologue_early}
explore12.PLANS = {
    "Llama-3.2-1B": [("pre_bn64_bk128_s8", dict(P, bn=64, block_k=128, split=8)),
                     ("pre_bn128_bk64_s8", dict(P, bn=128, block_k=64, split=8)),
                     ("st_bn64_bk64_s8_st6_pf128", dict(S, bn=64, block_k=64, split=8, stages=6, pf_k=128))],
    "Qwen3-30B-A3B": [("pre_bn64_bk128_s8", dict(P, bn=64, block_k=128, split=8)),
                      ("pre_bn64_bk64_s8", dict(P, bn=64, block_k=64, split=8)),
                      ("st_bn64_bk64_s8_st6_pf128", dict(S, bn=64, block_k=64, split=8, stages=6, pf_k=128))],
    "SmolLM2-135M": [("pre_bn64_bk64_s5", dict(P, bn=64, block_k=64, split=5)),
                     ("pre_bn32_bk64_s5", dict(P, bn=32, block_k=64, split=5)),
                     ("pre_bn32_bk16_s8", dict(P, bn=32, block_k=16, split=8)),
                     ("st_bn32_bk32_s6_st3_pf0", dict(S, bn=32, block_k=32, split=6, stages=3, pf_k=0))],
}
explore12.ROWS = {"Qwen3-30B-A3B": (1, 6, 48), "Llama-3.2-1B": (1, 6, 48), "SmolLM2-135M": (1, 6, 48)}

if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    ap.add_argument("--budget-s", type=float, default=200.0)
    a = ap.parse_args()
    explore12.main(["--budget-s", str(a.budget_s), "--reps", "2"] + (["--out", a.out] if a.out else []))
