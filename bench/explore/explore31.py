"""Session 23: explore16's GEMV with no split-K, written so that after `gdc_wait` it pays one round trip.

Session 6's explore16 held each program's whole weight slice [BN, K] in registers across the wait and measured
45-54% of copy bandwidth at 1 row (Llama out_proj 4.05-4.3 us for 8.4 MB), while a pure read of the same bytes
with every load before the wait ran at 91%. Its sm_90 SASS (session 23, `tests/unit/compile_sm90.py ... dump`)
shows why: after ACQBULK (the wait) it loads x one chunk at a time, 2 bytes a thread (LDG.E.U16), each load
behind the previous chunk's BAR.SYNC (x is loaded in its own 1-D layout and moved through shared memory to
the weights' layout), so the chain after the wait is K / KC dependent round trips, not one.

Here each program loads one [BN, K] weight tile and, after the wait, [1, K] rows of x; Triton gives both the layout
"8 bf16 a thread along K, lanes then warps along K, every row repeated in each thread", so x's 16 bytes a thread
meet every row's weights in registers with no layout conversion (sm_90 SASS: every weight LDG.E.128 before
ACQBULK, then one LDG.E.128 of x, the FMAs, and one reduction over K at the end: shuffles, then one pass through
shared memory across the warps). Two first attempts, kept out: per-chunk x tiles with a zero row stride (vector loads
only with the stride specialised divisible by 16; ptxas then spread the loads between the FMAs), and [1, KC] x tiles
(Triton gave them one element a thread and converted through shared memory). Chain after the wait: x loads (one
round trip), FMAs, the reduction, the store.

    y[r, n] = res[r, n] + sum_k x[r, k] W[n, k]                      (RES: out_proj's residual GEMV)
    y[r, n] = rstd(x[r]) * sum_k (x[r, k] g[k]) W[n, k]               (norm: the prologue's normed GEMV, no RoPE)

Rows are taken RB at a time (every x row of the group loaded first). MODE 2: weights (and, for RES, the residual
rows: production loads its residual after the wait) loaded before the wait; MODE 1: after it. EARLY 1: dependents
released at the start (the next launch's programs may load while this one waits); EARLY 0: right after the wait (the
production rule); `pdl_point`. Timed as the fused step runs its launches (PDL-chained over rotating cold copies,
`_common.check_and_time`), beside the production residual GEMV's plan (`time_gemv_plans`) in the same run.

    python bench/explore/explore31.py --out $OUT/explore31.json [--budget-s 240] [--rows 1 6 16]
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))          # _common, also when imported as explore.explore31
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from _common import check_and_time, explore_main, gemv_reference, time_production_residual  # noqa: E402

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait  # noqa: E402

from lowlat.benchmarking import rotation_copies  # noqa: E402
from lowlat.kernels._gemv import rstd_of  # noqa: E402

#: (label, N, K, epilogue): Llama-3.2-1B out_proj 8.4 MB, Qwen3-30B-A3B out_proj 16.8 MB, Llama QKV 12.6 MB,
#: Qwen3 QKV 21 MB
SHAPES = [("llama_out", 2048, 2048, "res"), ("qwen3_out", 2048, 4096, "res"),
          ("llama_qkv", 3072, 2048, "norm"), ("qwen3_qkv", 5120, 2048, "norm")]
#: (BN, warps, maxnreg or 0) per K. Registers at 1 row (ptxas, sm_90, residual epilogue): K 2048: 16 / 8 194 (128 with
#: 52 bytes spilled), 8 / 8 80, 8 / 4 150, 4 / 4 80; K 4096: 8 / 8 150 (128: 96 bytes spilled), 16 / 16 128 (52
#: spilled), 4 / 4 155. One launch's weights are 64 KB an SM at K 2048 (Llama out_proj): the next launch's programs
#: find room beside them only where a launch takes at most half the register file.
CONFIGS = {2048: [(16, 8, 128), (16, 8, 0), (8, 8, 0), (8, 4, 0), (4, 4, 0)],
           4096: [(8, 8, 128), (8, 8, 0), (16, 16, 0), (4, 4, 0)]}


@triton.jit
def pdl_point(MODE: tl.constexpr, EARLY: tl.constexpr, AT: tl.constexpr):
    """The explore GEMVs' PDL wait / release, called at AT = 1 (the kernel's start, before the weight loads) and AT = 2
    (after them). MODE 0: no PDL; MODE 1: wait at the start; MODE 2: wait after the weight loads. EARLY: release the
    next launch at the start; else right after the wait."""
    if AT == 1 and MODE > 0 and EARLY:
        gdc_launch_dependents()
    if MODE == AT:
        gdc_wait()
        if not EARLY:
            gdc_launch_dependents()


@triton.jit
def _held_kernel(x_ptr, g_ptr, w_ptr, res_ptr, out_ptr, N, eps, K: tl.constexpr, BN: tl.constexpr,
                 R: tl.constexpr, RB: tl.constexpr, MODE: tl.constexpr, EARLY: tl.constexpr, RES: tl.constexpr):
    pid = tl.program_id(0)
    rn = pid * BN + tl.arange(0, BN)
    # one [BN, K] tile and [1, K] rows of x: both take the layout 8 bf16 a thread along K, lanes and then warps
    # along K, rows repeated in each thread, so x's 16 bytes a thread meet every row's weights in registers
    rk = tl.arange(0, K)[None, :]
    pdl_point(MODE, EARLY, 1)
    w = tl.load(w_ptr + rn[:, None].to(tl.int64) * K + rk)
    if not RES:
        g = tl.load(g_ptr + rk).to(tl.float32)
    resv = ()
    if RES:
        for r in tl.static_range(R):
            resv = resv + (tl.load(res_ptr + r * N + rn).to(tl.float32),)
    pdl_point(MODE, EARLY, 2)
    for r0 in tl.static_range(0, R, RB):
        xts = ()                            # every x row of the group first: one round trip
        for j in tl.static_range(RB):
            if r0 + j < R:
                xts = xts + (tl.load(x_ptr + (r0 + j) * K + rk),)
        for j in tl.static_range(RB):
            if r0 + j < R:
                xt = xts[j].to(tl.float32)
                if RES:
                    y = tl.sum(w.to(tl.float32) * xt, axis=1) + resv[r0 + j]
                else:
                    y = tl.sum(w.to(tl.float32) * (xt * g), axis=1)
                    y = y * rstd_of(tl.sum(tl.sum(xt * xt, axis=1), axis=0), K, eps)
                tl.store(out_ptr + (r0 + j) * N + rn, y.to(tl.bfloat16))


def launch_held(x, g, w, res, out, *, bn: int, warps: int, rb: int, mode: int, early: int, res_epi: bool,
                maxnreg: int = 0):
    """out [R, N] bf16 from x [R, K], g [K] (norm), w [N, K], res [R, N] (residual) on a grid of N / bn programs."""
    n, k = w.shape
    r = x.shape[0]
    opts = dict(maxnreg=maxnreg) if maxnreg else {}
    _held_kernel[(n // bn,)](x, g, w, res, out, n, 1e-5, K=k, BN=bn, R=r, RB=rb, MODE=mode,
                             EARLY=early, RES=res_epi, num_warps=warps, launch_pdl=mode > 0, **opts)


def held(rec, deadline, reps: int, rows):
    dev = torch.device("cuda")
    for label, n, k, epi in SHAPES:
        nbytes = n * k * 2
        nc = rotation_copies(nbytes)
        gen = torch.Generator(device=dev).manual_seed(31)
        ws = [(torch.randn(n, k, generator=gen, device=dev) * k ** -0.5).to(torch.bfloat16) for _ in range(nc)]
        g = (1 + 0.1 * torch.randn(k, generator=gen, device=dev)).to(torch.bfloat16)
        for r in rows:
            x = torch.randn(r, k, generator=gen, device=dev).to(torch.bfloat16)
            res = torch.randn(r, n, generator=gen, device=dev).to(torch.bfloat16)
            out = torch.empty(r, n, device=dev, dtype=torch.bfloat16)
            want = gemv_reference(epi, x, g, res, ws[0])
            variants = [(bn, nw, mr, m, e) for bn, nw, mr in CONFIGS[k] for m, e in ((2, 0), (2, 1), (1, 0))
                        if r == 1 or (m, e) == (2, 0)]
            for rep in range(reps):
                for bn, nw, mr, mode, early in variants:
                    if time.time() > deadline:
                        return
                    rb = min(r, 4)

                    def launch(i, bn=bn, nw=nw, mr=mr, mode=mode, early=early, rb=rb):
                        launch_held(x, g, ws[i], res, out, bn=bn, warps=nw, rb=rb, mode=mode, early=early,
                                    res_epi=epi == "res", maxnreg=mr)

                    def one(bn=bn, nw=nw, mr=mr, mode=mode, early=early, rb=rb, launch=launch):
                        check_and_time(rec, launch, out, want, nc, nbytes,
                                       dict(op="held", shape=label, n=n, k=k, rows=r, rep=rep, bn=bn, warps=nw,
                                            maxnreg=mr, rb=rb, mode=mode, early=early))
                    rec.guard(f"{label}/r{r}/bn{bn}/w{nw}/mr{mr}/m{mode}/e{early}", one, op="held", rows=r)
        del ws
        torch.cuda.empty_cache()


def production(rec, deadline, reps: int, rows):
    """The production residual GEMV at the out_proj shapes, same run."""
    time_production_residual(rec, deadline, reps, rows, [(label, n, k) for label, n, k, epi in SHAPES if epi == "res"])


def main():
    explore_main([1, 6, 16], [("production", production), ("held", held)])


if __name__ == "__main__":
    main()
