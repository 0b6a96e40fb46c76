"""Session 24: a residual GEMV on tensor cores whose weights stay in REGISTERS across the PDL wait (Gluon).

NOTES "Left" (session 23) named it: explore31 (FMA, weights held in registers, one round trip after the wait)
reaches 71-78% of copy bandwidth at 1 row but is slow at 6-48 rows and its bits are not the MMA plans'; explore32
(the same with a batched `tl.dot`) is row invariant but Triton stages its weights through 128 KB of shared memory
a program. Gluon (Triton 3.6's explicit-layout dialect) can load the weights from global memory straight into the
mma.sync A-operand layout and keep them there, so nothing goes through shared memory but x's tiny B operand
fragments (loaded straight into their layout too) and one cross-warp sum.

Per program: BN = 16 output features (the mma's m), Q warps, K cut into S slices (S a multiple of Q; version 1, call
3: S = Q), slice s = W[n0:n0+16, s KQ:(s+1) KQ] (KQ = K / S) held in registers as A [S, BN, KQ] (batched mma_v2,
instruction [1, 16, 8], batch = slice: S / Q independent chains a warp). After the wait, per block of RB = 8 or 16
rows (the mma's n, once or twice): x^T as B [S, KQ, RB] (x[m, s KQ + k], rows past M masked to 0), acc [S, BN, RB] =
mma_v2(A, B, C) (KQ / 16 instructions a slice, in K order; C = the residual for slice 0, 0 for the others), y =
sum_s acc[s] (the slices' partial sums in one fixed order). The mma's columns do not interact, so RB does not move
a row's bits; S does. The same instructions for every M (row blocks of 8, masked rows zero): a row's output is bitwise
independent of M (row invariant), but not the production plans' bits, so it could only replace a launch's kernel at
every width.

    y[r, n] = res[r, n] + sum_k x[r, k] W[n, k]

Production's bits (written after call 4, not yet run): with k_width 2 (contiguous k16 mma steps, as production's
mma.sync / wgmma take them), S = the production plan's split and PROD (every slice's chain from zero, the slices
summed in order from zero, then + residual: `out_proj._residual_gemv_kernel`'s order), the output may equal the
production residual GEMV's bit for bit; the run records it per tiling and width (op "held_mma_bits",
same_bits_as_production). If it does, this kernel could serve the widths where it is faster without breaking row
invariance, production the others.

MODE 2: weights loaded before the wait (MODE 1: after it); EARLY 1: dependents released at the start, else right after
the wait (the production rule): explore31's `pdl_point` (a triton.jit function; Gluon kernels call it too). Timed as
explore31 (PDL-chained over rotating cold copies, `_common.check_and_time`) beside the production residual GEMV in the
same run. Registers a thread: BN KQ / 64 for the weights (64 at Llama's out_proj with Q 8, K 2048), KQ RB / 64 for one
x block.

    python bench/explore/explore33.py --out $OUT/explore33.json [--budget-s 240] [--rows 1 6 16 48]
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))          # _common, also when imported as explore.explore33
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from _common import check_and_time, explore_main, gemv_reference, time_production_residual  # noqa: E402
from explore31 import pdl_point  # noqa: E402

import torch  # noqa: E402
from triton.experimental import gluon  # noqa: E402
from triton.experimental.gluon import language as gl  # noqa: E402
from triton.experimental.gluon.language.nvidia.ampere import mma_v2  # noqa: E402

from lowlat.benchmarking import rotation_copies  # noqa: E402
from lowlat.kernels._gemv import _pow2, plan_gemv  # noqa: E402
from lowlat.kernels.out_proj import residual_gemv  # noqa: E402

BN = 16        # output features a program (the mma's m)
RB = 8         # rows a block (the mma's n)
#: (label, N, K): Llama-3.2-1B out_proj 8.4 MB, Qwen3-30B-A3B out_proj 16.8 MB
SHAPES = [("llama_out", 2048, 2048), ("qwen3_out", 2048, 4096)]
#: (warps, K slices, rows a block, k_width, production's order) per K; BN K / (32 warps) weight elements a thread.
#: Call 3 ran one slice a warp, 8 rows a block, k_width 8 (version 1): best warps 4 at K 2048, 8 at K 4096; 16 warps
#: slower everywhere. Call 4 (version 2, these five first of each list) best: 4 / 8 at K 2048, 8 / 8 at K 4096. The
#: last two of each list are session 24's candidates for production's bits (slices = the production plan's split 8,
#: k_width 2, production's summation order), not yet run
CONFIGS = {2048: [(4, 4, 8, 8, False), (8, 8, 8, 8, False), (4, 8, 8, 8, False), (8, 16, 8, 8, False),
                  (8, 8, 16, 8, False), (8, 16, 16, 8, False), (4, 8, 8, 2, True), (8, 8, 8, 2, True)],
           4096: [(8, 8, 8, 8, False), (8, 16, 8, 8, False), (8, 8, 16, 8, False), (8, 16, 16, 8, False),
                  (16, 32, 8, 8, False), (8, 8, 8, 2, True), (8, 8, 16, 2, True)]}


@gluon.jit
def _held_mma_kernel(x_ptr, w_ptr, res_ptr, out_ptr, M, N, K: gl.constexpr, Q: gl.constexpr,
                     NMB: gl.constexpr, MODE: gl.constexpr, EARLY: gl.constexpr, S: gl.constexpr = 0,
                     RB: gl.constexpr = 8, KW: gl.constexpr = 8, PROD: gl.constexpr = False):
    """See the module docstring. x [M, K], w [N, K], res / out [M, N] bf16, contiguous; grid N / 16 programs of Q warps;
    S K slices (0: S = Q; a multiple of Q: S / Q independent mma chains a warp), RB rows a block (8 or 16: the
    mma's n, once or twice), NMB = ceil(M / RB) row blocks (a launch constexpr). KW: the operands' k_width (8: 16-byte
    loads, each mma step over a permuted set of 16 k; 2: contiguous k16 steps, 4-byte loads). PROD: production's
    arithmetic order (`out_proj._residual_gemv_kernel` with split S): every slice's chain from zero, the slices
    summed in order 0..S-1 from zero (through shared memory), then + residual; else the residual starts slice 0's
    chain and the slices are summed as a tree (`gl.sum`)."""
    SL: gl.constexpr = Q if S == 0 else S
    MMA: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[Q, 1, 1], instr_shape=[1, 16, 8])
    LA: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=MMA, k_width=KW)
    LB: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=MMA, k_width=KW)
    LY: gl.constexpr = gl.SliceLayout(0, MMA)                                       # [BN, RB]
    KQ: gl.constexpr = K // SL
    n0 = gl.program_id(0) * 16
    aq = gl.arange(0, SL, layout=gl.SliceLayout(1, gl.SliceLayout(2, LA)))
    an = gl.arange(0, 16, layout=gl.SliceLayout(0, gl.SliceLayout(2, LA)))
    ak = gl.arange(0, KQ, layout=gl.SliceLayout(0, gl.SliceLayout(1, LA)))
    aoff = (gl.expand_dims(gl.expand_dims(n0 + an, 0), 2) * K + gl.expand_dims(gl.expand_dims(aq, 1), 2) * KQ
            + gl.expand_dims(gl.expand_dims(ak, 0), 1))
    bq = gl.arange(0, SL, layout=gl.SliceLayout(1, gl.SliceLayout(2, LB)))
    bk = gl.arange(0, KQ, layout=gl.SliceLayout(0, gl.SliceLayout(2, LB)))
    bm = gl.arange(0, RB, layout=gl.SliceLayout(0, gl.SliceLayout(1, LB)))
    boff = (gl.expand_dims(gl.expand_dims(bm, 0), 1) * K + gl.expand_dims(gl.expand_dims(bq, 1), 2) * KQ
            + gl.expand_dims(gl.expand_dims(bk, 0), 2))
    ym = gl.arange(0, RB, layout=gl.SliceLayout(0, LY))
    yn = n0 + gl.arange(0, 16, layout=gl.SliceLayout(1, LY))
    # the residual as slice 0's accumulator start ([S, 16, RB] in the mma layout, 0 for the other slices): needed
    # before the first mma, so its loads go out with x's (one round trip after the wait; added last, ptxas issued
    # them after the mma chain: a second round trip)
    cq = gl.arange(0, SL, layout=gl.SliceLayout(1, gl.SliceLayout(2, MMA)))
    cn = n0 + gl.arange(0, 16, layout=gl.SliceLayout(0, gl.SliceLayout(2, MMA)))
    cm = gl.arange(0, RB, layout=gl.SliceLayout(0, gl.SliceLayout(1, MMA)))
    coff = gl.expand_dims(gl.expand_dims(cm, 0), 1) * N + gl.expand_dims(gl.expand_dims(cn, 0), 2)
    cq0 = gl.expand_dims(gl.expand_dims(cq == 0, 1), 2)
    if PROD:   # the slices' partials, summed one slice at a time in order (production's `sum_partials`)
        LE3: gl.constexpr = gl.BlockedLayout([1, 1, 1], [1, 4, 8], [1, Q, 1], [2, 1, 0])    # one slice [1, 16, RB]
        LE: gl.constexpr = gl.SliceLayout(0, LE3)                                   # [16, RB] epilogue tiles
        part = gl.allocate_shared_memory(gl.float32, [SL, 16, RB], gl.SwizzledSharedLayout(1, 1, 1, [2, 1, 0]))
        em = gl.arange(0, RB, layout=gl.SliceLayout(0, LE))
        en = n0 + gl.arange(0, 16, layout=gl.SliceLayout(1, LE))
    pdl_point(MODE, EARLY, 1)
    w = gl.load(w_ptr + aoff)                                                       # held: [S, 16, KQ] in LA
    pdl_point(MODE, EARLY, 2)
    for b in gl.static_range(NMB):
        rows = b * RB + bm
        bmask = gl.expand_dims(gl.expand_dims(rows < M, 0), 1) & (boff >= 0)
        xb = gl.load(x_ptr + b * RB * K + boff, mask=bmask, other=0.0)
        if PROD:
            erow = b * RB + em
            eoff = gl.expand_dims(erow, 0) * N + gl.expand_dims(en, 1)
            emask = gl.expand_dims(erow < M, 0) & gl.expand_dims(en >= 0, 1)
            res = gl.load(res_ptr + eoff, mask=emask, other=0.0).to(gl.float32)
            acc = mma_v2(w, xb, gl.zeros([SL, 16, RB], gl.float32, MMA))
            if b > 0:
                gl.thread_barrier()                                                 # the last block's reads done
            part.store(acc)
            gl.thread_barrier()
            tot = gl.zeros([1, 16, RB], gl.float32, LE3)
            for sl in gl.static_range(SL):
                tot += part.slice(sl, 1, dim=0).load(LE3)
            y = gl.sum(tot, axis=0) + res                                           # (a size-1 axis: exact)
            gl.store(out_ptr + eoff, y.to(gl.bfloat16), mask=emask)
        else:
            cmask = cq0 & gl.expand_dims(gl.expand_dims(b * RB + cm < M, 0), 1)
            acc = gl.load(res_ptr + b * RB * N + coff, mask=cmask, other=0.0).to(gl.float32)
            acc = mma_v2(w, xb, acc)
            y = gl.sum(acc, axis=0)                                                 # res + the slices' sums
            yrow = b * RB + ym
            ooff = gl.expand_dims(yrow, 0) * N + gl.expand_dims(yn, 1)
            omask = gl.expand_dims(yrow < M, 0) & gl.expand_dims(yn >= 0, 1)
            gl.store(out_ptr + ooff, y.to(gl.bfloat16), mask=omask)


def launch_held_mma(x, w, res, out, *, warps: int, mode: int, early: int, slices: int = 0, rb: int = 8,
                    k_width: int = 8, prod: bool = False):
    """out [M, N] = res + x w^T on a grid of N / 16 programs of `warps` warps, K cut into `slices` (0: one a warp;
    a multiple of warps) slices of K / slices columns, rows in blocks of rb (8 or 16), operands of k_width 8 or 2,
    with production's summation order if prod (the kernel's KW / PROD). x [M, K], w [N, K], res / out [M, N]:
    contiguous bf16 on one CUDA device (the kernel takes the row strides to be K and N). mode 0 / 1 / 2 and early 0 / 1
    as explore31's `pdl_point`.

    Raises ValueError (one message per condition, naming the value) for: M outside 1..48; warps or slices not a power
    of two, or slices not a multiple of warps; N not a multiple of 16; K / slices not a power-of-two multiple of 16; rb
    not 8 / 16; k_width not 2 / 8; mode / early out of range; a tensor of another shape, dtype or device, or not
    contiguous."""
    n, k = w.shape
    m = x.shape[0]
    sl = slices or warps
    checks = [
        (1 <= m <= 48, f"M {m} must lie in 1..48"),
        (_pow2(warps), f"warps {warps} must be a power of two"),
        (_pow2(sl) and sl % warps == 0, f"slices {sl} must be a power of two and a multiple of {warps} warps"),
        (n % BN == 0, f"N {n} must divide by {BN}"),
        (k % sl == 0 and _pow2(k // sl) and k // sl >= 16,
         f"K {k} must be {sl} slices of a power of two >= 16 columns"),
        (rb in (8, 16), f"rb {rb} must be 8 or 16"),
        (k_width in (2, 8), f"k_width {k_width} must be 2 or 8"),
        (mode in (0, 1, 2) and early in (0, 1), f"mode {mode} must be 0 / 1 / 2 and early {early} 0 / 1"),
    ]
    for t, name, shape in ((x, "x", (m, k)), (w, "w", (n, k)), (res, "res", (m, n)), (out, "out", (m, n))):
        checks.append((tuple(t.shape) == shape and t.dtype == torch.bfloat16 and t.is_contiguous()
                       and t.device == w.device,
                       f"{name} {tuple(t.shape)} {t.dtype} on {t.device} must be a contiguous bf16 {shape} on "
                       f"{w.device}"))
    for ok, msg in checks:
        if not ok:
            raise ValueError(f"held mma GEMV: {msg}")
    _held_mma_kernel[(n // BN,)](x, w, res, out, m, n, K=k, Q=warps, NMB=(m + rb - 1) // rb, MODE=mode,
                                 EARLY=early, S=slices, RB=rb, KW=k_width, PROD=prod, num_warps=warps,
                                 launch_pdl=mode > 0)


def held_mma(rec, deadline, reps: int, rows):
    dev = torch.device("cuda")
    for label, n, k in SHAPES:
        nbytes = n * k * 2
        nc = rotation_copies(nbytes)
        gen = torch.Generator(device=dev).manual_seed(33)
        ws = [(torch.randn(n, k, generator=gen, device=dev) * k ** -0.5).to(torch.bfloat16) for _ in range(nc)]
        for r in rows:
            x = torch.randn(r, k, generator=gen, device=dev).to(torch.bfloat16)
            res = torch.randn(r, n, generator=gen, device=dev).to(torch.bfloat16)
            out = torch.empty(r, n, device=dev, dtype=torch.bfloat16)
            want = gemv_reference("res", x, None, res, ws[0])
            prod_out = residual_gemv(x, ws[0], res, plan=plan_gemv(n, k, kind="residual"))   # production's bits
            variants = [(q, sl, rb, kw, pr, m, e) for q, sl, rb, kw, pr in CONFIGS[k] for m, e in ((2, 0), (2, 1))
                        if e == 0 or r == 1]
            for rep in range(reps):
                for q, sl, rb, kw, pr, mode, early in variants:
                    if time.time() > deadline:
                        return

                    def launch(i, q=q, sl=sl, rb=rb, kw=kw, pr=pr, mode=mode, early=early):
                        launch_held_mma(x, ws[i], res, out, warps=q, mode=mode, early=early, slices=sl, rb=rb,
                                        k_width=kw, prod=pr)

                    def one(q=q, sl=sl, rb=rb, kw=kw, pr=pr, mode=mode, early=early, launch=launch):
                        check_and_time(rec, launch, out, want, nc, nbytes,
                                       dict(op="held_mma", shape=label, n=n, k=k, rows=r, rep=rep, warps=q,
                                            slices=sl, rb=rb, k_width=kw, prod=pr, mode=mode, early=early))
                        launch(0)                   # copy 0 again: its output beside production's
                        torch.cuda.synchronize()
                        rec(dict(op="held_mma_bits", shape=label, rows=r, warps=q, slices=sl, rb=rb, k_width=kw,
                                 prod=pr, mode=mode, early=early,
                                 same_bits_as_production=bool(torch.equal(out, prod_out))))
                    rec.guard(f"{label}/r{r}/w{q}/s{sl}/rb{rb}/kw{kw}/p{pr}/m{mode}/e{early}", one, op="held_mma",
                              rows=r)
        del ws
        torch.cuda.empty_cache()


def production(rec, deadline, reps: int, rows):
    """The production residual GEMV at the same shapes, same run (its dependents released after its wait)."""
    time_production_residual(rec, deadline, reps, rows, SHAPES)


def main():
    explore_main([1, 6, 16, 48], [("production", production), ("held_mma", held_mma)])


if __name__ == "__main__":
    main()
