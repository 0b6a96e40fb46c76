"""Speculative-sampling verification in one launch (Triton): acceptance, residual / bonus token, counts.

Matches `lowlat.reference.rejection_sampling.rejection_sample` token for token (same Philox counters,
same float64 arithmetic: accept iff u * q(x) < p(x); the residual max(0, p - q) and the race w / E in
float64; ties to the lowest token id).

Grid (B requests, NSPLIT vocabulary chunks). Sampling mode: every program recomputes the request's
acceptance chain (k gathered scalars and k Philox uniforms, cheap) to find j, the first rejected
position (or n = num_drafts when all are accepted), then runs the exponential race
argmax_t w_t / E_t over its chunk of the vocabulary for w = max(0, p_j - q_j) (residual) or w = p_n
(bonus), and, for the all-zero-residual fallback, the race over p_j as well. Greedy mode: every
program takes the argmax of p_i over its chunk for each position i <= n. Partials go to a workspace;
the last program of the request to arrive on its atomic counter reduces them in split order (max,
ties to the lowest id: exact, so the result does not depend on the split plan or arrival order),
writes emitted [k+1] and accepted, and resets the counter (no clearing between launches; CUDA-graph
friendly). Padded draft slots (i >= num_drafts) are never read as tokens, accepted or emitted.

Non-finite probabilities are not refused (the launch is capturable; refusing would need a host sync)
but given the reference's meaning exactly: a NaN p(x) or q(x) rejects the draft (u * q < p is false);
a NaN anywhere in the residual p_j - q_j sends the draw to the race over p_j (the reference's
sum(w) > 0 is false; ws_any 2 marks it), and every race / argmax takes the lowest-id NaN when there is
one, as torch.argmax does (a program's NaN id travels as id - 2^30 < 0 in the id partial, so the
reductions find it with a min; finite inputs give the same tokens as before).

Cost: sampling mode reads two rows of V floats per request (p_j, q_j); greedy mode reads k+1 rows.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from lowlat.errors import StepContractError, UnsupportedConfigError
from lowlat.kernels._attn_common import interpreting, require_runnable
from lowlat.kernels.philox import philox_exponential, philox_uniform52

_BIG_ID = tl.constexpr(2147483647)
_NAN_SHIFT = tl.constexpr(1 << 30)      # a NaN's id travels as id - 2^30 (< 0): it wins, as in torch.argmax


@triton.jit
def _rejection_kernel(
        tok_ptr, q_ptr, p_ptr, nd_ptr, seed_ptr, off_ptr, emit_ptr, accn_ptr,
        ws_score, ws_id, ws_any, ws_gval, ws_gid, cnt_ptr,
        V, stride_tb, stride_qb, stride_qk, stride_pb, stride_pk, stride_eb,
        NSPLIT, CHUNK,
        K: tl.constexpr, K1_PAD: tl.constexpr, BLOCK_V: tl.constexpr, TILES: tl.constexpr,
        S_PAD: tl.constexpr, GREEDY: tl.constexpr, USE_PDL: tl.constexpr):
    b = tl.program_id(0)
    s = tl.program_id(1)
    if USE_PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    n = tl.minimum(tl.maximum(tl.load(nd_ptr + b).to(tl.int32), 0), K)
    ii = tl.arange(0, K1_PAD)
    iv = ii < n
    x = tl.load(tok_ptr + b * stride_tb + ii, mask=iv, other=0)
    x = tl.minimum(tl.maximum(x, 0), V - 1)                   # in bounds whatever the caller passed
    v_begin = s * CHUNK
    v_end = tl.minimum(v_begin + CHUNK, V)
    seed = tl.load(seed_ptr + b)
    off = tl.load(off_ptr + b)

    if GREEDY:
        for i in range(0, K + 1):
            if i <= n:
                bv = tl.full([], float("-inf"), tl.float32)
                bi = tl.full([], 0, tl.int32) + v_begin
                for t in range(0, TILES):
                    cols = v_begin + t * BLOCK_V + tl.arange(0, BLOCK_V)
                    pv = tl.load(p_ptr + b * stride_pb + i * stride_pk + cols, mask=cols < v_end,
                                 other=float("-inf"))
                    tv = tl.max(pv, axis=0)
                    ti = tl.min(tl.where(pv != pv, cols - _NAN_SHIFT, tl.where(pv == tv, cols, _BIG_ID)), axis=0)
                    # equal: the earlier tile has the lower id; a NaN (id < 0) wins, the first one stays
                    better = ((tv > bv) | (ti < 0)) & (bi >= 0)
                    bi = tl.where(better, ti, bi)
                    bv = tl.where(better, tv, bv)
                tl.store(ws_gval + (b * (K + 1) + i) * NSPLIT + s, bv)
                tl.store(ws_gid + (b * (K + 1) + i) * NSPLIT + s, bi)
    else:
        j = n
        if K > 0:
            px = tl.load(p_ptr + b * stride_pb + ii * stride_pk + x, mask=iv, other=0.0).to(tl.float64)
            qx = tl.load(q_ptr + b * stride_qb + ii * stride_qk + x, mask=iv, other=0.0).to(tl.float64)
            u = philox_uniform52(seed, off, ii, 1)
            rej = iv & ~(u * qx < px)
            j = tl.minimum(tl.min(tl.where(rej, ii, K1_PAD), axis=0), n)
        is_res = j < n
        jq = tl.minimum(j, K - 1)
        bw = tl.full([], -1.0, tl.float64)
        bwi = tl.full([], 0, tl.int32)
        bp = tl.full([], -1.0, tl.float64)
        bpi = tl.full([], 0, tl.int32)
        anyw = tl.full([], 0, tl.int32)
        for t in range(0, TILES):
            cols = v_begin + t * BLOCK_V + tl.arange(0, BLOCK_V)
            cm = cols < v_end
            pv = tl.load(p_ptr + b * stride_pb + j * stride_pk + cols, mask=cm, other=0.0).to(tl.float64)
            qv = tl.load(q_ptr + b * stride_qb + jq * stride_qk + cols, mask=cm & is_res, other=0.0).to(tl.float64)
            d = pv - qv
            w = tl.where(is_res, tl.where(d < 0.0, 0.0, d), pv)   # max(0, d) keeping a NaN, as torch.clamp
            expo = philox_exponential(seed, off, cols, 2)
            sw = tl.where(cm, w / expo, -1.0)                 # NaN exactly where w is (expo > 0, finite)
            sp = tl.where(cm, pv / expo, -1.0)
            tw = tl.max(sw, axis=0)
            # a NaN wins, as in torch.argmax: its id - _NAN_SHIFT (< 0), the lowest one
            twi = tl.min(tl.where(sw != sw, cols - _NAN_SHIFT, tl.where(sw == tw, cols, _BIG_ID)), axis=0)
            tp = tl.max(sp, axis=0)
            tpi = tl.min(tl.where(sp != sp, cols - _NAN_SHIFT, tl.where(sp == tp, cols, _BIG_ID)), axis=0)
            # 1: some w > 0; 2: some w NaN (the reference's sum(w) > 0 fails then: the race runs over p_j)
            anyw = tl.maximum(anyw, tl.max(tl.where(sw != sw, 2, (cm & (w > 0.0)).to(tl.int32)), axis=0))
            better = ((tw > bw) | (twi < 0)) & (bwi >= 0)     # the first NaN (earlier tile: lower id) stays
            bwi = tl.where(better, twi, bwi)
            bw = tl.where(better, tw, bw)
            better = ((tp > bp) | (tpi < 0)) & (bpi >= 0)
            bpi = tl.where(better, tpi, bpi)
            bp = tl.where(better, tp, bp)
        tl.store(ws_score + (b * NSPLIT + s) * 2, bw)
        tl.store(ws_score + (b * NSPLIT + s) * 2 + 1, bp)
        tl.store(ws_id + (b * NSPLIT + s) * 2, bwi)
        tl.store(ws_id + (b * NSPLIT + s) * 2 + 1, bpi)
        tl.store(ws_any + b * NSPLIT + s, anyw)

    tl.debug_barrier()        # every thread's partials are stored before the release below
    old = tl.atomic_add(cnt_ptr + b, 1, sem="acq_rel")
    if old == NSPLIT - 1:
        ss = tl.arange(0, S_PAD)
        sm = ss < NSPLIT
        if GREEDY:
            am = tl.zeros([K1_PAD], dtype=tl.int32)
            for i in range(0, K + 1):
                gv = tl.load(ws_gval + (b * (K + 1) + i) * NSPLIT + ss, mask=sm & (i <= n), other=float("-inf"),
                             cache_modifier=".cg")
                gi = tl.load(ws_gid + (b * (K + 1) + i) * NSPLIT + ss, mask=sm & (i <= n), other=_BIG_ID,
                             cache_modifier=".cg")
                mv = tl.max(gv, axis=0)
                mi = tl.min(tl.where(gv == mv, gi, _BIG_ID), axis=0)
                nan_i = tl.min(gi, axis=0)                    # < 0: the lowest NaN id - _NAN_SHIFT
                mi = tl.where(nan_i < 0, nan_i + _NAN_SHIFT, mi)
                am = tl.where(ii == i, mi, am)
            rej = iv & (x != am.to(tl.int64))
            j = tl.minimum(tl.min(tl.where(rej, ii, K1_PAD), axis=0), n)
            final = tl.max(tl.where(ii == j, am, -1), axis=0)
        else:
            anyw = tl.max(tl.load(ws_any + b * NSPLIT + ss, mask=sm, other=0, cache_modifier=".cg"), axis=0)
            which = tl.where(is_res & (anyw != 1), 1, 0)      # zero (or NaN) residual -> race over p_j
            sc = tl.load(ws_score + (b * NSPLIT + ss) * 2 + which, mask=sm, other=-2.0, cache_modifier=".cg")
            si = tl.load(ws_id + (b * NSPLIT + ss) * 2 + which, mask=sm, other=_BIG_ID, cache_modifier=".cg")
            best = tl.max(sc, axis=0)
            final = tl.min(tl.where(sc == best, si, _BIG_ID), axis=0)
            nan_i = tl.min(si, axis=0)                        # < 0: the lowest NaN weight's id - _NAN_SHIFT
            final = tl.where(nan_i < 0, nan_i + _NAN_SHIFT, final)
        emitted = tl.where(ii < j, x, tl.where(ii == j, final.to(tl.int64), -1))
        tl.store(emit_ptr + b * stride_eb + ii, emitted, mask=ii < K + 1)
        tl.store(accn_ptr + b, j.to(tl.int32))
        tl.store(cnt_ptr + b, 0)


@dataclass
class _Workspace:
    score: torch.Tensor
    ids: torch.Tensor
    anyw: torch.Tensor
    gval: torch.Tensor
    gid: torch.Tensor
    counters: torch.Tensor


_WORKSPACES: dict = {}


def _workspace(device, b: int, k: int, nsplit: int) -> _Workspace:
    key = (str(device), b, k, nsplit)
    ws = _WORKSPACES.get(key)
    if ws is None:
        ws = _Workspace(score=torch.empty(b * nsplit * 2, dtype=torch.float64, device=device),
                        ids=torch.empty(b * nsplit * 2, dtype=torch.int32, device=device),
                        anyw=torch.empty(b * nsplit, dtype=torch.int32, device=device),
                        gval=torch.empty(b * (k + 1) * nsplit, dtype=torch.float32, device=device),
                        gid=torch.empty(b * (k + 1) * nsplit, dtype=torch.int32, device=device),
                        counters=torch.zeros(b, dtype=torch.int32, device=device))
        _WORKSPACES[key] = ws
    return ws




#: programs the split plan aims for (about two per SM of an H200)
TARGET_PROGRAMS = 264


def rejection_sample_into(draft_tokens: torch.Tensor, draft_probs: torch.Tensor | None, target_probs: torch.Tensor,
                          num_drafts: torch.Tensor, seeds: torch.Tensor, offsets: torch.Tensor,
                          emitted: torch.Tensor, accepted: torch.Tensor, *, greedy: bool = False,
                          block_v: int | None = None, nsplit: int | None = None, num_warps: int = 4,
                          use_pdl: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Launch-level entry (no host sync, CUDA-graph capturable); writes emitted [B, k+1] int64 and
    accepted [B] int32. Shapes / dtypes as `rejection_sample`; values are not checked (num_drafts is
    clamped to [0, k] and token ids to [0, V) so nothing is read out of bounds; NaN / inf probabilities
    are given the reference's meaning, see the module docstring).
    Raises StepContractError on shapes, dtypes, strides or devices, UnsupportedConfigError for V > 2^30.
    Mutates emitted, accepted and the cached workspace of this (device, B, k, split)."""
    require_runnable("draft_tokens", draft_tokens); require_runnable("target_probs", target_probs)
    if draft_tokens.dim() != 2 or target_probs.dim() != 3:
        raise StepContractError(f"draft_tokens must be [B, k] and target_probs [B, k+1, V], got "
                                f"{tuple(draft_tokens.shape)}, {tuple(target_probs.shape)}")
    b, k = draft_tokens.shape
    v = target_probs.shape[2]
    dev = target_probs.device
    if tuple(target_probs.shape[:2]) != (b, k + 1) or target_probs.dtype != torch.float32:
        raise StepContractError(f"target_probs must be [B, k+1, V] = [{b}, {k + 1}, V] float32, got "
                                f"{tuple(target_probs.shape)} {target_probs.dtype}")
    if draft_probs is None:
        if not greedy:
            raise StepContractError("draft_probs is required unless greedy")
        draft_probs = target_probs                # never read: a valid pointer of the right dtype
    elif tuple(draft_probs.shape) != (b, k, v) or draft_probs.dtype != torch.float32:
        raise StepContractError(f"draft_probs must be [B, k, V] = [{b}, {k}, {v}] float32, got "
                                f"{tuple(draft_probs.shape)} {draft_probs.dtype}")
    for name, t, dt in (("draft_tokens", draft_tokens, torch.int64), ("num_drafts", num_drafts, torch.int32),
                        ("seeds", seeds, torch.int64), ("offsets", offsets, torch.int64),
                        ("emitted", emitted, torch.int64), ("accepted", accepted, torch.int32)):
        if t.dtype != dt or t.device != dev:
            raise StepContractError(f"{name} must be {dt} on {dev}, got {t.dtype} on {t.device}")
    for name, t, shape in (("num_drafts", num_drafts, (b,)), ("seeds", seeds, (b,)), ("offsets", offsets, (b,)),
                           ("emitted", emitted, (b, k + 1)), ("accepted", accepted, (b,))):
        if tuple(t.shape) != shape:
            raise StepContractError(f"{name} must have shape {list(shape)}, got {list(t.shape)}")
    for name, t in (("draft_tokens", draft_tokens), ("draft_probs", draft_probs), ("target_probs", target_probs),
                    ("emitted", emitted)):
        if t.numel() and t.stride(-1) != 1:
            raise StepContractError(f"{name} must be contiguous in its last dim (strides {t.stride()})")
    for name, t in (("num_drafts", num_drafts), ("seeds", seeds), ("offsets", offsets), ("accepted", accepted)):
        if t.numel() > 1 and t.stride(0) != 1:
            raise StepContractError(f"{name} must be contiguous")
    if v > 1 << 30:
        raise UnsupportedConfigError("vocab_size", v, "the kernel passes token ids as int32 with 2^30 headroom "
                                     "(V <= 2^30)")
    if b == 0:
        return emitted, accepted
    interp = interpreting()
    if block_v is None:
        block_v = min(1024, triton.next_power_of_2(v)) if not interp else min(128, triton.next_power_of_2(v))
    if nsplit is None:
        nsplit = max(1, min(triton.cdiv(v, block_v), triton.cdiv(TARGET_PROGRAMS, b)))
    chunk = triton.cdiv(triton.cdiv(v, nsplit), block_v) * block_v
    nsplit = triton.cdiv(v, chunk)
    ws = _workspace(dev, b, k, nsplit)
    kwargs = {} if interp else {"num_warps": num_warps}
    if use_pdl and not interp:
        kwargs["launch_pdl"] = True
    _rejection_kernel[(b, nsplit)](
        draft_tokens, draft_probs, target_probs, num_drafts, seeds, offsets, emitted, accepted,
        ws.score, ws.ids, ws.anyw, ws.gval, ws.gid, ws.counters,
        v, draft_tokens.stride(0), draft_probs.stride(0), draft_probs.stride(1) if k else 0,
        target_probs.stride(0), target_probs.stride(1), emitted.stride(0),
        nsplit, chunk,
        K=k, K1_PAD=triton.next_power_of_2(k + 1), BLOCK_V=block_v, TILES=chunk // block_v,
        S_PAD=triton.next_power_of_2(nsplit), GREEDY=greedy, USE_PDL=use_pdl and not interp, **kwargs)
    return emitted, accepted


