"""Fused mixture-of-experts decode block without sorting: Triton kernels for Hopper (sm_90).

Matches `lowlat.reference.moe` — `route_topk` (router + softmax + top-k as a routing bitmap),
`moe_experts` (gated sum of the chosen experts' SwiGLU outputs) and `moe` (plus the shared expert) —
and returns the residual sum of `lowlat.reference.layer.decoder_layer`'s FFN step:

    out[m] = x_residual[m] + moe(h)[m]             h, x_residual, out: [M, H] bf16

or, given the layer's norm weight g (`moe_forward(norm_weight=g, eps=...)`), with the FFN's RMSNorm done
by the first launch on the pre-norm rows x:

    out[m] = x_residual[m] + moe(rms_norm(x, g, eps))[m]     x: [M, H] bf16, commonly x_residual itself

so the launch before the block (out_proj) can be a plain residual GEMV, x = x + attn Wo^T, instead of also
normalising x, which needs every row's sum of squares over all of its output tiles: a cross-program
reduction chain inside that launch.

Five launches (seven with a shared expert), each a fixed grid, no host synchronisation, every buffer
preallocated in a `MoEWorkspace`, so the whole block can be captured in a CUDA graph:

1. `_router_logits_kernel`, grid (ceil(E / BE), NSPLIT): partial router logits of every row over
   one slice of the hidden dim, part[s, m, e] = sum_{k in slice s} h[m, k] * router[e, k] (fp32).
   With the norm (NORM) every program first reduces whole rows of x itself — rstd[m] =
   `_gemv.rstd_of(sum_k x[m, k]^2, H, eps, EXACT=True)`, the squares added in a fixed [BK, 64] tile
   (never a function of M, so a row's bits are the same for any M, and the same in every program) — no
   extra launch, no cross-program chain; or, given the previous launch's partial sums of squares
   (`moe_forward(sum_sq_parts=)`, P a row: `residual_gemv_held(sum_sq_out=)` writes H / 16), from
   their sum in one fixed tree over a [next power of two of P, 64] tile (zero-padded: exact), loaded
   with x's first slice: one round trip; then h[m, k] = bf16(g[k] * bf16(x[m, k] * rstd[m])), the two
   roundings of `kernels/rms_norm.py` (`lowlat.reference.rms_norm.rms_norm`'s), replaces x in the
   product, and the programs of expert block 0 store it, each its hidden slice of every row < M (padding
   rows computed like valid ones), to h_out (or `MoEWorkspace.h`): the later launches read h there.
2. `_route_plan_kernel`, a program for every 16 of the M <= 64 rows (`PLAN_CHUNK`; each row's work
   is its own and its reductions do not depend on their order — maxima, and the two sums in int64
   fixed point, `_exact_row_sum` — so the tile changes no result): logits[m, e]
   = sum_s part[s, m, e] (s increasing), rounded to bf16 as the reference's bf16 `x @ router.T` is;
   softmax in fp32; top-k, each pick one max over int32 keys that pack the bf16 logit's 16 bits above the expert
   index (`_route_key32`: one shuffle a reduction level where int64 keys took two and a 64-bit compare; the plan
   kernel 4.70 -> 4.16 us at 1 row, 6.21 -> 5.28 at 48 in Qwen3-30B-A3B's step, H100, session 34); optional
   renormalisation. Writes the routing bitmap [M, E] (uint8 0/1) and gates [M, E]
   fp32 (0 where not chosen). Ties: the k chosen experts are the k largest bf16 logits, and among
   equal logits the lower expert index wins — the reference's stable descending sort of the
   probabilities. (Softmax is monotone, so equal logits give equal probabilities; the cases that
   can differ are two distinct bf16 logits whose fp32 probabilities round to the same value — logits
   within ~2^-17 of zero, or logits ~88+ below the row's max whose probabilities underflow (to 0 beyond
   ~104): the reference then takes the lower index, this kernel the larger logit, gates equal — and a row
   with a NaN or +inf logit, whose probabilities are all NaN: the reference takes the first K experts,
   this kernel the NaN / +inf ones first, gates NaN either way.) Padding rows (m >= num_valid_rows) get an
   all-zero bitmap row and zero gates.
   Then the plan: an expert is active when its bitmap column has a set bit (population count > 0);
   plan = [A, the A active experts in increasing index]; with several programs each ORs its experts
   into `MoEWorkspace.plan_sync` and the last to arrive (an atomic count) writes the plan: no program
   waits for another. (Forced routing runs only this plan part on the given bitmap.)
3. `_expert_gate_up_kernel`, grid (min(E, M*K), ceil(Ie / BN)): program (j, n) takes the j-th
   active expert e (programs j >= A exit before loading any weight, so an inactive expert's
   weights are never read). Placement without sort or scan over tokens: it loads column e of the
   bitmap (rows < num_valid_rows only), counts its rows (population count) and gives row m the
   place below[m] = population count of the column above row m (rows 0..m-1). Places 0..count-1
   fill row tiles of BR = 16 rows; an expert with more rows takes more tiles. Each tile computes
   act = silu(h W_gate^T) * (h W_up^T) in fp32 and stores it in bf16 at (row m, slot k), k = the
   population count of row m's bitmap below e (e's rank among m's chosen experts, in index order;
   loaded after the weight loop, so it is not in the chain before the first weight load).
4. `_expert_down_kernel`, grid (min(E, M*K), ceil(H / BNH)): same placement (read before its PDL
   wait: the plan is two launches old); y = act W_down^T in fp32, times the fp32 gate of (m, e),
   stored in fp32 at (row m, slot k). No atomics.
5. `_combine_kernel`, grid (M, ceil(H / BH)): out[m] = bf16( ((sum_{k=0..c-1} y_k) + s) + x_res )
   with the slots k summed in increasing order — the chosen experts in increasing expert index,
   the reference's order — starting from 0, then the shared expert's output s (if any), then the
   residual. Deterministic and row-invariant: no atomics, every block size is fixed by the weight
   shapes alone, never by M (the grids' sizes depend on M, what one row computes does not).

Rounding differs from the bf16 reference (which rounds after every matmul, rounds each expert's
output to bf16 before gating, and rounds the MoE sum, the shared sum and the residual sum): this
kernel keeps everything in fp32 from the matmul accumulators to the single final rounding; act
(the SwiGLU intermediate) is stored in bf16, as the reference's is. The numerics policy
(lowlat.numerics, 2x the bf16 reference's error against the float64 oracle) judges it.

Optional PDL (programmatic dependent launch, `use_pdl=True`, sm_90): every kernel waits
(`griddepcontrol.wait`) before reading what the previous kernel wrote and then lets the next kernel
launch; the router kernel loads its first weight slice (and with the norm the norm weight's first slice)
before waiting, x only after; the down kernel reads the plan (two launches old) before waiting. Off under
the interpreter. With the norm, x_residual may be h itself and out too (in place): h is read by the first
launch only, x_residual by the last (the combine), each element by the program that then writes it.

Where the time goes (H200, one Qwen3-30B-A3B block, 128 experts top-8, `bench/explore/moe_profile.py`:
CUPTI timestamps of the CUDA-graph replay after a read-only L2 flush, PDL on; session 8, 2026-12-01,
bench/results/session8/call6): at 1 row 36.0 us from the router's start to the combine's end (39.7 us
event-timed with the graph launch) against an 18.1 us HBM floor; what each launch adds to the end:
router +2.9, route / plan +5.0, gate/up +17.0 (50.3 MB: 2.96 TB/s = 70.6% of copy bandwidth, its
start chain included), down +9.4 (25.2 MB: 64%), combine +1.6. At 6 rows (41 experts) 118.4 us
against 92.3 us. The chain of five dependent launches (~10 us of it at 1 row moves no weights) keeps
the block under 50% of its floor at 1 row. Measured and not kept (session8/call1, call2, call5): an
evict-last L2 prefetch of the down weights before its wait (equal at 1 row, 4.5 us slower at 6);
deeper or finer gate/up streams (stages 4-8, BK 64 / 256, BN 16 / 64: equal or slower); 1, 2 or 4
plan warps (equal at 1 row, slower at 6 with 1 or 2); the plan kernel also writing per-expert row
words and a slot table so an expert program finds its rows in one round trip, together with the
down kernel's first weight chunk loaded before its wait (plan +2 us, gate/up unchanged; 1.4 us
slower at 1 row, 4.9 us at 6).

Under the Triton CPU interpreter (TRITON_INTERPRET=1, CI at tiny shapes) the kernels take
INTERP=True: operands are upcast to fp32 before every tl.dot, and fp32 -> bf16 is rounded to
nearest even on the bits (the interpreter's casts truncate); block sizes are as wide as the tiny
dims (its cost is per program). On the GPU the dots take bf16 operands with fp32 accumulation.

Sources followed: Shazeer et al. 2017 (sparsely-gated MoE), Fedus et al. 2021 / Qwen3-MoE and
Mixtral as HF transformers implements them (softmax router, top-k, renormalised gates), the
"swap AB" small-batch GEMM layout (weights on the MMA's M side, the few rows on its N side).
"""

from __future__ import annotations

import numbers
import types
from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from lowlat.config import ModelConfig
from lowlat.errors import StepContractError, UnsupportedConfigError
from lowlat.kernels._attn_common import interpreting, require_runnable
from lowlat.kernels._gemv import float_order_bits, rstd_of, to_bf16
from lowlat.weights import LayerWeights

#: Rows one call takes (the row block of the router and of the placement; MAX_ROWS is 48).
MAX_KERNEL_ROWS = 64
#: Partial sums of squares a row `moe_forward(sum_sq_parts=)` takes: H / 16 at H 4096 (an [256, 64] fp32 tile a
#: router program adds)
MAX_SUM_SQ_PARTS = 256
#: rows a route / plan program takes (its [PLAN_CHUNK, E] tile builds without spills at E 128; one program taking a
#: [32 | 64, E] tile spilled 24 / 296 bytes a thread, sm_90 ptxas, session 28, and took 8.1 / 23.7 us in the step at
#: 24 / 48 rows, one program looping over 16-row chunks 10.3 / 19.7: session 29, bench/results/session29/call2)
PLAN_CHUNK = tl.constexpr(16)


