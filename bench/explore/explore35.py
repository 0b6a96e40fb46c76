"""Session 27: where the held residual GEMV's partial sums of squares (`residual_gemv_held(sum_sq_out=)`) cost.

Variants of `lowlat/kernels/residual_gemv_held.py`, made from its source by text replacement at run time (so the
production kernel is measured as itself), timed at Qwen3-30B-A3B's output projection (N 2048, K 4096) at 1 / 6 / 16 /
48 rows the way `lowlat bench` times "fused_held" (a CUDA graph of launches over rotated weight copies, PDL on), each
variant twice in A B C D D C B A order:
  none     no sums (SS off; the production loop)
  conv     the 16 outputs converted to a column-per-thread layout (shared memory), summed in one thread, the
           row-block loop unrolled (no spills)
  mma      summed in the mma layout (shuffles), the loop unrolled: sm_90 ptxas spills 12 bytes at 33-48 rows (NMB 3)
  mma_dyn  production since session 27: the same sums with the row-block loop not unrolled (no spills)
Also prints whether each variant's out and sums are bitwise the production's.
Session 27's call 2 (bench/results/session27/call2) ran it when production was "conv" (the same variants).

    python bench/explore/explore35.py --out results.json
"""

from __future__ import annotations

import argparse
import json

import torch

from _common import module_from_source  # noqa: E402 (puts the repository on sys.path)
from lowlat.bench import _copies
from lowlat.benchmarking import graph_time_us
from lowlat.kernels import residual_gemv_held as prod

MMA = '''            yf = y.to(gl.bfloat16).to(gl.float32)
            gl.store(ss_ptr + yrow * stride_ss + gl.program_id(0), gl.sum(yf * yf, axis=0), mask=yrow < M)'''
CONV = '''            yf = gl.convert_layout(y, LQ).to(gl.bfloat16).to(gl.float32)
            srow = b * RB + gl.arange(0, RB, layout=gl.SliceLayout(0, LQ))
            gl.store(ss_ptr + srow * stride_ss + gl.program_id(0), gl.sum(yf * yf, axis=0), mask=srow < M)'''
LY = "    LY: gl.constexpr = gl.SliceLayout(0, MMA)"
LQ = "    LQ: gl.constexpr = gl.BlockedLayout([16, 1], [1, 32], [1, Q], [0, 1])\n"
LOOP, DYN = "    for b in gl.static_range(NMB):", "    for b in range(NMB):"


def variant(name: str, src: str):
    """The module with the variant's replacements, imported from a file of its own."""
    src = src.replace(DYN, LOOP)                                   # mma, conv: the loop unrolled
    if name == "conv":
        src = src.replace(MMA, CONV).replace(LY, LQ + LY)
    return module_from_source(f"rgh_{name}", src)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default="1,6,16,48")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    src = open(prod.__file__).read()
    assert src.count(MMA) == 1 and src.count(DYN) == 1 and src.count(LY) == 1, "the production source changed"
    names = ["none", "conv", "mma", "mma_dyn"]
    mods = {n: prod if n in ("none", "mma_dyn") else variant(n, src) for n in names}
    dev = torch.device("cuda")
    n, k = 2048, 4096
    g = torch.Generator(device=dev).manual_seed(1)
    nc = _copies(n * k * 2)
    ws = [(torch.randn(n, k, generator=g, device=dev) * k ** -0.5).to(torch.bfloat16) for _ in range(nc)]
    results = []
    for rows in [int(r) for r in args.rows.split(",")]:
        a = torch.randn(rows, k, generator=g, device=dev).to(torch.bfloat16)
        x = torch.randn(rows, n, generator=g, device=dev).to(torch.bfloat16)
        outs = {v: torch.empty_like(x) for v in names}
        sss = {v: torch.empty(rows, n // 16, device=dev) for v in names}

        def fn(v):
            ss = None if v == "none" else sss[v]
            return lambda i: mods[v].residual_gemv_held(a, ws[i % nc], x, out=outs[v], sum_sq_out=ss, use_pdl=True)

        for v in names:
            fn(v)(0)
        torch.cuda.synchronize()
        same = {v: (torch.equal(outs[v], outs["mma_dyn"]), torch.equal(sss[v], sss["mma_dyn"])) for v in names[1:3]}
        times = {v: [] for v in names}
        for v in names + names[::-1]:
            times[v].append(graph_time_us(fn(v), max(nc, 8)))
        line = " ".join(f"{v} {min(t):.2f}/{max(t):.2f}" for v, t in times.items())
        print(f"  r{rows:<3} us (min/max of 2) {line} | bitwise out/ss vs production {same}", flush=True)
        results.append(dict(rows=rows, us={v: t for v, t in times.items()}, bitwise_vs_production=same))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(dict(device=torch.cuda.get_device_name(), torch=torch.__version__, n=n, k=k,
                           results=results), f, indent=1)


if __name__ == "__main__":
    main()