def rejection_sample(draft_tokens: torch.Tensor, draft_probs: torch.Tensor | None, target_probs: torch.Tensor,
                     num_drafts: torch.Tensor, seeds: torch.Tensor | None = None,
                     offsets: torch.Tensor | None = None, *, greedy: bool = False,
                     **launch) -> tuple[torch.Tensor, torch.Tensor]:
    """Speculative sampling in one launch; same contract as the reference
    `lowlat.reference.rejection_sampling.rejection_sample` (which documents every argument):

    draft_tokens [B, k] int64, draft_probs [B, k, V] float32 (None if greedy), target_probs [B, k+1, V]
    float32, num_drafts [B] int32, seeds / offsets [B] int64 -> (emitted [B, k+1] int64, accepted [B] int32).

    Checks shapes, dtypes, num_drafts and the real draft tokens first (one host sync) and raises
    StepContractError naming the offending one; nothing is launched then. The probabilities' values are
    not checked: NaN / inf entries get the reference's meaning (a NaN p(x) or q(x) rejects x; a NaN in the
    residual draws from p_j; the first NaN wins a race or argmax, as torch.argmax), so the emitted tokens
    equal the reference's for entries >= 0, +inf or NaN. `launch`: block_v, nsplit, num_warps, use_pdl.
    """
    from lowlat.reference.rejection_sampling import _check_inputs

    _check_inputs(draft_tokens, draft_probs, target_probs, num_drafts, seeds, offsets, greedy)
    b, k = draft_tokens.shape
    dev = target_probs.device
    if greedy:
        seeds = torch.zeros(b, dtype=torch.int64, device=dev) if seeds is None else seeds
        offsets = torch.zeros(b, dtype=torch.int64, device=dev) if offsets is None else offsets
    emitted = torch.empty(b, k + 1, dtype=torch.int64, device=dev)
    accepted = torch.empty(b, dtype=torch.int32, device=dev)
    return rejection_sample_into(draft_tokens.contiguous(), None if draft_probs is None else draft_probs.contiguous(),
                                 target_probs.contiguous(), num_drafts.to(torch.int32).contiguous(), seeds, offsets,
                                 emitted, accepted, greedy=greedy, **launch)
