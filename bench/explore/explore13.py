"""Session-5 exploration, second round: the pair-GEMV attention prologue's plans narrowed to the winners of
explore12 plus narrower-tile plans for SmolLM2 (where the session-4 kernel, 135 programs of 8 KB, was faster),
at 1, 6 and 48 rows (Qwen3's QK-norm epilogue uses 205 registers at one row block); then the whole fused step of
SmolLM2-135M and Llama-3.2-1B with the session-4 prologue kernel swapped in (bench/explore/prologue_v1.py) and
with the production one, each through `lowlat.bench --sections step` in a subprocess.

    python bench/explore/explore13.py --out $OUT/explore13.json [--budget-s 150] [--step-out $OUT]
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import explore12

P = dict(preload=True)
S = dict(preload=False)
explore12.PLANS = {
    "Llama-3.2-1B": [("pre_bn64_bk128_s8", dict(P, bn=64, block_k=128, split=8)),
                     ("pre_bn64_bk64_s8", dict(P, bn=64, block_k=64, split=8)),
                     ("pre_bn128_bk64_s8", dict(P, bn=128, block_k=64, split=8)),
                     ("st_bn64_bk64_s8_st6_pf128", dict(S, bn=64, block_k=64, split=8, stages=6, pf_k=128))],
    "Qwen3-30B-A3B": [("pre_bn64_bk128_s8", dict(P, bn=64, block_k=128, split=8)),
                      ("pre_bn64_bk64_s8", dict(P, bn=64, block_k=64, split=8)),
                      ("st_bn64_bk64_s8_st6_pf128", dict(S, bn=64, block_k=64, split=8, stages=6, pf_k=128))],
    "SmolLM2-135M": [("pre_bn64_bk64_s5", dict(P, bn=64, block_k=64, split=5)),
                     ("pre_bn32_bk32_s6", dict(P, bn=32, block_k=32, split=6)),
                     ("pre_bn32_bk64_s5", dict(P, bn=32, block_k=64, split=5)),
                     ("pre_bn64_bk32_s6", dict(P, bn=64, block_k=32, split=6)),
                     ("st_bn32_bk32_s6_st3_pf0", dict(S, bn=32, block_k=32, split=6, stages=3, pf_k=0)),
                     ("st_bn32_bk64_s5_st2_pf64", dict(S, bn=32, block_k=64, split=5, stages=2, pf_k=64))],
}
explore12.ROWS = {"Qwen3-30B-A3B": (1, 6, 48), "Llama-3.2-1B": (1, 6, 48), "SmolLM2-135M": (1, 6, 48)}

SWAP = """import sys, runpy
sys.path.insert(0, {explore!r})
import prologue_v1, lowlat.kernels
sys.modules['lowlat.kernels.attn_prologue'] = prologue_v1
lowlat.kernels.attn_prologue = prologue_v1
sys.argv = ['lowlat.bench'] + sys.argv[1:]
runpy.run_module('lowlat.bench', run_name='__main__')
"""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    ap.add_argument("--budget-s", type=float, default=150.0)
    ap.add_argument("--step-out", default=None)
    args = ap.parse_args()
    explore12.main(["--budget-s", str(args.budget_s), "--reps", "2"] + (["--out", args.out] if args.out else []))
    if args.step_out:
        here = Path(__file__).resolve().parent
        bench = ["--sections", "copy,step", "--models", "SmolLM2-135M,Llama-3.2-1B", "--rows", "1,6",
                 "--budget-s", "100"]
        for tag, cmd in (("v1", [sys.executable, "-c", SWAP.format(explore=str(here))]),
                         ("v2", [sys.executable, "-m", "lowlat.bench"])):
            out = os.path.join(args.step_out, f"step_{tag}.json")
            subprocess.run(cmd + bench + ["--out", out], check=False, timeout=200)


if __name__ == "__main__":
    main()
