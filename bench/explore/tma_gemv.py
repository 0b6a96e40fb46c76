"""Experiment (sessions 3-4): the two GEMVs under their bandwidth targets with the weight stream loaded by TMA
(tensor descriptors) instead of cp.async, with switches that take parts of the kernel out (EPI, FIN) or
change the weight layout (PACKED); session 4 added the greedy tails EPI 6 (stores only) and EPI 7 (no
fence). Not used by lowlat; timed by bench/explore/explore5*.py and explore8.py against the production
kernels in the same run (see bench/explore/README.md).

* `tma_residual`: out = res + a W^T for M <= 16 rows, split-K with the production finisher's partials
  (`_gemv.store_partial` / `sum_partials`, arrival counter) but its session-3 counter reset (an acq_rel
  exchange before the output store, one round trip more than the production kernel's plain store after
  it; the explore5* timings were taken with it), the Llama-3.2-1B down projection's shape.
* `tma_greedy`: logits = h W^T for R <= 16 rows + greedy argmax (the draft sampler's greedy epilogue:
  int64 keys, atomic_max per row, arrival counter, last program writes the tokens).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
from triton.tools.tensor_descriptor import TensorDescriptor

from lowlat.kernels._gemv import argmax_key, key_id, store_partial, sum_partials
from lowlat.kernels._gemv import interpreting as _interp
from lowlat.kernels.draft_sampling import _KEY_MIN


@triton.jit
def _tma_residual_kernel(a_ptr, stride_am, w_desc, res_ptr, stride_rm, out_ptr, stride_om, ws_ptr, cnt_ptr,
                         M, N, K, SPLIT: tl.constexpr, CPS: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                         USE_PDL: tl.constexpr, UPCAST: tl.constexpr, FIN: tl.constexpr = 1,
                         PACKED: tl.constexpr = False):
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    n0 = pid_n * BN
    k_begin = pid_k * (CPS * BK)
    if USE_PDL:
        gdc_wait()
        gdc_launch_dependents()
    rm = tl.arange(0, 16)
    rn = n0 + tl.arange(0, BN)
    res = tl.load(res_ptr + rm[None, :] * stride_rm + rn[:, None], mask=(rm < M)[None, :], other=0.0)
    acc = tl.zeros((BN, 16), dtype=tl.float32)
    for c in range(CPS):
        k0 = k_begin + c * BK
        if PACKED:        # tile-contiguous layout [n_tiles, K / BK, BN, BK]
            w = w_desc.load([(pid_n * (K // BK) + k0 // BK) * BN, 0])
        else:
            w = w_desc.load([n0, k0])
        rk = k0 + tl.arange(0, BK)
        xt = tl.load(a_ptr + rm[None, :] * stride_am + rk[:, None], mask=(rm < M)[None, :], other=0.0)
        if UPCAST:
            acc = tl.dot(w.to(tl.float32), xt.to(tl.float32), acc, input_precision="ieee")
        else:
            acc = tl.dot(w, xt, acc)
    finished = True
    if SPLIT > 1:
        store_partial(ws_ptr, acc, pid_k, N, 16, n0, 0, BN, True)
        if FIN == 0:
            return
        tl.debug_barrier()
        arrived = tl.atomic_add(cnt_ptr + pid_n, 1, sem="acq_rel", scope="gpu")
        finished = arrived == SPLIT - 1
        if finished:
            acc = sum_partials(ws_ptr, 0, N, 16, n0, 0, BN, SPLIT, 1, True)
            tl.atomic_xchg(cnt_ptr + pid_n, 0)
    if finished:
        y = acc + res.to(tl.float32)
        tl.store(out_ptr + rm[None, :] * stride_om + rn[:, None], y.to(tl.bfloat16), mask=(rm < M)[None, :])


class TmaResidual:
    """Launcher with preallocated workspace; split s covers K / split columns in chunks of bk."""

    def __init__(self, n: int, k: int, *, bn: int = 64, bk: int = 128, split: int = 8, warps: int = 4,
                 stages: int = 4, device="cuda"):
        assert n % bn == 0 and k % (bk * split) == 0
        self.n, self.k, self.bn, self.bk, self.split, self.warps, self.stages = n, k, bn, bk, split, warps, stages
        self.cps = k // (bk * split)
        self.ws = torch.empty(split * n * 16, dtype=torch.float32, device=device)
        self.cnt = torch.zeros(n // bn, dtype=torch.int32, device=device)
        self.descs = {}

    def __call__(self, a, w, res, out, use_pdl=True, fin=1, packed=False):
        key = (w.data_ptr(), packed)
        if key not in self.descs:     # packed: w is `pack_tiles(W, bn, bk)`, [n_tiles * K / bk * bn, bk]
            self.descs[key] = TensorDescriptor(w, list(w.shape), list(w.stride()), [self.bn, self.bk])
        m = a.shape[0]
        _tma_residual_kernel[(self.n // self.bn, self.split)](
            a, a.stride(0), self.descs[key], res, res.stride(0), out, out.stride(0), self.ws, self.cnt,
            m, self.n, self.k, SPLIT=self.split, CPS=self.cps, BN=self.bn, BK=self.bk, USE_PDL=use_pdl,
            UPCAST=_interp(), FIN=fin, PACKED=packed,
            num_warps=self.warps, num_stages=self.stages, launch_pdl=use_pdl)
        return out


@triton.jit
def _greedy_prologue(R, USE_PDL: tl.constexpr):
    """(program id, the 16 row slots, rows < R); under PDL after the wait (nothing is loaded before it)."""
    if USE_PDL:
        gdc_wait()
        gdc_launch_dependents()
    rows = tl.arange(0, 16)
    return tl.program_id(0), rows, rows < R


@triton.jit
def _tma_greedy_kernel(h_ptr, stride_h, w_desc, x_ptr, stride_x, tok_ptr, gkeys_ptr, cnt_ptr, R, V, NUM_PROGS,
                       HIDDEN: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_H: tl.constexpr, USE_PDL: tl.constexpr,
                       UPCAST: tl.constexpr, EPI: tl.constexpr = 1, G: tl.constexpr = 16,
                       PACKED: tl.constexpr = False):
    pid, rows, rmask = _greedy_prologue(R, USE_PDL)
    v0 = pid * BLOCK_V
    cols = v0 + tl.arange(0, BLOCK_V)
    acc = tl.zeros([BLOCK_V, 16], dtype=tl.float32)
    for h0 in range(0, HIDDEN, BLOCK_H):
        if PACKED:        # tile-contiguous layout [V / BLOCK_V, HIDDEN / BLOCK_H, BLOCK_V, BLOCK_H]
            w = w_desc.load([(pid * (HIDDEN // BLOCK_H) + h0 // BLOCK_H) * BLOCK_V, 0])
        else:
            w = w_desc.load([v0, h0])
        hk = h0 + tl.arange(0, BLOCK_H)
        ht = tl.load(h_ptr + rows[None, :] * stride_h + hk[:, None], mask=rmask[None, :], other=0.0)
        if UPCAST:
            acc = tl.dot(w.to(tl.float32), ht.to(tl.float32), acc, input_precision="ieee")
        else:
            acc = tl.dot(w, ht, acc)
    if EPI == 0:
        tl.store(x_ptr + pid, tl.sum(tl.sum(acc, axis=1), axis=0))
        return
    if EPI == 6:          # the stores a correct tail needs (logits, one key per program), no cross-program step
        tl.store(x_ptr + rows[None, :] * stride_x + cols[:, None], acc, mask=rmask[None, :])
        tl.store(gkeys_ptr + G * 16 + rows * NUM_PROGS + pid, tl.max(argmax_key(acc, cols[:, None]), axis=0),
                 mask=rmask)
        return
    if EPI >= 3:
        _greedy_tail(acc, cols, rows, rmask, pid, x_ptr, stride_x, tok_ptr, gkeys_ptr, cnt_ptr, NUM_PROGS, EPI, G)
        return
    tl.store(x_ptr + rows[None, :] * stride_x + cols[:, None], acc, mask=rmask[None, :])
    key = argmax_key(acc, cols[:, None])
    if EPI == 2:
        tl.atomic_max(gkeys_ptr + rows, tl.max(key, axis=0), mask=rmask)
        return
    _acq_rel_argmax_tail(tl.max(key, axis=0), rows, rmask, tok_ptr, gkeys_ptr, cnt_ptr, NUM_PROGS)


@triton.jit
def _acq_rel_argmax_tail(best, rows, rmask, tok_ptr, gkeys_ptr, cnt_ptr, NUM_PROGS):
    """The production tail before session 3: acq_rel atomic_max of the program's best keys, acq_rel arrival,
    the last program swaps the slots back to empty and writes the tokens."""
    tl.atomic_max(gkeys_ptr + rows, best, mask=rmask)
    tl.debug_barrier()
    old = tl.atomic_add(cnt_ptr, 1, sem="acq_rel")
    if old == NUM_PROGS - 1:
        b = tl.atomic_xchg(gkeys_ptr + rows, tl.full([16], _KEY_MIN, tl.int64), mask=rmask)
        tl.store(tok_ptr + rows, key_id(b).to(tl.int64), mask=rmask)
        tl.store(cnt_ptr, 0)


@triton.jit
def _greedy_tail(acc, cols, rows, rmask, pid, x_ptr, stride_x, tok_ptr, gkeys_ptr, cnt_ptr, NUM_PROGS,
                 EPI: tl.constexpr, G: tl.constexpr):
    """EPI 3: relaxed atomic_max into one slot per row, one counter, logits stored after the arrival. EPI 7:
    EPI 3 with no fence (see there). EPI 8: EPI 3 without the logits stores.
    EPI 4: the same spread over G slot copies and G group counters (pid % G) + a root counter: same-address
    atomics queue G-fold shorter. EPI 5: per-program keys (plain stores, [16, NUM_PROGS] at gkeys + 16),
    group + root counters, the last program reduces all keys."""
    key = tl.max(argmax_key(acc, cols[:, None]), axis=0)
    if EPI == 7:
        # EPI 3 without fences: the arrival is issued only once this program's atomic_max has returned (a data
        # dependency through inline asm that ptxas cannot fold), so it is performed at L2 after the max; the
        # last program's exchange follows its arrival's return. Relies on atomics being performed at L2 (the
        # point of coherence) when they return; the PTX memory model does not promise it (timing study only).
        prev = tl.atomic_max(gkeys_ptr + rows, key, mask=rmask, sem="relaxed")
        dep = tl.max(tl.where(rmask, prev, 0), axis=0)
        inc = tl.inline_asm_elementwise(
            "{ .reg .pred p; setp.eq.s64 p, $1, 0x7ffffffffffffff0; selp.b32 $0, 2, 1, p; }",
            "=r,l", [dep], dtype=tl.int32, is_pure=True, pack=1)
        old = tl.atomic_add(cnt_ptr, inc, sem="relaxed")
        tl.store(x_ptr + rows[None, :] * stride_x + cols[:, None], acc, mask=rmask[None, :])
        if old == NUM_PROGS - 1:
            best = tl.atomic_xchg(gkeys_ptr + rows, tl.full([16], _KEY_MIN, tl.int64), mask=rmask, sem="relaxed")
            tl.store(tok_ptr + rows, key_id(best).to(tl.int64), mask=rmask)
            tl.store(cnt_ptr, 0)
    elif EPI == 3 or EPI == 8:
        tl.atomic_max(gkeys_ptr + rows, key, mask=rmask, sem="relaxed")
        tl.debug_barrier()
        old = tl.atomic_add(cnt_ptr, 1, sem="acq_rel")
        if EPI == 3:      # EPI 8: no logits stored (a greedy draft's q is one-hot; session 6)
            tl.store(x_ptr + rows[None, :] * stride_x + cols[:, None], acc, mask=rmask[None, :])
        if old == NUM_PROGS - 1:
            best = tl.atomic_xchg(gkeys_ptr + rows, tl.full([16], _KEY_MIN, tl.int64), mask=rmask, sem="relaxed")
            tl.store(tok_ptr + rows, key_id(best).to(tl.int64), mask=rmask)
            tl.store(cnt_ptr, 0)
    else:
        grp = pid % G
        n_in = (NUM_PROGS - grp + G - 1) // G
        if EPI == 4:
            tl.atomic_max(gkeys_ptr + grp * 16 + rows, key, mask=rmask, sem="relaxed")
        else:
            tl.store(gkeys_ptr + G * 16 + rows * NUM_PROGS + pid, key, mask=rmask)
        tl.debug_barrier()
        old = tl.atomic_add(cnt_ptr + 1 + grp, 1, sem="acq_rel")
        tl.store(x_ptr + rows[None, :] * stride_x + cols[:, None], acc, mask=rmask[None, :])
        if old == n_in - 1:
            tl.store(cnt_ptr + 1 + grp, 0)
            root = tl.atomic_add(cnt_ptr, 1, sem="acq_rel")
            if root == tl.minimum(NUM_PROGS, G) - 1:
                if EPI == 4:
                    gg = tl.arange(0, G)
                    allk = tl.atomic_xchg(gkeys_ptr + gg[:, None] * 16 + rows[None, :],
                                          tl.full([G, 16], _KEY_MIN, tl.int64), mask=rmask[None, :], sem="relaxed")
                    best = tl.max(allk, axis=0)
                else:
                    pp = tl.arange(0, 512)
                    allk = tl.load(gkeys_ptr + G * 16 + rows[None, :] * NUM_PROGS + pp[:, None],
                                   mask=rmask[None, :] & (pp < NUM_PROGS)[:, None], other=_KEY_MIN,
                                   cache_modifier=".cg")
                    best = tl.max(allk, axis=0)
                tl.store(tok_ptr + rows, key_id(best).to(tl.int64), mask=rmask)
                tl.store(cnt_ptr, 0)


class TmaGreedy:
    def __init__(self, v: int, hd: int, *, block_v: int = 128, block_h: int = 64, warps: int = 4, stages: int = 4,
                 device="cuda"):
        assert v % block_v == 0 and hd % block_h == 0
        self.v, self.hd, self.bv, self.bh, self.warps, self.stages = v, hd, block_v, block_h, warps, stages
        self.gkeys = torch.full((16 * 16 + 16 * 512,), torch.iinfo(torch.int64).min, dtype=torch.int64,
                                device=device)
        self.cnt = torch.zeros(1 + 16, dtype=torch.int32, device=device)
        self.descs = {}

    def __call__(self, h, w, x_out, tok_out, use_pdl=False, epi=1, packed=False):
        key = (w.data_ptr(), packed)
        if key not in self.descs:
            self.descs[key] = TensorDescriptor(w, list(w.shape), list(w.stride()), [self.bv, self.bh])
        np_ = self.v // self.bv
        _tma_greedy_kernel[(np_,)](h, h.stride(0), self.descs[key], x_out, x_out.stride(0), tok_out, self.gkeys,
                                   self.cnt, h.shape[0], self.v, np_, HIDDEN=self.hd, BLOCK_V=self.bv,
                                   BLOCK_H=self.bh, USE_PDL=use_pdl, UPCAST=_interp(), EPI=epi, PACKED=packed,
                                   num_warps=self.warps, num_stages=self.stages,
                                   launch_pdl=use_pdl)
        return tok_out


@triton.jit
def _rowgroup_greedy_kernel(h_ptr, stride_h, w_ptr, stride_w, x_ptr, stride_x, tok_ptr, gkeys_ptr, cnt_ptr, R, V,
                            NUM_PROGS, BLOCK_V: tl.constexpr, RG: tl.constexpr, BH: tl.constexpr, NCH: tl.constexpr,
                            NS: tl.constexpr, USE_PDL: tl.constexpr, UPCAST: tl.constexpr):
    """Greedy logits + argmax with the weight read in row groups: each loop step loads RG whole rows of W
    (RG x NCH*BH contiguous elements, as NCH [RG, BH] tiles), so the loads in flight cover contiguous memory."""
    pid, rows, rmask = _greedy_prologue(R, USE_PDL)
    hts = ()
    for c in tl.static_range(NCH):
        hk = c * BH + tl.arange(0, BH)
        ht = tl.load(h_ptr + rows[None, :] * stride_h + hk[:, None], mask=rmask[None, :], other=0.0)
        if UPCAST:
            ht = ht.to(tl.float32)
        hts = hts + (ht,)
    best = tl.full([16], _KEY_MIN, tl.int64)
    for g in tl.range(0, BLOCK_V // RG, num_stages=NS):
        vr = pid * BLOCK_V + g * RG + tl.arange(0, RG)
        acc = tl.zeros([RG, 16], dtype=tl.float32)
        for c in tl.static_range(NCH):
            hk = c * BH + tl.arange(0, BH)
            w = tl.load(w_ptr + vr[:, None] * stride_w + hk[None, :])
            if UPCAST:
                acc = tl.dot(w.to(tl.float32), hts[c], acc, input_precision="ieee")
            else:
                acc = tl.dot(w, hts[c], acc)
        tl.store(x_ptr + rows[None, :] * stride_x + vr[:, None], acc, mask=rmask[None, :])
        best = tl.maximum(best, tl.max(argmax_key(acc, vr[:, None]), axis=0))
    _acq_rel_argmax_tail(best, rows, rmask, tok_ptr, gkeys_ptr, cnt_ptr, NUM_PROGS)


class RowGroupGreedy(TmaGreedy):
    def __init__(self, v, hd, *, block_v=128, rg=16, bh=64, warps=4, stages=3, device="cuda"):
        super().__init__(v, hd, block_v=block_v, block_h=bh, warps=warps, stages=stages, device=device)
        self.rg = rg

    def __call__(self, h, w, x_out, tok_out, use_pdl=False, epi=1):
        np_ = self.v // self.bv
        _rowgroup_greedy_kernel[(np_,)](h, h.stride(0), w, w.stride(0), x_out, x_out.stride(0), tok_out, self.gkeys,
                                        self.cnt, h.shape[0], self.v, np_, BLOCK_V=self.bv, RG=self.rg, BH=self.bh,
                                        NCH=self.hd // self.bh, NS=self.stages, USE_PDL=use_pdl, UPCAST=_interp(),
                                        num_warps=self.warps, launch_pdl=use_pdl)
        return tok_out


def pack_tiles(w: torch.Tensor, bn: int, bk: int) -> torch.Tensor:
    """W [N, K] -> [N / bn * K / bk * bn, bk]: tile (i, j) = W[i*bn:(i+1)*bn, j*bk:(j+1)*bk] stored contiguously,
    tiles in (i, j) order (a program's tiles along K are adjacent)."""
    n, k = w.shape
    return w.view(n // bn, bn, k // bk, bk).permute(0, 2, 1, 3).contiguous().view(-1, bk)
