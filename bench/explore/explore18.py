"""Session-7 exploration (issue 3): GEMVs of 8-21 MB whose weight slice is held in SHARED memory across the PDL
wait (`smem_gemv.py`: Gluon, and the same plan in plain Triton). Same shapes, epilogues and timing as explore16
(one CUDA graph of PDL-chained launches over rotating cold weight copies), with the pure-read floors of the
same bytes and the production residual GEMV (out_proj shapes) in the same run. Calls 1-6 of session 7 ran the
kernel versions of commit 79d1754 (see smem_gemv.py); this script times the kept kernels.

    python bench/explore/explore18.py --out $OUT/explore18.json [--budget-s 240] [--reps 2] [--groups 16 8]
        [--rows 1 6] [--kernels gluon triton] [--maxnreg 48 64] [--skip smem production floor]
"""
from __future__ import annotations

import argparse
import time

from _common import Recorder, check_and_time, gemv_reference, time_gemv_plans

import torch  # noqa: E402

from lowlat.benchmarking import rotation_copies  # noqa: E402

#: (label, N, K, epilogue, BN choices) as explore16.SHAPES; BN 16 / 8 / 4: 64 / 32 / 16 KB of shared memory per
#: program at K 2048, twice that at K 4096
SHAPES = [("llama_qkv", 3072, 2048, "norm", (16, 8, 4)), ("qwen3_qkv", 5120, 2048, "norm", (16, 8, 4)),
          ("qwen3_out", 2048, 4096, "res", (8, 4, 16)), ("llama_out", 2048, 2048, "res", (16, 8, 4))]


def variants(bns, r: int, groups, kernels, caps) -> list[tuple]:
    """(bn, mode, kernel, group, maxnreg) timed per shape: every kernel at every group, MODE 2 (weights loaded
    before the wait), the Gluon kernel also under every register cap; at 1 row also MODE 1 (after the wait) for
    the Gluon kernel with the first group."""
    out = [(bn, 2, kern, g, None) for kern in kernels for bn in bns for g in groups]
    out += [(bn, 2, "gluon", g, cap) for cap in caps for bn in bns for g in groups]
    if r == 1 and "gluon" in kernels:
        out += [(bn, 1, "gluon", groups[0], None) for bn in bns]
    return out


def smem(rec, deadline, reps: int, rows, groups, kernels, caps) -> None:
    from smem_gemv import SmemGemv

    dev = torch.device("cuda")
    cases = []
    for label, n, k, epi, bns in SHAPES:
        nc = max(rotation_copies(n * k * 2), 8)
        gen = torch.Generator(device=dev).manual_seed(18)
        ws = [(torch.randn(n, k, generator=gen, device=dev) * k ** -0.5).to(torch.bfloat16) for _ in range(nc)]
        g = (1 + 0.1 * torch.randn(k, generator=gen, device=dev)).to(torch.bfloat16)
        cases.append((label, n, k, epi, bns, nc, ws, g, gen, {bn: SmemGemv(ws, bn) for bn in bns}))
    for r in rows:                       # every shape at 1 row first (the target), then 6 rows
        for label, n, k, epi, bns, nc, ws, g, gen, launchers in cases:
            x = torch.randn(r, k, generator=gen, device=dev).to(torch.bfloat16)
            res = torch.randn(r, n, generator=gen, device=dev).to(torch.bfloat16)
            out = torch.empty(r, n, device=dev, dtype=torch.bfloat16)
            want = gemv_reference(epi, x, g, res, ws[0])
            for rep in range(reps):
                for bn, mode, kern, grp, cap in variants(bns, r, groups, kernels, caps):
                    if time.time() > deadline:
                        return

                    def launch(i, bn=bn, mode=mode, kern=kern, grp=grp, cap=cap):
                        launchers[bn](i, x, g, res, out, mode=mode, res_epi=epi == "res", group=grp,
                                      triton_kernel=kern == "triton", maxnreg=cap)

                    entry = dict(op="smem", shape=label, n=n, k=k, rows=r, rep=rep, bn=bn, mode=mode, kernel=kern,
                                 group=grp, maxnreg=cap)
                    rec.guard(f"{label}/bn{bn}/m{mode}/{kern}/g{grp}/n{cap}/r{r}",
                              lambda launch=launch, entry=entry: check_and_time(rec, launch, out, want, nc, n * k * 2,
                                                                              entry),
                              op="smem", rows=r)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=None)
    p.add_argument("--budget-s", type=float, default=240)
    p.add_argument("--reps", type=int, default=2)
    p.add_argument("--skip", nargs="*", default=[])
    p.add_argument("--groups", type=int, nargs="+", default=[16, 8], help="chunks (of 64 columns) per TMA box")
    p.add_argument("--rows", type=int, nargs="+", default=[1, 6])
    p.add_argument("--kernels", nargs="+", default=["gluon"], choices=["gluon", "triton"])
    p.add_argument("--maxnreg", type=int, nargs="*", default=[], help="register caps of the Gluon launch to add")
    a = p.parse_args()
    deadline = time.time() + a.budget_s
    rec = Recorder(a.out)
    print(f"copy bandwidth {rec.bw / 1e12:.3f} TB/s", flush=True)
    if "smem" not in a.skip:
        rec.guard("smem", lambda: smem(rec, deadline, a.reps, a.rows, a.groups, a.kernels, a.maxnreg), op="smem")
    if "production" not in a.skip:
        for label, n, k, epi, _ in SHAPES:
            if epi == "res":
                rec.guard(f"production/{label}", lambda n=n, k=k: time_gemv_plans(
                    rec, deadline + 60, "residual", n, k, 1e-5, [("production", {})], 1), op="residual")
    if "floor" not in a.skip:
        from explore16 import floors
        rec.guard("floor", lambda: floors(rec, deadline + 120), op="read")


if __name__ == "__main__":
    main()
