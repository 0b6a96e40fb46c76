"""Fused attention prologue in one launch: RMSNorm -> QKV GEMV (+bias) -> QK-norm -> RoPE -> KV write.

Matches `lowlat.reference.attn_prologue.attn_prologue` (which composes `rms_norm`, `F.linear`,
`apply_rope` and `write_kv` exactly as `lowlat.reference.layer.attention_block` does).

The QKV projection is a pair GEMV of `lowlat.kernels._gemv` (kind "qkv", the gate/up kernel's form):
output row p of the GEMV (p < NP = (Hq + 2 Hkv) * D / 2) is rotary index j = p % (D/2) of head
p // (D/2), and its program multiplies the two weight rows of that pair, the lower half's (row
head * D + j of the packed [N, H] weight, `_gemv.weight_rows` with HALF_ROWS = D/2) and the upper
half's (D/2 rows further), so each program holds both RoPE partners of its rows in the same registers:

    lo[p, m], hi[p, m] = sum_k W[head*D + j (+ D/2), k] * bf16(attn_norm[k] * x[m, k])     fp32, "swap AB"

The grid is (tiles of BN output rows, `split` slices of K, blocks of 16 rows): BN is a multiple of D/2
(whole heads), and each program takes one block of 16 rows (M padded), as the session-4 kernel did, so
48 rows run three times the programs (looping over the row blocks in one program, as the other GEMVs
of `_gemv` do, took SmolLM2's prologue 8.0 us at 48 rows against 4.4 this way). The plan (preload or
stream mode, bn, block_k, split, PDL prefetch) is `plan_gemv(NP, H, kind="qkv")`, the tuned table
included; its weight stream and bn may depend on the launch's row-block count (`GemvPlan.by_row_blocks`; bn
only without QK-norm, `_gemv.BN_BY_ROW_BLOCKS_KINDS`). With split > 1 the partial tiles and the per-row sums of
x^2 are reduced in split order by the last program to arrive (deterministic whatever the arrival order, see
`_gemv`), which then runs the epilogue on its [BN, 16] tiles:

    rstd = 1 / sqrt(sum x^2 / H + eps);  y = rstd * (lo | hi) (+ bias)       (RMSNorm folded after the dot)
    q, k heads: y = q_norm|k_norm * y / sqrt(mean over the head of y^2 + eps)      (QK_NORM)
                (lo, hi) = (lo cos - hi sin, hi cos + lo sin), cos/sin rows of a precomputed fp32 table
    q -> out_q [M, Hq, D] bf16 (all rows); k, v -> k_cache / v_cache [out_cache_loc] (valid rows only)

A row's arithmetic never depends on M or on the other rows (rows are padded to blocks of 16, the plan
is a function of the weight's shape only). Given a `lowlat.kernels.out_proj.DeferredX` (the previous down
projection's split-K partials and residual, `out_proj.residual_gemv_deferred`), each program first reduces its K
slice of its row block, x = bf16((partials added to zeros in split order) + residual), into the DeferredX's `out`
(the bits `residual_gemv` would have stored) right after its wait, its preloaded weights still in flight, then runs
on it. All buffers are preallocated (`PrologueWorkspace`): one launch, CUDA-graph capturable. PDL (`use_pdl`): a
preload plan issues all its weight loads, a stream plan its L2 prefetch, before `gdc_wait`; dependents are released
right after it.

Measured on an H200 (session 5, bench/results/session5/call4/attn_prologue_h200.json, `python
bench/bench_attn_prologue.py`, PDL-chained launches on rotating cold copies, copy bandwidth 4154 GB/s):
SmolLM2-135M 3.65-3.85 us at 1-16 rows, 4.40 at 48; Llama-3.2-1B (QKV 12.6 MB) 8.24-8.36 us at 1-16 rows
= 37% of copy bandwidth, 16.4 at 48; Qwen3-30B-A3B (21 MB, QK-norm) 10.24-10.45 us = 49%, 24.6 at 48.
The session-4 kernel (x @ W^T with the rows as the MMA's M operand, one weight tile loaded ahead, 288
programs of 64-column heads; bench/explore/README.md names the commit that still runs it) took 9.8-10.1
/ 20.6-20.9 us (Llama, 1-6 / 48 rows), 11.7-12.1 / 23.3-23.5 (Qwen3) and 3.8-3.9 / 4.6 (SmolLM2) in the
same A/B runs (call2, call3). Neither reaches 70% of copy bandwidth: a launch that waits for its input
pays ~3.5-4 us of dependent round trips (x load, split-K arrival, partial loads, epilogue loads, stores)
whatever it streams (SmolLM2's 1.1 MB takes 3.65 us), which is as much as a 12-21 MB read takes at copy
bandwidth (3-5 us); see NOTES.md.

Numerics vs the reference: x * attn_norm is rounded to bf16 once (the reference rounds the normalised
x to bf16 and multiplies in bf16), rstd is applied in fp32 after the dot, QK-norm and RoPE run in
fp32 with fp32 cos/sin (the reference rounds every step to bf16), outputs are rounded once to bf16.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from lowlat.config import ModelConfig
from lowlat.errors import StepContractError
from lowlat.kernels._attn_common import (check_num_valid_rows, check_tensor, gdc_launch_dependents, gdc_wait,
                                         interpreting, pdl_supported, refuse_overlaps, require_runnable, to_bf16)
from lowlat.kernels._gemv import (MAX_ROWS, GemvPlan, GemvWorkspace, gemv_loop, launch_constexprs, plan_gemv,
                                  prefetch_l2, preload_product, preload_weights, refuse_bn_by_width, row_blocks,
                                  rstd_of, store_partial, store_split_ss, sum_partials, sum_split_ss)
from lowlat.kernels.out_proj import (DeferredX, _reduce_deferred, check_deferred, check_writes_apart, consumer_input,
                                     deferred_kernel_args)
from lowlat.reference.rope import rope_inv_freq
from lowlat.weights import LayerWeights


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


def prologue_plan(qkv_weight: torch.Tensor, head_dim: int, **fields) -> GemvPlan:
    """The GEMV plan of the prologue for `qkv_weight` [N, H]: `plan_gemv(N / 2, H, kind="qkv", **fields)`
    (fields: block_k, split, bn, preload, warps, stages, pf_k, forced as in `plan_gemv`), with bn raised
    to D/2 where it is narrower, so that a tile holds whole heads (QK-norm reduces over a head). Raises
    StepContractError for D > 256, or for a table plan whose bn at some row-block count (`by_row_blocks`) is
    narrower than D/2 (`attn_prologue` would refuse it at that width)."""
    n, hidden = qkv_weight.shape
    half = head_dim // 2
    if half > 128:
        raise StepContractError(f"head_dim D={head_dim} > 256: a head's rotary half must fit one tile (bn <= 128)")
    plan = plan_gemv(n // 2, hidden, kind="qkv", **fields)
    if plan.bn < half:
        plan = plan_gemv(n // 2, hidden, kind="qkv", **{**fields, "bn": half})
    narrow = [(b, plan.at(b).bn) for b in (1, 2, 3) if plan.at(b).bn < half]
    if narrow:
        raise StepContractError(f"the qkv plan {n // 2}x{hidden} runs bn {narrow[0][1]} at {narrow[0][0]} row blocks "
                                f"(by_row_blocks={plan.by_row_blocks}): narrower than D/2={half}, a tile must hold "
                                "whole heads")
    return plan


#: launches of fewer (tile, split) programs than this issue the epilogue's loads early (see `PrologueWorkspace`)
EARLY_INPUTS_PROGRAMS = 128


@dataclass
class PrologueWorkspace:
    """Preallocated scratch of `attn_prologue` for up to 48 rows (CUDA-graph capturable): its tile plan, a
    `GemvWorkspace` for its N / 2 pair rows (split-K partials, per-split sums of squares, arrival counters
    per (tile, row block): zero between launches, each launch's last arriver resets them), and where the
    epilogue's inputs are loaded: `early_inputs` (positions and KV slots right after the PDL wait,
    cos / sin, bias and norm weights together with the finisher's partial tiles: one round trip fewer,
    more registers) or at their point of use. Measured (session 5, bench/results/session5/call3/
    explore14.json, 1 / 6 rows): early pays where the grid is smaller than the GPU (SmolLM2, 40
    programs: 3.7 vs 4.9 us) and costs where it is not (Llama-3.2-1B, 192: 8.5 vs 8.0 us; Qwen3-30B-A3B,
    320, QK-norm: 14.0 vs 10.1 us), hence the default `n_tiles * split < EARLY_INPUTS_PROGRAMS` (of `plan.at(1)`).
    The results are the same bits either way (only the loads move)."""

    plan: GemvPlan
    gemv: GemvWorkspace
    early_inputs: bool

    @property
    def counters(self) -> torch.Tensor:
        return self.gemv.counters


def make_prologue_workspace(qkv_weight: torch.Tensor, head_dim: int, *, plan: GemvPlan | None = None,
                            early_inputs: bool | None = None, **fields) -> PrologueWorkspace:
    """Workspace for `qkv_weight` [N, H] (`pack_qkv`) on its device, for 1..48 rows. plan: a
    `prologue_plan` (default: `prologue_plan(qkv_weight, head_dim, **fields)`); early_inputs: see
    `PrologueWorkspace` (default: its rule, on the plan a launch of one row block runs, where it was measured)."""
    plan = prologue_plan(qkv_weight, head_dim, **fields) if plan is None else plan
    if early_inputs is None:
        one = plan.at(1)                # bn may depend on the row-block count
        early_inputs = one.n_tiles * one.split < EARLY_INPUTS_PROGRAMS
    return PrologueWorkspace(plan=plan, gemv=GemvWorkspace.create(plan.n, qkv_weight.device),
                             early_inputs=bool(early_inputs))


# --------------------------------------------------------------------------- the kernel
@triton.jit
def _rope_rows(tab_ptr, pos, mok, max_pos, j, D: tl.constexpr, HALF: tl.constexpr):
    """cos and sin [BN, 16] fp32 of rotary indices j [BN] at positions pos [16] (0 where not mok or the
    position is outside the table)."""
    ok = (mok & (pos >= 0) & (pos < max_pos))[None, :]
    tab = tab_ptr + pos.to(tl.int64)[None, :] * D + j[:, None]
    return tl.load(tab, mask=ok, other=0.0), tl.load(tab + HALF, mask=ok, other=0.0)


@triton.jit
def _head_weights(b_ptr, qn_ptr, kn_ptr, hd, j, nok, Hq, D: tl.constexpr, HALF: tl.constexpr, BN: tl.constexpr,
                  HAS_BIAS: tl.constexpr, QK_NORM: tl.constexpr):
    """Per tile row (head hd, rotary index j): the bias of its lower / upper half and the QK-norm weights
    of both halves (q_norm for q heads, k_norm otherwise), fp32 [BN] each; zeros where unused."""
    blo = tl.zeros((BN,), dtype=tl.float32)
    bhi = tl.zeros((BN,), dtype=tl.float32)
    nlo = tl.zeros((BN,), dtype=tl.float32)
    nhi = tl.zeros((BN,), dtype=tl.float32)
    if HAS_BIAS:
        blo = tl.load(b_ptr + hd * D + j, mask=nok, other=0.0).to(tl.float32)
        bhi = tl.load(b_ptr + hd * D + HALF + j, mask=nok, other=0.0).to(tl.float32)
    if QK_NORM:
        is_q = hd < Hq
        nlo = tl.where(is_q, tl.load(qn_ptr + j).to(tl.float32), tl.load(kn_ptr + j).to(tl.float32))
        nhi = tl.where(is_q, tl.load(qn_ptr + HALF + j).to(tl.float32), tl.load(kn_ptr + HALF + j).to(tl.float32))
    return blo, bhi, nlo, nhi


@triton.jit
def _epilogue_inputs(b_ptr, qn_ptr, kn_ptr, tab_ptr, pos, m0, M, max_pos, n0, NP, Hq, D: tl.constexpr,
                     HALF: tl.constexpr, BN: tl.constexpr, HAS_BIAS: tl.constexpr, QK_NORM: tl.constexpr):
    """What the epilogue of tile rows n0..n0+BN (pair rows) and rows m0..m0+15 (positions `pos`) reads:
    cos, sin [BN, 16] fp32 (0 past M or outside the table), and per tile row the bias of the lower /
    upper half and the QK-norm weights of both halves, fp32 [BN] (zeros where unused). Issued together
    (and, in the finisher, with the partial tiles' loads): one round trip, not one per input (EARLY)."""
    rn = n0 + tl.arange(0, BN)
    rm = m0 + tl.arange(0, 16)
    nok = rn < NP
    hd = rn // HALF
    j = rn % HALF
    cos, sin = _rope_rows(tab_ptr, pos, rm < M, max_pos, j, D, HALF)
    blo, bhi, nlo, nhi = _head_weights(b_ptr, qn_ptr, kn_ptr, hd, j, nok, Hq, D, HALF, BN, HAS_BIAS, QK_NORM)
    return cos, sin, blo, bhi, nlo, nhi


@triton.jit
def _rope_epilogue(lo, hi, ss, m0, n0, M, NP, K, eps, nvr, pos, loc, cos, sin, blo, bhi, nlo, nhi,
                   b_ptr, qn_ptr, kn_ptr, pos_ptr, loc_ptr, tab_ptr, kc_ptr, vc_ptr, q_ptr, Hq, Hkv, max_pos,
                   stride_qm, stride_qh, stride_kcs, stride_kch, stride_vcs, stride_vch,
                   D: tl.constexpr, HALF: tl.constexpr, BN: tl.constexpr, HAS_BIAS: tl.constexpr,
                   QK_NORM: tl.constexpr, EARLY: tl.constexpr, UPCAST: tl.constexpr):
    """RMSNorm scale, bias, QK-norm, RoPE and the stores of one [BN, 16] tile pair (lower / upper
    rotary halves of pair rows n0.., rows m0..m0+15). EARLY: positions, slots, cos / sin, bias and norm
    weights are given (`_epilogue_inputs`); else they are loaded here (pos, loc, cos, sin, blo, bhi, nlo,
    nhi are then placeholders), positions / cos / sin and slots where they are used."""
    rn = n0 + tl.arange(0, BN)
    rm = m0 + tl.arange(0, 16)
    nok = rn < NP
    mok = rm < M
    hd = rn // HALF                        # head of the fused weight: q heads, then k heads, then v heads
    j = rn % HALF                          # rotary index within the head
    if not EARLY:
        blo, bhi, nlo, nhi = _head_weights(b_ptr, qn_ptr, kn_ptr, hd, j, nok, Hq, D, HALF, BN, HAS_BIAS, QK_NORM)
    rstd = rstd_of(ss, K, eps)
    ylo = lo * rstd[None, :]
    yhi = hi * rstd[None, :]
    if HAS_BIAS:
        ylo += blo[:, None]
        yhi += bhi[:, None]
    is_q = hd < Hq
    is_v = hd >= Hq + Hkv
    is_k = (hd >= Hq) & (hd < Hq + Hkv)
    if QK_NORM:                            # per head and row: the head's BN // HALF groups of HALF tile rows
        G: tl.constexpr = BN // HALF
        sq = tl.reshape(ylo * ylo + yhi * yhi, [G, HALF, 16])
        r2 = rstd_of(tl.sum(sq, axis=1), D, eps)                                    # [G, 16]
        r2 = tl.reshape(tl.broadcast_to(r2[:, None, :], [G, HALF, 16]), [BN, 16])
        ylo = tl.where(is_v[:, None], ylo, ylo * r2 * nlo[:, None])
        yhi = tl.where(is_v[:, None], yhi, yhi * r2 * nhi[:, None])
    if not EARLY:
        pos = tl.load(pos_ptr + rm, mask=mok, other=0)
        cos, sin = _rope_rows(tab_ptr, pos, mok, max_pos, j, D, HALF)
    rlo = ylo * cos - yhi * sin
    rhi = yhi * cos + ylo * sin
    olo = to_bf16(tl.where(is_v[:, None], ylo, rlo), UPCAST)
    ohi = to_bf16(tl.where(is_v[:, None], yhi, rhi), UPCAST)

    qp = q_ptr + rm.to(tl.int64)[None, :] * stride_qm + (hd * stride_qh + j)[:, None]
    qmask = (nok & is_q)[:, None] & mok[None, :]
    tl.store(qp, olo, mask=qmask)
    tl.store(qp + HALF, ohi, mask=qmask)
    wok = mok & (rm < nvr)
    if not EARLY:
        loc = tl.load(loc_ptr + rm, mask=wok, other=0).to(tl.int64)
    kp = kc_ptr + loc[None, :] * stride_kcs + ((hd - Hq) * stride_kch + j)[:, None]
    kmask = (nok & is_k)[:, None] & wok[None, :]
    tl.store(kp, olo, mask=kmask)
    tl.store(kp + HALF, ohi, mask=kmask)
    vp = vc_ptr + loc[None, :] * stride_vcs + ((hd - Hq - Hkv) * stride_vch + j)[:, None]
    vmask = (nok & is_v)[:, None] & wok[None, :]
    tl.store(vp, olo, mask=vmask)
    tl.store(vp + HALF, ohi, mask=vmask)


@triton.jit(do_not_specialize=["M"])
def _attn_prologue_kernel(
        x_ptr, stride_xm, w_ptr, stride_wn, an_ptr, ws_ptr, sss_ptr, cnt_ptr,
        b_ptr, qn_ptr, kn_ptr, pos_ptr, loc_ptr, nvr_ptr, nvr_int, kc_ptr, vc_ptr, tab_ptr, q_ptr,
        M, NP, K, Hq, Hkv, max_pos, eps,
        stride_qm, stride_qh, stride_kcs, stride_kch, stride_vcs, stride_vch,
        xp_ptr, xp_stride_s, xp_stride_m, xout_ptr, stride_om,
        D: tl.constexpr, HALF: tl.constexpr,
        SPLIT: tl.constexpr, CPS: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, NUM_MB: tl.constexpr,
        EVEN_N: tl.constexpr, EVEN_K: tl.constexpr, PF_K: tl.constexpr, PRELOAD: tl.constexpr,
        HAS_BIAS: tl.constexpr, QK_NORM: tl.constexpr, NVR_FROM_PTR: tl.constexpr, EARLY: tl.constexpr,
        USE_PDL: tl.constexpr, UPCAST: tl.constexpr, XSPLIT: tl.constexpr = 0, RB: tl.constexpr = 16,
        NRB: tl.constexpr = 1, KC: tl.constexpr = 16):
    # grid (tile, split, row block): each program one block of 16 rows (NUM_MB is the launch's row-block
    # count, for the workspace layout; the GEMV helpers run with one block at rows m0..m0+15).
    # XSPLIT > 0 (`out_proj.DeferredX`): x_ptr holds the residual and xp the XSPLIT split-K partials of the
    # previous residual GEMV (the down projection); right after the wait every program first computes its K slice of
    # its row block's x = bf16(partials in split order + residual) into xout (`_reduce_deferred`; the programs of
    # one K slice store the same bits), then runs on xout, the preloaded weights' loads in flight meanwhile.
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    pid_m = tl.program_id(2)
    n0 = pid_n * BN
    m0 = pid_m * 16
    k_begin = pid_k * (CPS * BK)
    k_end = tl.minimum(k_begin + CPS * BK, K)
    w2_off = HALF * stride_wn                          # the upper rotary half: HALF weight rows further
    if PRELOAD:                                        # weight loads issued before the wait
        lws = preload_weights(w_ptr, stride_wn, n0, NP, k_begin, k_end, BN, BK, CPS, EVEN_N, EVEN_K, UPCAST, HALF)
        hws = preload_weights(w_ptr + w2_off, stride_wn, n0, NP, k_begin, k_end, BN, BK, CPS, EVEN_N, EVEN_K,
                              UPCAST, HALF)
    elif USE_PDL and PF_K > 0:
        prefetch_l2(w_ptr, stride_wn, n0, NP, k_begin, K, BN, PF_K, HALF)
        prefetch_l2(w_ptr + w2_off, stride_wn, n0, NP, k_begin, K, BN, PF_K, HALF)
    if USE_PDL:
        gdc_wait()
        gdc_launch_dependents()
    rm = m0 + tl.arange(0, 16)
    if NVR_FROM_PTR:
        nvr = tl.load(nvr_ptr)
    else:
        nvr = nvr_int
    pos = tl.zeros((16,), dtype=tl.int64)   # EARLY: the rows' positions and KV slots now (two [16] vectors),
    loc = pos                               # so the finisher's table loads go out with its partial-tile loads
    if EARLY:
        pos = tl.load(pos_ptr + rm, mask=rm < M, other=0)
        loc = tl.load(loc_ptr + rm, mask=(rm < M) & (rm < nvr), other=0).to(tl.int64)
    if XSPLIT > 0:                     # after the EARLY loads: they share its first round trip
        _reduce_deferred(x_ptr + m0 * stride_xm, stride_xm, xp_ptr + m0 * xp_stride_m, xp_stride_s, xp_stride_m,
                         xout_ptr + m0 * stride_om, stride_om, M - m0, k_begin, k_end, CPS * BK, XSPLIT, RB, NRB, KC,
                         UPCAST)
        tl.debug_barrier()          # this program's xout stores before its own loads of them
        x_ptr = xout_ptr
        stride_xm = stride_om
    xb = x_ptr + m0 * stride_xm                        # this program's row block, as rows 0..15 of the helpers
    z = tl.zeros((16,), dtype=tl.float32)
    if PRELOAD:
        lo, _l1, _l2, hi, _h1, _h2, ss, _s1, _s2 = preload_product(
            lws, hws, xb, stride_xm, M - m0, k_begin, k_end, an_ptr, z, z, z, BN, BK, CPS, 1, True, 2, EVEN_K, UPCAST)
    else:
        lo, _l1, _l2, hi, _h1, _h2, ss, _s1, _s2 = gemv_loop(
            w_ptr, w2_off, stride_wn, xb, stride_xm, M - m0, NP, n0, k_begin, K, an_ptr, z, z, z,
            BN, BK, CPS, 1, True, 2, EVEN_N, EVEN_K, UPCAST, HALF)
    MP: tl.constexpr = 16 * NUM_MB
    cos = tl.zeros((BN, 16), dtype=tl.float32)     # placeholders unless EARLY (`_rope_epilogue` loads them)
    sin = cos
    blo = tl.zeros((BN,), dtype=tl.float32)
    bhi = blo
    nlo = blo
    nhi = blo
    finished = True
    if SPLIT > 1:
        store_partial(ws_ptr, lo, 2 * pid_k, NP, MP, n0, m0, BN, EVEN_N)
        store_partial(ws_ptr, hi, 2 * pid_k + 1, NP, MP, n0, m0, BN, EVEN_N)
        store_split_ss(sss_ptr, ss, pid_n, pid_k, m0, SPLIT)
        tl.debug_barrier()
        cnt = cnt_ptr + pid_n * NUM_MB + pid_m
        arrived = tl.atomic_add(cnt, 1, sem="acq_rel", scope="gpu")
        finished = arrived == SPLIT - 1
    if finished:
        if EARLY:                      # before the partial tiles' loads: they share a round trip
            cos, sin, blo, bhi, nlo, nhi = _epilogue_inputs(b_ptr, qn_ptr, kn_ptr, tab_ptr, pos, m0, M, max_pos, n0,
                                                            NP, Hq, D, HALF, BN, HAS_BIAS, QK_NORM)
        if SPLIT > 1:                  # the last to arrive: every split's partials, in split order
            lo = sum_partials(ws_ptr, 0, NP, MP, n0, m0, BN, SPLIT, 2, EVEN_N)
            hi = sum_partials(ws_ptr, 1, NP, MP, n0, m0, BN, SPLIT, 2, EVEN_N)
            ss = sum_split_ss(sss_ptr, pid_n, m0, SPLIT)
            tl.store(cnt, 0)           # reset for the next launch (plain store, see `_gemv` "Split-K")
        _rope_epilogue(lo, hi, ss, m0, n0, M, NP, K, eps, nvr, pos, loc, cos, sin, blo, bhi, nlo, nhi,
                       b_ptr, qn_ptr, kn_ptr, pos_ptr, loc_ptr, tab_ptr, kc_ptr, vc_ptr, q_ptr, Hq, Hkv, max_pos,
                       stride_qm, stride_qh, stride_kcs, stride_kch, stride_vcs, stride_vch,
                       D, HALF, BN, HAS_BIAS, QK_NORM, EARLY, UPCAST)


# --------------------------------------------------------------------------- the wrapper
def attn_prologue(x: torch.Tensor | DeferredX, qkv_weight: torch.Tensor, qkv_bias: torch.Tensor | None,
                  attn_norm: torch.Tensor, q_norm: torch.Tensor | None, k_norm: torch.Tensor | None,
                  positions: torch.Tensor, out_cache_loc: torch.Tensor, num_valid_rows: int | torch.Tensor,
                  k_cache: torch.Tensor, v_cache: torch.Tensor, cos_sin_table: torch.Tensor, *,
                  cfg: ModelConfig, out_q: torch.Tensor | None = None,
                  workspace: PrologueWorkspace | None = None, use_pdl: bool = False,
                  check_values: bool = False) -> torch.Tensor:
    """RMSNorm -> QKV projection (+bias) -> QK-norm (Qwen3) -> RoPE -> KV write, in one launch.

    Matches `lowlat.reference.attn_prologue.attn_prologue` (numerics policy of lowlat/numerics.py).

    Parameters:
        x             [M, H] bf16 (M = 1..48), last dim contiguous: the layer's input rows (pre-norm); or a
                      `DeferredX` (`out_proj.residual_gemv_deferred` of the previous layer's down projection): the
                      rows are then bf16(residual + the partials summed in split order), the bits `residual_gemv`
                      would have stored, and this launch writes them to its `out` (every program its K slice of
                      its row block) before its GEMV reads them; `out` must not overlap out_q or the KV caches
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
        workspace     optional `make_prologue_workspace(qkv_weight, D)` (its plan decides the tiling);
                      allocated (not capturable) when None
        use_pdl       launch with programmatic dependent launch (sm_90; ignored when interpreting)
        check_values  also check positions / out_cache_loc values: positions in the table, valid rows' slots in
                      1..S-1 and distinct (host sync; not under capture)
    Returns: q [M, Hq, D] bf16, post-RoPE, every row (padding rows computed like valid ones).
    Mutates: k_cache, v_cache at out_cache_loc[:num_valid_rows] (bf16); padding rows write nothing.
    Raises: StepContractError naming the offending tensor / value (cfg.rms_eps not a finite float > 0, out_q /
    k_cache / v_cache overlapping one another or a tensor the launch reads: `check_prologue_writes`); nothing is
    written then.
    """
    require_runnable("x", x); require_runnable("qkv_weight", qkv_weight)
    x, deferred = consumer_input(x)
    dev = x.device
    check_tensor("x", x, dtype=torch.bfloat16, ndim=2, device=dev)
    m, hidden = x.shape
    xsplit = 0 if deferred is None else check_deferred(deferred, m, hidden, dev)
    if not 1 <= m <= MAX_ROWS:
        raise StepContractError(f"x has M={m} rows; the fused prologue takes 1..{MAX_ROWS}")
    d = cfg.head_dim
    s_slots, hkv, hq = check_qkv_and_caches(qkv_weight, k_cache, v_cache, hidden, d, dev)
    n = qkv_weight.shape[0]
    if d & (d - 1) or not 16 <= d <= 256:
        raise StepContractError(f"head_dim D={d} must be a power of two in 16..256 (a tile holds whole heads)")
    if qkv_bias is not None:
        check_tensor("qkv_bias", qkv_bias, dtype=torch.bfloat16, ndim=1, shape=(("N", n),), device=dev)
    check_tensor("attn_norm", attn_norm, dtype=torch.bfloat16, ndim=1, shape=(("H", hidden),), device=dev)
    if (q_norm is None) != (k_norm is None):
        raise StepContractError("q_norm and k_norm must both be given (Qwen3 QK-norm) or both be None")
    if q_norm is not None:
        check_tensor("q_norm", q_norm, dtype=torch.bfloat16, ndim=1, shape=(("D", d),), device=dev)
        check_tensor("k_norm", k_norm, dtype=torch.bfloat16, ndim=1, shape=(("D", d),), device=dev)
    nvr_int, nvr_t, out_q = check_rows_inputs(positions, out_cache_loc, cos_sin_table, num_valid_rows, out_q, m, hq,
                                              d, dev)
    if workspace is None:
        workspace = make_prologue_workspace(qkv_weight, d)
    plan = workspace.plan
    nmb = row_blocks(m)
    tiles = plan.at(nmb)               # the tiling of this launch (bn may depend on the row-block count)
    # the QK-norm sums over a head's tile rows: with it bn may not depend on the width
    refuse_bn_by_width(plan, "qkv" if q_norm is None else None, "the attention prologue with QK-norm")
    bns = sorted({plan.at(b).bn for b in (1, 2, 3)})                 # bn of each row-block count
    if (plan.n, plan.k) != (n // 2, hidden) or any(bn % (d // 2) for bn in bns) or \
            workspace.gemv.max_n < plan.n or workspace.counters.device != dev:
        raise StepContractError(
            f"workspace (plan N={plan.n}, K={plan.k}, bn={'/'.join(map(str, bns))}; scratch for N <= "
            f"{workspace.gemv.max_n} on {workspace.counters.device}) does not fit a weight of {n} rows (N/2={n // 2} "
            "rotary pairs, each bn a multiple of D/2), "
            f"H={hidden}, D={d} on {dev}")
    if deferred is not None:
        check_writes_apart(deferred, {"out_q": out_q, "k_cache": k_cache, "v_cache": v_cache})
    check_prologue_writes(cfg.rms_eps, out_q, k_cache, v_cache,
                          {"x": x, "qkv_weight": qkv_weight, "qkv_bias": qkv_bias, "attn_norm": attn_norm,
                           "q_norm": q_norm, "k_norm": k_norm, "positions": positions, "out_cache_loc": out_cache_loc,
                           "cos_sin_table": cos_sin_table, "num_valid_rows": nvr_t})
    if check_values:
        _check_values(positions, out_cache_loc, nvr_int if nvr_t is None else int(nvr_t.item()),
                      cos_sin_table.shape[0], s_slots)

    upcast = interpreting()
    pdl = bool(use_pdl) and pdl_supported(dev)
    gws = workspace.gemv
    dummy = attn_norm
    dargs, dconst = deferred_kernel_args(deferred, xsplit, min(m, 16), tiles, gws.row_ss, x)
    _attn_prologue_kernel[(*tiles.grid, nmb)](
        x, x.stride(0), qkv_weight, qkv_weight.stride(0), attn_norm, gws.partials, gws.split_ss, gws.counters,
        qkv_bias if qkv_bias is not None else dummy, q_norm if q_norm is not None else dummy,
        k_norm if k_norm is not None else dummy, positions, out_cache_loc,
        nvr_t if nvr_t is not None else out_cache_loc, nvr_int, k_cache, v_cache, cos_sin_table, out_q,
        m, plan.n, hidden, hq, hkv, cos_sin_table.shape[0], float(cfg.rms_eps),
        out_q.stride(0), out_q.stride(1), k_cache.stride(0), k_cache.stride(1), v_cache.stride(0), v_cache.stride(1),
        *dargs, D=d, HALF=d // 2, HAS_BIAS=qkv_bias is not None, QK_NORM=q_norm is not None,
        NVR_FROM_PTR=nvr_t is not None,
        EARLY=workspace.early_inputs, USE_PDL=pdl, UPCAST=upcast, launch_pdl=pdl,
        **launch_constexprs(plan, nmb, program_row_blocks=1), **dconst)       # one row block per program
    return out_q


def check_qkv_and_caches(qkv_weight: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, hidden: int,
                         head_dim: int, device: torch.device) -> tuple[int, int, int]:
    """(S, Hkv, Hq) of a prologue's packed QKV weight [N, H] (bf16, contiguous, N = (Hq + 2 Hkv) D with Hq a multiple
    of Hkv) and its K / V caches [S, Hkv, D] (bf16, last dim contiguous), all on `device`; raises StepContractError
    naming the tensor otherwise. Shared by `attn_prologue` and `attn_prologue_held.attn_prologue_held`."""
    d = head_dim
    check_tensor("k_cache", k_cache, dtype=torch.bfloat16, ndim=3, shape=(None, None, ("D", d)), device=device)
    s_slots, hkv, _ = k_cache.shape
    check_tensor("v_cache", v_cache, dtype=torch.bfloat16, ndim=3,
                 shape=(("S", s_slots), ("Hkv", hkv), ("D", d)), device=device)
    check_tensor("qkv_weight", qkv_weight, dtype=torch.bfloat16, ndim=2, shape=(None, ("H", hidden)), device=device)
    if not qkv_weight.is_contiguous():
        raise StepContractError(f"qkv_weight must be contiguous, got strides {qkv_weight.stride()}")
    n = qkv_weight.shape[0]
    if n % d or n // d <= 2 * hkv or (n // d - 2 * hkv) % hkv:
        raise StepContractError(
            f"qkv_weight has N={n} rows; must be (Hq + 2*Hkv)*D with D={d}, Hkv={hkv} and Hq a multiple of Hkv")
    return s_slots, hkv, n // d - 2 * hkv


def check_rows_inputs(positions: torch.Tensor, out_cache_loc: torch.Tensor, cos_sin_table: torch.Tensor,
                      num_valid_rows: int | torch.Tensor, out_q: torch.Tensor | None, m: int, hq: int, head_dim: int,
                      device: torch.device) -> tuple[int, torch.Tensor | None, torch.Tensor]:
    """Check a prologue's per-row inputs (positions [M] int64, out_cache_loc [M] int32, cos_sin_table [P, D] fp32
    contiguous, num_valid_rows: `check_num_valid_rows`) and its out_q [M, Hq, D] bf16 (allocated when None); returns
    (num_valid_rows as an int or 0, as a device tensor or None, out_q). StepContractError naming the tensor otherwise.
    Shared by `attn_prologue` and `attn_prologue_held.attn_prologue_held`."""
    d = head_dim
    check_tensor("positions", positions, dtype=torch.int64, ndim=1, shape=(("M", m),), device=device)
    check_tensor("out_cache_loc", out_cache_loc, dtype=torch.int32, ndim=1, shape=(("M", m),), device=device)
    check_tensor("cos_sin_table", cos_sin_table, dtype=torch.float32, ndim=2, shape=(None, ("D", d)), device=device)
    if not cos_sin_table.is_contiguous():
        raise StepContractError("cos_sin_table must be contiguous")
    nvr_int, nvr_t = check_num_valid_rows(num_valid_rows, m, device)
    if out_q is None:
        out_q = torch.empty((m, hq, d), dtype=torch.bfloat16, device=device)
    else:
        check_tensor("out_q", out_q, dtype=torch.bfloat16, ndim=3, shape=(("M", m), ("Hq", hq), ("D", d)),
                     device=device)
    return nvr_int, nvr_t, out_q


def check_prologue_writes(eps, out_q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, reads: dict) -> None:
    """Refuse (StepContractError) a prologue launch whose eps (cfg.rms_eps) is not a finite real > 0, or whose
    outputs overlap: out_q, k_cache and v_cache pairwise, or any of them with a tensor the launch reads (`reads`: name
    -> tensor or None; other programs read those while one writes). Byte spans (`_attn_common.overlap`): a
    conservative test. Shared by `attn_prologue` and `attn_prologue_held.attn_prologue_held`."""
    if isinstance(eps, bool) or not isinstance(eps, numbers.Real) or not math.isfinite(eps) or eps <= 0:
        raise StepContractError(f"cfg.rms_eps={eps!r} must be a finite float > 0")
    refuse_overlaps({"out_q": out_q}, {"k_cache": k_cache, "v_cache": v_cache},
                    "{a} overlaps {b}: the prologue writes both")
    refuse_overlaps({"k_cache": k_cache}, {"v_cache": v_cache}, "{a} overlaps {b}: the prologue writes both")
    refuse_overlaps({"out_q": out_q, "k_cache": k_cache, "v_cache": v_cache}, reads,
                    "{a} overlaps {b}, which the prologue reads while it writes {a}")


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
    slots, counts = loc.unique(return_counts=True)
    if (counts > 1).any():
        slot = int(slots[counts > 1][0])
        rows = (loc == slot).nonzero().flatten().tolist()
        raise StepContractError(f"out_cache_loc rows {rows} all write KV slot {slot}: each valid row needs its own")
