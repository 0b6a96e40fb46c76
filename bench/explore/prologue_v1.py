"""Fused attention prologue in one launch: RMSNorm -> QKV GEMV (+bias) -> QK-norm -> RoPE -> KV write.

Matches `lowlat.reference.attn_prologue.attn_prologue` (which composes `rms_norm`, `F.linear`,
`apply_rope` and `write_kv` exactly as `lowlat.reference.layer.attention_block` does).

Parallelisation (decode GEMV, rows M <= 48): the fused weight W [N, H], N = (Hq + 2 Hkv) D, is cut
into whole heads (D output columns each) times SPLIT_K contiguous slices of H. Program
(row tile, head, split) loads its rows of x [16, k-slice] (M padded to tiles of 16 rows, so a row's
arithmetic never depends on M), scales them by attn_norm, and streams its weight tile
[D, k-slice] through `tl.dot` with fp32 accumulation, keeping each head's two RoPE halves in two
accumulators. It also sums x^2 over its slice. With SPLIT_K > 1 every program stores its partial
(sum x^2, acc) in fp32 and bumps a per-(row tile, head) counter; the last one to arrive re-reads all
partials in split order 0..SPLIT_K-1 (so results are bitwise deterministic whatever the arrival
order) and runs the epilogue:

    rstd = rsqrt(sum x^2 / H + eps);  y = rstd * acc (+ bias)         (RMSNorm folded after the dot)
    q, k heads: y = q_norm|k_norm * y * rsqrt(mean(y^2) + eps)        (QK_NORM)
                y = RoPE(y) with cos/sin rows of a precomputed fp32 table
    q -> out_q [M, Hq, D] bf16 (all rows); k, v -> k_cache / v_cache [out_cache_loc] (valid rows only)

The split partition depends on H and the head count only (never on M), the counter is reset by the
last arriver, and all buffers are preallocated (`PrologueWorkspace`): one launch, CUDA-graph capturable.
PDL (`use_pdl`): the first weight tile is loaded before `gdc_wait()` (the wait for the previous
kernel's output x), and dependents are released right after it.

Measured on an H200 (session 4, bench/results/session4/call10/, `python bench/bench_attn_prologue.py`):
Llama-3.2-1B (QKV 12.6 MB) 9.8 us PDL-chained at 1 row = 31% of copy bandwidth, Qwen3-30B-A3B (21 MB) 11.6 us
= 44%. Two variants with the same arithmetic were slower and are not kept: the whole slice loaded before
the wait (Llama 10.8 us, Qwen3 23.1 us) and a software-pipelined K loop with an L2 prefetch of the slice
(Llama 12.3 us, Qwen3 15.8 us); see NOTES.md ("Left", issue 3).

Numerics vs the reference: x * attn_norm is rounded to bf16 once (the reference rounds the normalised
x to bf16 and multiplies in bf16), rstd is applied in fp32 after the dot, QK-norm and RoPE run in
fp32 with fp32 cos/sin (the reference rounds every step to bf16), outputs are rounded once to bf16.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from lowlat.config import ModelConfig
from lowlat.errors import StepContractError
from lowlat.kernels._attn_common import (check_num_valid_rows, check_tensor, gdc_launch_dependents, gdc_wait,
                                         interpreting, pdl_supported, round_bf16, to_bf16, to_dot)
from lowlat.reference.rope import rope_inv_freq
from lowlat.weights import LayerWeights

#: rows per row tile (tl.dot's M); fixed so a row's result never depends on how many rows there are
ROW_TILE = 16
#: programs per row tile the split-K heuristic aims for (about two waves on an H200's 132 SMs)
TARGET_PROGRAMS = 264


# --------------------------------------------------------------------------- build-time helpers
def pack_qkv(lw: LayerWeights) -> torch.Tensor:
    """Fused QKV weight [Hq*D + 2*Hkv*D, H] bf16 contiguous: rows Wq, then Wk, then Wv."""
    return torch.cat([lw.wq, lw.wk, lw.wv], dim=0).to(torch.bfloat16).contiguous()


def pack_qkv_bias(lw: LayerWeights) -> torch.Tensor | None:
    """Fused QKV bias [Hq*D + 2*Hkv*D] bf16 (bq | bk | bv), or None when the layer has no bias."""
    if lw.bq is None:
        return None
    return torch.cat([lw.bq, lw.bk, lw.bv]).to(torch.bfloat16).contiguous()


def rope_table(cfg: ModelConfig, max_pos: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """cos/sin table [P, D] float32 for positions 0..P-1 (P = max_pos): columns 0..D/2-1 hold
    cos(p * inv_freq[i]), columns D/2..D-1 hold sin(p * inv_freq[i]). Angles are computed in float64
    (inv_freq from `lowlat.reference.rope.rope_inv_freq`, incl. llama3 scaling), then rounded once."""
    if max_pos <= 0:
        raise StepContractError(f"max_pos={max_pos} must be positive")
    inv = rope_inv_freq(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling, torch.float64)
    ang = torch.arange(max_pos, dtype=torch.float64)[:, None] * inv[None, :]
    return torch.cat([ang.cos(), ang.sin()], dim=1).to(torch.float32).contiguous().to(device)


def split_plan(hidden: int, num_heads_total: int, block_k: int | None = None,
               split_k: int | None = None) -> tuple[int, int, int]:
    """(split_k, k_chunk, block_k): H is cut into split_k slices of k_chunk columns (a multiple of
    block_k; the last slice may be shorter). Depends on H and the head count only, never on M."""
    if hidden % 16:
        raise StepContractError(f"hidden size H={hidden} must be a multiple of 16")
    bk = block_k or next(b for b in (64, 32, 16) if hidden % b == 0)
    if bk < 16 or bk & (bk - 1) or hidden % bk:
        raise StepContractError(f"block_k={bk} must be a power of two >= 16 dividing H={hidden}")
    tiles = triton.cdiv(hidden, bk)
    want = split_k or max(1, triton.cdiv(TARGET_PROGRAMS, num_heads_total))
    want = max(1, min(want, tiles))
    k_chunk = triton.cdiv(tiles, want) * bk
    return triton.cdiv(hidden, k_chunk), k_chunk, bk


@dataclass
class PrologueWorkspace:
    """Preallocated scratch of `attn_prologue` for up to `max_rows` rows (CUDA-graph capturable).

    partial_acc [SPLIT_K, R, N] fp32 (R = max_rows rounded up to 16), partial_ss [SPLIT_K, NH, R] fp32,
    counters [R/16, NH] int32 (zero between launches: each launch's last arriver resets them).
    """

    split_k: int
    k_chunk: int
    block_k: int
    max_rows: int
    partial_acc: torch.Tensor
    partial_ss: torch.Tensor
    counters: torch.Tensor


def make_prologue_workspace(qkv_weight: torch.Tensor, head_dim: int, max_rows: int, *,
                            block_k: int | None = None, split_k: int | None = None) -> PrologueWorkspace:
    """Workspace for `qkv_weight` [N, H] (N = NH * head_dim) and up to max_rows rows, on its device."""
    n, hidden = qkv_weight.shape
    nh = n // head_dim
    sk, chunk, bk = split_plan(hidden, nh, block_k, split_k)
    rows = triton.cdiv(max(max_rows, 1), ROW_TILE) * ROW_TILE
    dev = qkv_weight.device
    return PrologueWorkspace(
        split_k=sk, k_chunk=chunk, block_k=bk, max_rows=rows,
        partial_acc=torch.empty((sk, rows, n) if sk > 1 else (1,), dtype=torch.float32, device=dev),
        partial_ss=torch.empty((sk, nh, rows) if sk > 1 else (1,), dtype=torch.float32, device=dev),
        counters=torch.zeros((rows // ROW_TILE, nh), dtype=torch.int32, device=dev))


# --------------------------------------------------------------------------- the kernel
@triton.jit
def _attn_prologue_kernel(
        x_ptr, w_ptr, b_ptr, an_ptr, qn_ptr, kn_ptr, pos_ptr, loc_ptr, nvr_ptr, nvr_int,
        kc_ptr, vc_ptr, tab_ptr, q_ptr, wsa_ptr, wss_ptr, cnt_ptr,
        M, H, Hq, Hkv, max_pos, eps, ws_rows,
        stride_xm, stride_qm, stride_qh, stride_kcs, stride_kch, stride_vcs, stride_vch,
        D: tl.constexpr, HALF: tl.constexpr, BM: tl.constexpr, BK: tl.constexpr, K_ITERS: tl.constexpr,
        SPLIT_K: tl.constexpr,
        HAS_BIAS: tl.constexpr, QK_NORM: tl.constexpr, NVR_FROM_PTR: tl.constexpr,
        USE_PDL: tl.constexpr, INTERP: tl.constexpr):
    rt = tl.program_id(0)          # row tile
    hh = tl.program_id(1)          # head of the fused weight: q heads, then k heads, then v heads
    sp = tl.program_id(2)          # K split
    NH = tl.num_programs(1)
    N = NH * D

    rows = rt * BM + tl.arange(0, BM)
    rmask = rows < M
    jl = tl.arange(0, HALF)
    kk = tl.arange(0, BK)
    wrow_lo = (hh * D + jl).to(tl.int64) * H
    wrow_hi = (hh * D + HALF + jl).to(tl.int64) * H
    k0 = sp * (K_ITERS * BK)

    # constant inputs first (weights): issued before waiting on the previous kernel (PDL).
    # H is a multiple of BK, so a K tile is either wholly inside [0, H) or wholly past it: the masks
    # are uniform per tile and the loads stay vectorised.
    live = k0 < H
    w_lo = tl.load(w_ptr + wrow_lo[:, None] + (k0 + kk)[None, :], mask=live, other=0.0)
    w_hi = tl.load(w_ptr + wrow_hi[:, None] + (k0 + kk)[None, :], mask=live, other=0.0)
    an = tl.load(an_ptr + k0 + kk, mask=live, other=0.0).to(tl.float32)
    if USE_PDL:
        gdc_wait()
        gdc_launch_dependents()

    acc_lo = tl.zeros([BM, HALF], dtype=tl.float32)
    acc_hi = tl.zeros([BM, HALF], dtype=tl.float32)
    ss = tl.zeros([BM], dtype=tl.float32)
    for it in range(K_ITERS):   # constexpr trip count: the slice is K_ITERS * BK columns (masked past H)
        kt = k0 + it * BK
        xv = tl.load(x_ptr + rows[:, None].to(tl.int64) * stride_xm + (kt + kk)[None, :],
                     mask=rmask[:, None] & (kt < H), other=0.0).to(tl.float32)
        ss += tl.sum(xv * xv, axis=1)
        xs = xv * an[None, :]
        if INTERP:
            xs = round_bf16(xs)
        # prefetch the next tile before the dots (masked off past the slice)
        nlive = (kt + BK < H) & (it + 1 < K_ITERS)
        w_lo_n = tl.load(w_ptr + wrow_lo[:, None] + (kt + BK + kk)[None, :], mask=nlive, other=0.0)
        w_hi_n = tl.load(w_ptr + wrow_hi[:, None] + (kt + BK + kk)[None, :], mask=nlive, other=0.0)
        an_n = tl.load(an_ptr + kt + BK + kk, mask=nlive, other=0.0).to(tl.float32)
        xd = to_dot(xs, INTERP)
        acc_lo += tl.dot(xd, tl.trans(to_dot(w_lo, INTERP)))
        acc_hi += tl.dot(xd, tl.trans(to_dot(w_hi, INTERP)))
        w_lo = w_lo_n
        w_hi = w_hi_n
        an = an_n

    do_epilogue = True
    if SPLIT_K > 1:
        # partials in fp32; the last program of this (row tile, head) sums them in split order
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


# --------------------------------------------------------------------------- the wrapper
def attn_prologue(x: torch.Tensor, qkv_weight: torch.Tensor, qkv_bias: torch.Tensor | None,
                  attn_norm: torch.Tensor, q_norm: torch.Tensor | None, k_norm: torch.Tensor | None,
                  positions: torch.Tensor, out_cache_loc: torch.Tensor, num_valid_rows: int | torch.Tensor,
                  k_cache: torch.Tensor, v_cache: torch.Tensor, cos_sin_table: torch.Tensor, *,
                  cfg: ModelConfig, out_q: torch.Tensor | None = None,
                  workspace: PrologueWorkspace | None = None, use_pdl: bool = False,
                  check_values: bool = False) -> torch.Tensor:
    """RMSNorm -> QKV projection (+bias) -> QK-norm (Qwen3) -> RoPE -> KV write, in one launch.

    Matches `lowlat.reference.attn_prologue.attn_prologue` (numerics policy of lowlat/numerics.py).

    Parameters:
        x             [M, H] bf16, last dim contiguous: the layer's input rows (pre-norm)
        qkv_weight    [N, H] bf16 contiguous, N = Hq*D + 2*Hkv*D (`pack_qkv`)
        qkv_bias      [N] bf16 (`pack_qkv_bias`) or None
        attn_norm     [H] bf16; q_norm, k_norm: [D] bf16, both given (Qwen3 QK-norm) or both None
        positions     [M] int64, position of each row (rows of padding may hold anything in 0..P-1)
        out_cache_loc [M] int32, KV slot each valid row writes
        num_valid_rows  int in 0..M, or a 1-element int32 device tensor (read in-kernel, for graphs)
        k_cache, v_cache [S, Hkv, D] bf16, last dim contiguous (SGLang's MHATokenToKVPool layout)
        cos_sin_table [P, D] float32 contiguous (`rope_table`): cos | sin halves per position
        cfg           gives head_dim (D) and rms_eps; head counts come from the shapes (TP shards work)
        out_q         optional preallocated [M, Hq, D] bf16 output (last dim contiguous)
        workspace     optional `make_prologue_workspace(qkv_weight, D, max_rows >= M)`; allocated
                      (not capturable) when None
        use_pdl       launch with programmatic dependent launch (sm_90; ignored when interpreting)
        check_values  also check positions / out_cache_loc values (host sync; not under capture)
    Returns: q [M, Hq, D] bf16, post-RoPE, every row (padding rows computed like valid ones).
    Mutates: k_cache, v_cache at out_cache_loc[:num_valid_rows] (bf16); padding rows write nothing.
    Raises: StepContractError naming the offending tensor / value; nothing is written then.
    """
    dev = x.device
    check_tensor("x", x, dtype=torch.bfloat16, ndim=2, device=dev)
    m, hidden = x.shape
    if m < 1:
        raise StepContractError("x has M=0 rows; a step needs at least one row")
    d = cfg.head_dim
    check_tensor("k_cache", k_cache, dtype=torch.bfloat16, ndim=3, shape=(None, None, ("D", d)), device=dev)
    s_slots, hkv, _ = k_cache.shape
    check_tensor("v_cache", v_cache, dtype=torch.bfloat16, ndim=3,
                 shape=(("S", s_slots), ("Hkv", hkv), ("D", d)), device=dev)
    check_tensor("qkv_weight", qkv_weight, dtype=torch.bfloat16, ndim=2, shape=(None, ("H", hidden)), device=dev)
    if not qkv_weight.is_contiguous():
        raise StepContractError(f"qkv_weight must be contiguous, got strides {qkv_weight.stride()}")
    n = qkv_weight.shape[0]
    if n % d or n // d <= 2 * hkv or (n // d - 2 * hkv) % hkv:
        raise StepContractError(
            f"qkv_weight has N={n} rows; must be (Hq + 2*Hkv)*D with D={d}, Hkv={hkv} and Hq a multiple of Hkv")
    nh = n // d
    hq = nh - 2 * hkv
    if d % 32:
        raise StepContractError(f"head_dim D={d} must be a multiple of 32 (each RoPE half feeds tl.dot)")
    if d & (d - 1):
        raise StepContractError(f"head_dim D={d} must be a power of two")
    if qkv_bias is not None:
        check_tensor("qkv_bias", qkv_bias, dtype=torch.bfloat16, ndim=1, shape=(("N", n),), device=dev)
    check_tensor("attn_norm", attn_norm, dtype=torch.bfloat16, ndim=1, shape=(("H", hidden),), device=dev)
    if (q_norm is None) != (k_norm is None):
        raise StepContractError("q_norm and k_norm must both be given (Qwen3 QK-norm) or both be None")
    if q_norm is not None:
        check_tensor("q_norm", q_norm, dtype=torch.bfloat16, ndim=1, shape=(("D", d),), device=dev)
        check_tensor("k_norm", k_norm, dtype=torch.bfloat16, ndim=1, shape=(("D", d),), device=dev)
    check_tensor("positions", positions, dtype=torch.int64, ndim=1, shape=(("M", m),), device=dev)
    check_tensor("out_cache_loc", out_cache_loc, dtype=torch.int32, ndim=1, shape=(("M", m),), device=dev)
    check_tensor("cos_sin_table", cos_sin_table, dtype=torch.float32, ndim=2, shape=(None, ("D", d)), device=dev)
    if not cos_sin_table.is_contiguous():
        raise StepContractError("cos_sin_table must be contiguous")
    nvr_int, nvr_t = check_num_valid_rows(num_valid_rows, m, dev)
    if out_q is None:
        out_q = torch.empty((m, hq, d), dtype=torch.bfloat16, device=dev)
    else:
        check_tensor("out_q", out_q, dtype=torch.bfloat16, ndim=3, shape=(("M", m), ("Hq", hq), ("D", d)),
                     device=dev)
    if workspace is None:
        workspace = make_prologue_workspace(qkv_weight, d, m)
    elif workspace.max_rows < m or workspace.counters.shape[1] != nh or workspace.counters.device != dev or (
            workspace.split_k > 1 and workspace.partial_acc.shape[2] != n):
        raise StepContractError(
            f"workspace (max_rows={workspace.max_rows}, heads={workspace.counters.shape[1]}) does not fit "
            f"M={m} rows of a weight with N={n} rows ({nh} heads) on {dev}")
    if check_values:
        _check_values(positions, out_cache_loc, nvr_int if nvr_t is None else int(nvr_t.item()),
                      cos_sin_table.shape[0], s_slots)

    interp = interpreting()
    pdl = bool(use_pdl) and pdl_supported(dev)
    grid = (triton.cdiv(m, ROW_TILE), nh, workspace.split_k)
    extra = {"launch_pdl": True} if pdl else {}
    dummy = attn_norm
    _attn_prologue_kernel[grid](
        x, qkv_weight, qkv_bias if qkv_bias is not None else dummy, attn_norm,
        q_norm if q_norm is not None else dummy, k_norm if k_norm is not None else dummy,
        positions, out_cache_loc, nvr_t if nvr_t is not None else out_cache_loc, nvr_int,
        k_cache, v_cache, cos_sin_table, out_q,
        workspace.partial_acc, workspace.partial_ss, workspace.counters,
        m, hidden, hq, hkv, cos_sin_table.shape[0], float(cfg.rms_eps), workspace.max_rows,
        x.stride(0), out_q.stride(0), out_q.stride(1), k_cache.stride(0), k_cache.stride(1),
        v_cache.stride(0), v_cache.stride(1),
        D=d, HALF=d // 2, BM=ROW_TILE, BK=workspace.block_k, K_ITERS=workspace.k_chunk // workspace.block_k,
        SPLIT_K=workspace.split_k,
        HAS_BIAS=qkv_bias is not None, QK_NORM=q_norm is not None, NVR_FROM_PTR=nvr_t is not None,
        USE_PDL=pdl, INTERP=interp, num_warps=4, **extra)
    return out_q


def _check_values(positions, out_cache_loc, n, max_pos, num_slots) -> None:
    pos = positions.cpu()
    bad = (pos < 0) | (pos >= max_pos)
    if bad.any():
        i = int(bad.nonzero()[0, 0])
        raise StepContractError(f"positions[{i}]={int(pos[i])} outside the RoPE table [0, {max_pos})")
    loc = out_cache_loc[:n].cpu()
    bad = (loc < 1) | (loc >= num_slots)
    if bad.any():
        i = int(bad.nonzero()[0, 0])
        raise StepContractError(f"out_cache_loc[{i}]={int(loc[i])} outside [1, {num_slots}) (slot 0 is the dummy slot)")
