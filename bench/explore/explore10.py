"""Session-4 A/B: the attention prologue with its whole weight slice loaded before the PDL wait (lowlat, "preload")
against the session-3 kernel that streams the slice one tile ahead (bench/explore/prologue_stream.py, "stream"),
in the same run: the prologue bench (Llama-3.2-1B and Qwen3-30B-A3B shapes, fused and PDL-chained), the fused
decode step of Llama-3.2-1B, and one Qwen3-30B-A3B layer (attention + MoE), each variant after the other.

    python bench/explore/explore10.py --out-dir $OUT
"""
from __future__ import annotations

import sys

import _common  # noqa: F401  (puts the checkout and bench/ on sys.path)
import bench_attn_prologue
import prologue_stream

import lowlat.kernels.attn_prologue as ap
from lowlat import bench

NEW = (ap._attn_prologue_kernel, ap.prologue_warps)


def use(variant: str) -> None:
    if variant == "stream":
        ap._attn_prologue_kernel = prologue_stream._attn_prologue_kernel
        ap.prologue_warps = lambda head_dim, k_chunk: 4
    else:
        ap._attn_prologue_kernel, ap.prologue_warps = NEW


if __name__ == "__main__":
    out = sys.argv[sys.argv.index("--out-dir") + 1]
    for rep in (0,):
        for variant in ("preload", "stream"):
            use(variant)
            sys.argv = ["bench_attn_prologue.py", "--models", "Llama-3.2-1B", "Qwen3-30B-A3B", "--rows", "1", "6",
                        "--budget-s", "0", "--out", f"{out}/prologue_{variant}_{rep}.json"]
            bench_attn_prologue.main()
            bench.main(["--sections", "copy,step,moe", "--models", "Llama-3.2-1B,Qwen3-30B-A3B", "--rows", "1,6",
                        "--budget-s", "100", "--out", f"{out}/step_moe_{variant}_{rep}.json"])
