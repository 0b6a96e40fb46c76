"""Session-4 A/B: the attention prologue with Triton's software-pipelined K loop and an L2 prefetch of the slice
before the PDL wait (bench/explore/prologue_pipelined.py, stages 3 and 4) against the production kernel
(register double buffer), in one run: the prologue bench (Llama-3.2-1B and Qwen3-30B-A3B shapes), the fused
decode step of Llama-3.2-1B and one Qwen3-30B-A3B layer (attention + MoE).

    python bench/explore/explore11.py --out-dir $OUT
"""
from __future__ import annotations

import sys

import _common  # noqa: F401  (puts the checkout and bench/ on sys.path)
import bench_attn_prologue
import prologue_pipelined

import lowlat.kernels.attn_prologue as ap
from lowlat import bench

PRODUCTION = ap._attn_prologue_kernel

if __name__ == "__main__":
    out = sys.argv[sys.argv.index("--out-dir") + 1]
    for variant, kern in (("production", PRODUCTION), ("pipelined3", prologue_pipelined.launcher(3)),
                          ("pipelined4", prologue_pipelined.launcher(4))):
        ap._attn_prologue_kernel = kern
        sys.argv = ["bench_attn_prologue.py", "--models", "Llama-3.2-1B", "Qwen3-30B-A3B", "--rows", "1", "6",
                    "--budget-s", "0", "--out", f"{out}/prologue_{variant}.json"]
        bench_attn_prologue.main()
        bench.main(["--sections", "copy,step,moe", "--models", "Llama-3.2-1B,Qwen3-30B-A3B", "--rows", "1,6",
                    "--budget-s", "100", "--out", f"{out}/step_moe_{variant}.json"])
