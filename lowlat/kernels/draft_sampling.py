"""Single-launch draft sampling (Triton): LM-head GEMV + temperature + top-k/top-p + counter-based sample.

Matches `lowlat.reference.draft_sampling.draft_sample` (tokens, and q through `DraftSample.probs()`).

One launch per draft position, grid (P = cdiv(V, BLOCK_V) vocabulary tiles, cdiv(R, 16) row blocks):

1. every program computes its logits tile x = (h @ W_tile^T) / T for 16 rows ("swap AB" MMA: the
   weight tile is the wgmma m64 operand, rows padded to 16; fp32 accumulation; IEEE division), stores
   it, and publishes per-row partials: tile max m_p, tile sum-exp s_p, and the tile's best Gumbel score
   x_t - log(E_t) with its token id (E from Philox keyed by (seed, offset, token id),
   `lowlat.kernels.philox`; the plain argmax for greedy rows). With top-k on (K_CAP > 0) it also
   publishes its tile's top-K_CAP keys (int64: value, then lowest id), sorted (`tl.topk`).
2. the programs of a group of GROUP tiles count themselves in on an atomic counter; the last to arrive
   merges the group's sorted key lists into one top-K_CAP list (a tree of bitonic merges). The last
   group (or, without top-k, the last program) to arrive on the row block's counter does the final
   reduction: global max and sum-exp over the P partials (a fixed reduction tree over program index),
   the Gumbel argmax (ties to the lowest token id), and for top-k rows the merged top-K_CAP list ->
   top-k -> top-p (mass before < top_p, as `filtered_probs`) -> Gumbel argmax over the kept tokens.
   Every partial is reduced in program order whatever the arrival order, so every run (and every TP
   rank holding the whole vocabulary) picks the same token. The last program resets the counters, so
   the workspace needs no clearing between launches (CUDA-graph friendly).

q is not materialised inside the launch (a dense [R, V] write by one program would cost more than the
GEMV): the kernel stores the scaled logits x [R, V] plus three per-row numbers, lse (log-sum-exp over
the kept tokens) and the cut (value, id) of the last kept token, and

    q_t = exp(x_t - lse)  if  x_t > cut_value  or  (x_t == cut_value and t <= cut_id),  else 0.

`DraftSample.probs()` evaluates that (one elementwise op, e.g. once per verify for all k positions).

Supported range (checked by `draft_sample`, which raises UnsupportedConfigError naming the value):
temperature >= 0 (0 = greedy); top_k in [0, 64] or >= V (0 and >= V mean off); top_p in (0, 1], and
top_p < 1 needs 1 <= top_k <= 64 (the nucleus is taken within the top-k candidates; a full-vocabulary
nucleus would need a sort of V entries). The launch-level `draft_sample_into` does no value checks
(it is capturable in a CUDA graph); a row outside the range gets token -1, never a silent wrong token.

Tokens equal the reference's for the same counters whenever the logits agree bitwise (the tests use
inputs whose GEMV is exact in fp32 to check that); on general inputs the GEMV's fp32 summation order
differs from torch's, so a token can differ only where two Gumbel scores (or a top-p boundary) are
within fp32 rounding of each other (~1e-6 per draw).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from lowlat.errors import StepContractError, UnsupportedConfigError
from lowlat.kernels.philox import philox_exponential

#: most top-k candidates the kernel merges (top_k above this is refused)
MAX_TOP_K = 64
BLOCK_R = 16
_KEY_EMPTY = tl.constexpr(-9_220_000_000_000_000_000)   # below every real key, including -inf's


def _interpreting() -> bool:
    import os
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


# ----------------------------------------------------------------------------------------------------
# keys: int64 that sort like (value descending, token id ascending), unique per token
# ----------------------------------------------------------------------------------------------------
@triton.jit
def _make_key(x, ids):
    b = tl.where(x == 0.0, 0.0, x).to(tl.int32, bitcast=True)     # -0.0 ties with +0.0, as in the reference
    s = tl.where(b < 0, b ^ 0x7FFFFFFF, b)                    # monotone int32 image of the float
    low = (ids.to(tl.uint32) ^ 0xFFFFFFFF).to(tl.int64)      # larger for smaller ids
    return (s.to(tl.int64) << 32) | low


@triton.jit
def _key_value(key):
    s = (key >> 32).to(tl.int32)
    b = tl.where(s < 0, s ^ 0x7FFFFFFF, s)
    return b.to(tl.float32, bitcast=True)


@triton.jit
def _key_id(key):
    return (key.to(tl.uint32) ^ 0xFFFFFFFF).to(tl.int32)


@triton.jit
def _top_of_sorted_lists(x, G: tl.constexpr, K: tl.constexpr, LOG_G: tl.constexpr):
    """x [G, K]: G lists each sorted descending -> the K largest of all, sorted descending [K].

    A tree of bitonic merges (Batcher 1968): max(A, reversed B) of two descending lists holds the K
    largest of their union as a bitonic sequence, which a log2(K)-stage bitonic merge sorts; log2(G)
    levels. Exact: keys are unique, so the result does not depend on how the lists were grouped."""
    for level in tl.static_range(LOG_G):
        y = tl.permute(tl.reshape(x, [G >> (level + 1), 2, K]), (0, 2, 1))
        a, b = tl.split(y)
        x = tl.bitonic_merge(tl.maximum(a, tl.flip(b, 1)), 1, True)
    return tl.reshape(x, [K])


@triton.jit
def _draft_sample_kernel(
        h_ptr, w_ptr, temp_ptr, topk_ptr, topp_ptr, seed_ptr, off_ptr,
        tok_ptr, x_ptr, lse_ptr, cutv_ptr, cuti_ptr,
        ws_m, ws_s, ws_bs, ws_bi, ws_keys, ws_gkeys, cnt_ptr,
        R, V, stride_h, stride_w, stride_x,
        NUM_PROGS, NUM_GROUPS,
        HIDDEN: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_H: tl.constexpr,
        K_CAP: tl.constexpr, GROUP: tl.constexpr, LOG_GROUP: tl.constexpr, P_PAD: tl.constexpr,
        NG_PAD: tl.constexpr, LOG_NG: tl.constexpr,
        NEED_NOISE: tl.constexpr, UPCAST: tl.constexpr, USE_PDL: tl.constexpr):
    pid = tl.program_id(0)
    rb = tl.program_id(1)
    if USE_PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    rl = tl.arange(0, BLOCK_R)
    rows = rb * BLOCK_R + rl
    rmask = rows < R
    cols = pid * BLOCK_V + tl.arange(0, BLOCK_V)
    vmask = cols < V

    # ---- 1. logits tile, vocabulary-major: acc [BLOCK_V, BLOCK_R] = W_tile [BLOCK_V, H] @ h^T [H, BLOCK_R]
    # ("swap AB": the weight tile is the large MMA operand; rows are padded to 16)
    acc = tl.zeros([BLOCK_V, BLOCK_R], dtype=tl.float32)
    for h0 in range(0, HIDDEN, BLOCK_H):
        hk = h0 + tl.arange(0, BLOCK_H)
        hmask = hk < HIDDEN
        w = tl.load(w_ptr + cols[:, None] * stride_w + hk[None, :], mask=vmask[:, None] & hmask[None, :], other=0.0)
        ht = tl.load(h_ptr + rows[None, :] * stride_h + hk[:, None], mask=rmask[None, :] & hmask[:, None], other=0.0)
        if UPCAST:   # the interpreter computes bf16 wrongly: upcast right after the load
            acc = tl.dot(w.to(tl.float32), ht.to(tl.float32), acc, input_precision="ieee")
        else:        # bf16 x bf16 products are exact in fp32; fp32 accumulation
            acc = tl.dot(w, ht, acc)
    temp = tl.load(temp_ptr + rows, mask=rmask, other=1.0)
    scale = tl.where(temp <= 0.0, 1.0, temp)
    x = tl.div_rn(acc, scale[None, :] + tl.zeros([BLOCK_V, BLOCK_R], dtype=tl.float32))
    x = tl.where(vmask[:, None], x, float("-inf"))
    tl.store(x_ptr + rows[None, :] * stride_x + cols[:, None], x, mask=rmask[None, :] & vmask[:, None])

    # ---- per-row tile partials -----------------------------------------------------------------
    m_p = tl.max(x, axis=0)
    s_p = tl.sum(tl.exp(x - m_p[None, :]), axis=0)
    tl.store(ws_m + rows * NUM_PROGS + pid, m_p, mask=rmask)
    tl.store(ws_s + rows * NUM_PROGS + pid, s_p, mask=rmask)
    n_rows = tl.minimum(R - rb * BLOCK_R, BLOCK_R)
    for r in range(0, BLOCK_R):
        if r < n_rows:
            row = rb * BLOCK_R + r
            xr = tl.max(tl.where(rl[None, :] == r, x, float("-inf")), axis=1)        # [BLOCK_V]
            score = xr.to(tl.float64)
            if NEED_NOISE:
                t_r = tl.load(temp_ptr + row)
                k_r = tl.load(topk_ptr + row)
                if (t_r > 0.0) & ((k_r <= 0) | (k_r >= V)):      # sampled without top-k: Gumbel here
                    seed = tl.load(seed_ptr + row)
                    off = tl.load(off_ptr + row)
                    score = score - tl.log(philox_exponential(seed, off, cols, 0))
            score = tl.where(vmask, score, float("-inf"))
            best = tl.max(score, axis=0)
            best_id = tl.min(tl.where(score == best, cols, 2147483647), axis=0)
            tl.store(ws_bs + row * NUM_PROGS + pid, best)
            tl.store(ws_bi + row * NUM_PROGS + pid, best_id)
            if K_CAP > 0:
                keys = tl.where(vmask, _make_key(xr, cols), _KEY_EMPTY)
                top = tl.topk(keys, K_CAP)
                tl.store(ws_keys + (row * NUM_PROGS + pid) * K_CAP + tl.arange(0, K_CAP), top)

    # ---- 2. arrival: group merge (top-k), then the row block's final reduction -------------------
    is_last = pid < 0
    tl.debug_barrier()        # every thread's partials are stored before the release below
    if K_CAP > 0:
        g = pid // GROUP
        g_size = tl.minimum(NUM_PROGS - g * GROUP, GROUP)
        old = tl.atomic_add(cnt_ptr + rb * (1 + NUM_GROUPS) + 1 + g, 1, sem="acq_rel")
        if old == g_size - 1:
            gl = tl.arange(0, GROUP * K_CAP)
            src = g * GROUP + gl // K_CAP
            for r in range(0, BLOCK_R):
                if r < n_rows:
                    row = rb * BLOCK_R + r
                    keys = tl.load(ws_keys + (row * NUM_PROGS + g * GROUP) * K_CAP + gl, mask=src < NUM_PROGS,
                                   other=_KEY_EMPTY, cache_modifier=".cg")
                    top = _top_of_sorted_lists(tl.reshape(keys, [GROUP, K_CAP]), GROUP, K_CAP, LOG_GROUP)
                    tl.store(ws_gkeys + (row * NUM_GROUPS + g) * K_CAP + tl.arange(0, K_CAP), top)
            tl.store(cnt_ptr + rb * (1 + NUM_GROUPS) + 1 + g, 0)
            tl.debug_barrier()
            old2 = tl.atomic_add(cnt_ptr + rb * (1 + NUM_GROUPS), 1, sem="acq_rel")
            is_last = old2 == NUM_GROUPS - 1
    else:
        old = tl.atomic_add(cnt_ptr + rb * (1 + NUM_GROUPS), 1, sem="acq_rel")
        is_last = old == NUM_PROGS - 1

    if is_last:
        pp = tl.arange(0, P_PAD)
        pm = pp < NUM_PROGS
        for r in range(0, BLOCK_R):
            if r < n_rows:
                row = rb * BLOCK_R + r
                t_r = tl.load(temp_ptr + row)
                k_r = tl.load(topk_ptr + row)
                p_r = tl.load(topp_ptr + row)
                k_r = tl.where(k_r >= V, 0, k_r)
                m_all = tl.load(ws_m + row * NUM_PROGS + pp, mask=pm, other=float("-inf"), cache_modifier=".cg")
                s_all = tl.load(ws_s + row * NUM_PROGS + pp, mask=pm, other=0.0, cache_modifier=".cg")
                big_m = tl.max(m_all, axis=0)
                big_s = tl.sum(s_all * tl.exp(m_all - big_m), axis=0)
                bs = tl.load(ws_bs + row * NUM_PROGS + pp, mask=pm, other=float("-inf"), cache_modifier=".cg")
                bi = tl.load(ws_bi + row * NUM_PROGS + pp, mask=pm, other=2147483647, cache_modifier=".cg")
                best = tl.max(bs, axis=0)
                tok = tl.min(tl.where(bs == best, bi, 2147483647), axis=0)
                lse = big_m + tl.log(big_s)
                cut_v = tl.full([], -3.4028234663852886e38, tl.float32)     # lowest finite: keep all
                cut_i = tl.full([], 0, tl.int32) + V
                if t_r <= 0.0:                       # greedy: q = one-hot(argmax)
                    lse = big_m
                    cut_v = big_m
                    cut_i = tok
                elif k_r > 0:
                    if K_CAP > 0:
                        if k_r <= K_CAP:
                            jj = tl.arange(0, K_CAP)
                            gk = tl.arange(0, NG_PAD * K_CAP)
                            keys = tl.load(ws_gkeys + row * NUM_GROUPS * K_CAP + gk, mask=gk // K_CAP < NUM_GROUPS,
                                           other=_KEY_EMPTY, cache_modifier=".cg")
                            top = _top_of_sorted_lists(tl.reshape(keys, [NG_PAD, K_CAP]), NG_PAD, K_CAP, LOG_NG)
                            vals = _key_value(top)
                            ids = _key_id(top)
                            prob = tl.exp(vals - big_m) / big_s
                            keep = jj < k_r
                            pk = tl.where(keep, prob, 0.0)
                            before = tl.cumsum(pk, axis=0) - pk
                            keep = keep & (before < p_r)
                            n_keep = tl.sum(keep.to(tl.int32), axis=0)
                            lse = big_m + tl.log(tl.sum(tl.where(keep, tl.exp(vals - big_m), 0.0), axis=0))
                            cut_v = tl.max(tl.where(jj == n_keep - 1, vals, float("-inf")), axis=0)
                            cut_i = tl.max(tl.where(jj == n_keep - 1, ids, -1), axis=0)
                            seed = tl.load(seed_ptr + row)
                            off = tl.load(off_ptr + row)
                            sc = vals.to(tl.float64) - tl.log(philox_exponential(seed, off, ids, 0))
                            sc = tl.where(keep, sc, float("-inf"))
                            best_k = tl.max(sc, axis=0)
                            tok = tl.min(tl.where(sc == best_k, ids, 2147483647), axis=0)
                        else:
                            tok = tok * 0 - 1
                    else:
                        tok = tok * 0 - 1
                elif p_r < 1.0:                      # top-p without top-k: outside the supported range
                    tok = tok * 0 - 1
                tl.store(tok_ptr + row, tok.to(tl.int64))
                tl.store(lse_ptr + row, lse)
                tl.store(cutv_ptr + row, cut_v)
                tl.store(cuti_ptr + row, cut_i)
        tl.store(cnt_ptr + rb * (1 + NUM_GROUPS), 0)


# ----------------------------------------------------------------------------------------------------
# host side
# ----------------------------------------------------------------------------------------------------
@dataclass
class DraftSample:
    """Output of one draft-sampling launch (R rows, vocabulary V).

    tokens [R] int64 (-1 marks a row whose parameters are outside the supported range);
    logits [R, V] float32 — x = (h @ W^T) / T (T = 1 for greedy rows);
    lse [R] float32 — log-sum-exp of x over the kept tokens;
    cut_value [R] float32, cut_id [R] int32 — the last kept token in (value desc, id asc) order
    (rows without filtering: the lowest finite float32 and V, so every token is kept).
    """

    tokens: torch.Tensor
    logits: torch.Tensor
    lse: torch.Tensor
    cut_value: torch.Tensor
    cut_id: torch.Tensor

    def kept(self) -> torch.Tensor:
        """[R, V] bool: the tokens the row's top-k / top-p filter keeps."""
        ids = torch.arange(self.logits.shape[1], device=self.logits.device)
        cv, ci = self.cut_value[:, None], self.cut_id[:, None]
        return (self.logits > cv) | ((self.logits == cv) & (ids[None, :] <= ci))

    def probs(self) -> torch.Tensor:
        """q [R, V] float32: exp(x - lse) on the kept tokens, 0 elsewhere (rows sum to 1)."""
        return torch.where(self.kept(), torch.exp(self.logits - self.lse[:, None]), 0.0)


