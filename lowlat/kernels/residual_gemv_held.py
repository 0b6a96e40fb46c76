"""A residual GEMV whose weights stay in registers across the PDL wait (Gluon, mma.sync, sm_90, GPU only).

Matches `lowlat.reference.out_proj`'s residual add (`x + a Wo^T`), the same operation as `out_proj.residual_gemv`:

    out[m, n] = bf16( res[m, n] + sum_k a[m, k] W[n, k] )          a [M, K], W [N, K], res / out [M, N] bf16, fp32 sums

Why a second residual GEMV: the split-K plans of `out_proj.residual_gemv` pay their reduction's chain (release fence,
arrival atomic, the partials' loads, the epilogue) after the PDL wait; at Qwen3-30B-A3B's output projection (N 2048,
K 4096, 16.8 MB) that is 7.35 us per kernel at 1 row, 55% of copy bandwidth. Here every program holds its whole weight
slice in registers as mma.sync A operands, loaded BEFORE the wait, so after it one round trip (a and the residual)
precedes the mma chain and the store. `bench/explore/explore33.py` (session 24, the design study: version 2, call 4,
bench/results/session24/call4) measured this tiling at 5.65 / 6.02 / 7.68 / 14.74 us at 1 / 6 / 16 / 48 rows against
production's 7.35 / 7.39 / 7.45 / 11.33 in the same run (70.7% of copy bandwidth at 1 row): faster to 16 rows,
slower at 48 (every 16-row block pays its own a round trip and a dependent chain of K / (16 S) mma steps).

Tiling (a function of K only, never of M: a row's output is bitwise independent of M and of the other rows, row
invariant; not `residual_gemv`'s bits, so one launch uses one of the two at every width): program p takes the 16 output
features p 16 .. p 16 + 15 (the mma's m); K is cut into S = 8 slices of K / 8 columns, Q warps each holding S / Q slices
([S, 16, K / S] bf16 in the A layout, k_width 8: 16-byte loads; Q = 4 at K <= 2048, 8 at 4096, so 128 registers of
weights a thread at K 2048 and 4096); after the wait per block of RB rows (`row_block`: 16 past 8 rows at 8 warps, else
8: the mma's n once or twice; the mma's columns do not interact, so RB moves no bits) a^T as B [S, K / S, RB], the
residual as slice 0's accumulator start (its loads leave with a's), one batched mma_v2, the S slices' partial sums added
by `gl.sum` (a fixed tree), the bf16 store. Padding rows (past M) are masked to zero and never stored.

With `sum_sq_out` each program also stores, per row, the sum of its 16 bf16 outputs' squares: the statistic of the
RMSNorm that follows in N / 16 partial sums, so the next launch (the MoE router, `moe.moe_forward(sum_sq_parts=)`)
adds 128 values a row (Qwen3-30B-A3B) instead of reading the whole row before its first product.

PDL (use_pdl): the weights are loaded before `gdc_wait`, a and the residual after it, and the next launch is released
right after the wait (the production rule: the next launch may read before its wait only what two or more launches
back wrote). Without PDL the same instructions minus the wait / release.
"""

from __future__ import annotations

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import mma_v2

from lowlat.errors import StepContractError
from lowlat.kernels._attn_common import (check_tensor, gluon_sm90_reason, overlap, pdl_supported, pdl_wait_then_release,
                                         require_runnable)
from lowlat.kernels._gemv import MAX_ROWS

BLOCK_N = 16     # output features a program (the mma's m)
SLICES = 8       # K slices, summed by one fixed tree
MIN_K = 1024     # K / 8 >= 128 columns a slice (narrower slices are replicated in the mma operand layout)
MAX_K = 4096     # 16 K / (32 Q) bf16 weights a thread: 128 registers at K 4096 with 8 warps


def held_warps(k: int) -> int:
    """Warps a program for K columns: 4 up to K 2048, 8 at 4096 (explore33 version 2's best at 1-6 rows)."""
    return 4 if k <= 2048 else 8


