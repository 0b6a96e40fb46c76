"""Experiment (session 7, issue 3): a GEMV that holds its whole weight slice in SHARED memory across the PDL wait.

Session 6 (explore16) held the slice in registers: one launch's 12-21 MB filled the register files, so the
next PDL launch could not become resident (and start its own loads) until this one exited: 40-54% of copy
bandwidth. Shared memory holds the same bytes densely. The intent: where two launches' slices fit an SM
(Llama-3.2-1B's 12.6 MB QKV is 95 KB per SM of 227 KB), launch i + 1 streams its weights while launch i waits
for its input and computes. That overlap is not measured directly; for the 16.8-21 MB shapes two slices
exceed the GPU's shared memory.

Per program: BN whole output rows (N / BN programs, no split-K, no cross-program step), FMA in fp32 over a
blocked layout (no tensor cores: the 1-row case). Epilogues as explore16's: "res" y = res + x W^T, "norm"
y = rstd(x) * ((x * g) W^T). `_smem_gemv_kernel` is Gluon (Triton's explicit-layout dialect,
`triton.experimental.gluon`; GPU only, no CPU interpreter); `_triton_smem_gemv_kernel` is the same plan in
plain Triton.

Measured on the H200 (bench/results/session7/, explore18.py, PDL-chained launches over rotating cold copies,
1 row, the best plan of each repeat; NOTES.md "Measured -> session 7"). The Gluon kernel's history, versions at
commit 79d1754:
  v1 one mbarrier and one x load from global per 64-wide chunk: 29-41% of copy bandwidth;
  v2 activations staged to shared memory in one step after the wait: 38-57%;
  v3 (this kernel) boxes of G chunks, one mbarrier and one [BN, G, BK] shared read each (calls 4-7): Qwen3-30B-A3B's
     out_proj (16.8 MB, res) 4.84-5.29 us = 75-84% (production 7.61 us = 53%), Llama-3.2-1B QKV (12.6 MB, norm)
     4.49-4.95 us = 61-68%, Qwen3 QKV (21 MB) 7.49-7.91 us = 64-66%, Llama out_proj (8.4 MB) 3.21-3.53 us =
     57-63% (production 4.89 us = 41%); 6 rows 6.3-39 us (FMA: slower than production there);
  v4 activations and norm weight by TMA, 8 warps: 54-79%, no better.
Plain Triton cannot express it efficiently: its software pipeliner issues every load of the loop (the
activations' too) before a `gdc_wait` placed in the loop (bench/explore/pipeliner_check.py), so
`_triton_smem_gemv_kernel` keeps the activations in registers, loaded in an `if` of the first iteration, and
picks each box's chunks by a masked sum: correct, but 18-77 us at 1 row (3.7-5.4x the Gluon kernel's best).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
from triton.tools.tensor_descriptor import TensorDescriptor as TritonTensorDescriptor

from lowlat.kernels._gemv import interpreting, rstd_of


@gluon.jit
def _smem_gemv_kernel(w_desc, x_ptr, g_ptr, res_ptr, out_ptr, N, eps, K: gl.constexpr, BN: gl.constexpr,
                       BK: gl.constexpr, R: gl.constexpr, MODE: gl.constexpr, RES: gl.constexpr,
                       SPT: gl.constexpr, TR: gl.constexpr, TC: gl.constexpr, WARPS: gl.constexpr, RP: gl.constexpr,
                       G: gl.constexpr):
    """The weight as the 3-d view [N, K / BK, BK]: NG = K / (G BK) TMA boxes [BN, G, BK], one mbarrier each,
    all issued before `gdc_wait` (MODE 2); then every row's activations to shared memory in one step (their
    sums of squares on the way), the residual read; then per box one [BN, G, BK] shared load (G chunks per
    thread, summed in registers) serves all R rows (R accumulators [BN, BK])."""
    NC: gl.constexpr = K // BK
    NG: gl.constexpr = NC // G
    L3: gl.constexpr = gl.BlockedLayout([1, G, SPT], [TR, 1, TC], [WARPS, 1, 1], [2, 1, 0])
    LA: gl.constexpr = gl.SliceLayout(1, L3)                    # [BN, BK] accumulators
    LXG: gl.constexpr = gl.SliceLayout(0, L3)                   # [G, BK] activations of a group
    LX: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [WARPS, 1], [1, 0])
    SX: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [1, 0])
    pid = gl.program_id(0)
    n0 = pid * BN
    w_smem = gl.allocate_shared_memory(gl.bfloat16, [NG, BN, G, BK], w_desc.layout)
    x_smem = gl.allocate_shared_memory(gl.bfloat16, [RP * NC, BK], SX)
    g_smem = gl.allocate_shared_memory(gl.bfloat16, [NC, BK], SX)
    bars = gl.allocate_shared_memory(gl.int64, [NG, 1], mbarrier.MBarrierLayout())
    for j in gl.static_range(NG):
        mbarrier.init(bars.index(j), count=1)
    if MODE == 1:
        gdc_wait()
        gdc_launch_dependents()
    if MODE == 2:
        gdc_launch_dependents()
    for j in gl.static_range(NG):
        mbarrier.expect(bars.index(j), w_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(w_desc, [n0, j * G, 0], bars.index(j), w_smem.index(j))
    offs = gl.expand_dims(gl.arange(0, NC, layout=gl.SliceLayout(1, LX)), 1) * BK \
        + gl.expand_dims(gl.arange(0, BK, layout=gl.SliceLayout(0, LX)), 0)
    if not RES:
        g_smem.store(gl.load(g_ptr + offs))
    if MODE == 2:
        gdc_wait()
    rn = n0 + gl.arange(0, BN, layout=gl.SliceLayout(1, LA))
    scale = ()
    resv = ()
    for r in gl.static_range(R):
        xr = gl.load(x_ptr + r * K + offs)
        x_smem.slice(r * NC, NC).store(xr)
        if RES:
            resv = resv + (gl.load(res_ptr + r * N + rn).to(gl.float32),)
        else:
            xr = xr.to(gl.float32)
            scale = scale + (1.0 / gl.sqrt_rn(gl.sum(gl.sum(xr * xr, axis=1), axis=0) / K + eps),)
    gl.thread_barrier()
    accs = ()
    for r in gl.static_range(R):
        accs = accs + (gl.zeros([BN, BK], gl.float32, LA),)
    for j in gl.static_range(NG):
        mbarrier.wait(bars.index(j), 0)
        w = w_smem.index(j).load(L3).to(gl.float32)
        if not RES:
            gj = g_smem.slice(j * G, G).load(LXG).to(gl.float32)
        new = ()
        for r in gl.static_range(R):
            xk = x_smem.slice(r * NC + j * G, G).load(LXG).to(gl.float32)
            if not RES:
                xk = xk * gj
            new = new + (accs[r] + gl.sum(w * gl.expand_dims(xk, 0), axis=1),)
        accs = new
    for r in gl.static_range(R):
        y = gl.sum(accs[r], axis=1)
        if RES:
            y = y + resv[r]
        else:
            y = y * scale[r]
        gl.store(out_ptr + r * N + rn, y.to(gl.bfloat16))
    for j in gl.static_range(NG):
        mbarrier.invalidate(bars.index(j))


@triton.jit
def _triton_smem_gemv_kernel(w_desc, x_ptr, g_ptr, res_ptr, out_ptr, N, eps, K: tl.constexpr, BN: tl.constexpr,
                             BK: tl.constexpr, G: tl.constexpr, R: tl.constexpr, RP: tl.constexpr, MODE: tl.constexpr,
                             RES: tl.constexpr):
    """The same in plain Triton (CPU interpreter too). The weight's 3-d view [N, K / BK, BK] is
    read in NG = K / (G BK) boxes [BN, G, BK] by a software-pipelined loop of NG + 1 stages, so all NG TMA loads
    are issued before the loop; `gdc_wait` and the activation load sit in the loop's first iteration (an `if`
    the pipeliner does not peel), the activations stay in registers ([RP, NG, G, BK], the group picked by a
    masked sum)."""
    NC: tl.constexpr = K // BK
    NG: tl.constexpr = NC // G
    pid = tl.program_id(0)
    n0 = pid * BN
    if MODE == 2:
        gdc_launch_dependents()
    if MODE == 1:
        gdc_wait()
        gdc_launch_dependents()
    r4 = tl.arange(0, RP)[:, None, None, None]
    j4 = tl.arange(0, NG)[None, :, None, None]
    c4 = tl.arange(0, G)[None, None, :, None]
    k4 = tl.arange(0, BK)[None, None, None, :]
    xoff = r4 * K + (j4 * G + c4) * BK + k4                       # [RP, NG, G, BK]
    xmask = (r4 < R) & (j4 >= 0) & (c4 >= 0) & (k4 >= 0)           # rows < R, broadcast to the full shape
    if RES:
        gw = tl.full([1, NG, G, BK], 1.0, tl.float32)
    else:
        gw = tl.load(g_ptr + (j4 * G + c4) * BK + k4).to(tl.float32)
    xr = tl.zeros([RP, NG, G, BK], dtype=tl.float32)
    acc = tl.zeros([RP, BN, BK], dtype=tl.float32)
    for j in tl.range(0, NG, num_stages=NG + 1):
        w = w_desc.load([n0, j * G, 0]).to(tl.float32)           # [BN, G, BK]
        if j == 0:
            if MODE == 2:
                gdc_wait()
            xr = tl.load(x_ptr + xoff, mask=xmask, other=0.0).to(tl.float32)
        xg = tl.sum(tl.where(j4 == j, xr * gw, 0.0), axis=1)      # [RP, G, BK]
        acc += tl.sum(w[None, :, :, :] * xg[:, None, :, :], axis=2)
    y = tl.sum(acc, axis=2)                                       # [RP, BN]
    rr = tl.arange(0, RP)[:, None]
    rn = n0 + tl.arange(0, BN)[None, :]
    if RES:
        y = y + tl.load(res_ptr + rr * N + rn, mask=rr < R, other=0.0).to(tl.float32)
    else:
        ss = tl.sum(tl.sum(tl.sum(xr * xr, axis=3), axis=2), axis=1)      # [RP]
        y = y * rstd_of(ss, K, eps)[:, None]
    tl.store(out_ptr + rr * N + rn, y.to(tl.bfloat16), mask=rr < R)


#: thread shapes of the [BN, BK = 64] FMA tile with 4 warps: (size per thread along K, threads per warp (rows, cols))
_TILE = {16: (8, 4, 8), 8: (4, 2, 16), 4: (2, 1, 32)}
BK = 64


class SmemGemv:
    """Launcher of `_smem_gemv_kernel` (or, triton_kernel=True, `_triton_smem_gemv_kernel`) for one weight list
    (rotating copies; one descriptor per copy and box size, built on first use)."""

    def __init__(self, ws: list[torch.Tensor], bn: int):
        n, k = ws[0].shape
        self.n, self.k, self.bn, self.ws, self.descs = n, k, bn, ws, {}

    def desc(self, i: int, group: int, triton_desc: bool = False):
        """Copy i as the 3-d view [N, K / BK, BK], box [BN, group, BK] (Gluon's or Triton's host descriptor)."""
        key = (i, group, triton_desc)
        if key not in self.descs:
            shape, view, strides = [self.bn, group, BK], [self.n, self.k // BK, BK], [self.k, BK, 1]
            if triton_desc:
                self.descs[key] = TritonTensorDescriptor(self.ws[i], view, strides, shape)
            else:
                layout = gl.NVMMASharedLayout.get_default_for(shape, gl.bfloat16)
                self.descs[key] = TensorDescriptor(self.ws[i], view, strides, shape, layout)
        return self.descs[key]

    def __call__(self, i: int, x, g, res, out, *, mode: int, res_epi: bool, group: int = 16, eps: float = 1e-5,
                 triton_kernel: bool = False, maxnreg: int | None = None):
        """out = res + x W_i^T (res_epi) or rstd(x) ((x g) W_i^T); x [R, K], res / out [R, N] bf16 contiguous.
        mode: 2 weights loaded before `gdc_wait`, 1 after, 0 no PDL. group: chunks of BK per TMA box. maxnreg:
        register cap of the Gluon launch (more programs per SM: the next PDL launch can be resident sooner)."""
        grp = min(group, self.k // BK)
        rp = triton.next_power_of_2(x.shape[0])
        grid = (self.n // self.bn,)
        if triton_kernel:
            _triton_smem_gemv_kernel[grid](
                self.desc(i, grp, True), x, g, res, out, self.n, eps, K=self.k, BN=self.bn, BK=BK, G=grp,
                R=x.shape[0], RP=rp, MODE=mode, RES=res_epi, num_warps=4, num_stages=self.k // BK // grp + 1,
                **({} if interpreting() else dict(launch_pdl=mode > 0)))
            return
        spt, tr, tc = _TILE[self.bn]
        _smem_gemv_kernel[grid](
            self.desc(i, grp), x, g, res, out, self.n, eps, K=self.k, BN=self.bn, BK=BK, R=x.shape[0], MODE=mode,
            RES=res_epi, SPT=spt, TR=tr, TC=tc, WARPS=4, RP=rp, G=grp, num_warps=4, launch_pdl=mode > 0,
            **({} if maxnreg is None else dict(maxnreg=maxnreg)))