# ----------------------------------------------------------------------------------------- kernels
@triton.jit
def _num_valid(nvalid, nvalid_ptr, NV_PTR: tl.constexpr):
    """The number of valid rows: nvalid, or with NV_PTR the device value *nvalid_ptr clamped to nvalid, which the
    launch sets to M (`_check_rows`): a value above M reads and routes no row past M."""
    if NV_PTR:
        nv = tl.minimum(tl.load(nvalid_ptr), nvalid)
    else:
        nv = nvalid
    return nv


@triton.jit
def _round_bf16(x, INTERP: tl.constexpr):
    """fp32 -> bf16, round to nearest even. The interpreter's cast truncates, so under it the
    rounding is done on the bits (the result is then exactly representable and the cast exact)."""
    if INTERP:
        bits = x.to(tl.int32, bitcast=True)
        bits = (bits + (((bits >> 16) & 1) + 0x7FFF)) & -65536
        r = tl.where(x != x, x, bits.to(tl.float32, bitcast=True))
        return r.to(tl.bfloat16)
    else:
        return x.to(tl.bfloat16)


@triton.jit
def _row_rstd(x_ptr, stride_xm, rows, rmask, H, eps, KP: tl.constexpr, BK: tl.constexpr, BM: tl.constexpr):
    """rstd [BM] of the rows (`_gemv.rstd_of`, correctly rounded, over the whole row of H <= KP columns): the
    squares are added elementwise into a [BK, BM] fp32 tile, chunk after chunk in increasing k (loaded four chunks at a
    time: session 26 measured the router launch 4-10 us slower a layer in the step with one chunk's round trip after
    another), then reduced over k once. The tile is BM = MAX_KERNEL_ROWS rows whatever M (masked rows load nothing), so
    the order of a
    row's additions, hence its bits, follow H and BK only: the same in every router program and for any M."""
    ss = tl.zeros([BK, BM], dtype=tl.float32)
    for k0 in tl.static_range(0, KP, 4 * BK):        # 4 chunks' loads issued together, then added in k order
        xs0 = _x_chunk(x_ptr, stride_xm, rows, rmask, H, k0, BK)
        xs1 = _x_chunk(x_ptr, stride_xm, rows, rmask, H, k0 + BK, BK)
        xs2 = _x_chunk(x_ptr, stride_xm, rows, rmask, H, k0 + 2 * BK, BK)
        xs3 = _x_chunk(x_ptr, stride_xm, rows, rmask, H, k0 + 3 * BK, BK)
        ss += xs0 * xs0
        ss += xs1 * xs1
        ss += xs2 * xs2
        ss += xs3 * xs3
    return rstd_of(tl.sum(ss, axis=0), H, eps, EXACT=True)


@triton.jit
def _x_chunk(x_ptr, stride_xm, rows, rmask, H, k0, BK: tl.constexpr):
    """x^T [BK, BM] fp32 of columns k0..k0+BK-1 (0 past H or for masked rows)."""
    k = k0 + tl.arange(0, BK)
    return tl.load(x_ptr + rows[None, :] * stride_xm + k[:, None], mask=rmask[None, :] & (k < H)[:, None],
                   other=0.0).to(tl.float32)


@triton.jit
def _rstd_of_parts(ss_ptr, stride_ss, rows, rmask, NSS, H, eps, SS_P2: tl.constexpr):
    """rstd [BM] of the rows from the previous launch's NSS partial sums of squares a row (ss[m, 0..NSS-1], fp32;
    `residual_gemv_held(sum_sq_out=)`), added by one fixed tree over an [SS_P2, BM] tile (a function of NSS and BM
    only, never of M): one round trip instead of a pass over the whole row."""
    p = tl.arange(0, SS_P2)
    v = tl.load(ss_ptr + rows[None, :] * stride_ss + p[:, None], mask=rmask[None, :] & (p < NSS)[:, None], other=0.0)
    return rstd_of(tl.sum(v, axis=0), H, eps, EXACT=True)