def row_block(m: int, k: int) -> int:
    """Rows an mma block for an M-row launch over K columns: 16 past 8 rows with 8 warps (explore33: the same bits as 8,
    faster from 16 rows), else 8 (4 warps at K 2048 spill 56 bytes with 16-row blocks: sm_90 ptxas)."""
    return 16 if m > 8 and held_warps(k) == 8 else 8


def held_residual_supported(n: int, k: int, device: torch.device | str) -> str | None:
    """None where `residual_gemv_held` takes an [N, K] weight on this device, else why not: N a multiple of 16, K a
    power of two in 1024..4096, N K < 2^31, a CUDA device of compute capability >= 9.0 (not the Triton interpreter:
    Gluon kernels do not run there)."""
    dev = torch.device(device)
    if n < BLOCK_N or n % BLOCK_N:
        return f"N {n}: needs a positive multiple of {BLOCK_N} (output features a program)"
    if k & (k - 1) or not MIN_K <= k <= MAX_K:
        return f"K {k}: needs a power of two in {MIN_K}..{MAX_K} (weights held in registers)"
    if n * k >= 2 ** 31:
        return f"N x K = {n * k}: the kernel's int32 offsets need < 2^31 elements"
    return gluon_sm90_reason(dev)


@gluon.jit
def _held_residual_gemv_kernel(a_ptr, w_ptr, res_ptr, out_ptr, ss_ptr, stride_ss, M, N, K: gl.constexpr,
                               Q: gl.constexpr, S: gl.constexpr, NMB: gl.constexpr, RB: gl.constexpr,
                               USE_PDL: gl.constexpr, SS: gl.constexpr = False):
    """See the module docstring. a [M, K], w [N, K], res / out [M, N] bf16, contiguous (row strides K and N); grid
    N / 16 programs of Q warps; S K slices (a multiple of Q); NMB = ceil(M / RB) row blocks of RB (8 or 16) rows.
    SS: program p also stores ss[m, p] (fp32, row stride stride_ss) = the sum of its 16 bf16 outputs' squares of
    row m; without SS, ss_ptr / stride_ss are not read."""
    BN: gl.constexpr = 16                                                           # BLOCK_N
    MMA: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[Q, 1, 1], instr_shape=[1, 16, 8])
    LA: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=MMA, k_width=8)
    LB: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=MMA, k_width=8)
    LY: gl.constexpr = gl.SliceLayout(0, MMA)                                       # [16, RB]
    KQ: gl.constexpr = K // S
    n0 = gl.program_id(0) * BN
    aq = gl.arange(0, S, layout=gl.SliceLayout(1, gl.SliceLayout(2, LA)))
    an = gl.arange(0, BN, layout=gl.SliceLayout(0, gl.SliceLayout(2, LA)))
    ak = gl.arange(0, KQ, layout=gl.SliceLayout(0, gl.SliceLayout(1, LA)))
    woff = (gl.expand_dims(gl.expand_dims(n0 + an, 0), 2) * K
            + gl.expand_dims(gl.expand_dims(aq, 1), 2) * KQ + gl.expand_dims(gl.expand_dims(ak, 0), 1))
    bq = gl.arange(0, S, layout=gl.SliceLayout(1, gl.SliceLayout(2, LB)))
    bk = gl.arange(0, KQ, layout=gl.SliceLayout(0, gl.SliceLayout(2, LB)))
    bm = gl.arange(0, RB, layout=gl.SliceLayout(0, gl.SliceLayout(1, LB)))
    boff = (gl.expand_dims(gl.expand_dims(bm, 0), 1) * K + gl.expand_dims(gl.expand_dims(bq, 1), 2) * KQ
            + gl.expand_dims(gl.expand_dims(bk, 0), 2))
    cq = gl.arange(0, S, layout=gl.SliceLayout(1, gl.SliceLayout(2, MMA)))
    cn = n0 + gl.arange(0, BN, layout=gl.SliceLayout(0, gl.SliceLayout(2, MMA)))
    cm = gl.arange(0, RB, layout=gl.SliceLayout(0, gl.SliceLayout(1, MMA)))
    coff = gl.expand_dims(gl.expand_dims(cm, 0), 1) * N + gl.expand_dims(gl.expand_dims(cn, 0), 2)
    cq0 = gl.expand_dims(gl.expand_dims(cq == 0, 1), 2)
    ym = gl.arange(0, RB, layout=gl.SliceLayout(0, LY))
    yn = n0 + gl.arange(0, BN, layout=gl.SliceLayout(1, LY))
    w = gl.load(w_ptr + woff)                                                       # held: [S, 16, KQ] in LA
    pdl_wait_then_release(USE_PDL)
    # a loop, not unrolled: with the sums unrolled, sm_90 ptxas spilled 12 bytes at 33-48 rows (K 4096); session 27's
    # explore35 measured it no slower (Qwen3-30B-A3B's out_proj with the sums: 5.74 / 6.15 / 7.93 / 15.32 us at
    # 1 / 6 / 16 / 48 rows against 5.72 / 6.12 / 7.95 / 15.64 unrolled)
    for b in range(NMB):
        rows = b * RB + bm
        amask = gl.expand_dims(gl.expand_dims(rows < M, 0), 1) & (boff >= 0)
        ab = gl.load(a_ptr + b * RB * K + boff, mask=amask, other=0.0)
        # the residual as slice 0's accumulator start (0 for the other slices): its loads leave with a's
        cmask = cq0 & gl.expand_dims(gl.expand_dims(b * RB + cm < M, 0), 1)
        acc = gl.load(res_ptr + b * RB * N + coff, mask=cmask, other=0.0).to(gl.float32)
        acc = mma_v2(w, ab, acc)
        y = gl.sum(acc, axis=0)                                                     # res + the slices' sums
        yrow = b * RB + ym
        ooff = gl.expand_dims(yrow, 0) * N + gl.expand_dims(yn, 1)
        omask = gl.expand_dims(yrow < M, 0) & gl.expand_dims(yn >= 0, 1)
        gl.store(out_ptr + ooff, y.to(gl.bfloat16), mask=omask)
        if SS:                                        # the 16 bf16 outputs' squares, as the next RMSNorm reads them
            yf = y.to(gl.bfloat16).to(gl.float32)
            gl.store(ss_ptr + yrow * stride_ss + gl.program_id(0), gl.sum(yf * yf, axis=0), mask=yrow < M)


