"""Single-launch draft sampling (Triton): LM-head GEMV + temperature + top-k/top-p + counter-based sample.

Matches `lowlat.reference.draft_sampling.draft_sample` (tokens, and q through `DraftSample.probs()`).

One launch per draft position, grid (P = cdiv(V, BLOCK_V) vocabulary tiles, cdiv(R, 16) row blocks).
Every program computes its logits tile for 16 rows in the loop form of the LM head's GEMV ("swap AB": the
weight tile [BLOCK_V, BLOCK_H] is the wgmma m64 operand, h^T [BLOCK_H, 16] the n16 operand, rows padded
to 16; fp32 accumulation; a software-pipelined loop over H, `num_stages` deep; default tile 128 x 64, 4
warps, 4 stages, as `_gemv.TUNED_PLANS[('lm_head', 49152, 576)]`). What follows depends on the launch:

* greedy launch (no row samples: k_cap 0, need_noise False): its own kernel, `_greedy_tma_kernel`, the
  same GEMV with the weight tiles loaded by TMA (a host tensor descriptor) and NO logits stored: a greedy
  draft's q is one-hot at the token, so the launch writes tokens, lse = cut value = the largest logit, cut
  id = the token, and marks the output `one_hot` (`DraftSample.probs()` / `kept()` then read the tokens).
  Since session 9 it is PERSISTENT: one program per SM (`default_greedy_programs`) takes vocabulary tiles
  pid, pid + P, ... in one flattened loop over (tile, H step) pipelined GREEDY_STAGES (6) deep, folds each
  tile's keys into an elementwise running max in registers (one reduction across the tile, after the loop:
  session9/call5, up to 0.3 us faster than one per tile) and arrives once. Each row's best is one int64 key,
  (order-preserving int32 image of the value) << 32 | (2^32-1-id),
  whose max is the largest logit with the lowest id; a relaxed `atomic_max` into a per-row slot
  (order-free; the arrival counter's acq_rel release publishes it); the last program to arrive swaps
  the slots back to empty (relaxed exchange: the arrival's acquire orders it) and writes the tokens.
  Why persistent: the arrival is what the per-tile launch (384 programs, one tile each) paid for. In the
  same runs (bench/results/session9/call1-2, `bench/explore/explore19.py`, rows 1-8, two rounds each) the
  per-tile stream alone took 16.8-17.6 us and the launch with its 384 arrivals 18.5-19.7 us (median tail
  1.8-2.0 us); the persistent stream 17.2-18.0 us and the launch with 132 arrivals 17.9-19.0 us (median
  tail 0.8-1.0 us): 0.2-1.3 us (median 0.6) faster than the per-tile launch in every cell of both calls,
  2.01-2.12x the torch ops against 1.92-2.08x. Two programs per SM (64-row tiles, 264 programs)
  measured the same; 8 warps, 256-row tiles or 5 / 7 / 8 stages slower; 264 programs of 128-row tiles
  (unbalanced: up to 4 tiles on an SM) 20.7-21.0 us. Session 10 (`bench/explore/explore20.py`, session10/call1-2),
  no better under PDL: an L2 prefetch of the program's first tile before `gdc_wait` (its first 512 columns:
  +1.5 us back to back; the whole-tile variants, 26-30 us, hit the masked-lane hot spot `_gemv.prefetch_l2`
  had then and are not a measurement of the prefetch), the next launch triggered after the stream instead of at
  the start (+1.5 us back to back; equal after a norm), 128 programs or each program's tiles contiguous
  (within the spread). History of the per-tile launch (sessions 3-8, files
  under bench/results/): 16.8 us with no cross-program reduction, 18.6-20.3 with an arrival behind the
  logits stores, 18.1-19.4 us (1.97-2.08x the torch ops) once TMA-loaded without logits (session 6); tried and
  no better there: per-program key slots polled by a last program, the max / counter spread over 16 groups,
  an arrival without the fence, logits stored from the accumulator layout, block_v 64 / 256, block_h 32 /
  128, 2-6 stages, 8 warps, and a persistent launch of 128 programs x 3 stages with logits (session 4,
  19.1-20.4 us). The cp.async greedy branch of `_draft_sample_kernel` still serves LM heads TMA cannot take
  (`tma_greedy_ok`: fp32, unaligned rows, pre-Hopper GPUs): one tile per program, the same arrival
  (`_greedy_arrive` / `_greedy_finish`), and the logits tile stored as is (T = 1) after the arrival, so
  neither the release nor the exchange waits for it (as `kernels/lm_head.py`).
* general launch. The NR = min(16, next_pow2(R)) rows that exist are taken out of the accumulator once
  ([NR, BLOCK_V], bits moved, not recomputed) and everything after is vectorised over rows, with no
  per-row loop: x = acc / T (IEEE division) is stored; per row the tile max m_p, the tile sum-exp s_p,
  the tile's best Gumbel score x_t - log(E_t) with its id (E from Philox keyed by (seed, offset, token
  id), `lowlat.kernels.philox`; computed only when some row samples without top-k (NEED_NOISE); the
  plain argmax for the other rows), and with top-k on (K_CAP > 0) the tile's top-K_CAP keys (same key
  as above, `tl.topk` along the vocabulary axis of [NR, BLOCK_V]). The key lists are merged up a tree
  of fan-in FANIN (the last program to arrive at a node loads its children's sorted lists [RC, FANIN,
  K_CAP] at a time and merges them with a tree of bitonic merges, Batcher 1968; FANIN 8, fewer when
  RC * 8 * K_CAP would exceed 4096 keys: V = 49152 takes 384 -> 48 -> 6 -> 1, three levels); the last program
  at the root (or, without top-k, the last at the row block's counter) does the final reduction for
  all NR rows at once: global max and sum-exp over the P tiles, the Gumbel argmax (ties to the lowest token id), and
  for top-k rows the root list -> top-k -> top-p (mass before < top_p, as `filtered_probs`) -> Gumbel
  argmax over the kept tokens. Every counter is reset by the program that read it last (a merge node's
  by its finishing child, the row block's by the final program), so the workspace needs no clearing
  between launches (CUDA-graph friendly).

With top-k, the per-tile top-k and every merge node work on RC rows at a time in a loop
(`default_row_chunk`: 4 at K_CAP 64), not on all NR rows unrolled: at 8 rows that halved the launch.

Where the runtime runs it (session 10, bench/results/session10/call3/draft_sampling.json, `python
bench/bench_draft_sampling.py --rows 1 2 4 6 8`): inside `FusedModel.draft_position`'s graph, launched with
PDL right after the final RMSNorm kernel, its span from the norm's end to its own (CUPTI end times, the torch
ops measured in the same place): greedy 16.5-16.7 us against 36.5-37.9 (2.20-2.27x), temperature 19.2-29.3
against 89-105 (3.6-4.7x), top-k 50 + top-p 0.9 31.7-57.4 against 133-144 (2.5-4.2x). Launched back to back
on its own in the same run: greedy 19.0-21.9 us (1.96-2.24x the torch ops' 40.4-43.3).
Measured on an H200 (bench/results/session9/call3/draft_sampling_{1,2}.json, V 49152, H 576, CUDA graphs,
rows 1-8, `python bench/bench_draft_sampling.py --rows 1 2 4 6 8 [--no-pdl]`, two runs): greedy (persistent,
TMA, no logits) 18.1-19.4 us (1.96-2.08x the torch ops; 17.7-18.8 us = 2.06-2.12x launched with PDL; with
the running max of keys, session9/call5: 18.0-19.6 us = 1.96-2.09x),
temperature 21.2-32.5 us (3.3-4.5x), top-k 50 + top-p 0.9 33.8-59.4 us (2.3-3.9x). Session 6
(session6/call3): the per-tile greedy launch 18.6-19.3 us (1.98-2.04x). Session 4 (session4/draft_sampling_h200.json): the cp.async greedy launch with logits 19.0-20.6 us
(1.88-1.95x; 18.8-20.0 us with PDL); session 3 (acq_rel slot exchange) 19.2-20.7 us.

Occupancy: a program's 4-stage pipeline takes 72 KB of shared memory and the launch caps registers at
168 (`default_maxnreg`), so three programs fit on an SM and V = 49152 (384 tiles) runs in one wave on
the H200's 132 SMs; the epilogue works on the NR rows that exist (not 16), so its cost grows with the
rows that are really there, and nothing in it loops over rows.

Determinism without a fixed reduction order: max / argmax (ties to the lowest id) and the top-k of
unique keys are exact whatever the order or grouping; the sums are fixed point: each term (a tile's
exp(x - m_p) <= 1, a tile's s_p * exp(m_p - M) <= BLOCK_V, a top-k prob <= 1) is scaled by a power of
two and truncated to int64 (2^-52, 2^-(62 - log2(P * BLOCK_V)) and 2^-56 resolution, no overflow by
construction) and added as integers, which is associative. So every output of a row is bitwise the
same whatever the row count, the other rows, NR, the fan-in, and the arrival order (and on every TP
rank holding the whole vocabulary); it depends on BLOCK_V only through the tile partition of s_p. The
top-p test compares fixed-point mass before (cumsum of truncated probs) with the fixed-point top_p.

q is not materialised inside the launch (a dense [R, V] write by one program would cost more than the
GEMV): the kernel stores the scaled logits x [R, V] plus three per-row numbers, lse (log-sum-exp over
the kept tokens) and the cut (value, id) of the last kept token, and

    q_t = exp(x_t - lse)  if  x_t > cut_value  or  (x_t == cut_value and t <= cut_id),  else 0.

`DraftSample.probs()` evaluates that (one launch, `_dense_q_kernel`, e.g. once per verify for all k positions).

Supported range (checked by `draft_sample`, which raises UnsupportedConfigError naming the value):
temperature >= 0 (0 = greedy); top_k in [0, 64] or >= V (0 and >= V mean off); top_p in (0, 1], and
top_p < 1 needs 1 <= top_k <= 64 (the nucleus is taken within the top-k candidates; a full-vocabulary
nucleus would need a sort of V entries). The launch-level `draft_sample_into` does no value checks
(it is capturable in a CUDA graph); a row outside the range (or outside what the launch was compiled
for: top_k > k_cap, sampling without top-k when need_noise is False) gets token -1, never a silent
wrong token; only the token of such a row is meaningful.

Non-finite rows follow the reference (never a finite, plausible q): when a row's x holds a NaN (a NaN
in h or the LM head) or its largest x is +-inf (e.g. x = logits / T overflowing for a denormal T), the
reference's softmax is NaN. A greedy row then takes torch.argmax's token (the lowest NaN id, else the
lowest id of the largest logit) with q one-hot at it; a sampled row (any top-k / top-p) takes token 0
with q NaN everywhere. Tiles pass their lowest NaN id to the final as id - 2^30 (< 0) in the argmax id
partial, the greedy launches rank NaN above +inf in their keys (`_nan_first_key`), and the row's
cut_value is NaN, which `DraftSample.probs` reads. Finite rows' outputs are unchanged, bit for bit.

Tokens equal the reference's for the same counters whenever the logits agree bitwise (the tests use
inputs whose GEMV is exact in fp32 to check that); on general inputs the GEMV's fp32 summation order
differs from torch's, so a token can differ only where two Gumbel scores (or a top-p boundary) are
within fp32 rounding of each other (~1e-6 per draw).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice
from triton.tools.tensor_descriptor import TensorDescriptor

from lowlat.errors import StepContractError, UnsupportedConfigError
from lowlat.kernels._attn_common import cuda_props, refuse_overlaps, require_runnable
from lowlat.kernels._gemv import (argmax_key, check_rows_apart, check_tensor, interpreting, key_id, key_value,
                                  mma)
from lowlat.kernels.philox import philox_exponential

#: most top-k candidates the kernel merges (top_k above this is refused)
MAX_TOP_K = 64
BLOCK_R = 16
#: keys a merge node holds in registers at most (RC * FANIN * K_CAP; fan-in 8 unless that exceeds it)
NODE_KEYS = 4096
#: per-row tile partials the final program loads per chunk, over its NR rows (NR * chunk)
FINAL_CHUNK = 1024
_KEY_EMPTY = tl.constexpr(-9_220_000_000_000_000_000)   # below every real key, including -inf's
_KEY_MIN = tl.constexpr(-9_223_372_036_854_775_807)     # INT64_MIN + 1: below every key (greedy slots)
_FIX_TILE = tl.constexpr(4503599627370496.0)            # 2^52: tile sum-exp terms exp(x - m_p) <= 1
_FIX_TILE_INV = tl.constexpr(2.220446049250313e-16)     # 2^-52
_FIX_TOPK = tl.constexpr(72057594037927936.0)           # 2^56: top-k probs <= 1, at most 64 of them
_FIX_TOPK_INV = tl.constexpr(1.3877787807814457e-17)    # 2^-56
_LOWEST = tl.constexpr(-3.4028234663852886e38)          # lowest finite float32: cut that keeps every token
_NAN_SHIFT = tl.constexpr(1 << 30)                      # a tile's NaN id goes to the final as id - 2^30 (< 0)
_KEY_NAN_HI = tl.constexpr(0x7FFFFFFF << 32)            # `_nan_first_key`'s value image of every NaN


@triton.jit
def _merge_sorted_lists(x, NR: tl.constexpr, G: tl.constexpr, K: tl.constexpr, LOG_G: tl.constexpr):
    """x [NR, G, K]: per row, G lists each sorted descending -> the K largest of all, sorted descending [NR, K].

    A tree of bitonic merges (Batcher 1968): max(A, reversed B) of two descending lists holds the K
    largest of their union as a bitonic sequence, which a log2(K)-stage bitonic merge sorts; log2(G)
    levels, all rows at once. Exact: keys are unique, so the result does not depend on the grouping."""
    for level in tl.static_range(LOG_G):
        y = tl.permute(tl.reshape(x, [NR, G >> (level + 1), 2, K]), (0, 1, 3, 2))
        a, b = tl.split(y)
        x = tl.bitonic_merge(tl.maximum(a, tl.flip(b, 2)), 2, True)
    return tl.reshape(x, [NR, K])


@triton.jit
def _exclusive_prefix_sum(x, NR: tl.constexpr, K: tl.constexpr, LOG_K: tl.constexpr):
    """x [NR, K] int64 -> sum of x[:, i] over i < j, [NR, K] (exact; K a power of two).

    For each set bit l of j, add the total of the aligned block of 2^l elements just below j's block at
    that level; computed with reshapes and sums on the index hypercube (`tl.cumsum` on the merged lists'
    layout fails to lower in Triton 3.6 for short rows)."""
    out = tl.zeros([NR, K], dtype=tl.int64)
    for lvl in tl.static_range(LOG_K):
        y = tl.reshape(x, [NR, K >> (lvl + 1), 2, 1 << lvl])
        half = tl.arange(0, 2)[None, None, :, None]
        lower = tl.sum(tl.sum(tl.where(half == 0, y, 0), axis=3, keep_dims=True), axis=2, keep_dims=True)
        add = tl.broadcast_to(tl.where(half == 1, lower, 0), [NR, K >> (lvl + 1), 2, 1 << lvl])
        out += tl.reshape(add, [NR, K])
    return out


@triton.jit
def _rows_of(acc, NR: tl.constexpr, BLOCK_V: tl.constexpr, LOG_SPLIT: tl.constexpr):
    """acc [BLOCK_V, 16] -> its first NR = 16 >> LOG_SPLIT columns, transposed: [NR, BLOCK_V] (bits moved).

    Halving with `tl.split` (the dropped half is a register dimension), not a masked reduction: a
    reduction's result keeps the reduced dimension's threads and would replicate every later op
    (the Gumbel noise) 16 / NR times."""
    x = acc
    for i in tl.static_range(LOG_SPLIT):
        x, _hi = tl.split(tl.permute(tl.reshape(x, [BLOCK_V, 2, 8 >> i]), (0, 2, 1)))
    return tl.trans(x)


@triton.jit
def _tile_dot(w, ht, acc, UPCAST: tl.constexpr):
    """acc + W_tile @ h^T (`_gemv.mma`): bf16 x bf16 products are exact in fp32, fp32 accumulation; UPCAST (the
    interpreter, which computes bf16 dots wrongly) takes both operands to fp32 first."""
    if UPCAST:
        return mma(w.to(tl.float32), ht.to(tl.float32), acc, UPCAST)
    return mma(w, ht, acc, UPCAST)


@triton.jit
def _program_rows(R, cnt_ptr, CNT_ROW, USE_PDL: tl.constexpr):
    """(pid, rb, rows [16], rmask, cnt) of a draft-sampling program: pid = program_id(0) (the general launch's
    vocabulary tile; the persistent greedy launch's first tile), row block rb = program_id(1), its rows
    (valid below R) and its arrival counter; under USE_PDL, after the wait
    for the previous kernel (whose output h is read next) and the early launch of the next one."""
    pid = tl.program_id(0)
    rb = tl.program_id(1)
    if USE_PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    rows = rb * 16 + tl.arange(0, 16)
    return pid, rb, rows, rows < R, cnt_ptr + rb * CNT_ROW


@triton.jit
def _draft_sample_kernel(
        h_ptr, w_ptr, temp_ptr, topk_ptr, topp_ptr, seed_ptr, off_ptr,
        tok_ptr, x_ptr, lse_ptr, cutv_ptr, cuti_ptr,
        ws_m, ws_s, ws_bs, ws_bi, ws_keys, ws_gkeys, cnt_ptr,
        R, V, stride_h, stride_w, stride_x, NUM_PROGS, KEY_ROW, CNT_ROW,
        HIDDEN: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_H: tl.constexpr, EVEN_V: tl.constexpr,
        EVEN_H: tl.constexpr, NR: tl.constexpr, LOG_SPLIT: tl.constexpr, GREEDY: tl.constexpr,
        NEED_NOISE: tl.constexpr,
        K_CAP: tl.constexpr, LOG_K: tl.constexpr, FANIN: tl.constexpr, LOG_FANIN: tl.constexpr, NLEV: tl.constexpr,
        PCH: tl.constexpr, NCH: tl.constexpr, FIX_SUM: tl.constexpr, FIX_SUM_INV: tl.constexpr,
        RC: tl.constexpr, UPCAST: tl.constexpr, USE_PDL: tl.constexpr):
    pid, rb, rows, rmask, cnt = _program_rows(R, cnt_ptr, CNT_ROW, USE_PDL)
    cols = pid * BLOCK_V + tl.arange(0, BLOCK_V)
    vmask = cols < V

    # ---- 1. logits tile, vocabulary-major: acc [BLOCK_V, 16] = W_tile [BLOCK_V, H] @ h^T [H, 16] ------------
    acc = tl.zeros([BLOCK_V, 16], dtype=tl.float32)
    for h0 in range(0, HIDDEN, BLOCK_H):              # constexpr trip count: pipelined num_stages deep
        hk = h0 + tl.arange(0, BLOCK_H)
        wp = w_ptr + cols[:, None] * stride_w + hk[None, :]
        hp = h_ptr + rows[None, :] * stride_h + hk[:, None]
        if EVEN_V and EVEN_H:
            w = tl.load(wp)
        else:
            w = tl.load(wp, mask=vmask[:, None] & (hk < HIDDEN)[None, :], other=0.0)
        if EVEN_H:
            ht = tl.load(hp, mask=rmask[None, :], other=0.0)
        else:
            ht = tl.load(hp, mask=rmask[None, :] & (hk < HIDDEN)[:, None], other=0.0)
        acc = _tile_dot(w, ht, acc, UPCAST)

    if GREEDY:
        # ---- greedy launch (the cp.async fallback of `_greedy_tma_kernel`): logits stored as is ----------
        # the tile is stored after the arrival: neither its release nor the last program's exchange waits for it
        old = _greedy_arrive(_tile_best_key(acc, cols, vmask), rows, rmask, cnt, ws_gkeys)
        tl.store(x_ptr + rows[None, :] * stride_x + cols[:, None], acc, mask=rmask[None, :] & vmask[:, None])
        _greedy_finish(old, NUM_PROGS, rows, rmask, cnt, ws_gkeys, temp_ptr, tok_ptr, lse_ptr, cutv_ptr, cuti_ptr)
    else:
        # ---- general launch: the NR rows, vectorised ----------------------------------------------------
        er = rb * 16 + tl.arange(0, NR)
        emask = er < R
        temp = tl.load(temp_ptr + er, mask=emask, other=1.0)
        scale = tl.where(temp <= 0.0, 1.0, temp)
        xr = _rows_of(acc, NR, BLOCK_V, LOG_SPLIT)
        xr = tl.div_rn(xr, scale[:, None] + tl.zeros([NR, BLOCK_V], dtype=tl.float32))
        xr = tl.where(vmask[None, :], xr, float("-inf"))
        tl.store(x_ptr + er[:, None] * stride_x + cols[None, :], xr, mask=emask[:, None] & vmask[None, :])
        m_p = tl.max(xr, axis=1)
        # the tile's lowest NaN id - _NAN_SHIFT (< 0; BIG when none): a NaN comes first, as in torch.argmax.
        # Its own reduction here (not folded into best_id's below): ptxas, sm_90, 8 rows top-k + noise 113
        # registers against 131 with the mask held through the Philox draw
        nan_c = tl.min(tl.where(xr != xr, cols[None, :] - _NAN_SHIFT, 2147483647), axis=1)
        e = tl.exp(xr - m_p[:, None])
        s_p = tl.sum((e * _FIX_TILE).to(tl.int64), axis=1).to(tl.float32) * _FIX_TILE_INV
        if NEED_NOISE:            # rows sampled without top-k: Gumbel scores here (others: plain argmax)
            kr = tl.load(topk_ptr + er, mask=emask, other=0)
            noisy = (temp > 0.0) & ((kr <= 0) | (kr >= V))
            seed = tl.load(seed_ptr + er, mask=emask, other=0)
            off = tl.load(off_ptr + er, mask=emask, other=0)
            idx = cols[None, :] + tl.zeros([NR, BLOCK_V], dtype=tl.int32)
            g = tl.log(philox_exponential(seed[:, None], off[:, None], idx, 0))
            score = xr.to(tl.float64) - tl.where(noisy[:, None], g, 0.0)
            score = tl.where(vmask[None, :], score, float("-inf"))
            best = tl.max(score, axis=1)
            best_id = tl.min(tl.where(score == best[:, None], cols[None, :], 2147483647), axis=1)
        else:
            best = m_p.to(tl.float64)
            best_id = tl.min(tl.where(xr == m_p[:, None], cols[None, :], 2147483647), axis=1)
        best_id = tl.minimum(best_id, nan_c)
        po = er * NUM_PROGS + pid
        tl.store(ws_m + po, m_p, mask=emask)
        tl.store(ws_s + po, s_p, mask=emask)
        tl.store(ws_bs + po, best, mask=emask)
        tl.store(ws_bi + po, best_id, mask=emask)

        # ---- 2. arrival: top-k merge tree (or the row block's counter), then the final reduction -------
        if K_CAP > 0:
            kk = tl.arange(0, K_CAP)
            if RC == NR:
                keys = tl.where(vmask[None, :], argmax_key(xr, cols[None, :]), _KEY_EMPTY)
                merged = tl.topk(keys, K_CAP)                                      # [NR, K_CAP]
                tl.store(ws_keys + er[:, None] * KEY_ROW + pid * K_CAP + kk[None, :], merged, mask=emask[:, None])
            else:                 # RC rows at a time (a loop, not unrolled): x back from this program's store
                tl.debug_barrier()
                for ch in tl.range(0, NR // RC, num_stages=1):
                    ec = rb * 16 + ch * RC + tl.arange(0, RC)
                    cm = ec < R
                    xc = tl.load(x_ptr + ec[:, None] * stride_x + cols[None, :], mask=cm[:, None] & vmask[None, :],
                                 other=float("-inf"), cache_modifier=".cg")
                    kc = tl.where(vmask[None, :], argmax_key(xc, cols[None, :]), _KEY_EMPTY)
                    tl.store(ws_keys + ec[:, None] * KEY_ROW + pid * K_CAP + kk[None, :], tl.topk(kc, K_CAP),
                             mask=cm[:, None])
            tl.debug_barrier()    # every thread's partials and keys are stored before the release below
            active = pid >= 0
            node = pid
            n_prev = NUM_PROGS    # nodes of the level below
            off_prev = 0          # their first list in ws_keys
            coff = 1              # first counter of the level
            cc = tl.arange(0, FANIN)
            for j in tl.static_range(NLEV):
                parent = node // FANIN
                n_cur = (n_prev + FANIN - 1) // FANIN
                if active:
                    nch = tl.minimum(n_prev - parent * FANIN, FANIN)
                    old = tl.atomic_add(cnt + coff + parent, 1, sem="acq_rel")
                    active = old == nch - 1
                    if active:    # last child in: merge the children's lists, all rows at once
                        src = off_prev + parent * FANIN + cc
                        if RC == NR:
                            lists = tl.load(ws_keys + er[:, None, None] * KEY_ROW + src[None, :, None] * K_CAP
                                            + kk[None, None, :],
                                            mask=emask[:, None, None] & (cc < nch)[None, :, None],
                                            other=_KEY_EMPTY, cache_modifier=".cg")
                            merged = _merge_sorted_lists(lists, NR, FANIN, K_CAP, LOG_FANIN)
                            if j + 1 < NLEV:
                                tl.store(ws_keys + er[:, None] * KEY_ROW + (off_prev + n_prev + parent) * K_CAP
                                         + kk[None, :], merged, mask=emask[:, None])
                        else:     # RC rows at a time (a loop); the root's list is stored too (the final reloads it)
                            for ch in tl.range(0, NR // RC, num_stages=1):
                                ec = rb * 16 + ch * RC + tl.arange(0, RC)
                                cm = ec < R
                                lc = tl.load(ws_keys + ec[:, None, None] * KEY_ROW + src[None, :, None] * K_CAP
                                             + kk[None, None, :],
                                             mask=cm[:, None, None] & (cc < nch)[None, :, None],
                                             other=_KEY_EMPTY, cache_modifier=".cg")
                                tl.store(ws_keys + ec[:, None] * KEY_ROW + (off_prev + n_prev + parent) * K_CAP
                                         + kk[None, :], _merge_sorted_lists(lc, RC, FANIN, K_CAP, LOG_FANIN),
                                         mask=cm[:, None])
                        tl.store(cnt + coff + parent, 0)
                        tl.debug_barrier()
                node = parent
                off_prev = off_prev + n_prev
                coff = coff + n_cur
                n_prev = n_cur
            is_last = active
        else:
            tl.debug_barrier()    # every thread's partials are stored before the release below
            old = tl.atomic_add(cnt, 1, sem="acq_rel")
            is_last = old == NUM_PROGS - 1

        if is_last:
            kr = tl.load(topk_ptr + er, mask=emask, other=0)
            kr = tl.where(kr >= V, 0, kr)
            pr = tl.load(topp_ptr + er, mask=emask, other=1.0)
            # pass 1: global max, Gumbel argmax (ties to the lowest id; chunks are in token order)
            big_m = tl.full([NR], float("-inf"), tl.float32)
            best = tl.full([NR], float("-inf"), tl.float64)
            tok = tl.full([NR], 2147483647, tl.int32)
            for c in tl.static_range(NCH):
                pp = c * PCH + tl.arange(0, PCH)
                msk = emask[:, None] & (pp < NUM_PROGS)[None, :]
                offs = er[:, None] * NUM_PROGS + pp[None, :]
                m_all = tl.load(ws_m + offs, mask=msk, other=float("-inf"), cache_modifier=".cg")
                bs = tl.load(ws_bs + offs, mask=msk, other=float("-inf"), cache_modifier=".cg")
                bi = tl.load(ws_bi + offs, mask=msk, other=2147483647, cache_modifier=".cg")
                big_m = tl.maximum(big_m, tl.max(m_all, axis=1))
                cb = tl.max(bs, axis=1)
                # a tile's NaN id (< 0) wins every chunk after it too: tok < 0 then holds the lowest NaN id
                ci = tl.min(tl.where((bs == cb[:, None]) | (bi < 0), bi, 2147483647), axis=1)
                tok = tl.where((cb == best) | (ci < 0) | (tok < 0), tl.minimum(tok, ci), tl.where(cb > best, ci, tok))
                best = tl.maximum(best, cb)
            # a NaN x (tok < 0): the greedy token is the lowest NaN id (torch.argmax's); its big_m is marked NaN
            # only after pass 2 and the top-k block (whose results for the row the non-finite handling below
            # replaces): marked here, it cost 1.4 us at 8 temperature rows (session 36, H100 and H200)
            nan_row = tok < 0
            tok = tl.where(nan_row, tok + _NAN_SHIFT, tok)
            # pass 2: sum-exp relative to the global max, in fixed point (order-free)
            mz = tl.where(emask, big_m, 0.0)
            s_fix = tl.zeros([NR], dtype=tl.int64)
            for c in tl.static_range(NCH):
                pp = c * PCH + tl.arange(0, PCH)
                msk = emask[:, None] & (pp < NUM_PROGS)[None, :]
                offs = er[:, None] * NUM_PROGS + pp[None, :]
                m_all = tl.load(ws_m + offs, mask=msk, other=float("-inf"), cache_modifier=".cg")
                s_all = tl.load(ws_s + offs, mask=msk, other=0.0, cache_modifier=".cg")
                term = s_all * tl.exp(m_all - mz[:, None])
                s_fix += tl.sum((term * FIX_SUM).to(tl.int64), axis=1)
            big_s = tl.where(emask, s_fix.to(tl.float32) * FIX_SUM_INV, 1.0)    # >= 1 on real rows
            lse = big_m + tl.log(big_s)
            cut_v = tl.full([NR], _LOWEST, tl.float32)
            cut_i = tl.zeros([NR], dtype=tl.int32) + V
            sampled = temp > 0.0
            is_topk = sampled & (kr > 0)
            no_topk = sampled & (kr <= 0)
            bad = (no_topk & (pr < 1.0)) | (is_topk & (kr > K_CAP))
            if not NEED_NOISE:
                bad = bad | no_topk
            if K_CAP > 0:         # top-k rows: root list -> top-k -> top-p -> Gumbel argmax over the kept
                jj = tl.arange(0, K_CAP)[None, :]
                if RC < NR:       # the root list, stored by the chunked merge (this program, barrier passed)
                    merged = tl.load(ws_keys + er[:, None] * KEY_ROW + off_prev * K_CAP + jj,
                                     mask=emask[:, None], other=_KEY_EMPTY, cache_modifier=".cg")
                vals = key_value(merged)
                ids = key_id(merged)
                keep = jj < kr[:, None]
                ev = tl.where(keep, tl.exp(vals - mz[:, None]), 0.0)
                pfix = (ev / big_s[:, None] * _FIX_TOPK).to(tl.int64)
                before = _exclusive_prefix_sum(pfix, NR, K_CAP, LOG_K)
                pthr = (pr * _FIX_TOPK).to(tl.int64)
                keep = keep & ((before < pthr[:, None]) | (jj == 0))
                n_keep = tl.sum(keep.to(tl.int32), axis=1)
                e_fix = tl.sum((tl.where(keep, ev, 0.0) * _FIX_TOPK).to(tl.int64), axis=1)
                lse_k = big_m + tl.log(tl.maximum(e_fix, 1).to(tl.float32) * _FIX_TOPK_INV)  # >= 1 kept
                at_cut = jj == (n_keep - 1)[:, None]
                cv_k = tl.max(tl.where(at_cut, vals, float("-inf")), axis=1)
                ci_k = tl.max(tl.where(at_cut, ids, -1), axis=1)
                seed = tl.load(seed_ptr + er, mask=emask, other=0)
                off = tl.load(off_ptr + er, mask=emask, other=0)
                sc = vals.to(tl.float64) - tl.log(philox_exponential(seed[:, None], off[:, None], ids, 0))
                sc = tl.where(keep, sc, float("-inf"))
                bk = tl.max(sc, axis=1)
                tk = tl.min(tl.where(sc == bk[:, None], ids, 2147483647), axis=1)
                use = is_topk & (kr <= K_CAP)
                tok = tl.where(use, tk, tok)
                lse = tl.where(use, lse_k, lse)
                cut_v = tl.where(use, cv_k, cut_v)
                cut_i = tl.where(use, ci_k, cut_i)
            big_m = tl.where(nan_row, float("nan"), big_m)     # the max NaN (tested below)
            greedy = temp <= 0.0                     # greedy: q = one-hot(argmax)
            lse = tl.where(greedy, big_m, lse)
            cut_v = tl.where(greedy, big_m, cut_v)
            # x holds a NaN (big_m set NaN above) or its largest x is +-inf (the reference's softmax is NaN): a
            # greedy row keeps its token (torch.argmax's), a sampled row takes token 0 and lse NaN (q NaN, as the
            # reference's); the cut value NaN marks both (`DraftSample.probs`). Finite rows: as before, bitwise.
            nonfin = ~(tl.abs(big_m) < float("inf"))
            sampled_nonfin = nonfin & ~greedy
            tok = tl.where(sampled_nonfin, 0, tok)
            lse = tl.where(sampled_nonfin, float("nan"), lse)
            cut_v = tl.where(nonfin, float("nan"), cut_v)
            cut_i = tl.where(greedy, tok, tl.where(nonfin, V, cut_i))
            tok = tl.where(bad, -1, tok)
            tl.store(tok_ptr + er, tok.to(tl.int64), mask=emask)
            tl.store(lse_ptr + er, lse, mask=emask)
            tl.store(cutv_ptr + er, cut_v, mask=emask)
            tl.store(cuti_ptr + er, cut_i, mask=emask)
            if K_CAP == 0:
                tl.store(cnt, 0)


@triton.jit
def _greedy_tma_kernel(h_ptr, w_desc, temp_ptr, tok_ptr, lse_ptr, cutv_ptr, cuti_ptr, gkeys_ptr, cnt_ptr,
                       R, V, stride_h, NUM_PROGS, CNT_ROW, TILES_PER_PROG: tl.constexpr, HIDDEN: tl.constexpr,
                       BLOCK_V: tl.constexpr, BLOCK_H: tl.constexpr, UPCAST: tl.constexpr, USE_PDL: tl.constexpr):
    """The greedy-only launch, persistent: program pid takes vocabulary tiles pid, pid + P, ... (P =
    NUM_PROGS programs per row block, TILES_PER_PROG = cdiv(tiles, P) steps; a step past the last tile reads
    TMA zero fill and its columns are masked out). One flattened software-pipelined loop over (tile, H
    step) by TMA weight loads, every tile's keys folded elementwise into `best` [BLOCK_V, 16] in registers
    (reduced across the tile once, after the loop), then ONE arrival per program (`_greedy_arrive` /
    `_greedy_finish`). Writes no logits (q is one-hot)."""
    pid, _, rows, rmask, cnt = _program_rows(R, cnt_ptr, CNT_ROW, USE_PDL)
    best = tl.full([BLOCK_V, 16], _KEY_MIN, tl.int64)
    for i in tl.range(0, TILES_PER_PROG, flatten=True):
        v0 = (pid + i * NUM_PROGS) * BLOCK_V
        acc = tl.zeros([BLOCK_V, 16], dtype=tl.float32)
        for h0 in range(0, HIDDEN, BLOCK_H):          # constexpr trip count: pipelined num_stages deep
            w = w_desc.load([v0, h0])
            hk = h0 + tl.arange(0, BLOCK_H)
            ht = tl.load(h_ptr + rows[None, :] * stride_h + hk[:, None],
                         mask=rmask[None, :] & (hk < HIDDEN)[:, None], other=0.0)
            acc = _tile_dot(w, ht, acc, UPCAST)
        cols = v0 + tl.arange(0, BLOCK_V)
        # elementwise running max of the keys: the reduction across the tile (across warps) once, below
        best = tl.maximum(best, _tile_keys(acc, cols, cols < V))
    old = _greedy_arrive(tl.max(best, axis=0), rows, rmask, cnt, gkeys_ptr)
    _greedy_finish(old, NUM_PROGS, rows, rmask, cnt, gkeys_ptr, temp_ptr, tok_ptr, lse_ptr, cutv_ptr, cuti_ptr)


@triton.jit
def _nan_first_key(x, ids):
    """`argmax_key` with torch.argmax's NaN rule: every NaN (either sign bit) sorts above +inf, ties among NaNs
    to the lowest id; its `key_value` is a NaN. The same key as `argmax_key` for every other value."""
    key = argmax_key(x, ids)
    return tl.where(x != x, (key & 0xFFFFFFFF) | _KEY_NAN_HI, key)


@triton.jit
def _tile_keys(acc, cols, vmask):
    """[BLOCK_V, 16]: the `_nan_first_key` of every logit of acc (columns outside vmask: _KEY_MIN, never a win)."""
    return tl.where(vmask[:, None], _nan_first_key(acc, cols[:, None]), _KEY_MIN)


@triton.jit
def _tile_best_key(acc, cols, vmask):
    """[16]: per row of acc [BLOCK_V, 16] its largest logit with the lowest id as an `argmax_key`."""
    return tl.max(_tile_keys(acc, cols, vmask), axis=0)


@triton.jit
def _greedy_arrive(best, rows, rmask, cnt, gkeys_ptr):
    """The greedy launches' arrival: a relaxed `atomic_max` of the program's best keys into the rows' slots,
    then the acq_rel arrival counter (its release publishes the max); returns the arrivals before this one."""
    tl.atomic_max(gkeys_ptr + rows, best, mask=rmask, sem="relaxed")
    tl.debug_barrier()            # every thread's atomic is issued before the release below
    return tl.atomic_add(cnt, 1, sem="acq_rel")


@triton.jit
def _greedy_finish(old, NUM_PROGS, rows, rmask, cnt, gkeys_ptr, temp_ptr, tok_ptr, lse_ptr, cutv_ptr, cuti_ptr):
    """The last program to arrive (old == NUM_PROGS - 1) swaps the slots back to empty and writes tokens (-1
    for rows with temperature > 0), lse = cut value = the largest logit (the cut value NaN when that is NaN or
    +-inf: `DraftSample.probs` then reads q as one-hot at the cut id), cut id = the token, and resets the
    counter."""
    if old == NUM_PROGS - 1:
        # relaxed: the arrival's acquire orders it; acq_rel would wait for this program's logits stores
        best = tl.atomic_xchg(gkeys_ptr + rows, tl.full([16], _KEY_MIN, tl.int64), mask=rmask, sem="relaxed")
        val = key_value(best)
        tid = key_id(best)
        t = tl.load(temp_ptr + rows, mask=rmask, other=0.0)
        tl.store(tok_ptr + rows, tl.where(t > 0.0, -1, tid).to(tl.int64), mask=rmask)
        tl.store(lse_ptr + rows, val, mask=rmask)
        tl.store(cutv_ptr + rows, tl.where(tl.abs(val) < float("inf"), val, float("nan")), mask=rmask)
        tl.store(cuti_ptr + rows, tid, mask=rmask)
        tl.store(cnt, 0)


# ----------------------------------------------------------------------------------------------------
# host side
# ----------------------------------------------------------------------------------------------------
@dataclass
class DraftSample:
    """Output of one draft-sampling launch (R rows, vocabulary V).

    tokens [R] int64 (-1 marks a row whose parameters are outside the supported range);
    logits [R, V] float32 — x = (h @ W^T) / T (T = 1 for greedy rows); NOT written when one_hot;
    lse [R] float32 — log-sum-exp of x over the kept tokens (one_hot: the largest logit);
    cut_value [R] float32, cut_id [R] int32 — the last kept token in (value desc, id asc) order
    (rows without filtering: the lowest finite float32 and V, so every token is kept; one_hot: the
    largest logit and the token). cut_value NaN marks a row whose x holds a NaN or whose largest x is +-inf
    (a sampled row's softmax is NaN there): a greedy row then has cut_id = its token (the lowest NaN id,
    else as torch.argmax) and q one-hot at it; a sampled row token 0, lse NaN, cut_id V and q all NaN,
    as the reference's;
    one_hot — set by the launch: True when a greedy-only launch wrote only tokens / lse / cut (q is
    one-hot at the token, so the logits are not stored: `kept` and `probs` then read the tokens).
    """

    tokens: torch.Tensor
    logits: torch.Tensor
    lse: torch.Tensor
    cut_value: torch.Tensor
    cut_id: torch.Tensor
    one_hot: bool = False

    def kept(self) -> torch.Tensor:
        """[R, V] bool: the tokens the row's top-k / top-p filter keeps (one_hot: the token only; a row whose
        cut_value is NaN: the cut id, i.e. a greedy row's token, none for a sampled row)."""
        ids = torch.arange(self.logits.shape[1], device=self.logits.device)
        if self.one_hot:
            return ids[None, :] == self.tokens[:, None]
        cv, ci = self.cut_value[:, None], self.cut_id[:, None]
        ids = ids[None, :]
        return (self.logits > cv) | ((self.logits == cv) & (ids <= ci)) | (cv.isnan() & (ids == ci))

    def probs(self, out: torch.Tensor | None = None) -> torch.Tensor:
        """q [R, V] float32: exp(x - lse) on the kept tokens, 0 elsewhere (rows sum to 1; one_hot: 1 at
        the token, a row with token -1 all 0). A row whose cut_value is NaN (see the class): one-hot at the
        cut id when it is a token (greedy), else NaN everywhere (sampled), as the reference's q. No host sync.

        One launch (`_dense_q_kernel`): the q costs 3.5-15 us over the draft launch at 1-8 sampled rows of V 49152
        in a CUDA graph, against 22-42 us for the torch form, `kept()` then exp / where, ~8 elementwise launches
        (bench/results/session32, call3). out: [R, V] float32 with
        stride 1 along V, written whole (None: allocated). StepContractError (`_gemv.check_tensor`) for a field
        or out of another shape / dtype / device / layout, rows that overlap, or an out overlapping a field."""
        check_tensor("logits", self.logits, (None, None), torch.float32, getattr(self.logits, "device", None))
        r, v = self.logits.shape
        dev = self.logits.device
        check_rows_apart("logits", self.logits)
        fields = {"logits": self.logits, "tokens": self.tokens, "lse": self.lse, "cut_value": self.cut_value,
                  "cut_id": self.cut_id}
        for name, dtype in (("tokens", torch.int64), ("lse", torch.float32), ("cut_value", torch.float32),
                            ("cut_id", torch.int32)):
            check_tensor(name, fields[name], (r,), dtype, dev)
        if out is None:
            out = torch.empty(r, v, dtype=torch.float32, device=dev)
        check_tensor("out", out, (r, v), torch.float32, dev)
        check_rows_apart("out", out)
        refuse_overlaps({"out": out}, fields, "probs' {a} overlaps this sample's {b}")
        if self.one_hot:
            return out.copy_(self.kept())
        if r == 0 or v == 0:
            return out
        require_runnable("logits", self.logits)
        _dense_q_kernel[(r, triton.cdiv(v, _Q_BLOCK_V))](
            self.logits, self.logits.stride(0), self.lse, self.cut_value, self.cut_id, out, out.stride(0), v,
            BLOCK_V=_Q_BLOCK_V, INTERP=interpreting(), num_warps=4)
        return out


#: vocabulary entries a `_dense_q_kernel` program writes (4 warps, 8 a thread)
_Q_BLOCK_V = 1024


@triton.jit
def _dense_q_kernel(logits_ptr, stride_l, lse_ptr, cut_value_ptr, cut_id_ptr, q_ptr, stride_q, V,
                    BLOCK_V: tl.constexpr, INTERP: tl.constexpr):
    """q of one row's BLOCK_V tokens (`DraftSample.probs`): kept = x > cut_value, or x == cut_value and id <=
    cut_id, or (cut_value NaN) id == cut_id; q = exp(x - lse) on kept tokens (1 on a NaN-cut row's), else 0 (NaN on
    a NaN-cut row with no token). exp: libdevice's (torch's expf) on the GPU, numpy's under the interpreter."""
    r = tl.program_id(0).to(tl.int64)
    ids = tl.program_id(1) * BLOCK_V + tl.arange(0, BLOCK_V)
    inside = ids < V
    x = tl.load(logits_ptr + r * stride_l + ids, mask=inside, other=0.0)
    cv = tl.load(cut_value_ptr + r)
    ci = tl.load(cut_id_ptr + r)
    lse = tl.load(lse_ptr + r)
    nan_cut = (tl.zeros([BLOCK_V], dtype=tl.float32) + cv) != cv        # a block: the interpreter's & needs one
    kept = (x > cv) | ((x == cv) & (ids <= ci)) | (nan_cut & (ids == ci))
    if INTERP:
        e = tl.exp(x - lse)
    else:
        e = libdevice.exp(x - lse)
    fill = tl.where(nan_cut & (ci >= V), float("nan"), 0.0)
    q = tl.where(kept, tl.where(nan_cut, 1.0, e), fill)
    tl.store(q_ptr + r * stride_q + ids, q, mask=inside)


@dataclass
class _Workspace:
    m: torch.Tensor          # [rows_pad, P] float32: tile max per row
    s: torch.Tensor          # [rows_pad, P] float32: tile sum-exp per row (relative to the tile max)
    bs: torch.Tensor         # [rows_pad, P] float64: tile best score per row
    bi: torch.Tensor         # [rows_pad, P] int32: its token id
    keys: torch.Tensor       # [rows_pad, nodes * k_cap] int64: sorted top-k_cap lists of the tree's nodes
    gkeys: torch.Tensor      # [rows_pad] int64: greedy argmax slots (left at _KEY_MIN by every launch)
    counters: torch.Tensor   # [row blocks, 1 + tree nodes above the tiles] int32 (left at 0)


_WORKSPACES: dict = {}


def _workspace(device, rows_pad: int, num_progs: int, k_cap: int, nodes: int, n_counters: int) -> _Workspace:
    key = (str(device), rows_pad, num_progs, k_cap, nodes, n_counters)
    ws = _WORKSPACES.get(key)
    if ws is None:
        if torch.device(device).type == "cuda" and torch.cuda.is_current_stream_capturing():
            # its counters / key slots must hold their initial values when the first launch runs; an
            # allocation inside a capture would only record the fills
            raise StepContractError(f"draft-sampling workspace for {rows_pad} rows x {num_progs} tiles (k_cap "
                                    f"{k_cap}) created during CUDA-graph capture: run one launch of this "
                                    "shape eagerly before capturing")
        kc = max(k_cap, 1)
        ws = _Workspace(
            m=torch.empty(rows_pad, num_progs, dtype=torch.float32, device=device),
            s=torch.empty(rows_pad, num_progs, dtype=torch.float32, device=device),
            bs=torch.empty(rows_pad, num_progs, dtype=torch.float64, device=device),
            bi=torch.empty(rows_pad, num_progs, dtype=torch.int32, device=device),
            keys=torch.empty(rows_pad, nodes * kc, dtype=torch.int64, device=device),
            gkeys=torch.full((rows_pad,), int(_KEY_MIN), dtype=torch.int64, device=device),
            counters=torch.zeros(rows_pad // BLOCK_R, n_counters, dtype=torch.int32, device=device))
        _WORKSPACES[key] = ws
    return ws


def k_cap_for(max_top_k: int) -> int:
    """The candidate-list length compiled for rows whose largest top_k is max_top_k (0 = top-k off)."""
    if max_top_k <= 0:
        return 0
    if max_top_k > MAX_TOP_K:
        raise UnsupportedConfigError("top_k", max_top_k, f"the fused draft sampler supports top_k <= {MAX_TOP_K}")
    return max(2, triton.next_power_of_2(max_top_k))        # tl.topk needs k >= 2


def rows_per_launch(r: int) -> int:
    """NR: the rows the epilogue works on (the next power of two of R, at most one row block of 16)."""
    return min(BLOCK_R, triton.next_power_of_2(max(r, 1)))


def default_row_chunk(nr: int, k_cap: int) -> int:
    """RC: the rows the top-k parts (each tile's top-k_cap, every merge node) work on at a time, in a loop
    (not unrolled) over NR / RC chunks: NR while NR * k_cap <= 256 keys, else 256 / k_cap (4 at k_cap 64).
    ptxas, sm_90, k_cap 64: the all-rows code at NR 8 is twice NR 4's per merge level (1789 vs 917
    instructions) and the unrolled kernel 12.6k instructions (8.8k at NR 4); measured 103 vs 57 us.
    With RC 4 (2026-12-01, bench/results/draft_sampling_h200.json, its "sweep"): 8 rows 53.5 us (RC 8:
    103.0, RC 2: 77.0, RC 1: 113.3; RC 4 with fan-in 4: 50.0 but fan-in 16: 96.4), every variant
    with the default's tokens."""
    if k_cap <= 0:
        return nr
    return max(1, min(nr, 256 // k_cap))


def merge_tree(num_progs: int, nr: int, k_cap: int, group: int | None = None) -> tuple[int, list[int]]:
    """(fan-in, [nodes per level above the tiles]) of the top-k merge tree; the last level has one node.

    nr: the rows a node merges at a time (`launch_config` passes the row chunk RC). Default fan-in: 8
    while a node holds at most NODE_KEYS keys (nr * 8 * k_cap), else NODE_KEYS / (nr * k_cap); never above
    the tile count (rounded up to a power of two). Chosen from ptxas register
    counts for sm_90 (a node's keys live in registers; fan-in 16 / 32 went to 164-255 registers and spilled
    under the cap at some row counts). The tokens do not depend on it (exact top-k of unique keys)."""
    if group is None:
        group = max(2, min(8, 1 << ((NODE_KEYS // (nr * max(k_cap, 1))).bit_length() - 1)))
        group = max(2, min(group, triton.next_power_of_2(num_progs)))
    if group < 2 or group & (group - 1):
        raise UnsupportedConfigError("group", group, "must be a power of two >= 2")
    levels, n = [], num_progs
    while True:
        n = triton.cdiv(n, group)
        levels.append(n)
        if n == 1:
            return group, levels


def default_maxnreg(num_warps: int) -> int | None:
    """Register cap for the launch: with 4 warps, 168 = 65536 / (3 programs * 128 threads), rounded down
    to the allocation granule of 8, so three programs fit on an SM (their 4-stage pipelines take 3 x 72
    KB of shared memory) and V = 49152 at block_v 128 (384 programs) runs in one wave on 132 SMs. The
    GEMV loop needs ~90 registers and the epilogues up to 8 rows 88-152 (ptxas, sm_90); 16 rows with top-k
    take ~230 uncapped (the GEMV would run in 1.5 waves), ~200 bytes of epilogue spills under the cap.
    None (no cap) for other warp counts."""
    return 168 if num_warps == 4 else None


#: the candidate-list lengths a launch compiles for (`k_cap_for`; 0 = no row uses top-k)
K_CAPS = (0, 2, 4, 8, 16, 32, 64)


def check_sampling_args(r: int, temperature, top_k, top_p, seeds, offsets, *, k_cap, need_noise,
                        device=None) -> None:
    """The launch arguments `draft_sample_into` takes besides h / lm_head / out: temperature [R] float32,
    top_k [R] int32, top_p [R] float32, seeds / offsets [R] int64 (on `device` unless None), k_cap an int
    in K_CAPS, need_noise a bool. Raises StepContractError (tensors) or UnsupportedConfigError (flags)
    naming the value. Callers that launch other kernels first (`FusedModel.draft_position`) call it
    before those, so that nothing is written when the sampler would refuse."""
    where = "" if device is None else f" on {device}"
    for name, t, dt in (("temperature", temperature, torch.float32), ("top_k", top_k, torch.int32),
                        ("top_p", top_p, torch.float32), ("seeds", seeds, torch.int64),
                        ("offsets", offsets, torch.int64)):
        if (not isinstance(t, torch.Tensor) or tuple(t.shape) != (r,) or t.dtype != dt
                or (device is not None and t.device != device)):
            raise StepContractError(f"{name} must be [R] = [{r}] {dt}{where}, got {tuple(getattr(t, 'shape', ()))} "
                                    f"{getattr(t, 'dtype', type(t).__name__)} on {getattr(t, 'device', None)}")
    if type(k_cap) is not int or k_cap not in K_CAPS:
        raise UnsupportedConfigError("k_cap", k_cap, f"must be an int, one of {K_CAPS}")
    if type(need_noise) is not bool:
        raise UnsupportedConfigError("need_noise", need_noise, "must be a bool")


def draft_sample_into(h: torch.Tensor, lm_head: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor,
                      top_p: torch.Tensor, seeds: torch.Tensor, offsets: torch.Tensor, out: DraftSample, *,
                      k_cap: int, need_noise: bool = True, block_v: int = 128, block_h: int = 64,
                      group: int | None = None, row_chunk: int | None = None, num_warps: int = 4,
                      num_stages: int | None = None, maxnreg: int | None = -1, greedy_programs: int | None = None,
                      use_pdl: bool = False) -> DraftSample:
    """Launch-level entry (no host sync, CUDA-graph capturable): one launch, writes into `out`.

    h [R, H] bf16 (or fp32), lm_head [V, H] same dtype, row stride 1 along H; temperature [R] float32,
    top_k [R] int32, top_p [R] float32, seeds / offsets [R] int64, all on h's device. k_cap: 0 (no row uses
    top-k) or a power of two in [max(2, largest top_k), 64]. The five [R] tensors and out.tokens must be
    contiguous (StepContractError naming the tensor and its strides: nothing is copied here); out.logits
    [R, V] stride 1 along V, rows not overlapping. need_noise: False when no row samples without
    top-k (every row greedy or top-k); with k_cap 0 and need_noise False the launch is greedy-only (the
    lean argmax epilogue). Parameter values are not checked here (see `draft_sample`); rows outside the
    supported range or outside what k_cap / need_noise compile for get token -1. The greedy-only launch
    loads the weight by TMA (`_greedy_tma_kernel`) when `tma_greedy_ok` holds, writes no logits and sets
    out.one_hot (q through `DraftSample.probs()` either way); every other launch clears it. CUDA-graph padding rows:
    give them any valid parameters (e.g. temperature 0); a row's outputs never depend on the other rows.
    block_v (power of two in [max(16, k_cap), 1024]), block_h, group (fan-in of the top-k merge tree,
    power of two >= 2; default `merge_tree`'s), row_chunk (rows the top-k parts handle at a time, power of
    two; default `default_row_chunk`), num_warps, num_stages (None: GREEDY_STAGES for the TMA greedy launch,
    else 4), greedy_programs (programs per row block of the persistent TMA greedy launch, at most one per
    vocabulary tile; None: `default_greedy_programs`): launch tuning (outputs never depend on them).
    maxnreg: register cap per thread (-1: `default_maxnreg` for the general launch, which keeps three 4-warp
    programs per SM, none for the TMA greedy launch; None: no cap). Raises
    StepContractError on shapes / dtypes / devices / strides, UnsupportedConfigError on tuning values and
    on V > 2^30 or V x H, R x V beyond int32 offsets.
    Mutates: out.* and the cached workspace of this (device, shape).
    """
    require_runnable("h", h); require_runnable("lm_head", lm_head)
    if h.dim() != 2 or lm_head.dim() != 2 or h.shape[1] != lm_head.shape[1]:
        raise StepContractError(f"h must be [R, H] and lm_head [V, H] with the same H, got "
                                f"{tuple(h.shape)} and {tuple(lm_head.shape)}")
    r, hd = h.shape
    v = lm_head.shape[0]
    if h.dtype != lm_head.dtype or h.dtype not in (torch.bfloat16, torch.float16, torch.float32):
        raise StepContractError(f"h and lm_head must share a dtype in bf16/fp16/fp32, got {h.dtype}, {lm_head.dtype}")
    if h.stride(1) != 1 or lm_head.stride(1) != 1:
        raise StepContractError("h and lm_head must be contiguous along H (stride 1)")
    if v * max(lm_head.stride(0), hd) >= 2 ** 31:
        raise UnsupportedConfigError("vocab_size", v, f"V x H = {v} x {hd} needs 64-bit offsets (the kernel "
                                     "indexes the LM head with int32)")
    check_sampling_args(r, temperature, top_k, top_p, seeds, offsets, k_cap=k_cap, need_noise=need_noise,
                        device=h.device)
    for name, t in (("temperature", temperature), ("top_k", top_k), ("top_p", top_p), ("seeds", seeds),
                    ("offsets", offsets)):
        if r > 1 and t.stride(0) != 1:    # the kernel reads them with stride 1; no copy (capturable)
            raise StepContractError(f"{name} must be contiguous, got strides {t.stride()}")
    if v > 1 << 30:
        raise UnsupportedConfigError("vocab_size", v, "the kernel passes token ids as int32 with 2^30 headroom "
                                     "(V <= 2^30)")
    if greedy_programs is not None and (type(greedy_programs) is not int or greedy_programs < 1):
        raise UnsupportedConfigError("greedy_programs", greedy_programs, "must be None or an int >= 1")
    if block_h < 16 or block_h & (block_h - 1):
        raise UnsupportedConfigError("block_h", block_h, "must be a power of two >= 16")
    if block_v < max(k_cap, 16) or block_v > 1024 or block_v & (block_v - 1):
        raise UnsupportedConfigError("block_v", block_v, f"must be a power of two in [max(k_cap={k_cap}, 16), 1024]")
    if (tuple(out.tokens.shape) != (r,) or tuple(out.logits.shape) != (r, v) or out.logits.dtype != torch.float32
            or out.logits.stride(1) != 1 or out.tokens.dtype != torch.int64):
        raise StepContractError(f"out buffers must be tokens [R]={r} int64, logits [R, V]=[{r}, {v}] float32")
    if r > 1 and out.tokens.stride(0) != 1:
        raise StepContractError(f"out.tokens must be contiguous (the kernel writes it with stride 1), got strides "
                                f"{out.tokens.stride()}")
    if r > 1 and out.logits.stride(0) < v:
        raise StepContractError(f"out.logits rows overlap: row stride {out.logits.stride(0)} < V = {v} (strides "
                                f"{out.logits.stride()})")
    for name, t, dt in (("out.lse", out.lse, torch.float32), ("out.cut_value", out.cut_value, torch.float32),
                        ("out.cut_id", out.cut_id, torch.int32)):
        if tuple(t.shape) != (r,) or t.dtype != dt or not t.is_contiguous():
            raise StepContractError(f"{name} must be [R] = [{r}] {dt}, got {tuple(t.shape)} {t.dtype}")
    for name, t in (("lm_head", lm_head), ("out.tokens", out.tokens), ("out.logits", out.logits),
                    ("out.lse", out.lse), ("out.cut_value", out.cut_value), ("out.cut_id", out.cut_id)):
        if t.device != h.device:
            raise StepContractError(f"{name} is on {t.device}, h on {h.device}")
    if r * out.logits.stride(0) >= 2 ** 31:
        raise UnsupportedConfigError("vocab_size", v, f"R x V = {r} x {v} logits need 64-bit offsets (the "
                                     "kernel indexes them with int32)")
    if r == 0:
        return out
    cfg = launch_config(r, v, hd, k_cap=k_cap, need_noise=need_noise, block_v=block_v, block_h=block_h,
                        group=group, row_chunk=row_chunk)
    n_rb = triton.cdiv(r, BLOCK_R)
    ws = _workspace(h.device, n_rb * BLOCK_R, cfg["num_progs"], k_cap, cfg["nodes"], cfg["n_counters"])
    interp = interpreting()
    tma = cfg["constexprs"]["GREEDY"] and tma_greedy_ok(h, lm_head)
    if num_stages is None:
        num_stages = GREEDY_STAGES if tma else 4
    kwargs = {} if interp else {"num_warps": num_warps, "num_stages": num_stages}
    if maxnreg == -1:
        maxnreg = None if tma else default_maxnreg(num_warps)
    if maxnreg is not None and not interp:
        kwargs["maxnreg"] = maxnreg
    if use_pdl and not interp:
        kwargs["launch_pdl"] = True
    out.one_hot = bool(tma)
    if tma:
        tiles = cfg["num_progs"]
        progs = min(tiles, greedy_programs or default_greedy_programs(h.device))
        desc = TensorDescriptor(lm_head, [v, hd], [lm_head.stride(0), 1], [block_v, block_h])
        _greedy_tma_kernel[(progs, n_rb)](
            h, desc, temperature, out.tokens, out.lse, out.cut_value, out.cut_id, ws.gkeys, ws.counters,
            r, v, h.stride(0), progs, ws.counters.stride(0), TILES_PER_PROG=triton.cdiv(tiles, progs), HIDDEN=hd,
            BLOCK_V=block_v, BLOCK_H=block_h, UPCAST=interp, USE_PDL=use_pdl and not interp, **kwargs)
        return out
    _draft_sample_kernel[(cfg["num_progs"], n_rb)](
        h, lm_head, temperature, top_k, top_p, seeds, offsets,
        out.tokens, out.logits, out.lse, out.cut_value, out.cut_id,
        ws.m, ws.s, ws.bs, ws.bi, ws.keys, ws.gkeys, ws.counters,
        r, v, h.stride(0), lm_head.stride(0), out.logits.stride(0), cfg["num_progs"], ws.keys.stride(0),
        ws.counters.stride(0),
        UPCAST=interp or h.dtype == torch.float32, USE_PDL=use_pdl and not interp,
        **cfg["constexprs"], **kwargs)
    return out


#: pipeline depth of the persistent TMA greedy launch: 6 x 16 KB weight tiles in flight per program (one per
#: SM). Session 9 (bench/results/session9/call1-2, explore19.py): 5 / 6 / 7 / 8 stages 18.6-19.1 / 17.9-19.0 /
#: 18.7-19.0 / 18.4-19.5 us at 1-8 rows, 6 the best in both calls.
GREEDY_STAGES = 6

#: programs of the persistent greedy launch under the CPU interpreter: few, so that the tests run programs
#: of several tiles and steps past the last tile
_INTERP_GREEDY_PROGRAMS = 3


def default_greedy_programs(device) -> int:
    """Programs per row block of the persistent TMA greedy launch: one per SM of `device` (132 on the
    H200; 2 / SM with 64-row tiles and 264-396 programs measured no faster, session 9), or
    `_INTERP_GREEDY_PROGRAMS` under the interpreter."""
    if interpreting() or torch.device(device).type != "cuda":
        return _INTERP_GREEDY_PROGRAMS
    return cuda_props(device).multi_processor_count


def tma_greedy_ok(h: torch.Tensor, lm_head: torch.Tensor) -> bool:
    """Whether the greedy-only launch can load `lm_head` by TMA: bf16 / fp16, a 16-byte aligned base and
    row stride, and (on a GPU) compute capability >= 9 (Hopper); under the interpreter any such tensor."""
    if lm_head.dtype not in (torch.bfloat16, torch.float16) or h.dtype != lm_head.dtype:
        return False
    if lm_head.data_ptr() % 16 or (lm_head.stride(0) * lm_head.element_size()) % 16:
        return False
    if interpreting():
        return True
    return lm_head.device.type == "cuda" and cuda_props(lm_head.device).major >= 9


def launch_config(r: int, v: int, hidden: int, *, k_cap: int, need_noise: bool, block_v: int = 128,
                  block_h: int = 64, group: int | None = None, row_chunk: int | None = None) -> dict:
    """The launch's tiling: {"num_progs", "nodes" (key lists stored, the root's included), "n_counters" (per
    row block), "constexprs" (the kernel's, but UPCAST / USE_PDL)}; what `draft_sample_into` launches (and
    the sm_90 compile test compiles)."""
    num_progs = triton.cdiv(v, block_v)
    nr = rows_per_launch(r)
    rc = default_row_chunk(nr, k_cap) if row_chunk is None else min(row_chunk, nr)
    if rc < 1 or rc & (rc - 1):
        raise UnsupportedConfigError("row_chunk", row_chunk, "must be a power of two >= 1")
    fanin, levels = merge_tree(num_progs, rc, k_cap, group)
    if k_cap == 0:
        levels = []
    pch = min(triton.next_power_of_2(num_progs), FINAL_CHUNK // nr)
    fix_bits = 62 - (num_progs * block_v - 1).bit_length()     # P * BLOCK_V * 2^fix_bits <= 2^62
    constexprs = dict(
        HIDDEN=hidden, BLOCK_V=block_v, BLOCK_H=block_h, EVEN_V=v % block_v == 0, EVEN_H=hidden % block_h == 0,
        NR=nr, LOG_SPLIT=(16 // nr).bit_length() - 1, GREEDY=k_cap == 0 and not need_noise, NEED_NOISE=need_noise,
        K_CAP=k_cap,
        LOG_K=max(k_cap, 1).bit_length() - 1, FANIN=fanin,
        LOG_FANIN=fanin.bit_length() - 1, NLEV=len(levels), PCH=pch, NCH=triton.cdiv(num_progs, pch),
        FIX_SUM=float(2.0 ** fix_bits), FIX_SUM_INV=float(2.0 ** -fix_bits), RC=rc)
    if constexprs["GREEDY"]:     # the greedy branch reads none of the row / tree tiling: one compile for any R
        constexprs.update(NR=BLOCK_R, LOG_SPLIT=0, RC=BLOCK_R, PCH=1, NCH=1, FANIN=2, LOG_FANIN=1)
    return {"num_progs": num_progs, "nodes": num_progs + sum(levels), "n_counters": 1 + sum(levels),
            "constexprs": constexprs}


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
    temperature : float or [R] (as float32) — 0 = greedy (argmax, ties to the lowest id).
    top_k : int or [R] integer tensor (as int64) — 0 or >= V = off (any value >= V, also one beyond int32, is
        clamped to V before the launch's int32 top_k: never wrapped); else 1..64; negative: refused.
    top_p : float or [R] (as float32) — in (0, 1]; < 1 needs 1 <= top_k <= 64.
    seeds, offsets : [R] int64 — Philox key and step counter per row (any strides: made contiguous).
    out : a `DraftSample` to write into (`empty_draft_sample`; checked as in `draft_sample_into`), or None.
    launch : block_v, block_h, group, row_chunk, num_warps, num_stages, maxnreg, use_pdl (see `draft_sample_into`).

    Returns a `DraftSample` (tokens [R] int64; q via `.probs()` [R, V] float32). A row whose logits hold a NaN,
    or whose largest logit / T is +-inf (e.g. a denormal T), gets the reference's outputs: greedy, the
    lowest NaN id (else torch.argmax's) with q one-hot at it; sampled, token 0 with q NaN (see `DraftSample`).
    Raises UnsupportedConfigError naming the first out-of-range value (or one not convertible to its dtype);
    StepContractError on shapes, dtypes, devices and out buffers (`draft_sample_into`).
    Nothing is launched when a check fails.
    """
    from lowlat.reference.draft_sampling import check_sampling_params

    if h.dim() != 2 or lm_head.dim() != 2:
        raise StepContractError(f"h must be [R, H] and lm_head [V, H], got {tuple(h.shape)}, {tuple(lm_head.shape)}")
    r, v, dev = h.shape[0], lm_head.shape[0], h.device

    def per_row(val, dt, name):
        try:
            t = torch.as_tensor(val, dtype=dt)
        except (TypeError, ValueError, RuntimeError, OverflowError) as e:
            raise UnsupportedConfigError(name, val, f"must be a scalar or an [R] tensor convertible to {dt} "
                                         f"({type(e).__name__}: {e})") from None
        t = t.expand(r) if t.dim() == 0 else t
        if tuple(t.shape) != (r,):
            raise StepContractError(f"{name} must be a scalar or [R] = [{r}], got {tuple(t.shape)}")
        return t.to(dev).contiguous()

    temp_t = per_row(temperature, torch.float32, "temperature")
    topk64 = per_row(top_k, torch.int64, "top_k")           # int64 first: checked, then narrowed without wrapping
    topp_t = per_row(top_p, torch.float32, "top_p")
    tc, kc, pc = temp_t.cpu(), topk64.cpu(), topp_t.cpu()
    check_sampling_params(tc, kc, pc)
    topk_t = torch.clamp(topk64, max=v).to(torch.int32)     # >= V is off whatever its size: V then, never wrapped
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
    k_cap, need_noise = launch_flags(tc, kc, v)
    out = out if out is not None else empty_draft_sample(r, v, dev)
    seeds, offsets = (t.contiguous() if isinstance(t, torch.Tensor) else t for t in (seeds, offsets))
    return draft_sample_into(h, lm_head, temp_t, topk_t, topp_t, seeds, offsets, out,
                             k_cap=k_cap, need_noise=need_noise, **launch)


def launch_flags(temperature: torch.Tensor, top_k: torch.Tensor, vocab_size: int) -> tuple[int, bool]:
    """(k_cap, need_noise) of the launch that serves these rows: temperature [R] float, top_k [R] int (CPU
    tensors, values already checked as `draft_sample` does). k_cap covers the largest top-k of a sampled row
    (`k_cap_for`; top_k 0 or >= V is off), need_noise whether some sampled row has no top-k (per-token
    Gumbel noise). Greedy rows need neither."""
    k_eff = torch.where(top_k >= vocab_size, 0, top_k)
    sampled = temperature > 0
    max_k = int(torch.where(sampled, k_eff, 0).max()) if top_k.numel() else 0
    return k_cap_for(max_k), bool((sampled & (k_eff == 0)).any())


__all__ = ["DraftSample", "default_row_chunk", "draft_sample", "draft_sample_into", "empty_draft_sample", "k_cap_for",
           "launch_flags", "tma_greedy_ok",
           "merge_tree",
           "rows_per_launch", "MAX_TOP_K"]