@triton.jit
def _router_logits_kernel(x_ptr, stride_xm, w_ptr, stride_we, part_ptr, M, E, H,
                          g_ptr, hn_ptr, stride_hn, eps, ss_ptr, stride_ss, NSS,
                          BE: tl.constexpr, HS: tl.constexpr, BK: tl.constexpr, BM: tl.constexpr,
                          INTERP: tl.constexpr, USE_PDL: tl.constexpr, NORM: tl.constexpr = False,
                          NSPLIT: tl.constexpr = 1, SS_P2: tl.constexpr = 0):
    """part[s, m, e] = sum_{k in [s*HS, (s+1)*HS)} x[m, k] * w[e, k]; part is [NSPLIT, BM, E] fp32.

    NORM: x is the pre-norm rows; every program first computes rstd[m] — from the NSS partial sums of squares a row
    at ss_ptr when SS_P2 > 0 (`_rstd_of_parts`, SS_P2 the next power of two of NSS), else over whole rows of x
    (`_row_rstd`, over NSPLIT * HS >= H columns, NSPLIT the grid's second dim) — then uses hn[m, k] = bf16(g[k] *
    bf16(x[m, k] * rstd[m])) (`kernels/rms_norm.py`'s two roundings) in place of x; the programs of expert block 0
    store hn (their hidden slice, rows < M) to hn_ptr. With PDL the first router (and norm) weight slice is loaded
    before the wait, x (and the partial sums) only after. Without NORM, g_ptr, hn_ptr, stride_hn, eps, NSPLIT and the
    ss arguments are not read; without SS_P2, the ss arguments are not.
    """
    pid_e = tl.program_id(0)
    pid_s = tl.program_id(1)
    e = pid_e * BE + tl.arange(0, BE)
    rows = tl.arange(0, BM)
    emask = e < E
    rmask = rows < M
    acc = tl.zeros([BE, BM], dtype=tl.float32)
    # the router (and norm) weights do not depend on the previous kernel: their first slices are loaded before
    # waiting on it; x (its output) only after
    k = pid_s * HS + tl.arange(0, BK)
    kmask = k < H
    w_first = tl.load(w_ptr + e[:, None].to(tl.int64) * stride_we + k[None, :],
                      mask=emask[:, None] & kmask[None, :], other=0.0)
    if NORM:
        g_first = tl.load(g_ptr + k, mask=kmask, other=0.0)
    if USE_PDL:
        gdc_wait()
        gdc_launch_dependents()
    if NORM:
        if SS_P2 > 0:
            # x's first slice leaves with the partial sums: one round trip before the first product
            x_first = tl.load(x_ptr + rows[None, :] * stride_xm + k[:, None], mask=rmask[None, :] & kmask[:, None],
                              other=0.0)
            rstd = _rstd_of_parts(ss_ptr, stride_ss, rows, rmask, NSS, H, eps, SS_P2)
        else:
            rstd = _row_rstd(x_ptr, stride_xm, rows, rmask, H, eps, NSPLIT * HS, BK, BM)
    for i in tl.static_range(HS // BK):
        k = pid_s * HS + i * BK + tl.arange(0, BK)
        kmask = k < H
        if i == 0:
            w = w_first
        else:
            w = tl.load(w_ptr + e[:, None].to(tl.int64) * stride_we + k[None, :],
                        mask=emask[:, None] & kmask[None, :], other=0.0)
        if (NORM and SS_P2 > 0) and i == 0:
            xt = x_first
        else:
            xt = tl.load(x_ptr + rows[None, :] * stride_xm + k[:, None],
                         mask=rmask[None, :] & kmask[:, None], other=0.0)
        if NORM:
            if i == 0:
                gk = g_first
            else:
                gk = tl.load(g_ptr + k, mask=kmask, other=0.0)
            y = to_bf16(xt.to(tl.float32) * rstd[None, :], INTERP).to(tl.float32)     # the reference's first
            xt = to_bf16(gk.to(tl.float32)[:, None] * y, INTERP)                      # ... and second rounding
            tl.store(hn_ptr + rows[None, :] * stride_hn + k[:, None], xt,
                     mask=rmask[None, :] & kmask[:, None] & (pid_e == 0))
        if INTERP:
            w = w.to(tl.float32)
            xt = xt.to(tl.float32)
        acc = tl.dot(w, xt, acc)
    tl.store(part_ptr + pid_s * BM * E + rows[None, :] * E + e[:, None], acc,
             mask=emask[:, None] & rmask[None, :])


@triton.jit
def _exact_row_sum(v):
    """Row sums of v [R, C] fp32, 0 <= v <= 1, C < 2^15, whatever the order of the additions: each value
    is cut to a multiple of 2^-48 (exact for v >= 2^-24; the cut is < 2^-48 per value, far below an fp32
    ulp of a sum >= 1, as a softmax denominator is), the int64 sum is exact, then one rounding to fp32
    (NaN counts 0; its row's values stay NaN). A float `tl.sum` adds in an order set by the tile's layout,
    which followed the plan kernel's row tile, hence M, until session 29 (now a fixed [PLAN_CHUNK, E] tile a
    program): a row's gates then depended on M in the last bit (found in session 9 on the H200;
    `test_qwen3_route_gates_row_invariant`)."""
    q = (tl.where(v == v, v, 0.0) * 281474976710656.0).to(tl.int64)                     # 2^48
    return tl.sum(q, axis=1).to(tl.float32) * (1.0 / 281474976710656.0)


#: below every `_route_key32`: an expert already picked, or not there
_NO_KEY32 = tl.constexpr(-(2 ** 31))


@triton.jit
def _route_key32(x, ids):
    """int32 keys of bf16-exact fp32 values x that sort like (value descending, id ascending), ids < 2^16: the
    upper 16 bits of the order-preserving image `_gemv.float_order_bits` (a bf16 value's low 16 bits are 0, or all
    1 once negative values are flipped) above 0xFFFF - id."""
    return (float_order_bits(x) & -65536) | (ids ^ 0xFFFF)


@triton.jit
def _route_plan_kernel(part_ptr, bitmap_ptr, stride_bm, gates_ptr, stride_gm, plan_ptr, sync_ptr, nvalid, nvalid_ptr,
                       M, E, NSPLIT: tl.constexpr, TOP_K: tl.constexpr, PART_ROWS: tl.constexpr,
                       BM: tl.constexpr, E_P2: tl.constexpr, ROUTE: tl.constexpr, RENORM: tl.constexpr,
                       NV_PTR: tl.constexpr, INTERP: tl.constexpr, USE_PDL: tl.constexpr):
    """BM // PLAN_CHUNK programs (BM >= M, a multiple of PLAN_CHUNK), program c routing rows c PLAN_CHUNK ..
    (c + 1) PLAN_CHUNK - 1: every row's work is its own and its reductions are order-free (maxima, integer sums and
    `_exact_row_sum`), so neither BM nor the chunk, which set the tile's layout, changes a result.

    ROUTE: logits[m, e] = sum_s part[s, m, e] (s increasing; the NSPLIT loads are unrolled so they are
    all in flight at once; part is [NSPLIT, PART_ROWS, E]), rounded to bf16; softmax; top-k;
    writes bitmap [M, E] uint8 and gates [M, E] fp32. Otherwise the bitmap is read (forced routing).
    Then the plan: plan[0] = number of active experts A, plan[1 + j] = the j-th active expert in
    increasing index (an expert is active when a valid row chose it: its column's population count
    is > 0). One program writes it from its own rows; several OR their experts into sync[1 + e] (int32 [E + 1],
    zero between launches) and count their arrival in sync[0] (a CTA barrier, then an acquire-release add); the last
    to arrive reads and zeroes the ORs, zeroes the count and writes the plan (no program waits for another:
    `MoEWorkspace.plan_sync`).
    """
    if USE_PDL:
        gdc_wait()
        gdc_launch_dependents()
    nv = _num_valid(nvalid, nvalid_ptr, NV_PTR)
    ei = tl.arange(0, E_P2)
    emask = ei < E
    rows = tl.program_id(0) * PLAN_CHUNK + tl.arange(0, PLAN_CHUNK)
    valid = rows < nv
    if ROUTE:
        tile_mask = (rows[:, None] < M) & emask[None, :]
        logit = tl.zeros([PLAN_CHUNK, E_P2], dtype=tl.float32)
        for s in tl.static_range(NSPLIT):
            logit += tl.load(part_ptr + s * (PART_ROWS * E) + rows[:, None] * E + ei[None, :], mask=tile_mask,
                             other=0.0)
        # the reference's router matmul runs in bf16: its logits are rounded to bf16
        logit = _round_bf16(logit, INTERP).to(tl.float32)
        live = (rows[:, None] >= 0) & emask[None, :]
        logit = tl.where(live, logit, float("-inf"))
        mx = tl.max(logit, axis=1)
        ex = tl.where(live, tl.exp(logit - mx[:, None]), 0.0)
        prob = ex / _exact_row_sum(ex)[:, None]
        # selection key: the logit (softmax is monotone; NaN sorts first so a NaN row stays NaN) packed
        # with the expert index (`_route_key32`: larger logit first, lower index among equal ones), so each
        # pick is one max over the row; a picked or padded expert gets _NO_KEY32
        key = _route_key32(tl.where(logit != logit, float("inf"), logit), ei[None, :])
        key = tl.where(live, key, _NO_KEY32)
        chosen = tl.zeros([PLAN_CHUNK, E_P2], dtype=tl.int1)
        for _ in tl.static_range(TOP_K):
            best = tl.max(key, axis=1)
            hit = key == best[:, None]
            chosen = chosen | hit
            key = tl.where(hit, _NO_KEY32, key)
        chosen = chosen & live & valid[:, None]
        g = tl.where(chosen, prob, 0.0)
        if RENORM:
            den = _exact_row_sum(g)
            g = tl.where(chosen, g / tl.where(den > 0, den, 1.0)[:, None], 0.0)
        tl.store(bitmap_ptr + rows[:, None] * stride_bm + ei[None, :], chosen.to(tl.uint8), mask=tile_mask)
        tl.store(gates_ptr + rows[:, None] * stride_gm + ei[None, :], g, mask=tile_mask)
        bits = chosen.to(tl.int32)
    else:
        b = tl.load(bitmap_ptr + rows[:, None] * stride_bm + ei[None, :], mask=valid[:, None] & emask[None, :],
                    other=0)
        bits = (b != 0).to(tl.int32)
    active = (tl.sum(bits, axis=0) > 0).to(tl.int32)                     # [E_P2]
    if BM > PLAN_CHUNK:
        tl.atomic_or(sync_ptr + 1 + ei, active, mask=emask, sem="relaxed", scope="gpu")
        # the CTA barrier orders every thread's OR before the arrival, whose gpu-scope release carries them
        # (cumulative); the last arrival's acquire then sees every program's ORs (the pattern of
        # `draft_sampling` / `decode_attention`'s arrival counters)
        tl.debug_barrier()
        arrived = tl.atomic_add(sync_ptr, 1, sem="acq_rel", scope="gpu")
        if arrived == BM // PLAN_CHUNK - 1:                                # the last program: every row's experts
            # the count's acquire (one thread's atomic) reaches the others through the barrier that hands them its
            # result; .cg: from L2, where the ORs were performed
            _write_plan(plan_ptr, tl.load(sync_ptr + 1 + ei, mask=emask, other=0, cache_modifier=".cg"), ei)
            tl.debug_barrier()                     # every thread's read has returned (the plan's sum took them): zero
            tl.store(sync_ptr + 1 + ei, tl.zeros([E_P2], dtype=tl.int32), mask=emask)
            # take the launch's own arrivals back (not a store of 0): a count that started non-zero stays
            # non-zero, so `plan_sync.any()` tells (a store raced a later arrival: the GPU left 0 after a bad start)
            tl.atomic_add(sync_ptr, -(BM // PLAN_CHUNK), sem="relaxed", scope="gpu")
    else:
        _write_plan(plan_ptr, active, ei)


@triton.jit
def _write_plan(plan_ptr, active, ei):
    """plan[0] = the number of active experts A, plan[1 + j] = the j-th active expert (active [E_P2] 0/1 over
    expert indices ei, increasing): a scan over experts, no sort."""
    place = tl.cumsum(active, axis=0) - active
    tl.store(plan_ptr + 1 + place, ei, mask=active != 0)
    tl.store(plan_ptr, tl.sum(active, axis=0))


@triton.jit
def _expert_column(bitmap_ptr, stride_bm, e, nv, BM: tl.constexpr, ALL_ROWS: tl.constexpr):
    """Column e of the bitmap over the valid rows: (col [BM] 0/1, below [BM], count).

    below[m] = population count of col[0..m-1]: row m's place among the expert's rows.
    ALL_ROWS (the shared expert): every valid row.
    """
    m = tl.arange(0, BM)
    if ALL_ROWS:
        col = (m < nv).to(tl.int32)
    else:
        bits = tl.load(bitmap_ptr + m * stride_bm + e, mask=m < nv, other=0)
        col = (bits != 0).to(tl.int32)
    below = tl.sum(tl.where(m[None, :] < m[:, None], col[None, :], 0), axis=1)
    count = tl.sum(col, axis=0)
    return col, below, count


@triton.jit
def _tile_rows(col, below, count, t, BM: tl.constexpr, BR: tl.constexpr):
    """Rows of places t*BR .. t*BR+BR-1 of expert e: (rows [BR], ok [BR])."""
    m = tl.arange(0, BM)
    place = t * BR + tl.arange(0, BR)
    hit = (col[None, :] != 0) & (below[None, :] == place[:, None])          # [BR, BM]
    rows = tl.sum(tl.where(hit, m[None, :], 0), axis=1)
    ok = place < count
    return rows, ok


@triton.jit
def _tile_slots(rows, ok, bitmap_ptr, stride_bm, e, BR: tl.constexpr, E_P2: tl.constexpr,
                ALL_ROWS: tl.constexpr):
    """slot [BR]: number of experts below e chosen by rows[j] (population count of its bitmap row below
    e): where (row, e) sits among the row's chosen experts, in expert-index order. The gate/up kernel
    needs it only for its stores, so it loads it after its weight loop (one round trip less before the
    first weight load)."""
    if ALL_ROWS:
        slot = tl.zeros([BR], dtype=tl.int32)
    else:
        ei = tl.arange(0, E_P2)
        bits = tl.load(bitmap_ptr + rows[:, None] * stride_bm + ei[None, :],
                       mask=ok[:, None] & (ei[None, :] < e), other=0)
        slot = tl.sum((bits != 0).to(tl.int32), axis=1)
    return slot


@triton.jit
def _expert_of_program(plan_ptr, bitmap_ptr, stride_bm, nv, BM: tl.constexpr, ALL_ROWS: tl.constexpr):
    """(e, col, below, count) of this program: the j-th active expert of the plan, j = program_id(0);
    count = 0 for a program past the active experts (it then loads no weight)."""
    j = tl.program_id(0)
    if ALL_ROWS:
        e = j
        n_active = 1
    else:
        n_active = tl.load(plan_ptr)
        e = tl.load(plan_ptr + 1 + j, mask=j < n_active, other=0)
    col, below, count = _expert_column(bitmap_ptr, stride_bm, e, nv, BM, ALL_ROWS)
    count = tl.where(j < n_active, count, 0)
    return e, col, below, count


@triton.jit
def _expert_gate_up_kernel(x_ptr, stride_xm, bitmap_ptr, stride_bm, plan_ptr, wg_ptr, wu_ptr, stride_we,
                           stride_wn, act_ptr, stride_act, nvalid, nvalid_ptr,
                           H: tl.constexpr, IE: tl.constexpr, KMAX: tl.constexpr,
                           BM: tl.constexpr, BR: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                           E_P2: tl.constexpr, ALL_ROWS: tl.constexpr, NV_PTR: tl.constexpr,
                           INTERP: tl.constexpr, USE_PDL: tl.constexpr):
    """act[m*KMAX + slot, n] = silu(x[m] . wg[e, n]) * (x[m] . wu[e, n]) for expert e's rows m,
    e = plan[1 + program_id(0)] (the shared expert when ALL_ROWS)."""
    pid_n = tl.program_id(1)
    if USE_PDL:
        gdc_wait()
        # only after the wait: the down launch reads the plan before its own wait, which is safe because
        # it cannot start before every program here has passed this wait on the plan kernel
        gdc_launch_dependents()
    nv = _num_valid(nvalid, nvalid_ptr, NV_PTR)
    e, col, below, count = _expert_of_program(plan_ptr, bitmap_ptr, stride_bm, nv, BM, ALL_ROWS)
    n = pid_n * BN + tl.arange(0, BN)
    nmask = n < IE
    wg_base = wg_ptr + e.to(tl.int64) * stride_we + n[:, None] * stride_wn
    wu_base = wu_ptr + e.to(tl.int64) * stride_we + n[:, None] * stride_wn
    for t in range(0, BM // BR):
        if t * BR < count:                      # no rows left: no weight is loaded
            rows, ok = _tile_rows(col, below, count, t, BM, BR)
            acc_g = tl.zeros([BN, BR], dtype=tl.float32)
            acc_u = tl.zeros([BN, BR], dtype=tl.float32)
            for k0 in range(0, H, BK):
                k = k0 + tl.arange(0, BK)
                kmask = k < H
                xt = tl.load(x_ptr + rows[None, :] * stride_xm + k[:, None],
                             mask=ok[None, :] & kmask[:, None], other=0.0)
                wmask = nmask[:, None] & kmask[None, :]
                wg = tl.load(wg_base + k[None, :], mask=wmask, other=0.0)
                wu = tl.load(wu_base + k[None, :], mask=wmask, other=0.0)
                if INTERP:
                    xt = xt.to(tl.float32)
                    wg = wg.to(tl.float32)
                    wu = wu.to(tl.float32)
                acc_g = tl.dot(wg, xt, acc_g)
                acc_u = tl.dot(wu, xt, acc_u)
            act = acc_g / (1.0 + tl.exp(-acc_g)) * acc_u
            slot = _tile_slots(rows, ok, bitmap_ptr, stride_bm, e, BR, E_P2, ALL_ROWS)
            dst = (rows * KMAX + slot).to(tl.int64) * stride_act
            tl.store(act_ptr + dst[None, :] + n[:, None], _round_bf16(act, INTERP),
                     mask=nmask[:, None] & ok[None, :])


@triton.jit
def _expert_down_kernel(act_ptr, stride_act, bitmap_ptr, stride_bm, plan_ptr, gates_ptr, stride_gm,
                        wd_ptr, stride_we, stride_wh, y_ptr, stride_y, nvalid, nvalid_ptr,
                        H: tl.constexpr, IE: tl.constexpr, KMAX: tl.constexpr,
                        BM: tl.constexpr, BR: tl.constexpr, BNH: tl.constexpr, BKI: tl.constexpr,
                        E_P2: tl.constexpr, ALL_ROWS: tl.constexpr, NV_PTR: tl.constexpr,
                        INTERP: tl.constexpr, USE_PDL: tl.constexpr):
    """y[m*KMAX + slot, h] = gate[m, e] * (act[m*KMAX + slot] . wd[e, h]) for expert e's rows m (fp32),
    e = plan[1 + program_id(0)] (the shared expert when ALL_ROWS).

    The plan, the bitmap and num_valid_rows were written two launches back (the route / plan kernel,
    or before the block): under PDL this launch starts only after every gate/up program has passed its
    own wait on that kernel, so they are read before this launch's wait."""
    pid_h = tl.program_id(1)
    nv = _num_valid(nvalid, nvalid_ptr, NV_PTR)
    e, col, below, count = _expert_of_program(plan_ptr, bitmap_ptr, stride_bm, nv, BM, ALL_ROWS)
    h = pid_h * BNH + tl.arange(0, BNH)
    hmask = h < H
    wd_base = wd_ptr + e.to(tl.int64) * stride_we + h[:, None] * stride_wh
    if USE_PDL:
        gdc_wait()
        gdc_launch_dependents()
    for t in range(0, BM // BR):
        if t * BR < count:                      # no rows left: no weight is loaded
            rows, ok = _tile_rows(col, below, count, t, BM, BR)
            slot = _tile_slots(rows, ok, bitmap_ptr, stride_bm, e, BR, E_P2, ALL_ROWS)
            src = (rows * KMAX + slot).to(tl.int64) * stride_act
            acc = tl.zeros([BNH, BR], dtype=tl.float32)
            for i0 in range(0, IE, BKI):
                i = i0 + tl.arange(0, BKI)
                imask = i < IE
                at = tl.load(act_ptr + src[None, :] + i[:, None], mask=ok[None, :] & imask[:, None], other=0.0)
                w = tl.load(wd_base + i[None, :], mask=hmask[:, None] & imask[None, :], other=0.0)
                if INTERP:
                    at = at.to(tl.float32)
                    w = w.to(tl.float32)
                acc = tl.dot(w, at, acc)
            if not ALL_ROWS:
                g = tl.load(gates_ptr + rows * stride_gm + e, mask=ok, other=0.0)
                acc = acc * g[None, :]
            dst = (rows * KMAX + slot).to(tl.int64) * stride_y
            tl.store(y_ptr + dst[None, :] + h[:, None], acc, mask=hmask[:, None] & ok[None, :])


@triton.jit
def _combine_kernel(y_ptr, stride_y, bitmap_ptr, stride_bm, shared_ptr, stride_sh, res_ptr, stride_rm,
                    out_ptr, stride_om, nvalid, nvalid_ptr, E, H,
                    KMAX: tl.constexpr,
                    BH: tl.constexpr, E_P2: tl.constexpr, HAS_SHARED: tl.constexpr,
                    NV_PTR: tl.constexpr, INTERP: tl.constexpr, USE_PDL: tl.constexpr):
    """out[m, h] = bf16( ((sum_{k < c_m} y[m*KMAX + k, h]) + s[m, h]) + res[m, h] ), k increasing."""
    m = tl.program_id(0)
    pid_h = tl.program_id(1)
    if USE_PDL:
        gdc_wait()
        gdc_launch_dependents()
    nv = _num_valid(nvalid, nvalid_ptr, NV_PTR)
    valid = m < nv
    h = pid_h * BH + tl.arange(0, BH)
    hmask = h < H
    ei = tl.arange(0, E_P2)
    bits = tl.load(bitmap_ptr + m * stride_bm + ei, mask=(ei < E) & valid, other=0)
    c = tl.sum((bits != 0).to(tl.int32), axis=0)
    acc = tl.zeros([BH], dtype=tl.float32)
    for k in tl.static_range(KMAX):            # unrolled: the KMAX loads are in flight together
        acc += tl.load(y_ptr + (m * KMAX + k).to(tl.int64) * stride_y + h, mask=hmask & (k < c), other=0.0)
    if HAS_SHARED:
        s = tl.load(shared_ptr + m * stride_sh + h, mask=hmask & valid, other=0.0)
        acc = tl.where(valid, acc + s, acc)
    r = tl.load(res_ptr + m * stride_rm + h, mask=hmask, other=0.0).to(tl.float32)
    tl.store(out_ptr + m * stride_om + h, _round_bf16(acc + r, INTERP), mask=hmask)


# ----------------------------------------------------------------------------------------- config
def _p2(n: int) -> int:
    return triton.next_power_of_2(max(int(n), 1))


def _plan_rows(m: int) -> int:
    """Rows the route / plan kernel covers for M rows, a multiple of its chunk PLAN_CHUNK (each row's work is its
    own: no result depends on it)."""
    return max(PLAN_CHUNK.value, _p2(m))


def _plan_programs(m: int) -> int:
    """Programs of the route / plan kernel for M rows: one a PLAN_CHUNK rows of `_plan_rows(m)`."""
    return _plan_rows(m) // PLAN_CHUNK.value


@dataclass(frozen=True)
class MoEKernelConfig:
    """Block sizes. They depend on the weight shapes only (never on M): that makes rows invariant. (The
    route / plan kernel's grid does follow M, `_plan_rows`, but its work is per row along the experts,
    with order-free reductions, so no result depends on it.)

    BE experts x HS hidden per router program (BK per step); BR rows per expert tile; gate/up
    programs cover BN intermediate columns (BK hidden per step); down programs BNH hidden outputs
    (BKI intermediate per step); combine programs BH hidden columns.
    """

    BE: int
    HS: int
    BK_ROUTER: int
    BR: int
    BN: int
    BK: int
    BNH: int
    BKI: int
    BH: int
    num_warps: int = 4
    num_stages: int = 3
    #: warps of each route / plan program
    plan_warps: int = 8

    @classmethod
    def for_shapes(cls, hidden: int, num_experts: int, inter: int, *, interpret: bool = False) -> "MoEKernelConfig":
        """Defaults for H, E, Ie (every dot dim >= 16, as tl.dot needs on sm_90).

        interpret: for the CPU interpreter, whose cost is per program: blocks as wide as the
        (tiny) dims, so each expert is one gate/up and one down program.
        """
        h, e, i = _p2(max(hidden, 16)), _p2(max(num_experts, 16)), _p2(max(inter, 16))
        if interpret:
            return cls(BE=e, HS=h, BK_ROUTER=h, BR=16, BN=i, BK=h, BNH=h, BKI=i, BH=h)
        bk_router = min(128, h)
        return cls(BE=min(32, e), HS=min(256, h), BK_ROUTER=bk_router, BR=16, BN=min(32, i),
                   BK=min(128, h), BNH=min(64, h), BKI=min(128, i), BH=min(256, h))


def _check_config(c: MoEKernelConfig) -> None:
    for name in ("BE", "HS", "BK_ROUTER", "BR", "BN", "BK", "BNH", "BKI", "BH"):
        v = getattr(c, name)
        if v < 16 or v & (v - 1):
            raise UnsupportedConfigError(f"MoEKernelConfig.{name}", v, "must be a power of two >= 16")
    if c.HS % c.BK_ROUTER:
        raise UnsupportedConfigError("MoEKernelConfig.HS", c.HS, f"must be a multiple of BK_ROUTER={c.BK_ROUTER}")
    if c.plan_warps not in (1, 2, 4, 8, 16):
        raise UnsupportedConfigError("MoEKernelConfig.plan_warps", c.plan_warps, "must be 1, 2, 4, 8 or 16")
    if MAX_KERNEL_ROWS % c.BR:
        raise UnsupportedConfigError("MoEKernelConfig.BR", c.BR, f"must divide {MAX_KERNEL_ROWS}")


# ----------------------------------------------------------------------------------------- workspace
@dataclass
class MoEWorkspace:
    """Preallocated buffers of one MoE block (reuse across steps and CUDA-graph replays).

    logits      [NSPLIT, 64, E]         fp32   split router logits
    bitmap      [R, E]                  uint8  routing bitmap (1: expert e serves row m)
    gates       [R, E]                  fp32   gate of (m, e), 0 where bitmap is 0
    plan        [E + 1]                 int32  number of active experts A, then the A experts
    plan_sync   [E + 1]                 int32  the route / plan programs' arrival count, then each expert's OR
                                               over their rows: zero between launches (allocated so, left so by
                                               every complete launch), the one buffer whose contents carry over
    act         [R * KMAX, Ie]          bf16   SwiGLU intermediate of each (row, slot)
    y           [R * KMAX, H]           fp32   gated expert output of each (row, slot)
    shared_act  [R, Is] bf16, shared_y [R, H] fp32   (only with a shared expert)
    h           [R, H]                  bf16   the normed rows, when `moe_forward` normalises (norm_weight)
                                               and is given no h_out; None when allocated without normed_rows
    R = max_rows (<= 64), KMAX = slots per row (top_k).

    One MoE block at a time per workspace (every buffer is its launches' scratch). plan_sync alone carries over
    between launches: a route / plan launch of more than 16 rows leaves it zero only when it starts from zero and
    runs to its end alone on the workspace. After anything else (a launch that raised or was cut short, two streams
    using one workspace at once, plan_sync written by other code) later blocks of more than 16 rows may route
    correctly but plan the wrong experts, silently (no NaN, no error; blocks of 16 rows or fewer do not use it nor
    clear it): call `reset_plan_sync()` then. `plan_sync.any()` tells (a host sync).
    """

    max_rows: int
    slots_per_row: int
    hidden: int
    num_experts: int
    moe_inter: int
    shared_inter: int
    logits: torch.Tensor
    bitmap: torch.Tensor
    gates: torch.Tensor
    plan: torch.Tensor
    plan_sync: torch.Tensor
    act: torch.Tensor
    y: torch.Tensor
    shared_act: torch.Tensor | None
    shared_y: torch.Tensor | None
    h: torch.Tensor | None = None

    @classmethod
    def allocate(cls, *, max_rows: int, hidden: int, num_experts: int, slots_per_row: int, moe_inter: int,
                 shared_inter: int = 0, device: torch.device | str = "cuda",
                 config: MoEKernelConfig | None = None, normed_rows: bool = True) -> "MoEWorkspace":
        """Allocate every buffer: contents undefined (each launch writes what a later one reads) except
        plan_sync, zeroed (see the class docstring); h only with normed_rows (a caller that always passes
        moe_forward an h_out, as FusedModel does, needs none). device: where the block runs ("cpu" only under
        the Triton interpreter)."""
        if not 1 <= max_rows <= MAX_KERNEL_ROWS:
            raise StepContractError(f"max_rows={max_rows} must be in 1..{MAX_KERNEL_ROWS}")
        if slots_per_row < 1:
            raise StepContractError(f"slots_per_row={slots_per_row} must be >= 1")
        c = config or MoEKernelConfig.for_shapes(hidden, num_experts, moe_inter, interpret=interpreting())
        nsplit = triton.cdiv(hidden, c.HS)
        f32, bf16 = torch.float32, torch.bfloat16
        has_shared = shared_inter > 0
        return cls(
            max_rows=max_rows, slots_per_row=slots_per_row, hidden=hidden, num_experts=num_experts,
            moe_inter=moe_inter, shared_inter=shared_inter,
            logits=torch.empty(nsplit, MAX_KERNEL_ROWS, num_experts, dtype=f32, device=device),
            bitmap=torch.empty(max_rows, num_experts, dtype=torch.uint8, device=device),
            gates=torch.empty(max_rows, num_experts, dtype=f32, device=device),
            plan=torch.empty(num_experts + 1, dtype=torch.int32, device=device),
            plan_sync=torch.zeros(num_experts + 1, dtype=torch.int32, device=device),
            act=torch.empty(max_rows * slots_per_row, moe_inter, dtype=bf16, device=device),
            y=torch.empty(max_rows * slots_per_row, hidden, dtype=f32, device=device),
            shared_act=torch.empty(max_rows, shared_inter, dtype=bf16, device=device) if has_shared else None,
            shared_y=torch.empty(max_rows, hidden, dtype=f32, device=device) if has_shared else None,
            h=torch.empty(max_rows, hidden, dtype=bf16, device=device) if normed_rows else None,
        )

    def reset_plan_sync(self) -> None:
        """Zero plan_sync (stream-ordered on its device): after a route / plan launch that did not complete on this
        workspace (see the class docstring); complete launches leave it zero."""
        self.plan_sync.zero_()

    @classmethod
    def for_config(cls, cfg: ModelConfig, max_rows: int, device: torch.device | str = "cuda", *,
                   normed_rows: bool = True) -> "MoEWorkspace":
        """Workspace of one MoE layer of `cfg` for up to max_rows rows (slots per row = top_k); h only with
        normed_rows."""
        if not cfg.is_moe:
            raise UnsupportedConfigError("num_experts", cfg.num_experts, "not an MoE model")
        return cls.allocate(max_rows=max_rows, hidden=cfg.hidden_size, num_experts=cfg.num_experts,
                            slots_per_row=cfg.top_k, moe_inter=cfg.moe_intermediate_size,
                            shared_inter=cfg.shared_expert_intermediate_size, device=device,
                            normed_rows=normed_rows)


# ----------------------------------------------------------------------------------------- checks
def _check_device(t: torch.Tensor, name: str, use_pdl: bool) -> None:
    require_runnable(name, t)
    if use_pdl and (t.device.type != "cuda" or interpreting()):
        raise UnsupportedConfigError("use_pdl", True, "PDL (griddepcontrol) needs a CUDA device, "
                                     "not the Triton interpreter")


def _check_tensor(name: str, t, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> None:
    if not isinstance(t, torch.Tensor):
        raise StepContractError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype != dtype:
        raise StepContractError(f"{name} must be {dtype}, got {t.dtype}")
    if tuple(t.shape) != tuple(shape):
        raise StepContractError(f"{name} must have shape {tuple(shape)}, got {tuple(t.shape)}")
    if t.device != device:
        raise StepContractError(f"{name} is on {t.device}, expected {device}")
    if t.dim() and t.stride(-1) != 1:
        raise StepContractError(f"{name} must be contiguous in its last dim (stride {t.stride(-1)})")


def _check_weights(lw: LayerWeights, hidden: int, device: torch.device) -> tuple[int, int, int]:
    """(E, Ie, Is) of the MoE weights; raise StepContractError naming the first bad tensor."""
    if lw.router is None or lw.expert_gate is None:
        raise StepContractError("layer weights have no MoE (router / expert_gate is None)")
    e, ie = lw.router.shape[0], lw.expert_gate.shape[1]
    bf16 = torch.bfloat16
    _check_tensor("router", lw.router, (e, hidden), bf16, device)
    for name in ("expert_gate", "expert_up"):
        _check_tensor(name, getattr(lw, name), (e, ie, hidden), bf16, device)
        if not getattr(lw, name).is_contiguous():
            raise StepContractError(f"{name} must be contiguous")
    _check_tensor("expert_down", lw.expert_down, (e, hidden, ie), bf16, device)
    if lw.expert_gate.stride() != lw.expert_up.stride():
        raise StepContractError("expert_gate and expert_up must have the same strides")
    s = 0
    if lw.shared_gate is not None:
        s = lw.shared_gate.shape[0]
        _check_tensor("shared_gate", lw.shared_gate, (s, hidden), bf16, device)
        _check_tensor("shared_up", lw.shared_up, (s, hidden), bf16, device)
        _check_tensor("shared_down", lw.shared_down, (hidden, s), bf16, device)
        if lw.shared_gate.stride() != lw.shared_up.stride():
            raise StepContractError("shared_gate and shared_up must have the same strides")
    return e, ie, s


def _check_h(h, use_pdl: bool) -> tuple[int, int]:
    if not isinstance(h, torch.Tensor):
        raise StepContractError(f"h must be a torch.Tensor [M, H], got {type(h).__module__}.{type(h).__name__}")
    if h.dim() != 2:
        raise StepContractError(f"h must be an [M, H] tensor, got shape {tuple(h.shape)}")
    _check_device(h, "h", use_pdl)
    _check_tensor("h", h, tuple(h.shape), torch.bfloat16, h.device)
    return int(h.shape[0]), int(h.shape[1])


def _check_rows(h: torch.Tensor, num_valid_rows) -> tuple[int, torch.Tensor | None]:
    """(nvalid int, nvalid tensor or None): an int's value, or for a device tensor M, the bound the kernels clamp its
    value to (`_num_valid`); raise StepContractError for an out-of-range int."""
    m = h.shape[0]
    if not 1 <= m <= MAX_KERNEL_ROWS:
        raise StepContractError(f"M={m} rows must be in 1..{MAX_KERNEL_ROWS}")
    if isinstance(num_valid_rows, torch.Tensor):
        if num_valid_rows.dtype != torch.int32 or num_valid_rows.numel() != 1:
            raise StepContractError(f"num_valid_rows tensor must be one int32 element, got "
                                    f"{num_valid_rows.dtype} of shape {tuple(num_valid_rows.shape)}")
        if num_valid_rows.device != h.device:
            raise StepContractError(f"num_valid_rows is on {num_valid_rows.device}, h on {h.device}")
        return m, num_valid_rows
    if isinstance(num_valid_rows, bool) or not isinstance(num_valid_rows, int):
        raise StepContractError("num_valid_rows must be an int or an int32 tensor, got "
                                f"{type(num_valid_rows).__name__}")
    if not 0 <= num_valid_rows <= m:
        raise StepContractError(f"num_valid_rows={num_valid_rows} must be in 0..M={m}")
    return num_valid_rows, None


def _check_norm(h: torch.Tensor, norm_weight, eps, h_out, sum_sq_parts=None) -> bool:
    """True when moe_forward normalises (norm_weight given); raise StepContractError naming the bad value."""
    m, hidden = h.shape
    if norm_weight is None:
        if eps is not None:
            raise StepContractError(f"eps={eps!r} given without norm_weight (moe_forward normalises h only "
                                    "with a norm_weight)")
        if h_out is not None:
            raise StepContractError("h_out given without norm_weight (the normed rows are written only when "
                                    "moe_forward normalises h)")
        if sum_sq_parts is not None:
            raise StepContractError("sum_sq_parts given without norm_weight (the sums are the statistic of the "
                                    "norm moe_forward computes only with a norm_weight)")
        return False
    if sum_sq_parts is not None:
        if not isinstance(sum_sq_parts, torch.Tensor) or sum_sq_parts.dim() != 2:
            raise StepContractError(f"sum_sq_parts must be an [M, P] tensor, got "
                                    f"{getattr(sum_sq_parts, 'shape', type(sum_sq_parts))}")
        p = sum_sq_parts.shape[1]
        if not 1 <= p <= MAX_SUM_SQ_PARTS:
            raise StepContractError(f"sum_sq_parts has P={p} partial sums a row; the router adds 1.."
                                    f"{MAX_SUM_SQ_PARTS}")
        _check_tensor("sum_sq_parts", sum_sq_parts, (m, p), torch.float32, h.device)
        if m > 1 and sum_sq_parts.stride(0) < p:
            raise StepContractError(f"sum_sq_parts's rows overlap (row stride {sum_sq_parts.stride(0)} < P={p})")
    _check_tensor("norm_weight", norm_weight, (hidden,), torch.bfloat16, h.device)
    if isinstance(eps, bool) or not isinstance(eps, numbers.Real) or not 0 < float(eps) < float("inf"):
        raise StepContractError(f"eps={eps!r} must be a finite float > 0 with norm_weight")
    if h_out is not None:
        _check_tensor("h_out", h_out, (m, hidden), torch.bfloat16, h.device)
        if m > 1 and h_out.stride(0) < hidden:
            raise StepContractError(f"h_out's rows overlap (row stride {h_out.stride(0)} < H={hidden})")
    return True


def _shares_storage(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


def _normed_rows_buffer(h, x_residual, out, norm_weight, h_out, ws: MoEWorkspace, sum_sq_parts=None) -> torch.Tensor:
    """Where the router launch stores the normed rows: h_out, else workspace.h[:M]; refused (StepContractError)
    when it shares storage with a tensor the block reads or writes around it."""
    m, hidden = h.shape
    name = "h_out"
    if h_out is None:
        name = "workspace.h"
        if ws.h is None:
            raise StepContractError("workspace.h is None: moe_forward with norm_weight needs a workspace from "
                                    "MoEWorkspace.allocate / for_config, or h_out")
        _check_tensor(name, ws.h, (ws.max_rows, hidden), torch.bfloat16, h.device)
        h_out = ws.h[:m]
    for other, t in (("h", h), ("x_residual", x_residual), ("out", out), ("norm_weight", norm_weight),
                     ("sum_sq_parts", sum_sq_parts)):
        if t is not None and _shares_storage(h_out, t):
            raise StepContractError(f"{name} shares storage with {other}: the normed rows need a buffer of "
                                    "their own")
    return h_out


def _refuse_workspace_alias(name: str, t: torch.Tensor, ws: MoEWorkspace) -> None:
    """StepContractError when t shares storage with any buffer of the workspace (the block writes them)."""
    for field, buf in vars(ws).items():
        if isinstance(buf, torch.Tensor) and _shares_storage(t, buf):
            raise StepContractError(f"{name} shares storage with workspace.{field}: the block writes it while "
                                    f"{name} may still be read")


def _check_workspace(ws: MoEWorkspace, m: int, e: int, hidden: int, ie: int, s: int, kmax: int,
                     device: torch.device) -> None:
    want = dict(num_experts=e, hidden=hidden, moe_inter=ie, shared_inter=s)
    for k, v in want.items():
        if getattr(ws, k) != v:
            raise StepContractError(f"workspace.{k}={getattr(ws, k)} but the weights have {v}")
    if ws.max_rows < m:
        raise StepContractError(f"workspace.max_rows={ws.max_rows} < M={m}")
    if ws.slots_per_row < kmax:
        raise StepContractError(f"workspace.slots_per_row={ws.slots_per_row} < {kmax} slots per row needed")
    if ws.bitmap.device != device:
        raise StepContractError(f"workspace is on {ws.bitmap.device}, h on {device}")


def _plan_launch(c: MoEKernelConfig):
    """Launch shape of the route / plan kernel's programs (a [PLAN_CHUNK, E] tile over c.plan_warps warps)."""
    return types.SimpleNamespace(num_warps=c.plan_warps, num_stages=1)


#: launch shape of the combine kernel (no loop worth pipelining)
_COMBINE_LAUNCH = types.SimpleNamespace(num_warps=4, num_stages=1)


def _launch_opts(c, use_pdl: bool) -> dict:
    opts = dict(num_warps=c.num_warps, num_stages=c.num_stages)
    if use_pdl:
        opts["launch_pdl"] = True
    return opts


# ----------------------------------------------------------------------------------------- launches
def _launch_route(h, router, top_k, renormalize, nv, nv_t, ws: MoEWorkspace, c: MoEKernelConfig,
                  use_pdl: bool, norm_weight=None, eps=None, hn=None, ss=None) -> None:
    """Router logits + route / plan. With norm_weight: h is the pre-norm rows, the router launch normalises
    them (eps; their statistic from the partial sums of squares ss [M, P] when given) and stores the normed rows
    to hn [M, H]."""
    m, hidden = h.shape
    e = router.shape[0]
    interp = interpreting()
    nsplit = triton.cdiv(hidden, c.HS)
    if ws.logits.shape[0] < nsplit or ws.logits.shape[2] != e:
        raise StepContractError(f"workspace.logits {tuple(ws.logits.shape)} does not fit {nsplit} hidden "
                                f"slices of HS={c.HS} and E={e} (allocate it with the same config)")
    nv_ptr = nv_t if nv_t is not None else ws.bitmap
    opts = _launch_opts(c, use_pdl)
    norm = norm_weight is not None
    # without the norm, g_ptr / hn_ptr / stride_hn / eps are not read, without ss its arguments (any valid pointer
    # will do)
    with_ss = ss is not None
    _router_logits_kernel[(triton.cdiv(e, c.BE), nsplit)](
        h, h.stride(0), router, router.stride(0), ws.logits, m, e, hidden,
        norm_weight if norm else router, hn if norm else h, hn.stride(0) if norm else 0,
        float(eps) if norm else 1.0, ss if with_ss else h, ss.stride(0) if with_ss else 0,
        ss.shape[1] if with_ss else 0,
        BE=c.BE, HS=c.HS, BK=c.BK_ROUTER, BM=MAX_KERNEL_ROWS, INTERP=interp, USE_PDL=use_pdl, NORM=norm,
        NSPLIT=nsplit if norm and not with_ss else 1, SS_P2=_p2(ss.shape[1]) if with_ss else 0, **opts)
    _route_plan_kernel[(_plan_programs(m),)](
        ws.logits, ws.bitmap, ws.bitmap.stride(0), ws.gates, ws.gates.stride(0), ws.plan, ws.plan_sync, nv, nv_ptr,
        m, e,
        NSPLIT=nsplit, TOP_K=top_k, PART_ROWS=MAX_KERNEL_ROWS, BM=_plan_rows(m), E_P2=_p2(e), ROUTE=True,
        RENORM=bool(renormalize), NV_PTR=nv_t is not None, INTERP=interp, USE_PDL=use_pdl,
        **_launch_opts(_plan_launch(c), use_pdl))


def _launch_plan(bitmap_u8, nv, ws: MoEWorkspace, c: MoEKernelConfig, use_pdl: bool) -> None:
    """The plan (active experts) of a given bitmap [M, E] uint8 (forced routing)."""
    m, e = bitmap_u8.shape
    _route_plan_kernel[(_plan_programs(m),)](
        ws.logits, bitmap_u8, bitmap_u8.stride(0), ws.gates, ws.gates.stride(0), ws.plan, ws.plan_sync, nv,
        bitmap_u8, m, e,
        NSPLIT=1, TOP_K=1, PART_ROWS=MAX_KERNEL_ROWS, BM=_plan_rows(m), E_P2=_p2(e), ROUTE=False, RENORM=False,
        NV_PTR=False, INTERP=interpreting(), USE_PDL=use_pdl, **_launch_opts(_plan_launch(c), use_pdl))


def _launch_experts(h, x_residual, bitmap_u8, gates, lw: LayerWeights, nv, nv_t, kmax: int, out,
                    ws: MoEWorkspace, c: MoEKernelConfig, use_pdl: bool) -> None:
    m, hidden = h.shape
    e, ie = lw.expert_gate.shape[0], lw.expert_gate.shape[1]
    interp = interpreting()
    nv_ptr = nv_t if nv_t is not None else bitmap_u8
    e_p2 = _p2(e)
    opts = _launch_opts(c, use_pdl)
    common = dict(nvalid=nv, nvalid_ptr=nv_ptr, NV_PTR=nv_t is not None, INTERP=interp, USE_PDL=use_pdl,
                  BM=MAX_KERNEL_ROWS, BR=c.BR, E_P2=e_p2)
    max_active = min(e, m * kmax)      # a bound from shapes alone: no host sync
    _expert_gate_up_kernel[(max_active, triton.cdiv(ie, c.BN))](
        h, h.stride(0), bitmap_u8, bitmap_u8.stride(0), ws.plan, lw.expert_gate, lw.expert_up,
        lw.expert_gate.stride(0), lw.expert_gate.stride(1), ws.act, ws.act.stride(0),
        H=hidden, IE=ie, KMAX=kmax, BN=c.BN, BK=c.BK, ALL_ROWS=False, **common, **opts)
    _expert_down_kernel[(max_active, triton.cdiv(hidden, c.BNH))](
        ws.act, ws.act.stride(0), bitmap_u8, bitmap_u8.stride(0), ws.plan, gates, gates.stride(0),
        lw.expert_down, lw.expert_down.stride(0), lw.expert_down.stride(1), ws.y, ws.y.stride(0),
        H=hidden, IE=ie, KMAX=kmax, BNH=c.BNH, BKI=c.BKI, ALL_ROWS=False, **common, **opts)
    has_shared = lw.shared_gate is not None
    if has_shared:
        s = lw.shared_gate.shape[0]
        cs = MoEKernelConfig.for_shapes(hidden, 1, s, interpret=interp)
        _expert_gate_up_kernel[(1, triton.cdiv(s, cs.BN))](
            h, h.stride(0), bitmap_u8, bitmap_u8.stride(0), ws.plan, lw.shared_gate, lw.shared_up,
            0, lw.shared_gate.stride(0), ws.shared_act, ws.shared_act.stride(0),
            H=hidden, IE=s, KMAX=1, BN=cs.BN, BK=cs.BK, ALL_ROWS=True, **common, **opts)
        _expert_down_kernel[(1, triton.cdiv(hidden, cs.BNH))](
            ws.shared_act, ws.shared_act.stride(0), bitmap_u8, bitmap_u8.stride(0), ws.plan, gates, gates.stride(0),
            lw.shared_down, 0, lw.shared_down.stride(0), ws.shared_y, ws.shared_y.stride(0),
            H=hidden, IE=s, KMAX=1, BNH=cs.BNH, BKI=cs.BKI, ALL_ROWS=True, **common, **opts)
    shared_y = ws.shared_y if has_shared else ws.y
    _combine_kernel[(m, triton.cdiv(hidden, c.BH))](
        ws.y, ws.y.stride(0), bitmap_u8, bitmap_u8.stride(0), shared_y, shared_y.stride(0),
        x_residual, x_residual.stride(0), out, out.stride(0), nv, nv_ptr, e, hidden, kmax,
        BH=c.BH, E_P2=e_p2, HAS_SHARED=has_shared, NV_PTR=nv_t is not None, INTERP=interp, USE_PDL=use_pdl,
        **_launch_opts(_COMBINE_LAUNCH, use_pdl))


# ----------------------------------------------------------------------------------------- public API
def route(h: torch.Tensor, router: torch.Tensor, top_k: int, renormalize: bool, num_valid_rows, *,
          workspace: MoEWorkspace | None = None, use_pdl: bool = False,
          config: MoEKernelConfig | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Router GEMV + fp32 softmax + top-k (+ renormalisation) as a routing bitmap; matches
    `lowlat.reference.moe.route_topk`.

    Parameters
    ----------
    h : [M, H] bf16, 1 <= M <= 64 — the normed rows.
    router : [E, H] bf16.
    top_k : 1 <= K <= E experts per row.
    renormalize : divide the chosen probabilities by their sum (`norm_topk_prob`).
    num_valid_rows : int in 0..M, or an int32 [1] device tensor (read on the device; capturable). A tensor's
        value is not checked (that would need a host sync): the kernels take min(value, M), and a negative value
        means no valid row. Rows >= it are padding: all-False bitmap row, zero gates.
    workspace : buffers to use (`MoEWorkspace`); allocated for M rows when None.

    Returns
    -------
    bitmap : [M, E] bool (a view of workspace.bitmap): expert e serves row m.
    gates : [M, E] fp32 (a view of workspace.gates): the probability of (m, e), renormalised over
        the row's K experts when `renormalize`; 0 where bitmap is False.
    Both are overwritten by the next call that uses the same workspace.

    Logits are accumulated in fp32 and rounded to bf16 (as the reference's bf16 router matmul
    is); the chosen experts are the K largest, lower expert index first among ties.
    Raises StepContractError (bad shape, dtype, device, row count) or UnsupportedConfigError
    (top_k out of range, use_pdl off CUDA) before anything is written.
    """
    m, hidden = _check_h(h, use_pdl)
    nv, nv_t = _check_rows(h, num_valid_rows)
    if not isinstance(router, torch.Tensor) or router.dim() != 2:
        raise StepContractError(f"router must be an [E, H] tensor, got {getattr(router, 'shape', type(router))}")
    _check_tensor("router", router, (router.shape[0], hidden), torch.bfloat16, h.device)
    e = router.shape[0]
    if isinstance(top_k, bool) or not isinstance(top_k, int) or not 1 <= top_k <= e:
        raise UnsupportedConfigError("top_k", top_k, f"must be an int in 1..E={e}")
    c = config or MoEKernelConfig.for_shapes(hidden, e, 16, interpret=interpreting())
    _check_config(c)
    if workspace is None:
        workspace = MoEWorkspace.allocate(max_rows=m, hidden=hidden, num_experts=e, slots_per_row=top_k,
                                          moe_inter=16, device=h.device, config=c)
    else:
        for field, have, want in (("num_experts", workspace.num_experts, e), ("hidden", workspace.hidden, hidden)):
            if have != want:
                raise StepContractError(f"workspace.{field}={have} but the router has {want}")
        if workspace.max_rows < m:
            raise StepContractError(f"workspace.max_rows={workspace.max_rows} < M={m}")
    _launch_route(h, router, top_k, renormalize, nv, nv_t, workspace, c, use_pdl)
    return workspace.bitmap[:m].view(torch.bool), workspace.gates[:m]


def moe_forward(h: torch.Tensor, x_residual: torch.Tensor, lw: LayerWeights, cfg: ModelConfig,
                num_valid_rows, *, norm_weight: torch.Tensor | None = None, eps: float | None = None,
                h_out: torch.Tensor | None = None, sum_sq_parts: torch.Tensor | None = None,
                out: torch.Tensor | None = None, workspace: MoEWorkspace | None = None, use_pdl: bool = False,
                config: MoEKernelConfig | None = None) -> torch.Tensor:
    """x_residual + moe(h): route, run the active experts, combine; matches
    `x_residual + lowlat.reference.moe.moe(h, ...)` (the FFN step of `reference.layer.decoder_layer`).
    With norm_weight, x_residual + moe(rms_norm(h, norm_weight, eps)), the RMSNorm done by the router launch.

    Parameters
    ----------
    h : [M, H] bf16, 1 <= M <= 64 — rms_norm(x, mlp_norm) without norm_weight; with it the pre-norm rows x
        (commonly the very tensor x_residual is).
    x_residual : [M, H] bf16 — the residual stream x.
    lw : LayerWeights with router [E, H], expert_gate / expert_up [E, Ie, H] (contiguous),
        expert_down [E, H, Ie], optional shared_gate / shared_up [Is, H], shared_down [H, Is]; bf16.
    cfg : ModelConfig (top_k, norm_topk_prob).
    num_valid_rows : int in 0..M or an int32 [1] device tensor; rows >= it are padding: they never
        enter routing and out[m] = x_residual[m] for them. A device tensor's value is not checked (that would
        need a host sync): the kernels take min(value, M), and a negative value means no valid row.
    norm_weight : [H] bf16 contiguous on h's device (the layer's mlp_norm), or None (h is already normed).
        Given, the router launch computes, for every row m < M (padding rows included),
        rstd[m] = 1 / sqrt(sum_k h[m, k]^2 / H + eps) (fp32, correctly rounded mean, sqrt and reciprocal) and
        hn[m, k] = bf16(norm_weight[k] * bf16(h[m, k] * rstd[m])) — `lowlat.reference.rms_norm.rms_norm`'s
        two roundings, as `kernels/rms_norm.py` — routes on hn, stores it, and the expert launches read it.
        A row's hn is bitwise the same for any M (its statistic is reduced in a fixed [BK, 64] tile).
    eps : float > 0, finite — required with norm_weight, refused without it.
    h_out : [M, H] bf16 on h's device, stride 1 along H, rows not overlapping — where hn is stored (every
        element of its M rows); None: workspace.h[:M]. Only with norm_weight. It must not share storage
        with h, x_residual, out or norm_weight (the router reads whole rows of h while it writes hn).
    sum_sq_parts : [M, P] fp32 on h's device, stride 1 along P, rows not overlapping, 1 <= P <= 256, or None —
        only with norm_weight: the statistic in P partial sums a row, sum_p sum_sq_parts[m, p] = sum_k h[m, k]^2
        (the caller's promise: the previous launch wrote them, `residual_gemv_held(sum_sq_out=)`); the router then
        takes rstd[m] from their sum (one fixed tree over P, the same for any M) instead of reading h's whole
        rows first. Not stored to; must not share storage with h_out.
    out : [M, H] bf16, or None (allocated). May be x_residual itself (in-place residual add), or h itself:
        h is read only by the launches before the last (with norm_weight by the first alone), x_residual by the
        last (the combine, each element read by the program that then writes it).
    workspace : MoEWorkspace (preallocate it for CUDA graphs); allocated for M rows when None.
    use_pdl : launch with programmatic dependent launch (CUDA only).

    Returns out: [M, H] bf16, out[m] = bf16(((sum over m's experts in index order of
    gate * expert(hn[m])) + shared(hn[m])) + x_residual[m]), fp32 throughout (hn = h without norm_weight).
    Mutates: out, workspace, and h_out (or workspace.h) with norm_weight.
    Raises StepContractError (bad shape, dtype, device or layout of a tensor — norm_weight, h_out and
    sum_sq_parts included —, a row count, P outside 1..256, eps missing or not a finite float > 0 with
    norm_weight, eps, h_out or sum_sq_parts given without norm_weight, h_out sharing storage with h,
    x_residual, out, norm_weight or sum_sq_parts, sum_sq_parts sharing storage with a workspace buffer) or
    UnsupportedConfigError (config / weights mismatch, use_pdl off CUDA) before anything is written.
    """
    if not cfg.is_moe:
        raise UnsupportedConfigError("num_experts", cfg.num_experts, "moe_forward needs an MoE config")
    m, hidden = _check_h(h, use_pdl)
    if hidden != cfg.hidden_size:
        raise StepContractError(f"h has H={hidden}, config hidden_size={cfg.hidden_size}")
    _check_tensor("x_residual", x_residual, (m, hidden), torch.bfloat16, h.device)
    nv, nv_t = _check_rows(h, num_valid_rows)
    e, ie, s = _check_weights(lw, hidden, h.device)
    if e != cfg.num_experts:
        raise UnsupportedConfigError("num_experts", cfg.num_experts, f"the weights have E={e} experts")
    if not 1 <= cfg.top_k <= e:
        raise UnsupportedConfigError("top_k", cfg.top_k, f"must be in 1..E={e}")
    norm = _check_norm(h, norm_weight, eps, h_out, sum_sq_parts)
    if out is None:
        out = torch.empty_like(x_residual)
    _check_tensor("out", out, (m, hidden), torch.bfloat16, h.device)
    c = config or MoEKernelConfig.for_shapes(hidden, e, ie, interpret=interpreting())
    _check_config(c)
    if workspace is None:
        workspace = MoEWorkspace.allocate(max_rows=m, hidden=hidden, num_experts=e, slots_per_row=cfg.top_k,
                                          moe_inter=ie, shared_inter=s, device=h.device, config=c)
    _check_workspace(workspace, m, e, hidden, ie, s, cfg.top_k, h.device)
    hn = h
    if norm:
        hn = _normed_rows_buffer(h, x_residual, out, norm_weight, h_out, workspace, sum_sq_parts)
        if sum_sq_parts is not None:
            _refuse_workspace_alias("sum_sq_parts", sum_sq_parts, workspace)
    _launch_route(h, lw.router, cfg.top_k, cfg.norm_topk_prob, nv, nv_t, workspace, c, use_pdl,
                  norm_weight=norm_weight if norm else None, eps=eps, hn=hn, ss=sum_sq_parts)
    _launch_experts(hn, x_residual, workspace.bitmap, workspace.gates, lw, nv, nv_t, cfg.top_k, out,
                    workspace, c, use_pdl)
    return out


def moe_experts_forced(h: torch.Tensor, x_residual: torch.Tensor, bitmap: torch.Tensor, gates: torch.Tensor,
                       lw: LayerWeights, num_valid_rows: int, *, out: torch.Tensor | None = None,
                       workspace: MoEWorkspace | None = None, use_pdl: bool = False,
                       config: MoEKernelConfig | None = None) -> torch.Tensor:
    """Test entry point: the expert and combine stages of `moe_forward` on a given routing.

    x_residual + moe_experts(h, bitmap, gates, ...) (+ shared expert), matching
    `lowlat.reference.moe.moe_experts` with the bitmap's padding rows (>= num_valid_rows) ignored.

    Parameters: h, x_residual [M, H] bf16; bitmap [M, E] bool or uint8 (0/1); gates [M, E] fp32;
    lw as in `moe_forward`; num_valid_rows an int in 0..M. A row may have any number of experts
    (0..E); the slots per row are the largest count among valid rows (a host sync: not capturable).
    Returns out [M, H] bf16. Raises StepContractError for bad shapes, dtypes or bitmap values.
    """
    m, hidden = _check_h(h, use_pdl)
    _check_tensor("x_residual", x_residual, (m, hidden), torch.bfloat16, h.device)
    nv, nv_t = _check_rows(h, num_valid_rows)
    e, ie, s = _check_weights(lw, hidden, h.device)
    if not isinstance(bitmap, torch.Tensor) or bitmap.dtype not in (torch.bool, torch.uint8):
        raise StepContractError(f"bitmap must be a bool or uint8 tensor, got {getattr(bitmap, 'dtype', type(bitmap))}")
    _check_tensor("bitmap", bitmap, (m, e), bitmap.dtype, h.device)
    _check_tensor("gates", gates, (m, e), torch.float32, h.device)
    bitmap_u8 = bitmap.view(torch.uint8) if bitmap.dtype == torch.bool else bitmap
    if nv_t is not None:
        raise StepContractError("moe_experts_forced takes num_valid_rows as an int")
    valid_bits = bitmap_u8[:nv]
    if ((valid_bits != 0) & (valid_bits != 1)).any():
        raise StepContractError("bitmap values must be 0 or 1")
    kmax = max(1, int((valid_bits != 0).sum(1).max())) if nv else 1
    if out is None:
        out = torch.empty_like(x_residual)
    _check_tensor("out", out, (m, hidden), torch.bfloat16, h.device)
    c = config or MoEKernelConfig.for_shapes(hidden, e, ie, interpret=interpreting())
    _check_config(c)
    if workspace is None:
        workspace = MoEWorkspace.allocate(max_rows=m, hidden=hidden, num_experts=e, slots_per_row=kmax,
                                          moe_inter=ie, shared_inter=s, device=h.device, config=c)
    _check_workspace(workspace, m, e, hidden, ie, s, kmax, h.device)
    _launch_plan(bitmap_u8, nv, workspace, c, use_pdl)
    _launch_experts(h, x_residual, bitmap_u8, gates, lw, nv, None, kmax, out, workspace, c, use_pdl)
    return out


def sm90_compile_specs(hidden: int, num_experts: int, inter: int, top_k: int, *, use_pdl: bool = False,
                       shared_inter: int = 256):
    """(name, kernel, signature, constexprs, options) of every kernel as `moe_forward` launches it on
    a GPU, for an ahead-of-time build (`triton.compile(ASTSource(...), target=GPUTarget("cuda", 90,
    64), options=...)`) on a machine without one: the CPU tests use it to prove the kernels build."""
    c = MoEKernelConfig.for_shapes(hidden, num_experts, inter)
    cs = MoEKernelConfig.for_shapes(hidden, 1, shared_inter)
    e_p2 = _p2(num_experts)
    nsplit = triton.cdiv(hidden, c.HS)
    ptr = {"x_ptr": "*bf16", "w_ptr": "*bf16", "part_ptr": "*fp32", "bitmap_ptr": "*u8", "gates_ptr": "*fp32",
           "nvalid_ptr": "*i32", "plan_ptr": "*i32", "sync_ptr": "*i32", "wg_ptr": "*bf16", "wu_ptr": "*bf16",
           "act_ptr": "*bf16", "wd_ptr": "*bf16", "y_ptr": "*fp32", "shared_ptr": "*fp32", "res_ptr": "*bf16",
           "out_ptr": "*bf16", "g_ptr": "*bf16", "hn_ptr": "*bf16", "eps": "fp32", "ss_ptr": "*fp32"}
    # num_valid_rows as the step passes it, a device tensor (NV_PTR); forced routing (`moe_experts_forced`) an int
    base = dict(BM=MAX_KERNEL_ROWS, INTERP=False, USE_PDL=use_pdl, NV_PTR=True, NORM=False, SS_P2=0)
    specs = []

    def add(name, fn, launch, **cx):
        cx = {k: v for k, v in {**base, **cx}.items() if k in fn.arg_names}
        sig = {p: ptr.get(p, "i32") for p in fn.arg_names if p not in cx}
        specs.append((name, fn, sig, cx, dict(num_warps=launch.num_warps, num_stages=launch.num_stages)))

    add("router_logits", _router_logits_kernel, c, BE=c.BE, HS=c.HS, BK=c.BK_ROUTER, NSPLIT=1)
    add("router_logits_norm", _router_logits_kernel, c, BE=c.BE, HS=c.HS, BK=c.BK_ROUTER, NORM=True,
        NSPLIT=nsplit)
    add("router_logits_norm_ss", _router_logits_kernel, c, BE=c.BE, HS=c.HS, BK=c.BK_ROUTER, NORM=True,
        SS_P2=_p2(hidden // 16))                     # the statistic from H / 16 partial sums (the held out_proj's)
    for bm in (16, 32, MAX_KERNEL_ROWS):             # the plan row tiles `_plan_rows` gives
        add(f"route_plan_{bm}", _route_plan_kernel, _plan_launch(c), NSPLIT=nsplit, TOP_K=top_k,
            PART_ROWS=MAX_KERNEL_ROWS, BM=bm, E_P2=e_p2, ROUTE=True, RENORM=True)
        add(f"plan_forced_{bm}", _route_plan_kernel, _plan_launch(c), NSPLIT=1, TOP_K=1, PART_ROWS=MAX_KERNEL_ROWS,
            BM=bm, E_P2=e_p2, ROUTE=False, RENORM=False, NV_PTR=False)
    add("expert_gate_up", _expert_gate_up_kernel, c, H=hidden, IE=inter, KMAX=top_k, BR=c.BR, BN=c.BN, BK=c.BK,
        E_P2=e_p2, ALL_ROWS=False)
    add("expert_down", _expert_down_kernel, c, H=hidden, IE=inter, KMAX=top_k, BR=c.BR, BNH=c.BNH, BKI=c.BKI,
        E_P2=e_p2, ALL_ROWS=False)
    add("shared_gate_up", _expert_gate_up_kernel, cs, H=hidden, IE=shared_inter, KMAX=1, BR=cs.BR, BN=cs.BN,
        BK=cs.BK, E_P2=e_p2, ALL_ROWS=True)
    add("shared_down", _expert_down_kernel, cs, H=hidden, IE=shared_inter, KMAX=1, BR=cs.BR, BNH=cs.BNH,
        BKI=cs.BKI, E_P2=e_p2, ALL_ROWS=True)
    add("combine", _combine_kernel, _COMBINE_LAUNCH, KMAX=top_k, BH=c.BH, E_P2=e_p2, HAS_SHARED=True)
    return specs
