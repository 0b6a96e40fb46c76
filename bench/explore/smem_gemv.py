"""Experiment (session 7, issue 3): a GEMV that holds its whole weight slice in SHARED memory across the PDL wait.

Session 6 (explore16) held the slice in registers: one launch's 12-21 MB filled the register files, so the
next PDL launch could not become resident (and start its own loads) until this one exited: 40-54% of copy
bandwidth. Shared memory holds the same bytes densely (no per-thread overhead): Llama-3.2-1B's 12.6 MB QKV is
95 KB per SM of 227 KB, so two launches' slices fit an SM at once, and launch i + 1 can stream its weights
while launch i waits for its input and computes.

Written in Gluon (Triton's explicit-layout dialect, `triton.experimental.gluon`) because plain Triton 3.6
cannot hold TMA tiles in shared memory across `gdc_wait`: its software pipeliner peels the activation loads
into the prologue too, before the wait (checked on the sm_90 PTX of such a loop), and there is no other way
to keep a loaded tile in shared memory. Gluon does not run under the CPU interpreter: GPU only.

Per program: BN whole output rows (N / BN programs, no split-K, no cross-program step). The [BN, K] slice is
loaded as K / BK TMA boxes [BN, BK] into one shared buffer, one mbarrier per box. MODE 2: all boxes issued
before `gdc_wait` (then the wait, then x); MODE 1: wait first; MODE 0: no PDL. Compute: FMA over a blocked
layout (fp32), box by box, each waited for on first use; R rows (constexpr) reuse the shared slice.
Epilogues as explore16's: "res" y = res + x W^T, "norm" y = rstd(x) * ((x * g) W^T).
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


@gluon.jit
def _gdc_wait():
    gl.inline_asm_elementwise("griddepcontrol.wait; // dummy $0", "=r", [], dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def _gdc_launch_dependents():
    gl.inline_asm_elementwise("griddepcontrol.launch_dependents; // dummy $0", "=r", [], dtype=gl.int32,
                              is_pure=False, pack=1)


@gluon.jit
def _smem_gemv_kernel(w_desc, x_ptr, g_ptr, res_ptr, out_ptr, N, eps, K: gl.constexpr, BN: gl.constexpr,
                      BK: gl.constexpr, R: gl.constexpr, MODE: gl.constexpr, RES: gl.constexpr,
                      SPT: gl.constexpr, TR: gl.constexpr, TC: gl.constexpr, WARPS: gl.constexpr):
    NC: gl.constexpr = K // BK
    L: gl.constexpr = gl.BlockedLayout([1, SPT], [TR, TC], [WARPS, 1], [1, 0])
    pid = gl.program_id(0)
    n0 = pid * BN
    w_smem = gl.allocate_shared_memory(gl.bfloat16, [NC, BN, BK], w_desc.layout)
    bars = gl.allocate_shared_memory(gl.int64, [NC, 1], mbarrier.MBarrierLayout())
    for c in gl.static_range(NC):
        mbarrier.init(bars.index(c), count=1)
    if MODE == 1:
        _gdc_wait()
        _gdc_launch_dependents()
    if MODE == 2:
        _gdc_launch_dependents()
    for c in gl.static_range(NC):
        mbarrier.expect(bars.index(c), w_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(w_desc, [n0, c * BK], bars.index(c), w_smem.index(c))
    if MODE == 2:
        _gdc_wait()
    ks = gl.arange(0, BK, layout=gl.SliceLayout(0, L))
    rn = n0 + gl.arange(0, BN, layout=gl.SliceLayout(1, L))
    for r in gl.static_range(R):
        acc = gl.zeros([BN, BK], gl.float32, L)
        ss = gl.zeros([BK], gl.float32, gl.SliceLayout(0, L))
        for c in gl.static_range(NC):
            xk = gl.load(x_ptr + r * K + c * BK + ks).to(gl.float32)
            if not RES:
                ss += xk * xk
                xk = xk * gl.load(g_ptr + c * BK + ks).to(gl.float32)
            if r == 0:
                mbarrier.wait(bars.index(c), 0)
            w = w_smem.index(c).load(L).to(gl.float32)
            acc += w * gl.expand_dims(xk, 0)
        y = gl.sum(acc, axis=1)
        if RES:
            y = y + gl.load(res_ptr + r * N + rn).to(gl.float32)
        else:
            y = y * (1.0 / gl.sqrt_rn(gl.sum(ss, axis=0) / K + eps))
        gl.store(out_ptr + r * N + rn, y.to(gl.bfloat16))
    for c in gl.static_range(NC):
        mbarrier.invalidate(bars.index(c))


@gluon.jit
def _smem_gemv2_kernel(w_desc, x_ptr, g_ptr, res_ptr, out_ptr, N, eps, K: gl.constexpr, BN: gl.constexpr,
                       BK: gl.constexpr, R: gl.constexpr, MODE: gl.constexpr, RES: gl.constexpr,
                       SPT: gl.constexpr, TR: gl.constexpr, TC: gl.constexpr, WARPS: gl.constexpr, RP: gl.constexpr):
    """V2: the activations go to shared memory in one step right after the wait (every row's x as [K / BK, BK],
    its sum of squares taken on the way), the norm weight before the wait; then box by box one weight tile load
    serves all R rows (R accumulators), and the residual is read right after x, not at the end."""
    NC: gl.constexpr = K // BK
    L: gl.constexpr = gl.BlockedLayout([1, SPT], [TR, TC], [WARPS, 1], [1, 0])
    LX: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [WARPS, 1], [1, 0])          # staging of [NC, BK]
    SX: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [1, 0])
    pid = gl.program_id(0)
    n0 = pid * BN
    w_smem = gl.allocate_shared_memory(gl.bfloat16, [NC, BN, BK], w_desc.layout)
    x_smem = gl.allocate_shared_memory(gl.bfloat16, [RP * NC, BK], SX)     # RP: R to a power of 2
    g_smem = gl.allocate_shared_memory(gl.bfloat16, [NC, BK], SX)
    bars = gl.allocate_shared_memory(gl.int64, [NC, 1], mbarrier.MBarrierLayout())
    for c in gl.static_range(NC):
        mbarrier.init(bars.index(c), count=1)
    if MODE == 1:
        _gdc_wait()
        _gdc_launch_dependents()
    if MODE == 2:
        _gdc_launch_dependents()
    for c in gl.static_range(NC):
        mbarrier.expect(bars.index(c), w_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(w_desc, [n0, c * BK], bars.index(c), w_smem.index(c))
    offs = gl.expand_dims(gl.arange(0, NC, layout=gl.SliceLayout(1, LX)), 1) * BK \
        + gl.expand_dims(gl.arange(0, BK, layout=gl.SliceLayout(0, LX)), 0)
    if not RES:
        g_smem.store(gl.load(g_ptr + offs))
    if MODE == 2:
        _gdc_wait()
    rn = n0 + gl.arange(0, BN, layout=gl.SliceLayout(1, L))
    scale = ()
    resv = ()
    for r in gl.static_range(R):
        xr = gl.load(x_ptr + r * K + offs)
        x_smem.slice(r * NC, NC).store(xr)
        xr = xr.to(gl.float32)
        if RES:
            resv = resv + (gl.load(res_ptr + r * N + rn).to(gl.float32),)
        else:
            scale = scale + (1.0 / gl.sqrt_rn(gl.sum(gl.sum(xr * xr, axis=1), axis=0) / K + eps),)
    gl.thread_barrier()
    accs = ()
    for r in gl.static_range(R):
        accs = accs + (gl.zeros([BN, BK], gl.float32, L),)
    for c in gl.static_range(NC):
        mbarrier.wait(bars.index(c), 0)
        w = w_smem.index(c).load(L).to(gl.float32)
        if not RES:
            gc = g_smem.slice(c, 1).load(L).to(gl.float32)        # [1, BK]
        new = ()
        for r in gl.static_range(R):
            xk = x_smem.slice(r * NC + c, 1).load(L).to(gl.float32)
            if not RES:
                xk = xk * gc
            new = new + (accs[r] + w * xk,)
        accs = new
    for r in gl.static_range(R):
        y = gl.sum(accs[r], axis=1)
        if RES:
            y = y + resv[r]
        else:
            y = y * scale[r]
        gl.store(out_ptr + r * N + rn, y.to(gl.bfloat16))
    for c in gl.static_range(NC):
        mbarrier.invalidate(bars.index(c))


@gluon.jit
def _smem_gemv3_kernel(w_desc, x_ptr, g_ptr, res_ptr, out_ptr, N, eps, K: gl.constexpr, BN: gl.constexpr,
                       BK: gl.constexpr, R: gl.constexpr, MODE: gl.constexpr, RES: gl.constexpr,
                       SPT: gl.constexpr, TR: gl.constexpr, TC: gl.constexpr, WARPS: gl.constexpr, RP: gl.constexpr,
                       G: gl.constexpr):
    """V3: version 2 with the weight read as the 3-d view [N, K / BK, BK]: one TMA box [BN, G, BK] (G chunks)
    per mbarrier, and each box read from shared memory as one [BN, G, BK] tensor (G chunks per thread, summed in
    registers), so the chain barrier wait -> shared load -> FMA runs once per G chunks."""
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
        _gdc_wait()
        _gdc_launch_dependents()
    if MODE == 2:
        _gdc_launch_dependents()
    for j in gl.static_range(NG):
        mbarrier.expect(bars.index(j), w_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(w_desc, [n0, j * G, 0], bars.index(j), w_smem.index(j))
    offs = gl.expand_dims(gl.arange(0, NC, layout=gl.SliceLayout(1, LX)), 1) * BK \
        + gl.expand_dims(gl.arange(0, BK, layout=gl.SliceLayout(0, LX)), 0)
    if not RES:
        g_smem.store(gl.load(g_ptr + offs))
    if MODE == 2:
        _gdc_wait()
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


@gluon.jit
def _smem_gemv4_kernel(w_desc, x_desc, g_desc, res_ptr, out_ptr, N, eps, K: gl.constexpr, BN: gl.constexpr,
                       BK: gl.constexpr, R: gl.constexpr, MODE: gl.constexpr, RES: gl.constexpr,
                       SPT: gl.constexpr, TR: gl.constexpr, TC: gl.constexpr, WR: gl.constexpr, WK: gl.constexpr,
                       RP: gl.constexpr, G: gl.constexpr):
    """V4: version 3 with the activations (and the norm weight, before the wait) brought by TMA straight into
    shared memory ([R * K / BK, BK] view, one box [K / BK, BK] per row, one mbarrier), the sum of squares taken
    from the same shared tiles in the group loop, and WR x WK warps (rows x K)."""
    NC: gl.constexpr = K // BK
    NG: gl.constexpr = NC // G
    L3: gl.constexpr = gl.BlockedLayout([1, G, SPT], [TR, 1, TC], [WR, 1, WK], [2, 1, 0])
    LA: gl.constexpr = gl.SliceLayout(1, L3)                    # [BN, BK] accumulators
    LXG: gl.constexpr = gl.SliceLayout(0, L3)                   # [G, BK] activations of a group
    pid = gl.program_id(0)
    n0 = pid * BN
    w_smem = gl.allocate_shared_memory(gl.bfloat16, [NG, BN, G, BK], w_desc.layout)
    x_smem = gl.allocate_shared_memory(gl.bfloat16, [RP, NC, BK], x_desc.layout)
    g_smem = gl.allocate_shared_memory(gl.bfloat16, [NC, BK], x_desc.layout)
    bars = gl.allocate_shared_memory(gl.int64, [NG + 2, 1], mbarrier.MBarrierLayout())
    for j in gl.static_range(NG + 2):
        mbarrier.init(bars.index(j), count=1)
    if MODE == 1:
        _gdc_wait()
        _gdc_launch_dependents()
    if MODE == 2:
        _gdc_launch_dependents()
    for j in gl.static_range(NG):
        mbarrier.expect(bars.index(j), w_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(w_desc, [n0, j * G, 0], bars.index(j), w_smem.index(j))
    if not RES:
        mbarrier.expect(bars.index(NG + 1), g_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(g_desc, [0, 0], bars.index(NG + 1), g_smem)
    if MODE == 2:
        _gdc_wait()
    mbarrier.expect(bars.index(NG), R * x_desc.block_type.nbytes)
    for r in gl.static_range(R):
        tma.async_copy_global_to_shared(x_desc, [r * NC, 0], bars.index(NG), x_smem.index(r))
    rn = n0 + gl.arange(0, BN, layout=gl.SliceLayout(1, LA))
    resv = ()
    for r in gl.static_range(R):
        if RES:
            resv = resv + (gl.load(res_ptr + r * N + rn).to(gl.float32),)
    accs = ()
    sss = ()
    for r in gl.static_range(R):
        accs = accs + (gl.zeros([BN, BK], gl.float32, LA),)
        sss = sss + (gl.zeros([G, BK], gl.float32, LXG),)
    if not RES:
        mbarrier.wait(bars.index(NG + 1), 0)
    mbarrier.wait(bars.index(NG), 0)
    for j in gl.static_range(NG):
        mbarrier.wait(bars.index(j), 0)
        w = w_smem.index(j).load(L3).to(gl.float32)
        if not RES:
            gj = g_smem.slice(j * G, G).load(LXG).to(gl.float32)
        new = ()
        new_ss = ()
        for r in gl.static_range(R):
            xk = x_smem.index(r).slice(j * G, G).load(LXG).to(gl.float32)
            if not RES:
                new_ss = new_ss + (sss[r] + xk * xk,)
                xk = xk * gj
            new = new + (accs[r] + gl.sum(w * gl.expand_dims(xk, 0), axis=1),)
        accs = new
        if not RES:
            sss = new_ss
    for r in gl.static_range(R):
        y = gl.sum(accs[r], axis=1)
        if RES:
            y = y + resv[r]
        else:
            y = y * (1.0 / gl.sqrt_rn(gl.sum(gl.sum(sss[r], axis=1), axis=0) / K + eps))
        gl.store(out_ptr + r * N + rn, y.to(gl.bfloat16))
    for j in gl.static_range(NG + 2):
        mbarrier.invalidate(bars.index(j))


@triton.jit
def _triton_smem_gemv_kernel(w_desc, x_ptr, g_ptr, res_ptr, out_ptr, N, eps, K: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
        G: tl.constexpr, R: tl.constexpr, RP: tl.constexpr, MODE: tl.constexpr, RES: tl.constexpr):
    """Version "t3": version 3 in plain Triton (CPU interpreter too). The weight's 3-d view [N, K / BK, BK] is
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
    xmask = (r4 < R) & (j4 >= 0) & (c4 >= 0) & (k4 >= 0)
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
        y = y * (1.0 / tl.sqrt_rn(ss / K + eps))[:, None]
    tl.store(out_ptr + rr * N + rn, y.to(tl.bfloat16), mask=rr < R)


