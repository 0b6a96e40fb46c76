"""The decode attention's split-KV combine, folded into the next launch (the output projection).

`decode_attention(..., fold_combine=True)` stores every split's partial (m, l, acc) of every valid row, also a
single split's, and exits: no arrival counter, no combining program. It returns a `DeferredAttention`; the
output projection given it (`lowlat.kernels.out_proj`: `out_proj`, `residual_gemv`, `residual_gemv_deferred`)
computes, right after its PDL wait, the attention output of its own K slice (whole heads) for every row,

    out[i, h] = bf16( sum_s 2^(m_s - M) acc_s / sum_s 2^(m_s - M) l_s ),  M = max_s m_s,  s = 0..n_s(i) - 1

(`fold_attention_slice`), writes it into `DeferredAttention.out` and runs its GEMV on it. n_s(i) is the row's
split count, a function of its position only (`decode_attention`'s partition: nb = ceil((p + 1) / BLOCK_N),
n_s = ceil(nb / ceil(nb / MAX_SPLITS))); padding rows (i >= num_valid_rows) have none and output 0. The splits
are folded one at a time in split order with the arithmetic of `decode_attention._combine_splits` (a single
split's out is acc / l either way), so the bits are those of `decode_attention` followed by the projection.

Why it was tried (NOTES, session 19's explore29): at 1 row ~60% of the attention's in-step cost is its split
reduction's chain, the arrival (0.9 us) and the combining program's partial loads and stores (1.4-2.4 us), after its
KV loop; the output projection loads its activations after its wait anyway, so it could load the few partials of
its slice instead (a row's n_s x heads-per-slice x (D + 2) fp32), every column tile re-reading them.
Measured (session 22, NOTES): slower at every width and model tried, so `FusedModel` does not fold by default
(`FOLD_MAX_WIDTH` 0). At 1 row the attention's in-step cost fell 3.8 us a Llama-3.2-1B layer and out_proj's rose 4.9:
the combine's chain of dependent loads costs as much in the consumer, plus the consumer's write and re-read of its
slice, and every column tile repeats it (SmolLM2's split-1 out_proj: 36 tiles each combining all 9 heads).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from lowlat.errors import StepContractError
from lowlat.kernels._attn_common import refuse_overlaps, to_bf16

#: bytes of fp32 partials one piece of `fold_attention_slice` loads a round trip (rows x heads x D x CHUNK): 32 KB,
#: 64 registers a thread at 4 warps
FOLD_PIECE_BYTES = 32768


class DeferredAttention(NamedTuple):
    """The output of a `decode_attention(..., fold_combine=True)` whose split combine is left to the consuming
    output projection. out is written by the consumer (every element of its rows, padding rows 0)."""
    partial_o: torch.Tensor      # [R, Hq, S, D] fp32 (the workspace's): acc of split s of (row, head)
    partial_ml: torch.Tensor     # [R, Hq, S, 2] fp32: (m in log2 units, l) of split s
    positions: torch.Tensor      # [M] int64 contiguous: each row's position (its split count n_s)
    num_valid_rows: torch.Tensor  # 1-element int32 tensor on the device
    out: torch.Tensor            # [M, Hq, D] bf16 contiguous: where the consumer writes the attention output
    block_n: int                 # the attention's tokens per block (shapes the split partition)


def check_deferred_attention(d: DeferredAttention, m: int, k: int, device) -> tuple[int, int]:
    """Validate a DeferredAttention consumed as the [m, k] activations of a GEMV on `device`; returns (Hq, D).
    Raises StepContractError naming the field whose type, shape, dtype, device or layout is wrong."""
    if not isinstance(d, DeferredAttention):
        raise StepContractError(f"attention must be a DeferredAttention, got {type(d).__name__}")
    for name in ("partial_o", "partial_ml", "positions", "num_valid_rows", "out"):
        t = getattr(d, name)
        if not isinstance(t, torch.Tensor):
            raise StepContractError(f"deferred attention {name} must be a torch.Tensor, got {type(t).__name__}")
        if t.device != torch.device(device):
            raise StepContractError(f"deferred attention {name} is on {t.device}, expected {device}")
    o = d.out
    if o.dtype != torch.bfloat16 or o.dim() != 3 or o.shape[0] != m or o.shape[1] * o.shape[2] != k:
        raise StepContractError(f"deferred attention out must be [M={m}, Hq, D] bf16 with Hq*D = K={k}, got "
                                f"{tuple(o.shape)} {o.dtype}")
    if not o.is_contiguous():
        raise StepContractError("deferred attention out must be contiguous")
    hq, dh = o.shape[1], o.shape[2]
    po, pml = d.partial_o, d.partial_ml
    if (po.dtype != torch.float32 or po.dim() != 4 or po.shape[0] < m or po.shape[1] != hq or po.shape[3] != dh
            or not po.is_contiguous()):
        raise StepContractError(f"deferred attention partial_o must be [R >= {m}, Hq={hq}, S, D={dh}] fp32 "
                                f"contiguous, got {tuple(po.shape)} {po.dtype}")
    if (pml.dtype != torch.float32 or tuple(pml.shape) != (po.shape[0], hq, po.shape[2], 2)
            or not pml.is_contiguous()):
        raise StepContractError(f"deferred attention partial_ml must be [{po.shape[0]}, {hq}, {po.shape[2]}, 2] fp32 "
                                f"contiguous, got {tuple(pml.shape)} {pml.dtype}")
    if d.positions.dtype != torch.int64 or tuple(d.positions.shape) != (m,) or d.positions.stride(0) != 1:
        raise StepContractError(f"deferred attention positions must be [{m}] int64 contiguous, got "
                                f"{tuple(d.positions.shape)} {d.positions.dtype} stride {tuple(d.positions.stride())}")
    if d.num_valid_rows.dtype != torch.int32 or d.num_valid_rows.numel() != 1:
        raise StepContractError(f"deferred attention num_valid_rows must be a 1-element int32 tensor, got "
                                f"{tuple(d.num_valid_rows.shape)} {d.num_valid_rows.dtype}")
    s = po.shape[2]
    if (isinstance(d.block_n, bool) or not isinstance(d.block_n, int) or s & (s - 1) or d.block_n < 16
            or d.block_n & (d.block_n - 1)):
        raise StepContractError(f"deferred attention num_splits={s} / block_n={d.block_n!r} must be powers of two "
                                "(an int >= 16 for block_n)")
    if dh < 16 or dh & (dh - 1):
        raise StepContractError(f"deferred attention head_dim D={dh} must be a power of two >= 16")
    refuse_overlaps(dict(out=o), dict(partial_o=po, partial_ml=pml, positions=d.positions,
                                      num_valid_rows=d.num_valid_rows),
                    "deferred attention out overlaps its {b}: the consumer reads it while it writes out")
    return hq, dh


def fold_pieces(rows: int, span: int, head_dim: int, chunk: int) -> dict:
    """The constexprs of `fold_attention_slice` for `rows` rows and K slices of `span` columns (whole heads): HS
    heads a slice, HP = next power of two, RB rows a piece (a power of two <= 16, as many as keep RB x HP x D x
    chunk fp32 within FOLD_PIECE_BYTES; 1 when even one row's exceed it), NRB = ceil(rows / RB) pieces, CHUNK =
    chunk."""
    hs = span // head_dim
    hp = triton.next_power_of_2(hs)
    rb = min(16, triton.next_power_of_2(rows))
    while rb > 1 and rb * hp * head_dim * chunk * 4 > FOLD_PIECE_BYTES:
        rb //= 2
    return dict(F_HS=hs, F_HP=hp, F_RB=rb, F_NRB=triton.cdiv(rows, rb), F_CHUNK=chunk)


@triton.jit
def fold_nsplits(pos_ptr, nvr, m0, M, k_begin, k_end, D: tl.constexpr, BLOCK_N: tl.constexpr,
                 MAX_SPLITS: tl.constexpr, HS: tl.constexpr, HP: tl.constexpr, RB: tl.constexpr):
    """For the [RB x HP] (row, head) elements of rows m0.. and the heads of the K slice [k_begin, k_end): each
    element's split count n_s (0 for padding rows and for elements outside [M, slice]), and whether the element
    exists (row < M, a head of the slice). Reads positions only (written before the step: may run before the wait)."""
    e = tl.arange(0, RB * HP)
    r = m0 + e // HP
    hh = e % HP
    exists = (r < M) & (hh < HS) & (k_begin + hh * D < k_end)
    valid = exists & (r < nvr)
    pos = tl.load(pos_ptr + r, mask=valid, other=0).to(tl.int32)
    nblocks = tl.cdiv(pos + 1, BLOCK_N)
    per_split = tl.cdiv(nblocks, MAX_SPLITS)
    ns = tl.where(valid, tl.cdiv(nblocks, per_split), 0)
    return ns, exists


@triton.jit
def fold_attention_slice(wso_ptr, wsml_ptr, ns, exists, out_ptr, stride_om, Hq, m0, k_begin,
                         D: tl.constexpr, MAX_SPLITS: tl.constexpr, HP: tl.constexpr, RB: tl.constexpr,
                         CHUNK: tl.constexpr, INTERP: tl.constexpr):
    """out[r, h*D:(h+1)*D] = bf16(sum_s 2^(m_s - M) acc_s / sum_s 2^(m_s - M) l_s) for the elements of
    `fold_nsplits` (rows m0.., the slice's heads), splits folded in split order CHUNK partials a round trip, with
    the arithmetic of `decode_attention._combine_splits` (hence its bits); elements with no split write 0. out is
    the [M, Hq * D] view (row stride stride_om) of `DeferredAttention.out`."""
    e = tl.arange(0, RB * HP)
    r = (m0 + e // HP).to(tl.int64)
    head = k_begin // D + e % HP
    dd = tl.arange(0, D)
    hrow = r * Hq + head
    gmask = ns > 0
    ss = tl.arange(0, MAX_SPLITS)
    m_all = tl.load(wsml_ptr + (hrow[:, None] * MAX_SPLITS + ss[None, :]) * 2,
                    mask=gmask[:, None] & (ss[None, :] < ns[:, None]), other=float("-inf"), cache_modifier=".cg")
    m_max = tl.max(m_all, axis=1)
    m_max = tl.where(gmask, m_max, 0.0)
    l_tot = tl.zeros([RB * HP], dtype=tl.float32)
    o_tot = tl.zeros([RB * HP, D], dtype=tl.float32)
    most = tl.max(ns, axis=0)
    if INTERP:  # the interpreter cannot take tensor bounds in range(): while
        c0 = 0
        while c0 < most:
            l_tot, o_tot = _fold_chunk(l_tot, o_tot, c0, ns, m_max, hrow, gmask, dd, wso_ptr, wsml_ptr, D,
                                       MAX_SPLITS, CHUNK)
            c0 += CHUNK
    else:
        for c0 in range(0, most, CHUNK):
            l_tot, o_tot = _fold_chunk(l_tot, o_tot, c0, ns, m_max, hrow, gmask, dd, wso_ptr, wsml_ptr, D,
                                       MAX_SPLITS, CHUNK)
    l_tot = tl.where(gmask, l_tot, 1.0)
    tl.store(out_ptr + r[:, None] * stride_om + head[:, None] * D + dd[None, :],
             to_bf16(o_tot / l_tot[:, None], INTERP), mask=exists[:, None])


@triton.jit
def _fold_chunk(l_tot, o_tot, c0, ns, m_max, hrow, gmask, dd, wso_ptr, wsml_ptr, D: tl.constexpr,
                MAX_SPLITS: tl.constexpr, CHUNK: tl.constexpr):
    """Splits c0..c0+CHUNK-1 of each element (those < its n_s) added in split order: all loaded first (one round
    trip; written by the previous launch: .cg), then folded one split at a time (`_fold_splits`' arithmetic)."""
    parts = ()
    for c in tl.static_range(CHUNK):
        ok = gmask & (c0 + c < ns)
        at = hrow * MAX_SPLITS + c0 + c
        ms = tl.load(wsml_ptr + at * 2, mask=ok, other=0.0, cache_modifier=".cg")
        ls = tl.load(wsml_ptr + at * 2 + 1, mask=ok, other=0.0, cache_modifier=".cg")
        os_ = tl.load(wso_ptr + at[:, None] * D + dd[None, :], mask=ok[:, None], other=0.0, cache_modifier=".cg")
        parts = parts + ((ok, ms, ls, os_),)
    for c in tl.static_range(CHUNK):
        ok, ms, ls, os_ = parts[c]
        w = tl.exp2(ms - m_max)
        l_tot = tl.where(ok, l_tot + w * ls, l_tot)
        o_tot = tl.where(ok[:, None], o_tot + w[:, None] * os_, o_tot)
    return l_tot, o_tot
