"""Experiment (session 11, issue 3): session 7's shared-memory-resident GEMV (`smem_gemv.py`) on TENSOR CORES, one
arithmetic path for every row count (so a row's output is bitwise the same whatever M), the first step session 7
named for taking it to production.

Per program: BN = 16 whole output rows, no split-K, no cross-program step. The K range is cut into Q = 4
quarters, one per warp, computed as a BATCHED mma.sync (mma_v2, instruction [1, 16, 8]: batch = quarter):

    acc[q, n, m] = sum_k W[n0 + n, q K/4 + k] x[m0 + m, q K/4 + k]          A [Q, BN, BK], B [Q, BK, RB]

and y[m, n] = sum_q acc[q, n, m] in a fixed order. The weight slice [BN, K] is read by TMA as the permuted
3-d view [Q, N, K/Q] (strides [K/Q, K, 1]) in NS = K / (Q BK) boxes [Q, BN, BK], one mbarrier each, all
issued before `gdc_wait` (MODE 2), and stays in shared memory for the whole launch. Rows go in blocks of
RB = 8 (the mma's n): for each block, x [RB, K] (times the norm weight in the "norm" epilogue, with each row's
sum of squares) is staged once to shared memory, then per box one A load + one B load + the mma (the A load
compiles to ld.shared, not ldmatrix, from the 3-d swizzled tile: a reason it is slow).
Epilogues as smem_gemv's: "res" y = res + x W^T, "norm" y = rstd(x) ((x g) W^T).

Shared memory per program: BN K 2 bytes of weights + RB K 2 of activations: 64 + 32 KB at K 2048, 128 + 64
KB at K 4096. Gluon only (no CPU interpreter): the GPU tests in test_explore_kernels check it.
"""
from __future__ import annotations

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy, mma_v2
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

Q = 4          # K quarters = warps
BN = 16        # output rows per program (the mma's m)
RB = 8         # rows per block (the mma's n)
BK = 64        # columns per box (128 bytes: one 128-byte swizzle row)

# the kernels' tile sizes and layouts (gl.constexpr, so both kernels read the same ones)
_Q, _BN, _RB, _BK = gl.constexpr(Q), gl.constexpr(BN), gl.constexpr(RB), gl.constexpr(BK)
_MMA = gl.constexpr(gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[Q, 1, 1], instr_shape=[1, 16, 8]))
_LA = gl.constexpr(gl.DotOperandLayout(operand_index=0, parent=_MMA.value, k_width=8))
_LB = gl.constexpr(gl.DotOperandLayout(operand_index=1, parent=_MMA.value, k_width=8))
_LY = gl.constexpr(gl.SliceLayout(0, _MMA.value))                                  # [BN, RB]
_LX = gl.constexpr(gl.BlockedLayout([1, 1, 8], [1, 1, 32], [1, Q, 1], [2, 1, 0]))  # x staging [RB, Q, KC]: 8 columns a thread
_SX = gl.constexpr(gl.SwizzledSharedLayout(1, 1, 1, [2, 1, 0]))                    # x in shared memory [RB, Q, KQ]