#: thread shapes of the [BN, BK = 64] FMA tile with 4 warps: (size per thread along K, threads per warp (rows, cols))
_TILE = {16: (8, 4, 8), 8: (4, 2, 16), 4: (2, 1, 32)}
#: version 4 with 8 warps (4 along rows, 2 along K): (size per thread along K, threads per warp (rows, cols))
_TILE8 = {16: (4, 4, 8), 8: (2, 2, 16), 4: (1, 1, 32)}
BK = 64


def _interpreting() -> bool:
    import os
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


class SmemGemv:
    """Launcher of `_smem_gemv_kernel` for one weight list (rotating copies; one descriptor each)."""

    def __init__(self, ws: list[torch.Tensor], bn: int):
        n, k = ws[0].shape
        self.n, self.k, self.bn = n, k, bn
        layout = gl.NVMMASharedLayout.get_default_for([bn, BK], gl.bfloat16)
        self.descs = [] if _interpreting() else [TensorDescriptor(w, [n, k], [k, 1], [bn, BK], layout) for w in ws]
        self.ws, self.descs3 = ws, {}

    def desc3(self, i: int, group: int):
        """Version 3's descriptor of copy i: the 3-d view [N, K / BK, BK], box [BN, group, BK]."""
        if (i, group) not in self.descs3:
            shape = [self.bn, group, BK]
            layout = gl.NVMMASharedLayout.get_default_for(shape, gl.bfloat16)
            self.descs3[i, group] = TensorDescriptor(self.ws[i], [self.n, self.k // BK, BK], [self.k, BK, 1], shape,
                                                     layout)
        return self.descs3[i, group]

    def triton_desc(self, i: int, group: int):
        """Version t3's descriptor of copy i (Triton's host TensorDescriptor over the 3-d view)."""
        key = ("t", i, group)
        if key not in self.descs3:
            self.descs3[key] = TritonTensorDescriptor(self.ws[i], [self.n, self.k // BK, BK], [self.k, BK, 1],
                                                      [self.bn, group, BK])
        return self.descs3[key]

    def act_descs(self, x, g):
        """Version 4's descriptors of the activations x [R, K] (viewed [R K / BK, BK], box [K / BK, BK]) and of the
        norm weight g [K] (viewed [K / BK, BK]); cached per tensor."""
        key = ("x", x.data_ptr(), x.shape[0], g.data_ptr())
        if key not in self.descs3:
            nc = self.k // BK
            layout = gl.NVMMASharedLayout.get_default_for([nc, BK], gl.bfloat16)
            self.descs3[key] = (TensorDescriptor(x, [x.shape[0] * nc, BK], [BK, 1], [nc, BK], layout),
                                TensorDescriptor(g, [nc, BK], [BK, 1], [nc, BK], layout))
        return self.descs3[key]

    def __call__(self, i: int, x, g, res, out, *, mode: int, res_epi: bool, eps: float = 1e-5, version=2,
                 group: int = 8, warps: int = 4):
        if version == 4:
            grp = min(group, self.k // BK)
            spt, tr, tc = (_TILE8 if warps == 8 else _TILE)[self.bn]
            xd, gd = self.act_descs(x, g)
            _smem_gemv4_kernel[(self.n // self.bn,)](
                self.desc3(i, grp), xd, gd, res, out, self.n, eps, K=self.k, BN=self.bn, BK=BK, R=x.shape[0],
                MODE=mode, RES=res_epi, SPT=spt, TR=tr, TC=tc, WR=4, WK=warps // 4,
                RP=triton.next_power_of_2(x.shape[0]), G=grp, num_warps=warps, launch_pdl=mode > 0)
            return
        if version == "t3":
            grp = min(group, self.k // BK)
            ng = self.k // BK // grp
            _triton_smem_gemv_kernel[(self.n // self.bn,)](
                self.triton_desc(i, grp), x, g, res, out, self.n, eps, K=self.k, BN=self.bn, BK=BK, G=grp,
                R=x.shape[0], RP=triton.next_power_of_2(x.shape[0]), MODE=mode, RES=res_epi, num_warps=4,
                num_stages=ng + 1, **({} if _interpreting() else dict(launch_pdl=mode > 0)))
            return
        spt, tr, tc = _TILE[self.bn]
        kernel = {1: _smem_gemv_kernel, 2: _smem_gemv2_kernel, 3: _smem_gemv3_kernel}[version]
        extra = dict(RP=triton.next_power_of_2(x.shape[0])) if version >= 2 else {}
        desc = self.descs[i]
        if version == 3:
            extra["G"] = min(group, self.k // BK)
            desc = self.desc3(i, extra["G"])
        kernel[(self.n // self.bn,)](
            desc, x, g, res, out, self.n, eps, K=self.k, BN=self.bn, BK=BK, R=x.shape[0], MODE=mode,
            RES=res_epi, SPT=spt, TR=tr, TC=tc, WARPS=4, num_warps=4, launch_pdl=mode > 0, **extra)
