"""Session-4 experiment: the attention prologue kernel with its K loop left to Triton's software pipeliner
(`num_stages` deep, cp.async) instead of the register double buffer of lowlat.kernels.attn_prologue, and an L2
prefetch of the program's whole weight slice before the PDL wait (`_gemv.prefetch_l2`). Same signature, same
arithmetic in the same K order (so every output is bitwise the production kernel's); only the loads move.
explore11.py swaps it into lowlat.kernels.attn_prologue for an A/B in one run."""
from __future__ import annotations

import triton
import triton.language as tl

from lowlat.kernels._attn_common import gdc_launch_dependents, gdc_wait, round_bf16, to_bf16, to_dot
from lowlat.kernels._gemv import prefetch_l2


@triton.jit
def _attn_prologue_pipelined_kernel(
        x_ptr, w_ptr, b_ptr, an_ptr, qn_ptr, kn_ptr, pos_ptr, loc_ptr, nvr_ptr, nvr_int,
        kc_ptr, vc_ptr, tab_ptr, q_ptr, wsa_ptr, wss_ptr, cnt_ptr,
        M, H, Hq, Hkv, max_pos, eps, ws_rows,
        stride_xm, stride_qm, stride_qh, stride_kcs, stride_kch, stride_vcs, stride_vch,
        D: tl.constexpr, HALF: tl.constexpr, BM: tl.constexpr, BK: tl.constexpr, K_ITERS: tl.constexpr,
        SPLIT_K: tl.constexpr,
        HAS_BIAS: tl.constexpr, QK_NORM: tl.constexpr, NVR_FROM_PTR: tl.constexpr,
        USE_PDL: tl.constexpr, INTERP: tl.constexpr):
    rt = tl.program_id(0)
    hh = tl.program_id(1)
    sp = tl.program_id(2)
    NH = tl.num_programs(1)
    N = NH * D
    rows = rt * BM + tl.arange(0, BM)
    rmask = rows < M
    jl = tl.arange(0, HALF)
    kk = tl.arange(0, BK)
    wrow_lo = (hh * D + jl).to(tl.int64) * H
    wrow_hi = (hh * D + HALF + jl).to(tl.int64) * H
    k0 = sp * (K_ITERS * BK)
    if USE_PDL:
        k_end = tl.minimum(k0 + K_ITERS * BK, H)
        for it in tl.static_range(K_ITERS):       # the slice into L2 while the previous kernel drains
            prefetch_l2(w_ptr, H, hh * D, N, k0 + it * BK, k_end, D, 64)
        gdc_wait()
        gdc_launch_dependents()
    acc_lo = tl.zeros([BM, HALF], dtype=tl.float32)
    acc_hi = tl.zeros([BM, HALF], dtype=tl.float32)
    ss = tl.zeros([BM], dtype=tl.float32)
    for it in range(K_ITERS):                     # constexpr trip count: pipelined num_stages deep
        kt = k0 + it * BK
        live = kt < H
        w_lo = tl.load(w_ptr + wrow_lo[:, None] + (kt + kk)[None, :], mask=live, other=0.0)
        w_hi = tl.load(w_ptr + wrow_hi[:, None] + (kt + kk)[None, :], mask=live, other=0.0)
        an = tl.load(an_ptr + kt + kk, mask=live, other=0.0).to(tl.float32)
        xv = tl.load(x_ptr + rows[:, None].to(tl.int64) * stride_xm + (kt + kk)[None, :],
                     mask=rmask[:, None] & live, other=0.0).to(tl.float32)
        ss += tl.sum(xv * xv, axis=1)
        xs = xv * an[None, :]
        if INTERP:
            xs = round_bf16(xs)
        xd = to_dot(xs, INTERP)
        acc_lo += tl.dot(xd, tl.trans(to_dot(w_lo, INTERP)))
        acc_hi += tl.dot(xd, tl.trans(to_dot(w_hi, INTERP)))

    do_epilogue = True
    if SPLIT_K > 1:
        racc = rows[:, None].to(tl.int64) * N + hh * D
        base = sp.to(tl.int64) * ws_rows * N
        tl.store(wsa_ptr + base + racc + jl[None, :], acc_lo)
        tl.store(wsa_ptr + base + racc + HALF + jl[None, :], acc_hi)
        tl.store(wss_ptr + (sp * NH + hh).to(tl.int64) * ws_rows + rows, ss)
        tl.debug_barrier()
        cnt = tl.atomic_add(cnt_ptr + rt * NH + hh, 1, sem="acq_rel", scope="gpu")
        do_epilogue = cnt == SPLIT_K - 1
        if do_epilogue:
            acc_lo = tl.zeros([BM, HALF], dtype=tl.float32)
            acc_hi = tl.zeros([BM, HALF], dtype=tl.float32)
            ss = tl.zeros([BM], dtype=tl.float32)
            for s in range(SPLIT_K):
                b2 = s * ws_rows * N
                acc_lo += tl.load(wsa_ptr + b2 + racc + jl[None, :], cache_modifier=".cg")
                acc_hi += tl.load(wsa_ptr + b2 + racc + HALF + jl[None, :], cache_modifier=".cg")
                ss += tl.load(wss_ptr + (s * NH + hh).to(tl.int64) * ws_rows + rows, cache_modifier=".cg")
            tl.store(cnt_ptr + rt * NH + hh, 0)

    if do_epilogue:
        rstd = 1.0 / tl.sqrt(ss / H + eps)
        y_lo = acc_lo * rstd[:, None]
        y_hi = acc_hi * rstd[:, None]
        if HAS_BIAS:
            y_lo += tl.load(b_ptr + hh * D + jl).to(tl.float32)[None, :]
            y_hi += tl.load(b_ptr + hh * D + HALF + jl).to(tl.float32)[None, :]
        is_q = hh < Hq
        is_k = (hh >= Hq) & (hh < Hq + Hkv)
        is_v = hh >= Hq + Hkv
        if QK_NORM:
            msq = (tl.sum(y_lo * y_lo, axis=1) + tl.sum(y_hi * y_hi, axis=1)) / D
            r2 = 1.0 / tl.sqrt(msq + eps)
            nw_lo = tl.where(is_q, tl.load(qn_ptr + jl).to(tl.float32), tl.load(kn_ptr + jl).to(tl.float32))
            nw_hi = tl.where(is_q, tl.load(qn_ptr + HALF + jl).to(tl.float32),
                             tl.load(kn_ptr + HALF + jl).to(tl.float32))
            y_lo = tl.where(is_v, y_lo, y_lo * r2[:, None] * nw_lo[None, :])
            y_hi = tl.where(is_v, y_hi, y_hi * r2[:, None] * nw_hi[None, :])
        pos = tl.load(pos_ptr + rows, mask=rmask, other=0)
        pmask = rmask & (pos >= 0) & (pos < max_pos)
        trow = pos.to(tl.int64) * D
        cos = tl.load(tab_ptr + trow[:, None] + jl[None, :], mask=pmask[:, None], other=0.0)
        sin = tl.load(tab_ptr + trow[:, None] + HALF + jl[None, :], mask=pmask[:, None], other=0.0)
        r_lo = y_lo * cos - y_hi * sin
        r_hi = y_hi * cos + y_lo * sin
        y_lo = tl.where(is_v, y_lo, r_lo)
        y_hi = tl.where(is_v, y_hi, r_hi)
        o_lo = to_bf16(y_lo, INTERP)
        o_hi = to_bf16(y_hi, INTERP)
        qrow = rows[:, None].to(tl.int64) * stride_qm + hh * stride_qh
        qmask = rmask[:, None] & is_q
        tl.store(q_ptr + qrow + jl[None, :], o_lo, mask=qmask)
        tl.store(q_ptr + qrow + HALF + jl[None, :], o_hi, mask=qmask)
        if NVR_FROM_PTR:
            nvr = tl.load(nvr_ptr)
        else:
            nvr = nvr_int
        wmask = rmask & (rows < nvr)
        loc = tl.load(loc_ptr + rows, mask=wmask, other=0).to(tl.int64)
        krow = loc[:, None] * stride_kcs + (hh - Hq) * stride_kch
        kmask2 = wmask[:, None] & is_k
        tl.store(kc_ptr + krow + jl[None, :], o_lo, mask=kmask2)
        tl.store(kc_ptr + krow + HALF + jl[None, :], o_hi, mask=kmask2)
        vrow = loc[:, None] * stride_vcs + (hh - Hq - Hkv) * stride_vch
        vmask = wmask[:, None] & is_v
        tl.store(vc_ptr + vrow + jl[None, :], o_lo, mask=vmask)
        tl.store(vc_ptr + vrow + HALF + jl[None, :], o_hi, mask=vmask)


class _Launcher:
    """Stands in for the production kernel object: `kernel[grid](...)` launches the pipelined kernel with
    `num_stages` (the production wrapper passes none)."""

    def __init__(self, num_stages: int):
        self.num_stages = num_stages

    def __getitem__(self, grid):
        return lambda *args, **kw: _attn_prologue_pipelined_kernel[grid](*args, num_stages=self.num_stages, **kw)


def launcher(num_stages: int = 3) -> _Launcher:
    return _Launcher(num_stages)