def residual_gemv_held(a: torch.Tensor, w: torch.Tensor, residual: torch.Tensor, *,
                       out: torch.Tensor | None = None, sum_sq_out: torch.Tensor | None = None,
                       use_pdl: bool = False) -> torch.Tensor:
    """out = residual + a W^T (bf16; fp32 sums, one rounding), the weights held in registers across the PDL wait.

    Matches `lowlat.reference.out_proj`'s residual add within the numerics policy (lowlat/numerics.py); row invariant,
    deterministic; not `out_proj.residual_gemv`'s bits (another summation order).

    Parameters:
        a         [M, K] bf16 contiguous (M = 1..48): the attention output (or any GEMV input)
        w         [N, K] bf16 contiguous (`held_residual_supported(N, K, device)`: N % 16 == 0, K a power of two in
                  1024..4096, sm_90)
        residual  [M, N] bf16 contiguous
        out       optional [M, N] bf16 contiguous output; may be `residual` itself (a program reads its residual tile
                  before it stores that tile, and no program reads another's), must not overlap a or w
        sum_sq_out optional [M, N / 16] fp32, stride 1 along its last dim: also store, for every row m < M and
                  every group p of 16 output features, sum_sq_out[m, p] = sum_{n = 16 p .. 16 p + 15} float(out[m, n])^2
                  (fp32, the squares of the bf16 outputs added in one fixed tree: bitwise the same for any M). The
                  next RMSNorm's statistic in N / 16 partial sums, so its launch (`moe.moe_forward(sum_sq_parts=)`)
                  need not read whole rows of out before it can start. Must not overlap a, w, residual or out.
        use_pdl   wait for the previous launch (gdc_wait) after the weight loads, release the next right after it
                  (Hopper; off where `pdl_supported` says no)
    Returns: out [M, N] bf16, every row < M written (and sum_sq_out's M rows, when given).
    Raises: StepContractError naming the offending tensor / value before anything is launched (out allocated at most):
        a tensor of another dtype / rank / shape / device or not contiguous, M outside 1..48, out overlapping a or w,
        sum_sq_out overlapping a, w, residual or out, then a shape or device the kernel does not take
        (`held_residual_supported`'s reason).
    Source: session 24's explore33 (bench/explore/explore33.py), the "swap AB" small-batch layout (weights on the
    mma's M side, the few rows on its N side).
    """
    require_runnable("a", a); require_runnable("w", w)
    check_tensor("a", a, dtype=torch.bfloat16, ndim=2)
    dev = a.device
    m, k = a.shape
    if not 1 <= m <= MAX_ROWS:
        raise StepContractError(f"a has M={m} rows; the held residual GEMV takes 1..{MAX_ROWS}")
    check_tensor("w", w, dtype=torch.bfloat16, ndim=2, shape=(None, ("K", k)), device=dev)
    n = w.shape[0]
    check_tensor("residual", residual, dtype=torch.bfloat16, ndim=2, shape=(("M", m), ("N", n)), device=dev)
    if out is None:
        out = torch.empty((m, n), dtype=torch.bfloat16, device=dev)
    check_tensor("out", out, dtype=torch.bfloat16, ndim=2, shape=(("M", m), ("N", n)), device=dev)
    for name, t in (("a", a), ("w", w), ("residual", residual), ("out", out)):
        if not t.is_contiguous():
            raise StepContractError(f"{name} must be contiguous (the kernel takes its row stride to be its width), "
                                    f"got strides {t.stride()}")
    for name, t in (("a", a), ("w", w)):
        if overlap(out, t):
            raise StepContractError(f"out overlaps {name}: the kernel would read what it writes")
    if sum_sq_out is not None and n % BLOCK_N == 0:     # else held_residual_supported names N below
        check_tensor("sum_sq_out", sum_sq_out, dtype=torch.float32, ndim=2, shape=(("M", m), ("N / 16", n // BLOCK_N)),
                     device=dev)
        if m > 1 and sum_sq_out.stride(0) < n // BLOCK_N:
            raise StepContractError(f"sum_sq_out's rows overlap (row stride {sum_sq_out.stride(0)} < N / 16 = "
                                    f"{n // BLOCK_N})")
        for name, t in (("a", a), ("w", w), ("residual", residual), ("out", out)):
            if overlap(sum_sq_out, t):
                raise StepContractError(f"sum_sq_out overlaps {name}: the sums need a buffer of their own")
    why = held_residual_supported(n, k, dev)
    if why is not None:
        raise StepContractError(f"the held residual GEMV cannot run here: {why}")
    pdl = bool(use_pdl) and pdl_supported(dev)
    q, rb = held_warps(k), row_block(m, k)
    ss = sum_sq_out is not None
    _held_residual_gemv_kernel[(n // BLOCK_N,)](a, w, residual, out, sum_sq_out if ss else out,
                                           sum_sq_out.stride(0) if ss else 0, m, n, K=k, Q=q, S=SLICES,
                                           NMB=triton.cdiv(m, rb), RB=rb, USE_PDL=pdl, SS=ss, num_warps=q,
                                           launch_pdl=pdl)
    return out