@gluon.jit
def _load_weight_slice(w_desc, w_smem, bars, n0, NS: gl.constexpr, BK: gl.constexpr, MODE: gl.constexpr):
    """Both kernels' start: one mbarrier per box, the PDL hand-off (MODE 1: wait, then let the next launch
    start, so the boxes load after the wait; MODE 2: let it start, the caller waits later, so the boxes load
    before the wait), then the NS TMA boxes [Q, BN, BK] of this program's slice, all in flight at once."""
    for s in gl.static_range(NS):
        mbarrier.init(bars.index(s), count=1)
    if MODE == 1:
        gdc_wait()
        gdc_launch_dependents()
    if MODE == 2:
        gdc_launch_dependents()
    for s in gl.static_range(NS):
        mbarrier.expect(bars.index(s), w_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(w_desc, [0, n0, s * BK], bars.index(s), w_smem.index(s))


@gluon.jit
def _x_tile_index(KQ: gl.constexpr, KC: gl.constexpr):
    """rm [RB] (a row block's rows) and col [1, Q, KC] (quarter q's first KC columns: q KQ + k), in x's layout."""
    rm = gl.arange(0, _RB, layout=gl.SliceLayout(1, gl.SliceLayout(2, _LX)))
    rq = gl.arange(0, _Q, layout=gl.SliceLayout(0, gl.SliceLayout(2, _LX)))
    rk = gl.arange(0, KC, layout=gl.SliceLayout(0, gl.SliceLayout(1, _LX)))
    return rm, gl.expand_dims(gl.expand_dims(rq, 0), 2) * KQ + gl.expand_dims(gl.expand_dims(rk, 0), 1)


@gluon.jit
def _x_rows(rows, M, stride_x, col):
    """Offsets [RB, Q, KC] of rows `rows` of x at columns `col`, and their mask (rows >= M are not read)."""
    mask = gl.expand_dims(gl.expand_dims(rows < M, 1), 2) & (col >= 0)
    return gl.expand_dims(gl.expand_dims(rows, 1), 2) * stride_x + col, mask


@gluon.jit
def _mma_smem_gemv_kernel(w_desc, x_ptr, g_ptr, res_ptr, out_ptr, M, N, stride_x, eps,
                          K: gl.constexpr, NMB: gl.constexpr, MODE: gl.constexpr, RES: gl.constexpr,
                          KC: gl.constexpr):
    """See the module docstring. NMB row blocks of RB (a launch constexpr: ceil(M / RB)); KC columns of a
    quarter staged per step of the x staging loop."""
    KQ: gl.constexpr = K // _Q
    NS: gl.constexpr = KQ // _BK
    pid = gl.program_id(0)
    n0 = pid * _BN
    w_smem = gl.allocate_shared_memory(gl.bfloat16, [NS, _Q, _BN, _BK], w_desc.layout)
    x_smem = gl.allocate_shared_memory(gl.bfloat16, [_RB, _Q, KQ], _SX)
    bars = gl.allocate_shared_memory(gl.int64, [NS, 1], mbarrier.MBarrierLayout())
    _load_weight_slice(w_desc, w_smem, bars, n0, NS, _BK, MODE)
    rm, col = _x_tile_index(KQ, KC)
    if MODE == 2:
        gdc_wait()
    ym = gl.arange(0, _RB, layout=gl.SliceLayout(0, _LY))
    yn = n0 + gl.arange(0, _BN, layout=gl.SliceLayout(1, _LY))
    for b in gl.static_range(NMB):
        xoff, rmask = _x_rows(b * _RB + rm, M, stride_x, col)
        ss = gl.zeros([_RB], gl.float32, gl.SliceLayout(1, gl.SliceLayout(2, _LX)))
        for c in gl.static_range(KQ // KC):
            xc = gl.load(x_ptr + xoff + c * KC, mask=rmask, other=0.0)
            if not RES:
                xf = xc.to(gl.float32)
                ss += gl.sum(gl.sum(xf * xf, axis=2), axis=1)
                gc = gl.load(g_ptr + col + c * KC).to(gl.float32)
                xc = (xf * gc).to(gl.bfloat16)
            x_smem.slice(c * KC, KC, dim=2).store(xc)
        gl.thread_barrier()
        acc = gl.zeros([_Q, _BN, _RB], gl.float32, _MMA)
        for s in gl.static_range(NS):
            if b == 0:
                mbarrier.wait(bars.index(s), 0)
            a = w_smem.index(s).load(_LA)
            xb = x_smem.slice(s * _BK, _BK, dim=2).permute((1, 2, 0)).load(_LB)
            acc = mma_v2(a, xb, acc)
        y = gl.sum(acc, axis=0)                                                     # [BN, RB], quarters in order
        yrow = b * _RB + ym
        ooff = gl.expand_dims(yrow, 0) * N + gl.expand_dims(yn, 1)
        omask = gl.expand_dims(yrow < M, 0) & gl.expand_dims(yn >= 0, 1)
        if RES:
            y = y + gl.load(res_ptr + ooff, mask=omask, other=0.0).to(gl.float32)
        else:
            rstd = 1.0 / gl.sqrt_rn(ss / K + eps)
            rstd = gl.convert_layout(rstd, gl.SliceLayout(0, _LY))
            y = y * gl.expand_dims(rstd, 0)
        gl.store(out_ptr + ooff, y.to(gl.bfloat16), mask=omask)
        gl.thread_barrier()                                                         # x_smem reused by the next block
    for s in gl.static_range(NS):
        mbarrier.invalidate(bars.index(s))


@gluon.jit
def _copy_x_rows(buf, x_ptr, rows, M, stride_x, col, KC: gl.constexpr, NC: gl.constexpr):
    """cp.async of rows `rows` ([RB]) of x into the shared tile buf [RB, Q, KQ] (KQ = NC KC), one commit group;
    rows >= M are not read."""
    xoff, xmask = _x_rows(rows, M, stride_x, col)
    for c in gl.static_range(NC):
        async_copy.async_copy_global_to_shared(buf.slice(c * KC, KC, dim=2), x_ptr + xoff + c * KC, mask=xmask)
    async_copy.commit_group()


@gluon.jit
def _mma_smem_gemv_v2_kernel(w_desc, x_ptr, g_ptr, res_ptr, out_ptr, M, N, stride_x, eps,
                             K: gl.constexpr, NMB: gl.constexpr, MODE: gl.constexpr, RES: gl.constexpr,
                             KC: gl.constexpr, NBUF: gl.constexpr):
    """Version 2 (session 11, written after the device time ran out: compiled for sm_90 on the CPU, not yet run).
    What version 1 did serially after the wait, overlapped: the norm weight is staged to shared memory BEFORE
    the wait (no kernel writes it); after the wait every row block's residual is loaded at once; x goes to a
    double-buffered shared tile by cp.async, block b + 1's copy issued before block b's products; two
    accumulators (even / odd boxes) halve the chain of dependent mma. NBUF 2: block b + 1's copy overlaps
    block b's products; NBUF 1 (when two x tiles do not fit with the weights: K 4096) it overlaps only block
    b's epilogue. Same arithmetic for every M (row blocks of RB, fixed box order, acc0 + acc1 then the
    quarters summed in order): rows stay bitwise independent of M."""
    KQ: gl.constexpr = K // _Q
    NS: gl.constexpr = KQ // _BK
    NC: gl.constexpr = KQ // KC
    LG: gl.constexpr = gl.SliceLayout(0, _LX)                                        # [Q, KC]
    SG: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [1, 0])
    pid = gl.program_id(0)
    n0 = pid * _BN
    w_smem = gl.allocate_shared_memory(gl.bfloat16, [NS, _Q, _BN, _BK], w_desc.layout)
    x_smem = gl.allocate_shared_memory(gl.bfloat16, [NBUF, _RB, _Q, KQ], _SX)
    g_smem = gl.allocate_shared_memory(gl.bfloat16, [_Q, KQ], SG)
    bars = gl.allocate_shared_memory(gl.int64, [NS, 1], mbarrier.MBarrierLayout())
    _load_weight_slice(w_desc, w_smem, bars, n0, NS, _BK, MODE)
    rm, col = _x_tile_index(KQ, KC)
    if not RES:                       # the norm weight: no earlier kernel writes it, so before the wait
        gq = gl.arange(0, _Q, layout=gl.SliceLayout(1, LG))
        gk = gl.arange(0, KC, layout=gl.SliceLayout(0, LG))
        gcol = gl.expand_dims(gq, 1) * KQ + gl.expand_dims(gk, 0)
        for c in gl.static_range(NC):
            g_smem.slice(c * KC, KC, dim=1).store(gl.load(g_ptr + gcol + c * KC))
    if MODE == 2:
        gdc_wait()
    ym = gl.arange(0, _RB, layout=gl.SliceLayout(0, _LY))
    yn = n0 + gl.arange(0, _BN, layout=gl.SliceLayout(1, _LY))
    resv = ()
    if RES:                           # every block's residual at once (one round trip for all of them)
        for b in gl.static_range(NMB):
            yrow = b * _RB + ym
            roff = gl.expand_dims(yrow, 0) * N + gl.expand_dims(yn, 1)
            rmask = gl.expand_dims(yrow < M, 0) & gl.expand_dims(yn >= 0, 1)
            resv = resv + (gl.load(res_ptr + roff, mask=rmask, other=0.0).to(gl.float32),)
    _copy_x_rows(x_smem.index(0), x_ptr, rm, M, stride_x, col, KC, NC)             # block 0's x
    for b in gl.static_range(NMB):
        if NBUF == 2 and b + 1 < NMB:  # block b + 1's x into the other buffer, while block b computes
            _copy_x_rows(x_smem.index((b + 1) % 2), x_ptr, (b + 1) * _RB + rm, M, stride_x, col, KC, NC)
            async_copy.wait_group(1)
        else:
            async_copy.wait_group(0)
        gl.thread_barrier()
        xs = x_smem.index(b % NBUF)
        if not RES:                   # each row's sum of squares, then x * g in place
            ss = gl.zeros([_RB], gl.float32, gl.SliceLayout(1, gl.SliceLayout(2, _LX)))
            for c in gl.static_range(NC):
                xc = xs.slice(c * KC, KC, dim=2).load(_LX).to(gl.float32)
                ss += gl.sum(gl.sum(xc * xc, axis=2), axis=1)
                gc = g_smem.slice(c * KC, KC, dim=1).load(LG).to(gl.float32)
                xs.slice(c * KC, KC, dim=2).store((xc * gl.expand_dims(gc, 0)).to(gl.bfloat16))
            gl.thread_barrier()
        acc0 = gl.zeros([_Q, _BN, _RB], gl.float32, _MMA)
        acc1 = gl.zeros([_Q, _BN, _RB], gl.float32, _MMA)
        for s in gl.static_range(NS):
            if b == 0:
                mbarrier.wait(bars.index(s), 0)
            a = w_smem.index(s).load(_LA)
            xb = xs.slice(s * _BK, _BK, dim=2).permute((1, 2, 0)).load(_LB)
            if s % 2 == 0:
                acc0 = mma_v2(a, xb, acc0)
            else:
                acc1 = mma_v2(a, xb, acc1)
        if NBUF == 1 and b + 1 < NMB:  # the one buffer is free once every thread has read it: refill it now
            gl.thread_barrier()
            _copy_x_rows(x_smem.index(0), x_ptr, (b + 1) * _RB + rm, M, stride_x, col, KC, NC)
        y = gl.sum(acc0 + acc1, axis=0)                                             # quarters in order
        yrow = b * _RB + ym
        ooff = gl.expand_dims(yrow, 0) * N + gl.expand_dims(yn, 1)
        omask = gl.expand_dims(yrow < M, 0) & gl.expand_dims(yn >= 0, 1)
        if RES:
            y = y + resv[b]
        else:
            rstd = 1.0 / gl.sqrt_rn(ss / K + eps)
            rstd = gl.convert_layout(rstd, gl.SliceLayout(0, _LY))
            y = y * gl.expand_dims(rstd, 0)
        gl.store(out_ptr + ooff, y.to(gl.bfloat16), mask=omask)
        gl.thread_barrier()                                                         # buffer reuse
    for s in gl.static_range(NS):
        mbarrier.invalidate(bars.index(s))


def x_buffers(k: int) -> int:
    """Version 2's x tiles: two when the weight slice, two x tiles and the norm weight fit 220 KB of shared memory
    (K 2048: 132 KB), else one (K 4096: 200 KB)."""
    return 2 if BN * k * 2 + 2 * RB * k * 2 + k * 2 <= 220 << 10 else 1


class MmaSmemGemv:
    """Launcher of `_mma_smem_gemv_kernel` for one weight list (rotating copies; one TMA descriptor per copy)."""

    def __init__(self, ws: list[torch.Tensor]):
        n, k = ws[0].shape
        if n % BN or k % (Q * BK):
            raise ValueError(f"N {n} must be a multiple of {BN} and K {k} of {Q * BK}")
        self.n, self.k, self.ws, self.descs = n, k, ws, {}

    def desc(self, i: int):
        """Copy i as the permuted 3-d view [Q, N, K / Q] (strides [K / Q, K, 1]), box [Q, BN, BK]."""
        if i not in self.descs:
            kq = self.k // Q
            shape = [Q, BN, BK]
            layout = gl.NVMMASharedLayout.get_default_for(shape, gl.bfloat16)
            self.descs[i] = TensorDescriptor(self.ws[i], [Q, self.n, kq], [kq, self.k, 1], shape, layout)
        return self.descs[i]

    def __call__(self, i: int, x, g, res, out, *, mode: int = 2, res_epi: bool = True, eps: float = 1e-5,
                 version: int = 1):
        """out = res + x W_i^T (res_epi) or rstd(x) ((x g) W_i^T); x [M, K] (row stride any, 16-byte aligned rows
        for version 2's cp.async), res / out [M, N] bf16 contiguous, M <= 48. mode: 2 weights loaded before
        `gdc_wait`, 1 after, 0 no PDL. version: 1 `_mma_smem_gemv_kernel`, 2 `_mma_smem_gemv_v2_kernel`."""
        m = x.shape[0]
        kc = min(256, self.k // Q)
        extra = {} if version == 1 else dict(NBUF=x_buffers(self.k))
        kernel = {1: _mma_smem_gemv_kernel, 2: _mma_smem_gemv_v2_kernel}[version]
        kernel[(self.n // BN,)](
            self.desc(i), x, g, res, out, m, self.n, x.stride(0), eps, K=self.k, NMB=triton.cdiv(m, RB), MODE=mode,
            RES=res_epi, KC=kc, num_warps=Q, launch_pdl=mode > 0, **extra)
