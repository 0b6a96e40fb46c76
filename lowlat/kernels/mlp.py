"""Fused dense SwiGLU MLP + residual add: two launches chained by PDL (Triton, Hopper).

Matches `residual + lowlat.reference.mlp.swiglu_mlp(h, w_gate, w_up, w_down)` (Shazeer 2020):

    launch 1 (gate/up):  act = bf16( silu(h Wg^T) * (h Wu^T) )      gate and up tiles of the same
                         columns in one program, fp32 accumulation, one rounding
    launch 2 (down):     x   = bf16( residual + act Wd^T )          `out_proj.residual_gemv`

The FFN's RMSNorm can run inside launch 1, on the un-normalised residual stream x, two ways:
  * `norm_weight` + `rstd` (rstd from `lowlat.kernels.out_proj`): h = norm_weight * bf16(x * rstd)
    rounded to bf16 on load, the reference's rounding order;
  * `norm_weight` + `eps` (what the fused model runs): rstd computed here. RMSNorm's statistic is a
    per-row scalar, so the kernel multiplies the weights by bf16(norm_weight * x), accumulates the sum
    of squares of x from the same loads, and scales the fp32 gate / up accumulators by
    rstd = 1 / sqrt(mean(x^2) + eps) before SiLU: no separate pass, no producer-side statistic, one
    rounding of the operand where the reference rounds twice (numerics policy of lowlat/numerics.py).
    With split-K each split's sum of squares is stored and the finisher adds them in split order.

Given a `lowlat.kernels.out_proj.DeferredX` (the output projection's split-K partials and the residual, from
`residual_gemv_deferred`), launch 1 first reduces its K slice of x = bf16(residual + partials in split order) into
the DeferredX's `out` (the bits `residual_gemv` would have stored), then runs on it.

Why two launches: the down projection needs every column of `act` for each output column, i.e. the
whole gate/up grid must finish first. With PDL the down kernel's programs start while launch 1 runs,
prefetch their slice of Wd into L2, and only then wait (`gdc_wait`) for `act`.
Split-K reductions are deterministic (see `lowlat.kernels._gemv`).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from lowlat.errors import StepContractError
from lowlat.kernels._attn_common import require_runnable
from lowlat.kernels._gemv import (MAX_ROWS, GemvPlan, GemvWorkspace, check_eps, check_plan_for, check_rows_apart,
                                  check_tensor, gemv_loop, gemv_workspace, interpreting, launch_constexprs, plan_gemv,
                                  prefetch_l2, preload_product, preload_weights, refuse_aliasing, refuse_bn_by_width,
                                  require_tensors, row_blocks, rstd_of, store_partial, store_split_ss, sum_partials,
                                  sum_split_ss, to_bf16)
from lowlat.kernels.out_proj import (DeferredX, _prepare_residual_gemv, _reduce_deferred, check_deferred,
                                     check_writes_apart, consumer_input, deferred_kernel_args)


def pack_gate_up(w_gate: torch.Tensor, w_up: torch.Tensor) -> torch.Tensor:
    """[2I, H] bf16 contiguous: rows 0..I-1 = w_gate [I, H], rows I..2I-1 = w_up [I, H] (built once)."""
    if w_gate.shape != w_up.shape or w_gate.dim() != 2:
        raise StepContractError(f"w_gate {tuple(w_gate.shape)} and w_up {tuple(w_up.shape)} must both be [I, H]")
    return torch.cat([w_gate, w_up], dim=0).contiguous()


@triton.jit
def _finish_act(g, u, m0, n0, M, I, act_ptr, stride_am, BN: tl.constexpr, UPCAST: tl.constexpr):
    rn = n0 + tl.arange(0, BN)
    rm = m0 + tl.arange(0, 16)
    msk = (rn < I)[:, None] & (rm < M)[None, :]
    a = g / (1.0 + tl.exp(-g)) * u
    tl.store(act_ptr + rm[None, :] * stride_am + rn[:, None], to_bf16(a, UPCAST), mask=msk)


@triton.jit
def _load_rstd(rstd_ptr, m0, M, NORM: tl.constexpr):
    rm = m0 + tl.arange(0, 16)
    if NORM == 1:
        return tl.load(rstd_ptr + rm, mask=rm < M, other=0.0)
    else:
        return tl.zeros((16,), dtype=tl.float32)


@triton.jit(do_not_specialize=["M"])
def _gate_up_kernel(
        x_ptr, stride_xm, w_ptr, stride_wn, nw_ptr, rstd_ptr, act_ptr, stride_am, ws_ptr, sss_ptr, cnt_ptr,
        xp_ptr, xp_stride_s, xp_stride_m, xout_ptr, stride_om,
        M, I, K, eps,
        SPLIT: tl.constexpr, CPS: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, NUM_MB: tl.constexpr,
        NORM: tl.constexpr, EVEN_N: tl.constexpr, EVEN_K: tl.constexpr, PF_K: tl.constexpr,
        PRELOAD: tl.constexpr, USE_PDL: tl.constexpr, UPCAST: tl.constexpr, XSPLIT: tl.constexpr = 0,
        RB: tl.constexpr = 16, NRB: tl.constexpr = 1, KC: tl.constexpr = 16):
    """act[:, n0:n0+BN] = silu(h Wg^T) * (h Wu^T) for this program's columns.

    NORM 0: h = x.  NORM 1: h = rms_norm(x) on load with the given rstd (reference rounding order).
    NORM 2: factored RMSNorm, rstd computed here: the operand is bf16(nw * x), the sums of squares of
    x ride along the same loads, and the fp32 accumulators are scaled by rstd before SiLU.
    XSPLIT > 0 (`out_proj.DeferredX`): x_ptr holds the residual r and xp the XSPLIT split-K partials p_s of the
    residual GEMV before this launch. Right after the wait every program computes x = bf16(sum_s p_s + r) (the
    partials added to zeros in split order, then r: `residual_gemv`'s finisher's arithmetic, hence its bits) over
    its K slice, rows < M, and stores it to xout (programs of the same slice store the same bits), then runs the
    GEMV on xout: `_reduce_deferred`.
    """
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    n0 = pid_n * BN
    k_begin = pid_k * (CPS * BK)
    k_end = tl.minimum(k_begin + CPS * BK, K)
    w2_off = I * stride_wn
    if PRELOAD:                                       # gate and up weight loads issued before the wait
        gws = preload_weights(w_ptr, stride_wn, n0, I, k_begin, k_end, BN, BK, CPS, EVEN_N, EVEN_K, UPCAST)
        uws = preload_weights(w_ptr + w2_off, stride_wn, n0, I, k_begin, k_end, BN, BK, CPS, EVEN_N, EVEN_K,
                              UPCAST)
    elif USE_PDL and PF_K > 0:
        prefetch_l2(w_ptr, stride_wn, n0, I, k_begin, K, BN, PF_K)
        prefetch_l2(w_ptr + w2_off, stride_wn, n0, I, k_begin, K, BN, PF_K)
    if USE_PDL:
        gdc_wait()
        gdc_launch_dependents()
    if XSPLIT > 0:
        _reduce_deferred(x_ptr, stride_xm, xp_ptr, xp_stride_s, xp_stride_m, xout_ptr, stride_om, M, k_begin, k_end,
                         CPS * BK, XSPLIT, RB, NRB, KC, UPCAST)
        tl.debug_barrier()          # this program's xout stores before its own loads of them
        x_ptr = xout_ptr
        stride_xm = stride_om
    r0 = _load_rstd(rstd_ptr, 0, M, NORM)
    r1 = _load_rstd(rstd_ptr, 16, M, NORM)
    r2 = _load_rstd(rstd_ptr, 32, M, NORM)
    XMODE: tl.constexpr = NORM
    if PRELOAD:
        g0, g1, g2, u0, u1, u2, s0, s1, s2 = preload_product(
            gws, uws, x_ptr, stride_xm, M, k_begin, k_end, nw_ptr, r0, r1, r2, BN, BK, CPS, NUM_MB, True, XMODE,
            EVEN_K, UPCAST)
    else:
        g0, g1, g2, u0, u1, u2, s0, s1, s2 = gemv_loop(
            w_ptr, w2_off, stride_wn, x_ptr, stride_xm, M, I, n0, k_begin, K, nw_ptr, r0, r1, r2,
            BN, BK, CPS, NUM_MB, True, XMODE, EVEN_N, EVEN_K, UPCAST)
    MP: tl.constexpr = 16 * NUM_MB
    finished = True
    if SPLIT > 1:
        store_partial(ws_ptr, g0, 2 * pid_k, I, MP, n0, 0, BN, EVEN_N)
        store_partial(ws_ptr, u0, 2 * pid_k + 1, I, MP, n0, 0, BN, EVEN_N)
        if NORM == 2:
            store_split_ss(sss_ptr, s0, pid_n, pid_k, 0, SPLIT)
        if NUM_MB > 1:
            store_partial(ws_ptr, g1, 2 * pid_k, I, MP, n0, 16, BN, EVEN_N)
            store_partial(ws_ptr, u1, 2 * pid_k + 1, I, MP, n0, 16, BN, EVEN_N)
            if NORM == 2:
                store_split_ss(sss_ptr, s1, pid_n, pid_k, 16, SPLIT)
        if NUM_MB > 2:
            store_partial(ws_ptr, g2, 2 * pid_k, I, MP, n0, 32, BN, EVEN_N)
            store_partial(ws_ptr, u2, 2 * pid_k + 1, I, MP, n0, 32, BN, EVEN_N)
            if NORM == 2:
                store_split_ss(sss_ptr, s2, pid_n, pid_k, 32, SPLIT)
        tl.debug_barrier()
        arrived = tl.atomic_add(cnt_ptr + pid_n, 1, sem="acq_rel", scope="gpu")
        finished = arrived == SPLIT - 1
        if finished:
            g0 = sum_partials(ws_ptr, 0, I, MP, n0, 0, BN, SPLIT, 2, EVEN_N)
            u0 = sum_partials(ws_ptr, 1, I, MP, n0, 0, BN, SPLIT, 2, EVEN_N)
            if NORM == 2:
                s0 = sum_split_ss(sss_ptr, pid_n, 0, SPLIT)
            if NUM_MB > 1:
                g1 = sum_partials(ws_ptr, 0, I, MP, n0, 16, BN, SPLIT, 2, EVEN_N)
                u1 = sum_partials(ws_ptr, 1, I, MP, n0, 16, BN, SPLIT, 2, EVEN_N)
                if NORM == 2:
                    s1 = sum_split_ss(sss_ptr, pid_n, 16, SPLIT)
            if NUM_MB > 2:
                g2 = sum_partials(ws_ptr, 0, I, MP, n0, 32, BN, SPLIT, 2, EVEN_N)
                u2 = sum_partials(ws_ptr, 1, I, MP, n0, 32, BN, SPLIT, 2, EVEN_N)
                if NORM == 2:
                    s2 = sum_split_ss(sss_ptr, pid_n, 32, SPLIT)
            tl.store(cnt_ptr + pid_n, 0)      # reset for the next launch (plain store, see `_gemv` "Split-K")
    if finished:
        if NORM == 2:                                 # factored RMSNorm: scale by rstd before SiLU
            q0 = rstd_of(s0, K, eps)
            g0 = g0 * q0[None, :]
            u0 = u0 * q0[None, :]
            if NUM_MB > 1:
                q1 = rstd_of(s1, K, eps)
                g1 = g1 * q1[None, :]
                u1 = u1 * q1[None, :]
            if NUM_MB > 2:
                q2 = rstd_of(s2, K, eps)
                g2 = g2 * q2[None, :]
                u2 = u2 * q2[None, :]
        _finish_act(g0, u0, 0, n0, M, I, act_ptr, stride_am, BN, UPCAST)
        if NUM_MB > 1:
            _finish_act(g1, u1, 16, n0, M, I, act_ptr, stride_am, BN, UPCAST)
        if NUM_MB > 2:
            _finish_act(g2, u2, 32, n0, M, I, act_ptr, stride_am, BN, UPCAST)


def gate_up_act(x: torch.Tensor | DeferredX, w_gate_up: torch.Tensor, *, norm_weight: torch.Tensor | None = None,
                rstd: torch.Tensor | None = None, eps: float | None = None, out: torch.Tensor | None = None,
                workspace: GemvWorkspace | None = None, plan: GemvPlan | None = None,
                use_pdl: bool = False) -> torch.Tensor:
    """act = silu(h Wg^T) * (h Wu^T), one launch.

    Parameters:
        x            [M, H] bf16 (M = 1..48), or a `DeferredX` (`out_proj.residual_gemv_deferred`): the rows are
                     then bf16(residual + the partials summed in split order), the bits `residual_gemv` would
                     have stored, and this launch writes them to its `out` (every program its K slice; `out`
                     must not overlap act `out`)
        w_gate_up    [2I, H] bf16 contiguous (`pack_gate_up`)
        norm_weight  [H] bf16, with either rstd [M] fp32 (h = norm_weight * bf16(x * rstd), the
                     reference's rounding order) or eps, a finite float > 0 (h = rms_norm(x, norm_weight, eps) with
                     rstd computed in this kernel, factored: bf16(norm_weight * x) enters the MMA and
                     the fp32 accumulators are scaled by rstd); neither: h = x
        out          [M, I] bf16 (allocated when None), rows of their own (row stride >= I); no aliasing: it must
                     not overlap x, w_gate_up, norm_weight or rstd (every column tile reads all of x), nor a
                     DeferredX's out, residual or partials
        workspace    `GemvWorkspace` for >= I columns; plan: tiling (default `plan_gemv(I, H,
                     kind="gate_up")`); use_pdl: programmatic dependent launch (Hopper)
    Returns act [M, I] bf16 (one rounding of the fp32 silu(gate) * up).
    Raises StepContractError, before anything is written, for an argument that is not a tensor, wrong shapes /
    dtypes / devices, a norm_weight without rstd or eps, a bad eps (value named), a plan made for another shape,
    out rows that overlap, or out overlapping an input (both named).
    """
    require_runnable("x", x); require_runnable("w_gate_up", w_gate_up)
    out, launch = _prepare_gate_up(x, w_gate_up, norm_weight, rstd, eps, out, workspace, plan, use_pdl, "act out")
    launch()
    return out


def _prepare_gate_up(x, w_gate_up, norm_weight, rstd, eps, out, workspace, plan, use_pdl, out_name: str):
    """Every check of `gate_up_act` (the output named `out_name` in errors), then (out, a function of no arguments
    that launches the kernel): `mlp` checks its down launch too before this one writes."""
    x, deferred = consumer_input(x)
    require_tensors(x=x, w_gate_up=w_gate_up)
    dev = x.device
    if x.dim() != 2 or w_gate_up.dim() != 2:
        raise StepContractError(f"x [M, H] and w_gate_up [2I, H] expected, got {tuple(x.shape)}, "
                                f"{tuple(w_gate_up.shape)}")
    m, h = x.shape
    xsplit = 0 if deferred is None else check_deferred(deferred, m, h, dev)
    if not 1 <= m <= MAX_ROWS:
        raise StepContractError(f"x has M={m} rows; the fused MLP takes 1..{MAX_ROWS}")
    if w_gate_up.shape[0] % 2:
        raise StepContractError(f"w_gate_up has {w_gate_up.shape[0]} rows; expected 2I (gate rows, then up rows)")
    i = w_gate_up.shape[0] // 2
    check_tensor("x", x, (m, h), torch.bfloat16, dev)
    check_tensor("w_gate_up", w_gate_up, (2 * i, h), torch.bfloat16, dev)
    if not w_gate_up.is_contiguous():
        raise StepContractError("w_gate_up must be contiguous")
    norm = _norm_mode(norm_weight, rstd, eps)
    if norm:
        check_tensor("norm_weight", norm_weight, (h,), torch.bfloat16, dev)
    if norm == 1:
        check_tensor("rstd", rstd, (m,), torch.float32, dev)
    out = torch.empty((m, i), dtype=torch.bfloat16, device=dev) if out is None else out
    check_tensor(out_name, out, (m, i), torch.bfloat16, dev)
    check_rows_apart(out_name, out)
    if deferred is not None:
        check_writes_apart(deferred, {out_name: out})
    refuse_aliasing({out_name: out}, dict(x=x, w_gate_up=w_gate_up, norm_weight=norm_weight, rstd=rstd),
                    "the gate/up launch reads {b} while it writes {a}")
    ws = gemv_workspace(workspace, i, dev)
    ws.check(i, "gate/up GEMV")
    plan = plan_gemv(i, h, kind="gate_up") if plan is None else plan
    check_plan_for(plan, i, h, "gate/up (I, H)")
    refuse_bn_by_width(plan, "gate_up", "the gate/up GEMV")
    nmb = row_blocks(m)
    upcast = interpreting()
    pdl = bool(use_pdl) and not upcast
    dargs, dconst = deferred_kernel_args(deferred, xsplit, m, plan.at(nmb), ws.row_ss, x)
    feps = float(eps) if norm == 2 else 0.0

    def launch() -> None:
        _gate_up_kernel[plan.at(nmb).grid](
            x, x.stride(0), w_gate_up, w_gate_up.stride(0), norm_weight if norm else x,
            rstd if norm == 1 else ws.row_ss, out, out.stride(0), ws.partials, ws.split_ss, ws.counters, *dargs,
            m, i, h, feps,
            NORM=norm, USE_PDL=pdl, UPCAST=upcast, launch_pdl=pdl, **launch_constexprs(plan, nmb), **dconst)
    return out, launch


def _norm_mode(norm_weight, rstd, eps) -> int:
    """0: no norm; 1: RMSNorm on load with a given rstd; 2: rstd computed in the kernel."""
    if norm_weight is None:
        if rstd is not None or eps is not None:
            raise StepContractError("rstd / eps given without norm_weight: norm_weight and rstd go together "
                                    "(RMSNorm on load), or norm_weight and eps (rstd computed in-kernel)")
        return 0
    if rstd is not None:
        if eps is not None:
            raise StepContractError("give rstd or eps with norm_weight, not both")
        return 1
    if eps is None:
        raise StepContractError("norm_weight and rstd go together (RMSNorm on load), or norm_weight and eps "
                                "(rstd computed in-kernel); got norm_weight alone")
    check_eps(eps)
    return 2


def mlp(x: torch.Tensor, w_gate_up: torch.Tensor, w_down: torch.Tensor, residual: torch.Tensor, *,
        norm_weight: torch.Tensor | None = None, rstd: torch.Tensor | None = None, eps: float | None = None,
        out: torch.Tensor | None = None, act: torch.Tensor | None = None,
        workspace: GemvWorkspace | None = None, plans: tuple[GemvPlan, GemvPlan] | None = None,
        use_pdl: bool = False) -> torch.Tensor:
    """residual + swiglu_mlp(h, w_gate, w_up, w_down): gate/up launch, then down launch (PDL-chained).

    Parameters:
        x           [M, H] bf16 tensor (M = 1..48): the normed rows h, or (with norm_weight) the un-normed x,
                    normalised on load as rms_norm(x, norm_weight): with the given rstd [M] fp32, or with rstd
                    computed in the gate/up kernel from eps, a finite float > 0 (see the module docstring)
        w_gate_up   [2I, H] bf16 (`pack_gate_up`);  w_down [H, I] bf16 contiguous
        residual    [M, H] bf16 (may be x itself)
        out         [M, H] bf16 (allocated when None), rows of their own (row stride >= H)
        act         [M, I] bf16 scratch for silu(gate) * up (allocated when None), rows of their own
        workspace   `GemvWorkspace` for max(I, H) columns; plans: (gate/up, down) tiling overrides
        use_pdl     chain the two launches (and the previous kernel) with PDL
    Aliasing: `out` may be `residual` and / or `x` itself (the same tensor, or a view with the same data_ptr and
    strides: the in-place residual update `mlp(x, ..., x, out=x)`; the down launch reads each residual tile before
    it writes it, and x is read only by the gate/up launch, which completes first). Any other overlap of out, and
    any overlap of act, with an input (x, w_gate_up, w_down, residual, norm_weight, rstd) or with each other is
    refused (the gate/up launch reads all of x while it writes act; the down launch reads all of act while it
    writes out).
    Returns: [M, H] bf16 = residual + down(silu(gate(h)) * up(h)), fp32 accumulation, each stage
    rounded to bf16 once.
    Raises StepContractError, before either launch writes anything, naming the argument that is not a tensor or
    whose shape, dtype or device is wrong, a bad eps, a plan or workspace that does not fit either launch, output
    rows that overlap, or an overlap the aliasing rule refuses (both tensors named).
    """
    require_runnable("x", x); require_runnable("w_gate_up", w_gate_up)
    require_tensors(x=x, w_gate_up=w_gate_up, w_down=w_down)
    if x.dim() != 2:
        raise StepContractError(f"x must be [M, H], got shape {tuple(x.shape)}")
    dev = x.device
    m, hx = x.shape
    if w_down.dim() != 2 or w_gate_up.dim() != 2:
        raise StepContractError("w_gate_up [2I, H] and w_down [H, I] must be 2-D")
    if w_gate_up.shape[0] % 2:
        raise StepContractError(f"w_gate_up has {w_gate_up.shape[0]} rows; expected 2I (gate rows, then up rows)")
    hdim, i = w_down.shape
    check_tensor("w_down", w_down, (hdim, w_gate_up.shape[0] // 2), torch.bfloat16, dev)
    if not w_down.is_contiguous():
        raise StepContractError("w_down must be contiguous")
    check_tensor("residual", residual, (m, hdim), torch.bfloat16, dev)
    ws = gemv_workspace(workspace, max(i, hdim), dev)
    if plans is not None and (not isinstance(plans, tuple) or len(plans) != 2):
        raise StepContractError(f"plans must be a (gate/up, down) pair of GemvPlan or None, got {plans!r}")
    p_gu, p_down = plans if plans is not None else (plan_gemv(i, hx, kind="gate_up"),
                                                    plan_gemv(hdim, i, kind="residual"))
    act, launch_gate_up = _prepare_gate_up(x, w_gate_up, norm_weight, rstd, eps, act, ws, p_gu, use_pdl, "act")
    out = torch.empty((m, hdim), dtype=torch.bfloat16, device=dev) if out is None else out
    check_tensor("out", out, (m, hdim), torch.bfloat16, dev)
    check_rows_apart("out", out)
    check_plan_for(p_down, hdim, i, "down (H, I)")
    refuse_aliasing(dict(act=act), dict(residual=residual, w_down=w_down),
                    "the gate/up launch writes {a} before the down launch reads {b}")
    refuse_aliasing(dict(out=out), dict(act=act, w_down=w_down, residual=residual, x=x, w_gate_up=w_gate_up,
                                        norm_weight=norm_weight, rstd=rstd),
                    "mlp reads {b} while (or before) it writes {a}", in_place=dict(out=("residual", "x")))
    launch_down = _prepare_residual_gemv(act, w_down, residual, out, p_down, ws, use_pdl=use_pdl)
    launch_gate_up()
    launch_down()
    return out