@dataclass
class _Workspace:
    m: torch.Tensor
    s: torch.Tensor
    bs: torch.Tensor
    bi: torch.Tensor
    keys: torch.Tensor
    gkeys: torch.Tensor
    counters: torch.Tensor


_WORKSPACES: dict = {}


def _workspace(device, rows_pad: int, num_progs: int, num_groups: int, k_cap: int) -> _Workspace:
    key = (str(device), rows_pad, num_progs, num_groups, k_cap)
    ws = _WORKSPACES.get(key)
    if ws is None:
        kc = max(k_cap, 1)
        ws = _Workspace(
            m=torch.empty(rows_pad, num_progs, dtype=torch.float32, device=device),
            s=torch.empty(rows_pad, num_progs, dtype=torch.float32, device=device),
            bs=torch.empty(rows_pad, num_progs, dtype=torch.float64, device=device),
            bi=torch.empty(rows_pad, num_progs, dtype=torch.int32, device=device),
            keys=torch.empty(rows_pad, num_progs, kc, dtype=torch.int64, device=device),
            gkeys=torch.empty(rows_pad, num_groups, kc, dtype=torch.int64, device=device),
            counters=torch.zeros(rows_pad // BLOCK_R, 1 + num_groups, dtype=torch.int32, device=device))
        _WORKSPACES[key] = ws
    return ws


def k_cap_for(max_top_k: int) -> int:
    """The candidate-list length compiled for rows whose largest top_k is max_top_k (0 = top-k off)."""
    if max_top_k <= 0:
        return 0
    if max_top_k > MAX_TOP_K:
        raise UnsupportedConfigError("top_k", max_top_k, f"the fused draft sampler supports top_k <= {MAX_TOP_K}")
    return max(2, triton.next_power_of_2(max_top_k))        # tl.topk needs k >= 2


def draft_sample_into(h: torch.Tensor, lm_head: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor,
                      top_p: torch.Tensor, seeds: torch.Tensor, offsets: torch.Tensor, out: DraftSample, *,
                      k_cap: int, need_noise: bool = True, block_v: int = 64, block_h: int = 64,
                      group: int | None = None, num_warps: int = 4, num_stages: int = 3,
                      use_pdl: bool = False) -> DraftSample:
    """Launch-level entry (no host sync, CUDA-graph capturable): one launch, writes into `out`.

    h [R, H] bf16 (or fp32), lm_head [V, H] same dtype, row stride 1 along H; temperature [R] float32,
    top_k [R] int32, top_p [R] float32, seeds / offsets [R] int64, all on h's device. k_cap: 0 (no row uses
    top-k) or a power of two in [max(2, largest top_k), 64]. need_noise False when every row is greedy.
    Parameter values are not checked here (see `draft_sample`); rows outside the supported range get
    token -1. CUDA-graph padding rows: give them any valid parameters (e.g. temperature 0); a row's
    outputs never depend on the other rows. block_v (power of two >= max(16, k_cap)), block_h, group
    (tiles per top-k merge group, power of two; default about sqrt(P)), num_warps, num_stages: launch
    tuning. Raises StepContractError on shapes / dtypes / devices, UnsupportedConfigError on tuning values.
    Mutates: out.* and the cached workspace of this (device, shape).
    """
    if h.dim() != 2 or lm_head.dim() != 2 or h.shape[1] != lm_head.shape[1]:
        raise StepContractError(f"h must be [R, H] and lm_head [V, H] with the same H, got "
                                f"{tuple(h.shape)} and {tuple(lm_head.shape)}")
    r, hd = h.shape
    v = lm_head.shape[0]
    if h.dtype != lm_head.dtype or h.dtype not in (torch.bfloat16, torch.float16, torch.float32):
        raise StepContractError(f"h and lm_head must share a dtype in bf16/fp16/fp32, got {h.dtype}, {lm_head.dtype}")
    if h.stride(1) != 1 or lm_head.stride(1) != 1:
        raise StepContractError("h and lm_head must be contiguous along H (stride 1)")
    for name, t, dt in (("temperature", temperature, torch.float32), ("top_k", top_k, torch.int32),
                        ("top_p", top_p, torch.float32), ("seeds", seeds, torch.int64),
                        ("offsets", offsets, torch.int64)):
        if tuple(t.shape) != (r,) or t.dtype != dt or t.device != h.device:
            raise StepContractError(f"{name} must be [R] = [{r}] {dt} on {h.device}, got "
                                    f"{tuple(t.shape)} {t.dtype} on {t.device}")
    if k_cap not in (0, 2, 4, 8, 16, 32, 64):
        raise UnsupportedConfigError("k_cap", k_cap, "must be 0 or a power of two in [2, 64]")
    if block_h < 16 or block_h & (block_h - 1):
        raise UnsupportedConfigError("block_h", block_h, "must be a power of two >= 16")
    if block_v < max(k_cap, 16) or block_v & (block_v - 1):
        raise UnsupportedConfigError("block_v", block_v, f"must be a power of two >= max(k_cap={k_cap}, 16)")
    if (tuple(out.tokens.shape) != (r,) or tuple(out.logits.shape) != (r, v) or out.logits.dtype != torch.float32
            or out.logits.stride(1) != 1):
        raise StepContractError(f"out buffers must be tokens [R]={r}, logits [R, V]=[{r}, {v}] float32")
    if r == 0:
        return out
    num_progs = triton.cdiv(v, block_v)
    if group is None:     # about sqrt(P) tiles per group: both merge levels see ~sqrt(P) * k_cap keys
        group = triton.next_power_of_2(max(1, math.isqrt(num_progs - 1) + 1))
    if group < 1 or group & (group - 1):
        raise UnsupportedConfigError("group", group, "must be a power of two")
    num_groups = triton.cdiv(num_progs, group)
    n_rb = triton.cdiv(r, BLOCK_R)
    ws = _workspace(h.device, n_rb * BLOCK_R, num_progs, num_groups, k_cap)
    ng_pad = triton.next_power_of_2(num_groups)
    interp = _interpreting()
    kwargs = {} if interp else {"num_warps": num_warps, "num_stages": num_stages}
    if use_pdl and not interp:
        kwargs["launch_pdl"] = True
    _draft_sample_kernel[(num_progs, n_rb)](
        h, lm_head, temperature, top_k, top_p, seeds, offsets,
        out.tokens, out.logits, out.lse, out.cut_value, out.cut_id,
        ws.m, ws.s, ws.bs, ws.bi, ws.keys, ws.gkeys, ws.counters,
        r, v, h.stride(0), lm_head.stride(0), out.logits.stride(0),
        num_progs, num_groups,
        HIDDEN=hd, BLOCK_R=BLOCK_R, BLOCK_V=block_v, BLOCK_H=block_h, K_CAP=k_cap, GROUP=group,
        LOG_GROUP=group.bit_length() - 1, P_PAD=triton.next_power_of_2(num_progs), NG_PAD=ng_pad,
        LOG_NG=ng_pad.bit_length() - 1,
        NEED_NOISE=need_noise, UPCAST=interp or h.dtype == torch.float32, USE_PDL=use_pdl and not interp,
        **kwargs)
    return out


def empty_draft_sample(r: int, v: int, device) -> DraftSample:
    """Uninitialised output buffers for `draft_sample_into`."""
    return DraftSample(tokens=torch.empty(r, dtype=torch.int64, device=device),
                       logits=torch.empty(r, v, dtype=torch.float32, device=device),
                       lse=torch.empty(r, dtype=torch.float32, device=device),
                       cut_value=torch.empty(r, dtype=torch.float32, device=device),
                       cut_id=torch.empty(r, dtype=torch.int32, device=device))


def draft_sample(h: torch.Tensor, lm_head: torch.Tensor, temperature=1.0, top_k=0, top_p=1.0, *,
                 seeds: torch.Tensor, offsets: torch.Tensor, out: DraftSample | None = None,
                 **launch) -> DraftSample:
    """Sample one draft token per row in one launch; checks every value first (one host sync).

    Parameters
    ----------
    h : [R, H] bf16 — final-normed hidden states; lm_head : [V, H] bf16 (the embedding when tied).
    temperature : float or [R] — 0 = greedy (argmax, ties to the lowest id).
    top_k : int or [R] — 0 or >= V = off; else 1..64.
    top_p : float or [R] — in (0, 1]; < 1 needs 1 <= top_k <= 64.
    seeds, offsets : [R] int64 — Philox key and step counter per row.
    launch : block_v, block_h, group, num_warps, num_stages, use_pdl (see `draft_sample_into`).

    Returns a `DraftSample` (tokens [R] int64; q via `.probs()` [R, V] float32).
    Raises UnsupportedConfigError naming the first out-of-range value; StepContractError on shapes.
    Nothing is launched when a check fails.
    """
    from lowlat.reference.draft_sampling import check_sampling_params

    if h.dim() != 2 or lm_head.dim() != 2:
        raise StepContractError(f"h must be [R, H] and lm_head [V, H], got {tuple(h.shape)}, {tuple(lm_head.shape)}")
    r, v, dev = h.shape[0], lm_head.shape[0], h.device

    def per_row(val, dt, name):
        t = torch.as_tensor(val, dtype=dt)
        t = t.expand(r) if t.dim() == 0 else t
        if tuple(t.shape) != (r,):
            raise StepContractError(f"{name} must be a scalar or [R] = [{r}], got {tuple(t.shape)}")
        return t.to(dev).contiguous()

    temp_t = per_row(temperature, torch.float32, "temperature")
    topk_t = per_row(top_k, torch.int32, "top_k")
    topp_t = per_row(top_p, torch.float32, "top_p")
    tc, kc, pc = temp_t.cpu(), topk_t.cpu(), topp_t.cpu()
    check_sampling_params(tc, kc, pc)
    k_eff = torch.where(kc >= v, 0, kc)
    sampled = tc > 0
    bad = sampled & (k_eff > MAX_TOP_K)
    if bad.any():
        i = int(bad.nonzero()[0, 0])
        raise UnsupportedConfigError(f"top_k[{i}]", int(kc[i]), f"the fused draft sampler supports top_k <= "
                                     f"{MAX_TOP_K} (or 0 / >= V for off)")
    bad = sampled & (pc < 1) & (k_eff == 0)
    if bad.any():
        i = int(bad.nonzero()[0, 0])
        raise UnsupportedConfigError(f"top_p[{i}]", float(pc[i]), "top_p < 1 needs 1 <= top_k <= 64 in the fused "
                                     "draft sampler (the nucleus is taken within the top-k candidates)")
    max_k = int(torch.where(sampled, k_eff, 0).max()) if r else 0
    out = out if out is not None else empty_draft_sample(r, v, dev)
    return draft_sample_into(h, lm_head, temp_t, topk_t, topp_t, seeds, offsets, out,
                             k_cap=k_cap_for(max_k), need_noise=bool(sampled.any()), **launch)


__all__ = ["DraftSample", "draft_sample", "draft_sample_into", "empty_draft_sample", "k_cap_for", "MAX_TOP_K"]
