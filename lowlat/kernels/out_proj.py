"""Fused output projection + residual add + the FFN's RMSNorm, in one launch (Triton, Hopper).

Matches `lowlat.reference.out_proj.out_proj` (the lines of `lowlat.reference.layer.decoder_layer`
between attention and the FFN):

    x = residual + attn Wo^T            (fp32 accumulation, x rounded to bf16 once)
    h = mlp_norm * bf16(x * rstd),  rstd = 1 / sqrt(mean(x^2) + eps)   (x as stored in bf16)

How RMSNorm, which needs whole rows, fits one launch: the grid is (column tiles of Wo) x (split-K)
(the tile plan, preload or stream mode, is `lowlat.kernels._gemv`'s).
The program that finishes a column tile (the last split to arrive, see `_gemv`) adds the residual,
stores its bf16 x tile and that tile's per-row sum of squares, then raises an all-tiles counter; the
program that sees that counter reach n_tiles - 1 is the last tile finisher: it sums the per-tile
squares in tile order (a fixed tree over a [tiles, 16] block), writes rstd [M] and, with `write_h`,
normalises the whole [M, H] block into h. No program ever waits on another (no spin, nothing that
needs co-residency), every sum has a fixed order, so results are bitwise deterministic and do not
depend on which program arrives last.

The same kernel with the norm switched off is `residual_gemv` (x = residual + a W^T, no counters
without split-K): the fused model's dense layers use it for the output projection and the MLP's
down projection, and let the gate/up kernel compute the FFN norm's statistics itself
(`lowlat.kernels.mlp`), so no launch ends with a grid-wide arrival counter. The MoE layers use
`out_proj` with h written.

`residual_gemv_deferred` is the same kernel with its split-K reduction left to the next launch (`DEFER`): each
program stores its split's fp32 partial product and exits, and the next launch computes x = bf16(residual + the
partials in split order) (`lowlat.kernels.mlp.gate_up_act` after the output projection, the next layer's
`lowlat.kernels.attn_prologue.attn_prologue` after the down projection, each given the returned `DeferredX`;
`_reduce_deferred`): the same bits, without the finisher's chain of round trips in this launch. The fused model runs
it for out_proj at 1 row (`FusedModel.defers`) and for the down projection where the prologue's pre-pass reads few
partial bytes (`FusedModel.defers_down`).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from lowlat.errors import StepContractError
from lowlat.kernels._attn_common import check_early_release, refuse_overlaps, require_runnable
from lowlat.kernels.attn_combine import (DeferredAttention, check_deferred_attention, fold_attention_slice, fold_nsplits,
                                         fold_pieces)
from lowlat.kernels.decode_attention import COMBINE_CHUNK
from lowlat.kernels._gemv import (MAX_ROWS, GemvPlan, GemvWorkspace, check_eps, check_plan_for, check_rows_apart,
                                  check_tensor, gemv_loop, gemv_workspace, interpreting, launch_constexprs, plan_gemv,
                                  prefetch_l2, preload_product, preload_weights, refuse_aliasing, refuse_bn_by_width,
                                  require_tensors, row_blocks, rstd_of, store_partial, sum_partials, to_bf16)


@triton.jit
def _load_res(res_ptr, stride_rm, m0, n0, M, N, BN: tl.constexpr):
    """The residual tile [BN, 16] (columns n0.., rows m0..) as fp32 (0 outside [M, N])."""
    rn = n0 + tl.arange(0, BN)
    rm = m0 + tl.arange(0, 16)
    msk = (rn < N)[:, None] & (rm < M)[None, :]
    return tl.load(res_ptr + rm[None, :] * stride_rm + rn[:, None], mask=msk, other=0.0).to(tl.float32)


@triton.jit
def _finish_tile(acc, r, m0, n0, M, N, out_ptr, stride_om, ss_ptr, tile,
                 BN: tl.constexpr, NORM: tl.constexpr, UPCAST: tl.constexpr):
    """x tile = bf16(acc + residual tile r) stored; with NORM also its per-row sum of squares -> ss[tile]."""
    rn = n0 + tl.arange(0, BN)
    rm = m0 + tl.arange(0, 16)
    msk = (rn < N)[:, None] & (rm < M)[None, :]
    xn = to_bf16(acc + r, UPCAST)
    tl.store(out_ptr + rm[None, :] * stride_om + rn[:, None], xn, mask=msk)
    if NORM:
        xf = tl.where(msk, xn.to(tl.float32), 0.0)
        tl.store(ss_ptr + tile * 48 + rm, tl.sum(xf * xf, axis=0))


@triton.jit
def _finish_norm(m0, M, N, eps, ss_ptr, n_tiles, out_ptr, stride_om, nw_ptr, h_ptr, stride_hm, rstd_ptr,
                 NT_P2: tl.constexpr, WRITE_H: tl.constexpr, BH: tl.constexpr, N_COLS: tl.constexpr,
                 UPCAST: tl.constexpr):
    """rstd of rows m0..m0+15 from the per-tile sums of squares (fixed tree order); optionally h."""
    rm = m0 + tl.arange(0, 16)
    rt = tl.arange(0, NT_P2)
    ssm = tl.load(ss_ptr + rt[:, None] * 48 + rm[None, :], mask=(rt < n_tiles)[:, None], other=0.0,
                  cache_modifier=".cg")
    ss = tl.sum(ssm, axis=0)
    rstd = rstd_of(ss, N, eps)
    tl.store(rstd_ptr + rm, rstd, mask=rm < M)
    if WRITE_H:
        for c in range(tl.cdiv(N_COLS, BH)):
            rc = c * BH + tl.arange(0, BH)
            msk = (rm < M)[:, None] & (rc < N)[None, :]
            xv = tl.load(out_ptr + rm[:, None] * stride_om + rc[None, :], mask=msk, other=0.0,
                         cache_modifier=".cg").to(tl.float32)
            w = tl.load(nw_ptr + rc, mask=rc < N, other=0.0).to(tl.float32)
            y = to_bf16(xv * rstd[:, None], UPCAST).to(tl.float32)
            tl.store(h_ptr + rm[:, None] * stride_hm + rc[None, :], to_bf16(w[None, :] * y, UPCAST), mask=msk)


@triton.jit
def _store_deferred(dp_ptr, acc, m0, M, n0, N, dp_stride_m, BN: tl.constexpr):
    """dp[m, n] = acc[n - n0, m - m0] (fp32) for the rows m < M and columns n < N of a [BN, 16] tile."""
    rn = n0 + tl.arange(0, BN)
    rm = m0 + tl.arange(0, 16)
    tl.store(dp_ptr + rm[None, :] * dp_stride_m + rn[:, None], acc, mask=(rn < N)[:, None] & (rm < M)[None, :])


@triton.jit(do_not_specialize=["M"])
def _residual_gemv_kernel(
        a_ptr, stride_am, w_ptr, stride_wn, res_ptr, stride_rm, out_ptr, stride_om,
        nw_ptr, h_ptr, stride_hm, rstd_ptr, ws_ptr, ss_ptr, cnt_ptr, dp_ptr, dp_stride_s, dp_stride_m,
        fo_ptr, fml_ptr, fpos_ptr, fnvr_ptr, f_hq,
        M, N, K, n_tiles, eps,
        SPLIT: tl.constexpr, CPS: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, NUM_MB: tl.constexpr,
        NORM: tl.constexpr, WRITE_H: tl.constexpr, NT_P2: tl.constexpr, BH: tl.constexpr, N_COLS: tl.constexpr,
        EVEN_N: tl.constexpr, EVEN_K: tl.constexpr, PF_K: tl.constexpr, PRELOAD: tl.constexpr,
        USE_PDL: tl.constexpr, UPCAST: tl.constexpr, DEFER: tl.constexpr = False, FOLD: tl.constexpr = False,
        F_D: tl.constexpr = 64, F_BLOCK_N: tl.constexpr = 64, F_SPLITS: tl.constexpr = 32, F_HS: tl.constexpr = 1,
        F_HP: tl.constexpr = 1, F_RB: tl.constexpr = 1, F_NRB: tl.constexpr = 1, F_CHUNK: tl.constexpr = 4,
        EARLY_RELEASE: tl.constexpr = False):
    """out = residual + a @ W^T (bf16), optionally followed by RMSNorm statistics / h (see module doc).
    DEFER: each program stores its split's partial product to dp[pid_k] (rows < M) and exits: no residual, no
    arrival, no finisher (the next launch reduces, `residual_gemv`'s `deferred`).
    FOLD: a is the attention output, computed here first from the decode attention's split partials (fo, fml; the
    rows' positions and num_valid_rows give each row's split count) for this program's K slice of whole heads, F_RB
    rows at a time (`attn_combine.fold_attention_slice`), written to a; then the GEMV reads it back.
    EARLY_RELEASE: under PDL, the next launch is released at the program's start instead of right after its wait
    (`residual_gemv`'s early_release says when that is safe)."""
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    n0 = pid_n * BN
    k_begin = pid_k * (CPS * BK)
    k_end = tl.minimum(k_begin + CPS * BK, K)
    if USE_PDL and EARLY_RELEASE:                     # the next launch may start now (see `residual_gemv`)
        gdc_launch_dependents()
    if FOLD:    # the first piece's split counts before the wait (positions / num_valid_rows precede the step)
        f_nvr = tl.load(fnvr_ptr)
        ns0, ex0 = fold_nsplits(fpos_ptr, f_nvr, 0, M, k_begin, k_end, F_D, F_BLOCK_N, F_SPLITS, F_HS, F_HP, F_RB)
    if PRELOAD:                                       # weight loads issued before the wait
        ws = preload_weights(w_ptr, stride_wn, n0, N, k_begin, k_end, BN, BK, CPS, EVEN_N, EVEN_K, UPCAST)
    elif USE_PDL and PF_K > 0:
        prefetch_l2(w_ptr, stride_wn, n0, N, k_begin, K, BN, PF_K)
    if USE_PDL:
        gdc_wait()
        if not EARLY_RELEASE:
            gdc_launch_dependents()
    # the residual tile, in flight with the activations (every split loads it; the finisher uses it;
    # a tile is written only after all its splits arrived, so an in-place residual is safe)
    if DEFER:
        r0 = tl.zeros((BN, 16), dtype=tl.float32)
    else:
        r0 = _load_res(res_ptr, stride_rm, 0, n0, M, N, BN)
    r1 = r0
    r2 = r0
    if NUM_MB > 1 and not DEFER:
        r1 = _load_res(res_ptr, stride_rm, 16, n0, M, N, BN)
    if NUM_MB > 2 and not DEFER:
        r2 = _load_res(res_ptr, stride_rm, 32, n0, M, N, BN)
    if FOLD:    # the attention output of this K slice, every row (each column tile writes the same bits)
        fold_attention_slice(fo_ptr, fml_ptr, ns0, ex0, a_ptr, stride_am, f_hq, 0, k_begin, F_D, F_SPLITS, F_HP, F_RB,
                             F_CHUNK, UPCAST)
        for p in range(1, F_NRB):       # further pieces of F_RB rows (a loop: unrolled, 48 rows took minutes to compile)
            ns, ex = fold_nsplits(fpos_ptr, f_nvr, p * F_RB, M, k_begin, k_end, F_D, F_BLOCK_N, F_SPLITS, F_HS, F_HP,
                                  F_RB)
            fold_attention_slice(fo_ptr, fml_ptr, ns, ex, a_ptr, stride_am, f_hq, p * F_RB, k_begin, F_D, F_SPLITS,
                                 F_HP, F_RB, F_CHUNK, UPCAST)
        tl.debug_barrier()   # this CTA's stores of a, visible to its GEMV loads
    z = tl.zeros((16,), dtype=tl.float32)
    if PRELOAD:
        a0, a1, a2, b0, b1, b2, s0, s1, s2 = preload_product(
            ws, ws, a_ptr, stride_am, M, k_begin, k_end, nw_ptr, z, z, z, BN, BK, CPS, NUM_MB, False, 0, EVEN_K,
            UPCAST)
    else:
        a0, a1, a2, b0, b1, b2, s0, s1, s2 = gemv_loop(
            w_ptr, 0, stride_wn, a_ptr, stride_am, M, N, n0, k_begin, K, nw_ptr, z, z, z,
            BN, BK, CPS, NUM_MB, False, 0, EVEN_N, EVEN_K, UPCAST)
    MP: tl.constexpr = 16 * NUM_MB
    finished = True
    if DEFER:
        dps = dp_ptr + pid_k * dp_stride_s
        _store_deferred(dps, a0, 0, M, n0, N, dp_stride_m, BN)
        if NUM_MB > 1:
            _store_deferred(dps, a1, 16, M, n0, N, dp_stride_m, BN)
        if NUM_MB > 2:
            _store_deferred(dps, a2, 32, M, n0, N, dp_stride_m, BN)
        finished = False
    elif SPLIT > 1:
        store_partial(ws_ptr, a0, pid_k, N, MP, n0, 0, BN, EVEN_N)
        if NUM_MB > 1:
            store_partial(ws_ptr, a1, pid_k, N, MP, n0, 16, BN, EVEN_N)
        if NUM_MB > 2:
            store_partial(ws_ptr, a2, pid_k, N, MP, n0, 32, BN, EVEN_N)
        tl.debug_barrier()
        arrived = tl.atomic_add(cnt_ptr + pid_n, 1, sem="acq_rel", scope="gpu")
        finished = arrived == SPLIT - 1
        if finished:
            a0 = sum_partials(ws_ptr, 0, N, MP, n0, 0, BN, SPLIT, 1, EVEN_N)
            if NUM_MB > 1:
                a1 = sum_partials(ws_ptr, 0, N, MP, n0, 16, BN, SPLIT, 1, EVEN_N)
            if NUM_MB > 2:
                a2 = sum_partials(ws_ptr, 0, N, MP, n0, 32, BN, SPLIT, 1, EVEN_N)
    if finished:
        _finish_tile(a0, r0, 0, n0, M, N, out_ptr, stride_om, ss_ptr, pid_n, BN, NORM, UPCAST)
        if NUM_MB > 1:
            _finish_tile(a1, r1, 16, n0, M, N, out_ptr, stride_om, ss_ptr, pid_n, BN, NORM, UPCAST)
        if NUM_MB > 2:
            _finish_tile(a2, r2, 32, n0, M, N, out_ptr, stride_om, ss_ptr, pid_n, BN, NORM, UPCAST)
        if SPLIT > 1:     # reset for the next launch: a plain store (see `_gemv` "Split-K"), off the critical path
            tl.store(cnt_ptr + pid_n, 0)
        if NORM:
            tl.debug_barrier()
            done = tl.atomic_add(cnt_ptr + n_tiles, 1, sem="acq_rel", scope="gpu")
            if done == n_tiles - 1:
                _finish_norm(0, M, N, eps, ss_ptr, n_tiles, out_ptr, stride_om, nw_ptr, h_ptr, stride_hm,
                             rstd_ptr, NT_P2, WRITE_H, BH, N_COLS, UPCAST)
                if NUM_MB > 1:
                    _finish_norm(16, M, N, eps, ss_ptr, n_tiles, out_ptr, stride_om, nw_ptr, h_ptr, stride_hm,
                                 rstd_ptr, NT_P2, WRITE_H, BH, N_COLS, UPCAST)
                if NUM_MB > 2:
                    _finish_norm(32, M, N, eps, ss_ptr, n_tiles, out_ptr, stride_om, nw_ptr, h_ptr, stride_hm,
                                 rstd_ptr, NT_P2, WRITE_H, BH, N_COLS, UPCAST)
                tl.store(cnt_ptr + n_tiles, 0)


class DeferredX(NamedTuple):
    """The output x = bf16(residual + a W^T) of a residual GEMV whose split-K reduction is left to the next
    launch (`residual_gemv_deferred`). The consuming launch (`lowlat.kernels.mlp.gate_up_act` after the output
    projection, `lowlat.kernels.attn_prologue.attn_prologue` after the down projection) reads each x tile as
    bf16(sum_s partials[s] + residual), partials added to zeros in split order, then the residual: the arithmetic
    of `residual_gemv`'s own finisher, hence its bits; it writes x to `out` (`_reduce_deferred`)."""
    partials: torch.Tensor       # [S, M, N] fp32 contiguous: split s's partial product a W^T over its K slice
    residual: torch.Tensor       # [M, N] bf16
    out: torch.Tensor            # [M, N] bf16, written by the consuming launch; never overlaps residual / partials


def check_deferred(d: DeferredX, m: int, n: int, device) -> int:
    """Validate a `DeferredX` for [m, n] rows on `device`; returns its split count S. Raises StepContractError
    naming the field whose type, shape, dtype, device or layout is wrong, an `out` that overlaps `residual` or
    `partials` (the consuming launch reads those while it writes out), `partials` overlapping `residual` (the
    residual GEMV writes the partials before the consumer reads the residual), or an `out` whose rows overlap."""
    if not isinstance(d, DeferredX):
        raise StepContractError(f"deferred must be a DeferredX, got {type(d).__name__}")
    check_tensor("deferred partials", d.partials, (None, m, n), torch.float32, device)
    split = d.partials.shape[0]
    if split < 2:
        raise StepContractError(f"deferred partials must be [S >= 2, M, N] fp32, got shape {tuple(d.partials.shape)}")
    if not d.partials.is_contiguous():
        raise StepContractError("deferred partials must be contiguous")
    check_tensor("deferred residual", d.residual, (m, n), torch.bfloat16, device)
    check_tensor("deferred out", d.out, (m, n), torch.bfloat16, device)
    refuse_overlaps(dict(out=d.out), dict(residual=d.residual, partials=d.partials),
                    "deferred out overlaps deferred {b}: the consuming launch reads the {b} while it writes out")
    refuse_overlaps(dict(partials=d.partials), dict(residual=d.residual),
                    "deferred partials overlap deferred residual: the residual GEMV writes the partials before the "
                    "consuming launch reads the residual")
    check_rows_apart("deferred out", d.out)
    return split


@triton.jit
def _reduce_deferred(r_ptr, stride_rm, xp_ptr, xp_stride_s, xp_stride_m, xout_ptr, stride_om, M, k_begin, k_end,
                     KS: tl.constexpr, XSPLIT: tl.constexpr, RB: tl.constexpr, NRB: tl.constexpr, KC: tl.constexpr,
                     UPCAST: tl.constexpr):
    """xout[m, k] = bf16(sum_{s < XSPLIT} xp[s, m, k] + r[m, k]) for rows m < M and this program's K slice
    [k_begin, k_begin + KS) (columns >= k_end masked), in NRB x KS / KC pieces of [RB, KC] (`deferred_pieces`: at
    1 row the whole slice in one piece, so one round trip). The partials are added to zeros in split order, then r:
    the arithmetic of `sum_partials` + `_finish_tile`, hence the finisher's bits. The consumers (gate/up, the
    attention prologue) call it right after their wait, in a loop of its own: its pipelined loads never share the
    GEMV loop's shared memory (folded into the GEMV loop's x loads, Triton staged them beside the weights: 238 KB)."""
    for mb in tl.static_range(NRB):
        rm = mb * RB + tl.arange(0, RB)
        for c in range(KS // KC):
            rk = k_begin + c * KC + tl.arange(0, KC)
            msk = (rm < M)[:, None] & (rk < k_end)[None, :]
            offs = rm[:, None] * xp_stride_m + rk[None, :]
            tot = tl.zeros((RB, KC), dtype=tl.float32)
            for s in tl.static_range(XSPLIT):
                tot += tl.load(xp_ptr + s * xp_stride_s + offs, mask=msk, other=0.0, cache_modifier=".cg")
            r = tl.load(r_ptr + rm[:, None] * stride_rm + rk[None, :], mask=msk, other=0.0).to(tl.float32)
            tl.store(xout_ptr + rm[:, None] * stride_om + rk[None, :], to_bf16(tot + r, UPCAST), mask=msk)


#: bytes of fp32 partials one piece of `_reduce_deferred` loads (all splits): 32 KB, i.e. 32 registers a thread at 8
#: warps; Llama-3.2-1B's gate/up at 1 row reduces its 1024-column slice of 8 partials in one piece
DEFERRED_PIECE_BYTES = 32768


def deferred_pieces(m: int, block_k: int, cps: int, split: int) -> dict:
    """The piece constexprs of `_reduce_deferred` for m rows and a K slice of cps chunks of block_k columns: RB rows
    (a power of two <= 16, >= m up to 16) in NRB = ceil(m / RB) row pieces, by KC columns (a power of two dividing the
    slice, at least min(16, block_k)), as wide as keeps RB * KC * split fp32 within DEFERRED_PIECE_BYTES."""
    rb = min(16, triton.next_power_of_2(m))
    kc = block_k * (cps & -cps)           # the largest power of two dividing the slice (block_k is one)
    while kc > 16 and rb * kc * split * 4 > DEFERRED_PIECE_BYTES:
        kc //= 2
    return dict(RB=rb, NRB=triton.cdiv(m, rb), KC=kc)


def consumer_input(x) -> tuple[torch.Tensor, DeferredX | None]:
    """A consuming launch's x argument as (the [M, N] tensor its shapes and residual come from, the DeferredX or
    None). Raises StepContractError for a DeferredX whose residual is not a tensor."""
    if not isinstance(x, DeferredX):
        return x, None
    if not isinstance(x.residual, torch.Tensor):
        raise StepContractError(f"deferred residual must be a torch.Tensor, got {type(x.residual).__name__}")
    return x.residual, x


def check_writes_apart(d: DeferredX, writes: dict[str, torch.Tensor]) -> None:
    """Raise StepContractError when a tensor the consuming launch writes (name -> tensor) overlaps the DeferredX's
    out, residual or partials, which the launch reads or writes while it writes that tensor."""
    refuse_overlaps(writes, dict(out=d.out, residual=d.residual, partials=d.partials),
                    "{a} overlaps deferred {b}: this launch reads or writes it while it writes {a}")


def deferred_kernel_args(d: DeferredX | None, split: int, rows: int, plan: GemvPlan, f32_dummy: torch.Tensor,
                         bf16_dummy: torch.Tensor) -> tuple[tuple, dict]:
    """A consumer kernel's deferred-x arguments (xp_ptr, xp_stride_s, xp_stride_m, xout_ptr, stride_om) and
    constexprs (XSPLIT, RB, NRB, KC) for `_reduce_deferred` over `rows` rows a program, in the K slices of `plan`
    (the consumer's); d None (split 0): dummies and XSPLIT 0."""
    if d is None:
        return (f32_dummy, 0, 0, bf16_dummy, 0), dict(XSPLIT=0)
    m, n = d.residual.shape
    return ((d.partials, m * n, n, d.out, d.out.stride(0)),
            dict(XSPLIT=split, **deferred_pieces(rows, plan.block_k, plan.chunks_per_split, split)))


class OutProjResult(NamedTuple):
    x: torch.Tensor              # [M, H] bf16 new residual stream
    h: torch.Tensor | None       # [M, H] bf16 rms_norm(x, mlp_norm), None when write_h=False
    rstd: torch.Tensor           # [M] fp32 1 / sqrt(mean(x^2) + eps) of each row


def gemv_activations(a) -> tuple[torch.Tensor, DeferredAttention | None]:
    """A residual GEMV's activations argument as (the [M, K] bf16 tensor it reads, the DeferredAttention or None):
    a DeferredAttention (`decode_attention(..., fold_combine=True)`) is validated and its out viewed [M, Hq*D].
    Raises StepContractError for a malformed DeferredAttention."""
    if not isinstance(a, DeferredAttention):
        return a, None
    if not isinstance(a.out, torch.Tensor) or a.out.dim() != 3:
        raise StepContractError("deferred attention out must be a [M, Hq, D] tensor")
    m, hq, d = a.out.shape
    check_deferred_attention(a, m, hq * d, a.out.device)
    return a.out.view(m, hq * d), a


def check_fold_apart(attn: DeferredAttention, reads: dict[str, torch.Tensor], writes: dict[str, torch.Tensor]) -> None:
    """Raise StepContractError when a tensor the folding launch writes (its x, h, rstd, partials, workspace) overlaps
    what it reads or writes of the attention (partials, positions, out), or the attention's out overlaps a tensor the
    launch reads (its residual, weights); None entries are skipped."""
    theirs = dict(partial_o=attn.partial_o, partial_ml=attn.partial_ml, positions=attn.positions,
                  num_valid_rows=attn.num_valid_rows, out=attn.out)
    refuse_overlaps(writes, theirs, "{a} overlaps the deferred attention's {b}: this launch reads or writes it "
                    "while it writes {a}")
    refuse_overlaps(dict(out=attn.out), reads, "the deferred attention's out overlaps {b}, which this launch reads "
                    "while it writes the attention output")


def _launch_residual_gemv(a, w, residual, out, plan: GemvPlan, ws: GemvWorkspace, **kw) -> None:
    """Check, then launch, the residual GEMV kernel (`_prepare_residual_gemv`'s arguments)."""
    _prepare_residual_gemv(a, w, residual, out, plan, ws, **kw)()


def _prepare_residual_gemv(a, w, residual, out, plan: GemvPlan, ws: GemvWorkspace, *, norm_weight=None,
                           h=None, rstd=None, eps=0.0, use_pdl=False, deferred: torch.Tensor | None = None,
                           attn: DeferredAttention | None = None, early_release: bool = False):
    """Run the launch-level checks of the residual GEMV kernel (workspace width, plan, a DeferredAttention's fold)
    and return a function of no arguments that launches it: callers with two launches (`mlp`) check both before
    either writes. Raises StepContractError."""
    m, k = a.shape
    n = w.shape[0]
    norm = norm_weight is not None
    nmb = row_blocks(m)
    ws.check(n, "residual GEMV")
    refuse_bn_by_width(plan, "out_proj" if norm else "residual",   # out_proj sums its row statistics per tile
                       "out_proj with its RMSNorm epilogue")
    tiles = plan.at(nmb)           # the tiling of this launch (bn may depend on the row-block count)
    upcast = interpreting()
    pdl = bool(use_pdl) and not upcast
    dummy = out
    fold_args, fold = (ws.row_ss, ws.row_ss, ws.row_ss, ws.row_ss, 0), {}
    if attn is not None:
        hq, dh = attn.out.shape[1], attn.out.shape[2]
        if tiles.span % dh:
            raise StepContractError(f"plan {n}x{k} slices K by {tiles.span} columns, not whole heads of D={dh}: the "
                                    "attention's combine cannot fold into it")
        check_fold_apart(attn, dict(residual=residual, w=w, norm_weight=norm_weight),
                         dict(out=out, h=h, rstd=rstd, partials=deferred, workspace_partials=ws.partials,
                              workspace_row_ss=ws.row_ss, workspace_counters=ws.counters))
        splits = attn.partial_o.shape[2]
        fold_args = (attn.partial_o, attn.partial_ml, attn.positions, attn.num_valid_rows, hq)
        fold = dict(FOLD=True, F_D=dh, F_BLOCK_N=attn.block_n, F_SPLITS=splits,
                    **fold_pieces(m, tiles.span, dh, min(COMBINE_CHUNK, splits)))
    def launch() -> None:
        _residual_gemv_kernel[tiles.grid](
            a, a.stride(0), w, w.stride(0), residual, residual.stride(0), out, out.stride(0),
            norm_weight if norm else dummy, h if h is not None else dummy, h.stride(0) if h is not None else 0,
            rstd if norm else ws.row_ss, ws.partials, ws.row_ss, ws.counters,
            deferred if deferred is not None else ws.row_ss, m * n, n, *fold_args,
            m, n, k, tiles.n_tiles, float(eps), DEFER=deferred is not None, **fold,
            NORM=norm, WRITE_H=h is not None, NT_P2=max(triton.next_power_of_2(tiles.n_tiles), 2),
            BH=min(512, max(16, triton.next_power_of_2(n))), N_COLS=n if h is not None else 1,
            USE_PDL=pdl, UPCAST=upcast, launch_pdl=pdl, EARLY_RELEASE=early_release,
            **launch_constexprs(plan, nmb))
    return launch


def out_proj(attn: torch.Tensor | DeferredAttention, wo: torch.Tensor, residual: torch.Tensor, mlp_norm: torch.Tensor,
             eps: float,
             *, out: torch.Tensor | None = None, h_out: torch.Tensor | None = None,
             rstd_out: torch.Tensor | None = None, write_h: bool = True, workspace: GemvWorkspace | None = None,
             plan: GemvPlan | None = None, use_pdl: bool = False) -> OutProjResult:
    """x = residual + attn Wo^T and h = rms_norm(x, mlp_norm), one launch.

    Parameters:
        attn      [M, Hq*D] bf16, rows contiguous (M = 1..48; padding rows are computed like any row), or the
                  DeferredAttention of `decode_attention(..., fold_combine=True)`: the split combine runs here
                  first, each program for its K slice (the plan must slice K by whole heads), and writes
                  attn.out (the same bits as decode_attention's output)
        wo        [H, Hq*D] bf16 contiguous
        residual  [M, H] bf16
        mlp_norm  [H] bf16;  eps: RMSNorm epsilon, a finite float > 0
        out, h_out [M, H] bf16 and rstd_out [M] fp32: preallocated outputs (allocated when None), rows of their own
                  (row stride >= H)
        write_h   False skips h (rstd is always written): the fused model normalises in the MLP kernel
        workspace preallocated `GemvWorkspace` (needed for CUDA-graph capture); plan: tiling override
        use_pdl   programmatic dependent launch (Hopper; ignored under the interpreter)
    Aliasing: `out` may be `residual` itself (`out=residual`, or a view with the same data_ptr and strides: the
    in-place residual update of `FusedModel`'s MoE layers; each residual tile is read by the programs of its column
    tile before their finisher writes it). Any other overlap between an output (out, h_out, rstd_out) and an input
    (attn, wo, residual, mlp_norm) or another output is refused: other column tiles read all of attn while out is
    written, and h is normalised from out.
    Returns: OutProjResult(x [M, H] bf16, h [M, H] bf16 or None, rstd [M] fp32).
    Raises: StepContractError, before anything is written, naming the argument that is not a tensor or whose shape,
    dtype or device is wrong, a bad eps (value named), M > 48, an output whose rows overlap, or an output
    overlapping an input or another output (both named); for a DeferredAttention also a plan not slicing K by whole
    heads, or outputs overlapping its buffers.
    Numerics: fp32 accumulation; x is rounded to bf16 once (the reference rounds the projection and
    the sum separately); rstd from the stored bf16 x, as the reference computes it.
    """
    require_runnable("attn", attn); require_runnable("wo", wo)
    attn, folded = gemv_activations(attn)
    require_tensors(attn=attn, wo=wo)
    dev = attn.device
    if attn.dim() != 2:
        raise StepContractError(f"attn must be [M, Hq*D], got shape {tuple(attn.shape)}")
    m, k = attn.shape
    if not 1 <= m <= MAX_ROWS:
        raise StepContractError(f"attn has M={m} rows; out_proj takes 1..{MAX_ROWS}")
    n = wo.shape[0] if wo.dim() == 2 else -1
    check_tensor("attn", attn, (m, k), torch.bfloat16, dev)
    check_tensor("wo", wo, (n, k), torch.bfloat16, dev)
    if not wo.is_contiguous():
        raise StepContractError("wo must be contiguous")
    check_tensor("residual", residual, (m, n), torch.bfloat16, dev)
    check_tensor("mlp_norm", mlp_norm, (n,), torch.bfloat16, dev)
    eps = check_eps(eps)
    out = torch.empty((m, n), dtype=torch.bfloat16, device=dev) if out is None else out
    check_tensor("out", out, (m, n), torch.bfloat16, dev)
    check_rows_apart("out", out)
    if write_h:
        h_out = torch.empty((m, n), dtype=torch.bfloat16, device=dev) if h_out is None else h_out
        check_tensor("h_out", h_out, (m, n), torch.bfloat16, dev)
        check_rows_apart("h_out", h_out)
    else:
        h_out = None
    rstd_out = torch.empty((m,), dtype=torch.float32, device=dev) if rstd_out is None else rstd_out
    check_tensor("rstd_out", rstd_out, (m,), torch.float32, dev)
    # a folded attention's out is written here: `check_fold_apart` refuses outputs over it
    refuse_aliasing(dict(out=out, h_out=h_out, rstd_out=rstd_out),
                    dict(attn=None if folded is not None else attn, wo=wo, residual=residual, mlp_norm=mlp_norm),
                    "out_proj reads {b} while it writes {a}", in_place=dict(out=("residual",)))
    ws = gemv_workspace(workspace, n, dev)
    plan = plan_gemv(n, k, kind="out_proj") if plan is None else plan
    check_plan_for(plan, n, k, "wo")
    _launch_residual_gemv(attn, wo, residual, out, plan, ws, norm_weight=mlp_norm, h=h_out, rstd=rstd_out,
                          eps=eps, use_pdl=use_pdl, attn=folded)
    return OutProjResult(out, h_out, rstd_out)


def _check_gemv_inputs(a: torch.Tensor, w: torch.Tensor) -> tuple[int, int, int]:
    """(M, K, N) of a residual GEMV's a [M, K] and w [N, K] (bf16, one device, w contiguous, M = 1..48); raises
    StepContractError naming the tensor otherwise."""
    require_tensors(a=a, w=w)
    if a.dim() != 2 or w.dim() != 2:
        raise StepContractError(f"a [M, K] and w [N, K] expected, got {tuple(a.shape)} and {tuple(w.shape)}")
    m, k = a.shape
    n = w.shape[0]
    if not 1 <= m <= MAX_ROWS:
        raise StepContractError(f"a has M={m} rows; the fused GEMVs take 1..{MAX_ROWS}")
    check_tensor("a", a, (m, k), torch.bfloat16, a.device)
    check_tensor("w", w, (n, k), torch.bfloat16, a.device)
    if not w.is_contiguous():
        raise StepContractError("w must be contiguous")
    return m, k, n


def residual_gemv(a: torch.Tensor | DeferredAttention, w: torch.Tensor, residual: torch.Tensor, *,
                  out: torch.Tensor | None = None,
                  workspace: GemvWorkspace | None = None, plan: GemvPlan | None = None,
                  use_pdl: bool = False, early_release: bool = False) -> torch.Tensor:
    """out = residual + a W^T (bf16; fp32 accumulation, one rounding). a [M, K], w [N, K], residual [M, N].

    The fused step's output projection and the MLP's down projection + residual add
    (`lowlat.kernels.mlp`). out: [M, N] bf16 (allocated when None), rows of their own (row stride >= N).
    Aliasing: `out` may be `residual` itself (`out=residual` or a view with the same data_ptr and strides: a
    program reads its residual tile before it writes that tile, no program reads another's; `FusedModel`'s output
    projection runs `residual_gemv(attn, wo, x, out=x)`). Any other overlap of out with a, w or residual is refused
    (every column tile reads all of a). plan: tiling (default `plan_gemv(N, K, kind="residual")`); use_pdl:
    programmatic dependent launch (Hopper; ignored when interpreting).
    early_release (a bool; under PDL): release the next launch at the start of every program instead of right after
    its `gdc_wait` (explore31's finding, NOTES session 23: the next launch's programs become resident and load their
    weights while this one still waits). Same results. The caller must know it is safe: the launch rule is that a
    launch may read, before its own wait, anything written two or more launches back; with an early release the
    next launch S may start as soon as this launch's predecessor P has passed its wait (P releasing after its own
    wait, as every other lowlat launch does; two early releases in a row widen the window one launch further
    back), so S must not read, before its wait, anything P or this launch writes (the fused step's dense layers: S
    is gate/up, the next prologue, the final RMSNorm or the LM head, which read only weights before their waits).
    a may be a DeferredAttention (the output projection of `decode_attention(..., fold_combine=True)`: the split
    combine folded in, as `out_proj` describes).
    Raises StepContractError, before anything is written, for an argument that is not a tensor, wrong shapes /
    dtypes / devices, a plan made for another shape, an early_release that is not a bool, out rows that overlap, or
    out overlapping an input other than as the same view of residual (both named); for a DeferredAttention also a
    malformed one, a plan not slicing K by whole heads, or buffers overlapping its own.
    """
    require_runnable("a", a); require_runnable("w", w)
    check_early_release(early_release)
    a, folded = gemv_activations(a)
    m, k, n = _check_gemv_inputs(a, w)
    dev = a.device
    check_tensor("residual", residual, (m, n), torch.bfloat16, dev)
    out = torch.empty((m, n), dtype=torch.bfloat16, device=dev) if out is None else out
    check_tensor("out", out, (m, n), torch.bfloat16, dev)
    check_rows_apart("out", out)
    # a folded attention's out is written here: `check_fold_apart` refuses outputs over it
    refuse_aliasing(dict(out=out), dict(a=None if folded is not None else a, w=w, residual=residual),
                    "residual_gemv reads {b} while it writes {a}", in_place=dict(out=("residual",)))
    ws = gemv_workspace(workspace, n, dev)
    plan = plan_gemv(n, k, kind="residual") if plan is None else plan
    check_plan_for(plan, n, k, "w")
    _launch_residual_gemv(a, w, residual, out, plan, ws, use_pdl=use_pdl, attn=folded, early_release=early_release)
    return out


def residual_gemv_deferred(a: torch.Tensor | DeferredAttention, w: torch.Tensor, residual: torch.Tensor,
                           out: torch.Tensor, *,
                           partials: torch.Tensor | None = None, workspace: GemvWorkspace | None = None,
                           plan: GemvPlan | None = None, use_pdl: bool = False,
                           early_release: bool = False) -> DeferredX:
    """x = residual + a W^T with its split-K reduction left to the next launch: one launch that stores each
    split's fp32 partial product and exits (no residual load, no arrival counter, no finisher).

    The finisher of `residual_gemv` costs its launch a chain of dependent round trips after the split products
    (release fence + arrival atomic, partial loads, the residual add, the stores): 2.1 of Llama-3.2-1B's 3.6 us
    out_proj in the step at 1 row (NOTES, session 20). The consuming launch (`lowlat.kernels.mlp.gate_up_act` or
    `lowlat.kernels.attn_prologue.attn_prologue` given the returned `DeferredX`) already loads x after its wait;
    it loads the partials and the residual instead, in the same round trip, and computes exactly `residual_gemv`'s
    output (same bits), writing it to `out`. Pays where the consumer's extra bytes (S fp32 partials per x element,
    read by each of its column tiles) are few and its weight stream is not held back long: the fused model defers
    out_proj's at 1 row (`FusedModel` "defer"; measured slower at 6 / 16 rows, NOTES session 20) and the down
    projection's by the bytes its prologue's pre-pass reads ("defer_down", NOTES session 21).

    Parameters:
        a [M, K] bf16 (or a DeferredAttention, folded as in `out_proj`), w [N, K] bf16 contiguous,
                  residual [M, N] bf16 (M = 1..48)
        out       [M, N] bf16: where the consumer will write x, rows of their own; must not overlap residual or
                  partials
        partials  [S, M, N] fp32 contiguous, S = the plan's split (allocated when None); written here, so it must not
                  overlap a, w or residual
        workspace, plan (default `plan_gemv(N, K, kind="residual")`, split >= 2), use_pdl, early_release: as
                  `residual_gemv`
    Returns DeferredX(partials, residual, out) for the consumer.
    Raises StepContractError, before anything is written, for an argument that is not a tensor, wrong shapes /
    dtypes / devices, a plan with split 1 (nothing to defer: use `residual_gemv`), a plan made for another shape, an
    `out` overlapping `residual` or `partials` or with overlapping rows, `partials` overlapping a, w or residual, or an
    early_release that is not a bool; for a DeferredAttention also
    a malformed one, a plan not slicing K by whole heads, or buffers overlapping its own (`out` included, though this
    launch does not write it: conservative).
    """
    require_runnable("a", a); require_runnable("w", w)
    check_early_release(early_release)
    a, folded = gemv_activations(a)
    m, k, n = _check_gemv_inputs(a, w)
    dev = a.device
    plan = plan_gemv(n, k, kind="residual") if plan is None else plan
    check_plan_for(plan, n, k, "w")
    if plan.split < 2:
        raise StepContractError(f"plan {n}x{k} has split={plan.split}: a deferred reduction needs split-K >= 2 "
                                "(use residual_gemv)")
    if partials is None:
        partials = torch.empty((plan.split, m, n), dtype=torch.float32, device=dev)
    d = DeferredX(partials, residual, out)
    check_deferred(d, m, n, dev)
    if partials.shape[0] != plan.split:
        raise StepContractError(f"deferred partials hold {partials.shape[0]} splits; the plan has split={plan.split}")
    # a folded attention's out is written here: `check_fold_apart` refuses the partials over it
    refuse_aliasing(dict(partials=partials), dict(a=None if folded is not None else a, w=w),
                    "residual_gemv_deferred reads {b} while it writes the {a}")
    ws = gemv_workspace(workspace, n, dev)
    _launch_residual_gemv(a, w, residual, out, plan, ws, use_pdl=use_pdl, deferred=partials, attn=folded,
                          early_release=early_release)
    return d
