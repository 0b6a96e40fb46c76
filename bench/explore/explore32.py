"""Session 23: explore31's lesson (no split-K, weights held across the wait, one round trip after it) with tensor
cores, so that one kernel can serve every width (1-48 rows) with the same per-row arithmetic (row invariance).

explore31's FMA kernel reached 71-78% of copy bandwidth at 1 row (dependents released at the start) but costs
5.4 / 10.9 us at 6 / 16 rows (Llama out_proj; the production residual GEMV 4.8 / 4.9), and its bits differ from
the MMA plans', so it cannot serve 1 row alone. Here each program owns BN output columns and all of K, split into
S slices inside the program (a batched `tl.dot` [S, BN, KS] x [S, KS, RP]: Triton gives each warp a slice, mma.sync,
no wgmma), the slices' fp32 results summed over S once at the end (in the program: no partials in memory, no
arrival, no finisher):

    y[r, n] = res[r, n] + sum_s sum_{k in slice s} W[n, k] x[r, k]

Weights are loaded before `gdc_wait` (MODE 2) or after it (MODE 1); x after it, 16 rows at a time (masked), one
round trip a row block. EARLY: dependents released at the start / right after the wait. Timed as explore31
(PDL-chained over rotating cold copies) beside the production residual GEMV; each width's outputs checked against
float64 and, row by row, bit for bit against the 1-row launch's (row invariance).

    python bench/explore/explore32.py --out $OUT/explore32.json [--budget-s 240] [--rows 1 6 16 48]
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))          # _common, also when imported as explore.explore32
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from _common import check_and_time, explore_main, gemv_reference, time_production_residual  # noqa: E402

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from explore31 import pdl_point  # noqa: E402

from lowlat.benchmarking import rotation_copies  # noqa: E402
from lowlat.kernels._gemv import interpreting  # noqa: E402

#: (label, N, K): Llama-3.2-1B out_proj 8.4 MB. (Qwen3-30B-A3B's K 4096 does not fit: a program stages its whole
#: weight slice and a 16-row x block in shared memory, 256 KB at BN 16.)
SHAPES = [("llama_out", 2048, 2048)]
#: (BN, S, warps); sm_90 (ptxas, num_stages 1): 16 / 4 / 4 168 registers, 128 KB shared; 16 / 8 / 8 110, 128 KB;
#: 16 / 16 / 16 84, 128 KB; 32 / 8 / 8 (192 KB shared): one program an SM in every case
CONFIGS = [(16, 4, 4), (16, 8, 8), (16, 16, 16), (32, 8, 8)]


@triton.jit
def _held_mma_kernel(x_ptr, w_ptr, res_ptr, out_ptr, M, N, K: tl.constexpr, BN: tl.constexpr, S: tl.constexpr,
                     MODE: tl.constexpr, EARLY: tl.constexpr, NMB: tl.constexpr,
                     UPCAST: tl.constexpr = False):
    KS: tl.constexpr = K // S
    RB: tl.constexpr = 16                                 # rows a block (the smallest tl.dot N)
    pid = tl.program_id(0)
    rs = tl.arange(0, S)[:, None, None]
    rn = pid * BN + tl.arange(0, BN)
    rk = tl.arange(0, KS)
    rr = tl.arange(0, RB)
    pdl_point(MODE, EARLY, 1)
    # W [S, BN, KS]: slice s of row n is W[n, s * KS : (s + 1) * KS]
    w = tl.load(w_ptr + rn[None, :, None].to(tl.int64) * K + rs * KS + rk[None, None, :])
    pdl_point(MODE, EARLY, 2)
    for mb in range(NMB):                                 # a loop (not unrolled): one x block in shared memory
        rows = mb * RB + rr
        # x^T [S, KS, RB]: column r of slice s is x[m0 + r, s * KS : (s + 1) * KS] (rows past M read as 0)
        xt = tl.load(x_ptr + rows[None, None, :] * K + rs * KS + rk[None, :, None], mask=(rows < M)[None, None, :],
                     other=0.0)
        res = tl.load(res_ptr + rows[None, :] * N + rn[:, None], mask=(rows < M)[None, :], other=0.0)
        if UPCAST:                                        # the interpreter keeps bf16 as raw bits: dot in fp32
            acc = tl.dot(w.to(tl.float32), xt.to(tl.float32))
        else:
            acc = tl.dot(w, xt)                           # [S, BN, RB] fp32, one K slice a warp
        y = tl.sum(acc, axis=0) + res.to(tl.float32)      # [BN, RB]
        tl.store(out_ptr + rows[None, :] * N + rn[:, None], y.to(tl.bfloat16), mask=(rows < M)[None, :])


def launch_held_mma(x, w, res, out, *, bn: int, s: int, warps: int, mode: int, early: int):
    """out [M, N] bf16 = res + x W^T from x [M, K], w [N, K], res [M, N] on N / bn programs, rows 16 at a time."""
    n, k = w.shape
    m = x.shape[0]
    _held_mma_kernel[(n // bn,)](x, w, res, out, m, n, K=k, BN=bn, S=s, MODE=mode, EARLY=early,
                                 NMB=triton.cdiv(m, 16), UPCAST=interpreting(), num_warps=warps, num_stages=1,
                                 launch_pdl=mode > 0)


def held_mma(rec, deadline, reps: int, rows):
    dev = torch.device("cuda")
    for label, n, k in SHAPES:
        nbytes = n * k * 2
        nc = rotation_copies(nbytes)
        gen = torch.Generator(device=dev).manual_seed(32)
        ws = [(torch.randn(n, k, generator=gen, device=dev) * k ** -0.5).to(torch.bfloat16) for _ in range(nc)]
        xall = torch.randn(max(rows), k, generator=gen, device=dev).to(torch.bfloat16)
        rall = torch.randn(max(rows), n, generator=gen, device=dev).to(torch.bfloat16)
        one_row = {}
        for rep in range(reps):
            for bn, s, nw in CONFIGS:
                for r in rows:
                    x, res = xall[:r].contiguous(), rall[:r].contiguous()
                    out = torch.empty(r, n, device=dev, dtype=torch.bfloat16)
                    want = gemv_reference("res", x, None, res, ws[0])
                    for mode, early in ((2, 0), (2, 1), (1, 0)):
                        if time.time() > deadline:
                            return

                        def launch(i, bn=bn, s=s, nw=nw, mode=mode, early=early, x=x, res=res, out=out):
                            launch_held_mma(x, ws[i], res, out, bn=bn, s=s, warps=nw, mode=mode, early=early)

                        def one(bn=bn, s=s, nw=nw, mode=mode, early=early, r=r, launch=launch, out=out, want=want):
                            check_and_time(rec, launch, out, want, nc, nbytes,
                                           dict(op="held_mma", shape=label, n=n, k=k, rows=r, rep=rep, bn=bn, s=s,
                                                warps=nw, mode=mode, early=early))
                            # row invariance: row 0 at r > 1 rows equal, bit for bit, to the same row launched alone
                            # (the 1-row launch of the same tiling and mode)
                            launch(0)
                            torch.cuda.synchronize()
                            key = (bn, s, nw, mode, early)
                            if r == 1:
                                one_row.setdefault(key, out.clone())
                                return
                            firsts = one_row.get(key)
                            same = None if firsts is None else bool(torch.equal(out[:1], firsts))
                            rec(dict(op="held_mma_bits", shape=label, rows=r, bn=bn, s=s, warps=nw, mode=mode,
                                     early=early, row0_equal_to_1_row=same))
                        rec.guard(f"{label}/r{r}/bn{bn}/s{s}/w{nw}/m{mode}/e{early}", one, op="held_mma", rows=r)
        del ws
        torch.cuda.empty_cache()


def production(rec, deadline, reps: int, rows):
    """The production residual GEMV at the out_proj shapes, same run."""
    time_production_residual(rec, deadline, reps, rows, SHAPES)


def main():
    explore_main([1, 6, 16, 48], [("production", production), ("held_mma", held_mma)])


if __name__ == "__main__":
    main()
