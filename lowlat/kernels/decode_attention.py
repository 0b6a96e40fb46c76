"""Split-KV flash-decoding over the token-level page table, GQA-packed, deterministic combine.

Matches `lowlat.reference.attention.paged_attention` (numerics policy of lowlat/numerics.py):
row i of request r = req_indices[i] at position p = positions[i] attends to the KV slots
page_table[r, 0..p] (so verify rows are causal by construction), with G = Hq / Hkv query heads per
KV head (GQA, Ainslie et al. 2023); padding rows (i >= num_valid_rows) output 0.

Algorithm (flash-decoding: Dao et al., "Flash-Decoding for long-context inference", 2023; online
softmax: Milakov & Gimelshein 2018). Program (split s, KV head j, row i) holds the G query heads
of KV head j (padded to 16 rows for `tl.dot`, so K/V are read once per KV head) and runs the online
softmax over one contiguous range of the row's visible positions, BLOCK_N tokens at a time:
    scores = q . K^T * sm_scale * log2(e);  m' = max(m, rowmax);  p = 2^(scores - m')
    l = l * 2^(m - m') + sum(p);  acc = acc * 2^(m - m') + p V
The row's L = p + 1 visible tokens are cut into n_s = ceil(nb / ceil(nb / MAX_SPLITS)) splits of
whole BLOCK_N blocks (nb = ceil(L / BLOCK_N)): the partition depends on the row's own length only,
never on M or on the other rows. One split writes out = acc / l directly. Otherwise each split's
(m, l, acc) is stored in fp32 and one program combines all splits in fixed order 0..n_s-1
(out = sum_s 2^(m_s - M) acc_s / sum_s 2^(m_s - M) l_s; the partials of COMBINE_CHUNK splits are loaded
per round trip, then added one at a time): one launch, bitwise deterministic, row invariant.
Split groups (session 18): a (row, KV head) has `split_groups` programs (grid dim 0); program g runs
splits g, g + split_groups, ... in ONE loop over all their blocks: the state restarts (-inf, 0, 0) at a
split's first block and the split's partial is stored after its last, so each split is summed exactly as
its own program would, and Triton pipelines the loads across split ends (a loop of splits, session 18's
call 1, left each one-block split waiting for its own loads: ~2.4 us a block). With one group the program
then combines its own partials (after a CTA barrier); with more, each program bumps a per-(row, KV head)
counter once and the last of the min(n_s, split_groups) to arrive combines and resets it. The sums are the
same whatever the grouping, so `default_split_groups` may pick it from the grid: at 48 rows one program per
split is 32 x Hkv x 48 programs, most without work at short contexts.
Page-table entries past a row's position and the KV slots they name are never read.

PDL (`use_pdl`): without out_cache_loc the kernel waits (`gdc_wait`) before reading anything. With it
(the step's out_cache_loc, `pre_kv`), a program reads num_valid_rows, the positions, request indices,
out_cache_loc, its first block's page-table entries and K / V BEFORE the wait; after it, q, again the K / V
of the first block's slots that the previous launch (the attention prologue) writes in this step (a row's
own and its verify siblings' tokens), every later block, and the split partials. Every other slot
was written by an earlier step, and the launches before the prologue are complete once it has released
this one (lowlat kernels release only after their own wait). The default (`pre_kv_fits`) does this only
while the whole grid fits on the GPU at once: session 14 measured 1-1.8 us less an attention at 1 row
and a slower step once the grid needs a second wave (NOTES.md). By default (`pdl_trigger="after_kv"`) a program releases its
dependents only after its KV loop: released at once ("start"), the next launch (out_proj, 36 programs on
SmolLM2) became resident while this grid still held the GPU, and the block scheduler packed it onto the
few SMs with room, up to 7 programs on one SM (its shared-memory limit), where its GEMV ran ~3x slower
(NOTES.md, sessions 12-13: bench/explore/sm_placement.py, %smid of every program).
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from lowlat.errors import StepContractError
from lowlat.kernels.attn_combine import DeferredAttention
from lowlat.kernels._attn_common import (check_num_valid_rows, check_tensor, cuda_props, gdc_launch_dependents,
                                         gdc_wait, interpreting, pdl_supported, require_runnable, round_bf16, to_bf16,
                                         to_dot)

#: default upper bound of splits per (row, KV head); a kernel constant, never derived from M
MAX_SPLITS = 32
#: default tokens per block of the inner loop
BLOCK_N = 64
LOG2E = 1.4426950408889634
#: where a program calls `gdc_launch_dependents` under PDL (`decode_attention(pdl_trigger=...)`)
PDL_TRIGGERS = ("after_kv", "start")
#: splits whose partials the combining program loads at once (one round trip), before folding them one at a time
#: in split order (bitwise the same sums for any value). 4 keeps the sm_90 registers of one split per round trip
#: (80 at D 64, 126 at D 128); 8 takes 121 / 137 (session 14, NOTES "Measured -> session 14")
COMBINE_CHUNK = 4
#: programs of the early-KV kernel (PRE_KV, COMBINE_CHUNK 4, G <= 16 query heads per KV head, M <= 16 rows so
#: LOC_PAD 16) one SM holds, by head_dim: 80 registers at D <= 64 -> 6, 148 at D <= 128 -> 3 (sm_90 compile; a CPU
#: test keeps these true; LOC_PAD 32 took 89 at D 64 -> 5, hence the row bound in `pre_kv_fits`)
PRE_KV_PROGRAMS_PER_SM = {64: 6, 128: 3}


#: `default_split_groups`: one program per split unless that grid (num_splits x Hkv x M) exceeds WIDE_GRID programs,
#: then the most programs per (row, KV head), halving from num_splits, whose grid is at most WIDE_TARGET programs.
#: Session 19 (bench/results/session19/call2, steps at ctx 512): Llama-3.2-1B (32 x 8 x M programs) with that
#: grouping (2 groups at 19-32 rows, 1 at 33-48) and GROUPED_KV_STAGES took the step from 1357 / 1419 / 1776 us to
#: 1335 / 1363 / 1723 at 24 / 32 / 48 rows (session 18's rule, 4 groups past 6144 programs and 3 stages, had taken
#: it from 1453 to 1431 at 32 rows and from 1885 to 1833 at 48). SmolLM2-135M (Hkv 3, at most 4608 programs at 48
#: rows) lost 7-45 us a step at 6-48 rows when grouped that way, and Llama at 6 rows (8 groups) 4 us, so they keep
#: one program per split; Llama at 16 rows gained 16 us with 4 groups but WIDE_GRID leaves it ungrouped. Per kernel
#: (call 3, PDL-chained) at Llama's heads the rule won at 24 / 32 / 48 rows and ctx 512 / 4096 (48 rows, ctx 4096:
#: 120.9 us against 130.6 for one program per split and 129.7 for session 18's 4 groups). At Qwen3-30B-A3B's heads
#: (D 128: a 64-token K / V block is 32 KB; the sm_90 compile takes 77 KB of shared memory at 5 stages against 44 KB
#: at 3, two programs an SM against three) 2 groups with 5 stages lost (ctx 4096: 135.4 against 94.6 us at 37 rows,
#: 140.5 against 118.1 at 48), so the rule groups only at head_dim <= WIDE_MAX_HEAD_DIM.
WIDE_GRID = 4608
WIDE_TARGET = 512
WIDE_MAX_HEAD_DIM = 64
#: software-pipeline depth (Triton's num_stages) of the KV loop (`kv_stages`). Triton 3.6's pipeliner spends stages
#: on the page-table -> K / V chain: at 3 (Triton's default) it prefetches a block's slots two blocks ahead but its
#: K / V only one block ahead and waits for them at the top of the next iteration, so every block pays a memory round
#: trip; at 5, K / V are two blocks ahead (sm_90 compile: `async_wait num = 3`, 39 KB of shared memory against 23 KB).
#: Per kernel (session 19 call 2, PDL-chained, 1 row): a program running every block of its row (1 group) takes 1.0
#: against 1.5 us a block at ctx 4096 (66 against 96 us for 65 blocks), 12.4-12.5 against 15.4-15.7 us at ctx 512
#: (SmolLM2 / Llama heads); with one or two blocks a program the deeper pipeline only costs shared memory (one
#: program per split at 48 rows, ctx 512: 17.3 against 15.9 us on SmolLM2, 38.1 against 35.2 on Llama). Hence
#: GROUPED_KV_STAGES where a program runs at least GROUPED_MIN_SHARE splits' share of its row (split_groups *
#: GROUPED_MIN_SHARE <= num_splits: 1-2 of 32 groups) at head_dim <= WIDE_MAX_HEAD_DIM (measured there only), else
#: KV_STAGES; the early-KV kernel PRE_KV_STAGES (its PRE_KV_PROGRAMS_PER_SM table was measured at it).
KV_STAGES = 3
GROUPED_KV_STAGES = 5
PRE_KV_STAGES = 3
GROUPED_MIN_SHARE = 16


def default_split_groups(rows: int, num_kv_heads: int, num_splits: int = MAX_SPLITS, *, head_dim: int) -> int:
    """Programs per (row, KV head) by default: num_splits (one program per split) unless num_splits x Hkv x M
    exceeds WIDE_GRID and head_dim <= WIDE_MAX_HEAD_DIM, then num_splits halved while the grid (groups x Hkv x M)
    exceeds WIDE_TARGET (at least 1). A function of the launch's shape only (so CUDA graphs capture it); it moves no
    arithmetic (a program's splits are each summed as their own program would)."""
    if num_splits * num_kv_heads * rows <= WIDE_GRID or head_dim > WIDE_MAX_HEAD_DIM:
        return num_splits
    groups = num_splits
    while groups > 1 and groups * num_kv_heads * rows > WIDE_TARGET:
        groups //= 2
    return groups


def default_kv_stages(split_groups: int, num_splits: int, *, head_dim: int, pre_kv: bool) -> int:
    """The KV loop's pipeline depth by default: PRE_KV_STAGES on the early-KV path, GROUPED_KV_STAGES where a program
    runs at least GROUPED_MIN_SHARE splits' share of its row (split_groups * GROUPED_MIN_SHARE <= num_splits) and
    head_dim <= WIDE_MAX_HEAD_DIM,
    else KV_STAGES. Moves no arithmetic."""
    if pre_kv:
        return PRE_KV_STAGES
    if split_groups * GROUPED_MIN_SHARE <= num_splits and head_dim <= WIDE_MAX_HEAD_DIM:
        return GROUPED_KV_STAGES
    return KV_STAGES


def pre_kv_fits(programs: int, head_dim: int, group: int, rows: int, device: torch.device) -> bool:
    """Whether `decode_attention` loads the first KV block before its PDL wait by default: only while its whole
    grid (num_splits x Hkv x M programs) fits on the GPU at once, for at most 16 query heads per KV head and
    at most 16 rows (the table's compile). Measured (session 14, NOTES): with every
    program resident early, 1-row steps gain 1-1.8 us an attention; once the grid needs more than one wave, the
    later programs pay the early path's extra work for nothing and the step is slower."""
    if group > 16 or rows > 16:
        return False
    per_sm = next((n for d, n in sorted(PRE_KV_PROGRAMS_PER_SM.items()) if head_dim <= d), 0)
    return programs <= per_sm * cuda_props(device).multi_processor_count


@dataclass
class DecodeAttentionWorkspace:
    """Preallocated scratch of `decode_attention` for up to `max_rows` rows (CUDA-graph capturable).

    partial_o [R, Hq, MAX_SPLITS, D] fp32, partial_ml [R, Hq, MAX_SPLITS, 2] fp32 (running max in
    log2 units, sum), counters [R, Hkv] int32 (zero between launches; the last arriver resets them).
    """

    num_splits: int
    block_n: int
    max_rows: int
    partial_o: torch.Tensor
    partial_ml: torch.Tensor
    counters: torch.Tensor


def make_decode_workspace(max_rows: int, num_heads: int, num_kv_heads: int, head_dim: int,
                          device: torch.device | str, *, num_splits: int = MAX_SPLITS,
                          block_n: int = BLOCK_N) -> DecodeAttentionWorkspace:
    """Workspace for up to max_rows rows of Hq = num_heads, Hkv = num_kv_heads, D = head_dim.

    num_splits: most splits per (row, KV head) (power of two, 1..256); block_n: tokens per inner
    block (power of two >= 16). Both shape the split partition, hence the exact rounding.
    """
    if isinstance(num_splits, bool) or not isinstance(num_splits, int) or not 1 <= num_splits <= 256 \
            or num_splits & (num_splits - 1):
        raise StepContractError(f"num_splits={num_splits!r} must be an int (not a bool), a power of two in 1..256")
    if isinstance(block_n, bool) or not isinstance(block_n, int) or block_n < 16 or block_n & (block_n - 1):
        raise StepContractError(f"block_n={block_n!r} must be an int (not a bool), a power of two >= 16")
    r = max(max_rows, 1)
    return DecodeAttentionWorkspace(
        num_splits=num_splits, block_n=block_n, max_rows=r,
        partial_o=torch.empty((r, num_heads, num_splits, head_dim), dtype=torch.float32, device=device),
        partial_ml=torch.empty((r, num_heads, num_splits, 2), dtype=torch.float32, device=device),
        counters=torch.zeros((r, num_kv_heads), dtype=torch.int32, device=device))


@triton.jit
def _kv_tiles(t0, end, ok, req, j, kc_ptr, vc_ptr, pt_ptr, stride_kcs, stride_kch, stride_vcs, stride_vch,
              stride_pt, D: tl.constexpr, BLOCK_N: tl.constexpr):
    """Slots, mask and K / V tiles [BLOCK_N, D] of positions t0..t0+BLOCK_N-1 (those < end; none unless ok)."""
    dd = tl.arange(0, D)
    t = t0 + tl.arange(0, BLOCK_N)
    tmask = ok & (t < end)
    slot = tl.load(pt_ptr + req * stride_pt + t, mask=tmask, other=0).to(tl.int64)
    kv = tl.load(kc_ptr + slot[:, None] * stride_kcs + j * stride_kch + dd[None, :], mask=tmask[:, None], other=0.0)
    vv = tl.load(vc_ptr + slot[:, None] * stride_vcs + j * stride_vch + dd[None, :], mask=tmask[:, None], other=0.0)
    return slot, tmask, kv, vv


@triton.jit
def _attend_tiles(qd, m_i, l_i, acc, kv, vv, tmask, qk_scale, INTERP: tl.constexpr):
    """One online-softmax step over a block's K / V tiles (positions where tmask)."""
    s = tl.dot(qd, tl.trans(to_dot(kv, INTERP))) * qk_scale
    s = tl.where(tmask[None, :], s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, axis=1))
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(s - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, axis=1)
    if INTERP:
        p = round_bf16(p)
    acc = acc * alpha[:, None] + tl.dot(to_dot(p, INTERP), to_dot(vv, INTERP))
    return m_new, l_i, acc


@triton.jit
def _attend_block(qd, m_i, l_i, acc, t0, end, req, j, kc_ptr, vc_ptr, pt_ptr, qk_scale,
                  stride_kcs, stride_kch, stride_vcs, stride_vch, stride_pt,
                  D: tl.constexpr, BLOCK_N: tl.constexpr, INTERP: tl.constexpr):
    """One online-softmax step over positions t0..t0+BLOCK_N-1 (those < end) of request `req`."""
    _, tmask, kv, vv = _kv_tiles(t0, end, True, req, j, kc_ptr, vc_ptr, pt_ptr, stride_kcs, stride_kch,
                                 stride_vcs, stride_vch, stride_pt, D, BLOCK_N)
    return _attend_tiles(qd, m_i, l_i, acc, kv, vv, tmask, qk_scale, INTERP)


@triton.jit
def _fold_splits(l_tot, o_tot, c0, nsplits, m_max, hrow, gmask, omask, dd, wso_ptr, wsml_ptr,
                 D: tl.constexpr, MAX_SPLITS: tl.constexpr, CHUNK: tl.constexpr):
    """Add splits c0..c0+CHUNK-1 (those < nsplits), rescaled to m_max, in split order: the partials of all of them
    are loaded first (one L2 round trip; written by other programs: .cg), then folded one split at a time, so the
    sums are bitwise those of folding one split per round trip, whatever CHUNK is."""
    parts = ()
    for c in tl.static_range(CHUNK):
        ok = c0 + c < nsplits
        at = hrow * MAX_SPLITS + c0 + c
        ms = tl.load(wsml_ptr + at * 2, mask=gmask & ok, other=0.0, cache_modifier=".cg")
        ls = tl.load(wsml_ptr + at * 2 + 1, mask=gmask & ok, other=0.0, cache_modifier=".cg")
        os_ = tl.load(wso_ptr + at[:, None] * D + dd[None, :], mask=omask & ok, other=0.0, cache_modifier=".cg")
        parts = parts + ((ms, ls, os_),)
    for c in tl.static_range(CHUNK):
        ms, ls, os_ = parts[c]
        if c0 + c < nsplits:
            w = tl.exp2(ms - m_max)
            l_tot = l_tot + w * ls
            o_tot = o_tot + w[:, None] * os_
    return l_tot, o_tot


@triton.jit
def _split_partial(qd, start, end, req, j, kc_ptr, vc_ptr, pt_ptr, qk_scale,
                   stride_kcs, stride_kch, stride_vcs, stride_vch, stride_pt, k0, v0, tmask0,
                   G_PAD: tl.constexpr, D: tl.constexpr, BLOCK_N: tl.constexpr, TILE0: tl.constexpr,
                   INTERP: tl.constexpr):
    """(m, l, acc) of the split of positions start..end-1: the online softmax from scratch, a block at a time;
    with TILE0 its first block comes from the K / V tiles given (loaded before the PDL wait)."""
    m_i = tl.full([G_PAD], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([G_PAD], dtype=tl.float32)
    acc = tl.zeros([G_PAD, D], dtype=tl.float32)
    first = start
    if TILE0:
        m_i, l_i, acc = _attend_tiles(qd, m_i, l_i, acc, k0, v0, tmask0, qk_scale, INTERP)
        first = start + BLOCK_N
    if INTERP:  # the interpreter (numpy >= 2.4) cannot take tensor bounds in range(): while
        t0 = first
        while t0 < end:
            m_i, l_i, acc = _attend_block(qd, m_i, l_i, acc, t0, end, req, j, kc_ptr, vc_ptr, pt_ptr, qk_scale,
                                          stride_kcs, stride_kch, stride_vcs, stride_vch, stride_pt, D, BLOCK_N,
                                          INTERP)
            t0 += BLOCK_N
    else:
        for t0 in range(first, end, BLOCK_N):
            m_i, l_i, acc = _attend_block(qd, m_i, l_i, acc, t0, end, req, j, kc_ptr, vc_ptr, pt_ptr, qk_scale,
                                          stride_kcs, stride_kch, stride_vcs, stride_vch, stride_pt, D, BLOCK_N,
                                          INTERP)
    return m_i, l_i, acc


@triton.jit
def _grouped_block(qd, m_i, l_i, acc, f, gi, per_split, length, nsplits, req, j, row, Hq, heads, gmask, omask, dd,
                   kc_ptr, vc_ptr, pt_ptr, wso_ptr, wsml_ptr, qk_scale, stride_kcs, stride_kch, stride_vcs, stride_vch,
                   stride_pt, GROUPS: tl.constexpr, D: tl.constexpr, BLOCK_N: tl.constexpr, MAX_SPLITS: tl.constexpr,
                   FOLD: tl.constexpr, INTERP: tl.constexpr):
    """Block f of a grouped program's blocks: block i of its k-th split s = gi + k GROUPS. At a split's first block
    the state restarts (-inf, 0, 0: exactly a fresh program's); after its last, its partial is stored (when the row
    has more than one split, or with FOLD always)."""
    k = f // per_split
    i = f - k * per_split
    s = gi + k * GROUPS
    t0 = (s * per_split + i) * BLOCK_N
    end = tl.minimum((s + 1) * per_split * BLOCK_N, length)
    m_i = tl.where(i == 0, float("-inf"), m_i)
    l_i = tl.where(i == 0, 0.0, l_i)
    acc = tl.where(i == 0, 0.0, acc)
    m_i, l_i, acc = _attend_block(qd, m_i, l_i, acc, t0, end, req, j, kc_ptr, vc_ptr, pt_ptr, qk_scale,
                                  stride_kcs, stride_kch, stride_vcs, stride_vch, stride_pt, D, BLOCK_N, INTERP)
    last = t0 + BLOCK_N >= end
    if not FOLD:
        last = last & (nsplits > 1)
    if last:
        _store_partial(wso_ptr, wsml_ptr, row.to(tl.int64) * Hq + heads, s, m_i, l_i, acc, gmask, omask, dd, D,
                       MAX_SPLITS)
    return m_i, l_i, acc


@triton.jit
def _store_partial(wso_ptr, wsml_ptr, hrow, s, m_i, l_i, acc, gmask, omask, dd, D: tl.constexpr,
                   MAX_SPLITS: tl.constexpr):
    """Split s's (m, l, acc) of the G heads of rows hrow into the workspace."""
    wo = (hrow[:, None] * MAX_SPLITS + s) * D + dd[None, :]
    tl.store(wso_ptr + wo, acc, mask=omask)
    tl.store(wsml_ptr + (hrow * MAX_SPLITS + s) * 2, m_i, mask=gmask)
    tl.store(wsml_ptr + (hrow * MAX_SPLITS + s) * 2 + 1, l_i, mask=gmask)


@triton.jit
def _combine_splits(nsplits, hrow, gmask, omask, dd, wso_ptr, wsml_ptr, G_PAD: tl.constexpr, D: tl.constexpr,
                    MAX_SPLITS: tl.constexpr, CHUNK: tl.constexpr, INTERP: tl.constexpr):
    """out = sum_s 2^(m_s - M) acc_s / sum_s 2^(m_s - M) l_s over splits 0..nsplits-1 in split order (bf16)."""
    ss = tl.arange(0, MAX_SPLITS)
    ml = (hrow[:, None] * MAX_SPLITS + ss[None, :]) * 2
    m_all = tl.load(wsml_ptr + ml, mask=gmask[:, None] & (ss[None, :] < nsplits),
                    other=float("-inf"), cache_modifier=".cg")
    m_max = tl.max(m_all, axis=1)
    m_max = tl.where(gmask, m_max, 0.0)
    l_tot = tl.zeros([G_PAD], dtype=tl.float32)
    o_tot = tl.zeros([G_PAD, D], dtype=tl.float32)
    if INTERP:
        c0 = 0
        while c0 < nsplits:
            l_tot, o_tot = _fold_splits(l_tot, o_tot, c0, nsplits, m_max, hrow, gmask, omask, dd,
                                        wso_ptr, wsml_ptr, D, MAX_SPLITS, CHUNK)
            c0 += CHUNK
    else:
        for c0 in range(0, nsplits, CHUNK):
            l_tot, o_tot = _fold_splits(l_tot, o_tot, c0, nsplits, m_max, hrow, gmask, omask, dd,
                                        wso_ptr, wsml_ptr, D, MAX_SPLITS, CHUNK)
    l_tot = tl.where(gmask, l_tot, 1.0)
    return to_bf16(o_tot / l_tot[:, None], INTERP)


@triton.jit
def _decode_attention_kernel(
        q_ptr, kc_ptr, vc_ptr, pt_ptr, req_ptr, pos_ptr, nvr_ptr, nvr_int, loc_ptr, o_ptr,
        wso_ptr, wsml_ptr, cnt_ptr,
        M, Hq, Hkv, qk_scale,
        stride_qm, stride_qh, stride_kcs, stride_kch, stride_vcs, stride_vch, stride_pt, stride_om, stride_oh,
        G: tl.constexpr, G_PAD: tl.constexpr, D: tl.constexpr, BLOCK_N: tl.constexpr,
        MAX_SPLITS: tl.constexpr, GROUPS: tl.constexpr, CHUNK: tl.constexpr, NVR_FROM_PTR: tl.constexpr,
        PRE_KV: tl.constexpr, LOC_PAD: tl.constexpr, USE_PDL: tl.constexpr, TRIGGER_AFTER_KV: tl.constexpr,
        INTERP: tl.constexpr, FOLD: tl.constexpr = False):
    gi = tl.program_id(0)          # split group: splits gi, gi + GROUPS, gi + 2 GROUPS, ...
    j = tl.program_id(1)           # KV head
    row = tl.program_id(2)
    if USE_PDL and not PRE_KV:
        gdc_wait()
        if not TRIGGER_AFTER_KV:
            gdc_launch_dependents()
    if NVR_FROM_PTR:
        nvr = tl.load(nvr_ptr)
    else:
        nvr = nvr_int

    g = tl.arange(0, G_PAD)
    gmask = g < G
    heads = j * G + g
    dd = tl.arange(0, D)
    orow = row.to(tl.int64) * stride_om + heads[:, None] * stride_oh + dd[None, :]
    omask = gmask[:, None]

    valid = row < nvr
    pos = tl.where(valid, tl.load(pos_ptr + row).to(tl.int32), 0)   # a padding row's position is never used
    length = pos + 1
    nblocks = tl.cdiv(length, BLOCK_N)
    per_split = tl.cdiv(nblocks, MAX_SPLITS)
    nsplits = tl.cdiv(nblocks, per_split)
    work = valid & (gi < nsplits)
    req = tl.load(req_ptr + row).to(tl.int64)
    start = gi * per_split * BLOCK_N                  # this program's first split, gi
    end = tl.minimum(start + per_split * BLOCK_N, length)
    k0 = 0                         # the first block's tiles when loaded before the wait (PRE_KV)
    v0 = 0
    tmask0 = 0
    if PRE_KV:
        # the first block of this program's first split (gi) before the wait (under PDL); after it, those of its
        # slots that the previous launch writes (this step's out_cache_loc) are loaded again: every other slot is
        # older than it
        slot0, tmask0, k0, v0 = _kv_tiles(start, end, work, req, j, kc_ptr, vc_ptr, pt_ptr, stride_kcs,
                                          stride_kch, stride_vcs, stride_vch, stride_pt, D, BLOCK_N)
        li = tl.arange(0, LOC_PAD)
        locs = tl.load(loc_ptr + li, mask=li < M, other=-1)
        fresh = tmask0 & (tl.max((slot0.to(tl.int32)[:, None] == locs[None, :]).to(tl.int32), axis=1) > 0)
        if USE_PDL:
            gdc_wait()
            if not TRIGGER_AFTER_KV:
                gdc_launch_dependents()
        k0 = tl.load(kc_ptr + slot0[:, None] * stride_kcs + j * stride_kch + dd[None, :], mask=fresh[:, None],
                     other=k0)
        v0 = tl.load(vc_ptr + slot0[:, None] * stride_vcs + j * stride_vch + dd[None, :], mask=fresh[:, None],
                     other=v0)

    if row >= nvr:   # padding rows read no KV, page table or q, and output 0 (with FOLD the consumer writes it)
        if not FOLD:
            if gi == 0:
                tl.store(o_ptr + orow, tl.zeros([G_PAD, D], dtype=o_ptr.dtype.element_ty), mask=omask)
    else:
        if gi < nsplits:
            qv = tl.load(q_ptr + row.to(tl.int64) * stride_qm + heads[:, None] * stride_qh + dd[None, :],
                         mask=omask, other=0.0)
            qd = to_dot(qv, INTERP)
            if GROUPS < MAX_SPLITS:
                # every block of this program's splits in one loop (pipelined across split ends): the state is reset
                # at a split's first block and stored after its last, so each split is summed as its own program would
                nmine = tl.cdiv(nsplits - gi, GROUPS)                     # splits of this program
                last_start = (gi + (nmine - 1) * GROUPS) * per_split * BLOCK_N
                nb = (nmine - 1) * per_split + tl.minimum(per_split, tl.cdiv(length - last_start, BLOCK_N))
                m_i = tl.full([G_PAD], float("-inf"), dtype=tl.float32)
                l_i = tl.zeros([G_PAD], dtype=tl.float32)
                acc = tl.zeros([G_PAD, D], dtype=tl.float32)
                if INTERP:
                    f = 0
                    while f < nb:
                        m_i, l_i, acc = _grouped_block(qd, m_i, l_i, acc, f, gi, per_split, length, nsplits, req, j,
                                                       row, Hq, heads, gmask, omask, dd, kc_ptr, vc_ptr, pt_ptr,
                                                       wso_ptr, wsml_ptr, qk_scale, stride_kcs, stride_kch, stride_vcs,
                                                       stride_vch, stride_pt, GROUPS, D, BLOCK_N, MAX_SPLITS, FOLD,
                                                       INTERP)
                        f += 1
                else:
                    for f in range(0, nb):
                        m_i, l_i, acc = _grouped_block(qd, m_i, l_i, acc, f, gi, per_split, length, nsplits, req, j,
                                                       row, Hq, heads, gmask, omask, dd, kc_ptr, vc_ptr, pt_ptr,
                                                       wso_ptr, wsml_ptr, qk_scale, stride_kcs, stride_kch, stride_vcs,
                                                       stride_vch, stride_pt, GROUPS, D, BLOCK_N, MAX_SPLITS, FOLD,
                                                       INTERP)
            else:
                m_i, l_i, acc = _split_partial(qd, start, end, req, j, kc_ptr, vc_ptr, pt_ptr, qk_scale,
                                               stride_kcs, stride_kch, stride_vcs, stride_vch, stride_pt, k0, v0,
                                               tmask0, G_PAD, D, BLOCK_N, PRE_KV, INTERP)
            if USE_PDL and TRIGGER_AFTER_KV:   # programs without work release by exiting
                gdc_launch_dependents()

            if FOLD:   # every split's partial, also a single one's (grouped: stored in the loop); the consumer
                #          combines (`attn_combine.fold_attention_slice`)
                if GROUPS == MAX_SPLITS:
                    _store_partial(wso_ptr, wsml_ptr, row.to(tl.int64) * Hq + heads, gi, m_i, l_i, acc, gmask, omask,
                                   dd, D, MAX_SPLITS)
            elif nsplits == 1:
                tl.store(o_ptr + orow, to_bf16(acc / l_i[:, None], INTERP), mask=omask)
            else:
                # the partial (m, l, acc) of its split (grouped: stored in the loop); the combining program sums all
                # splits in split order
                hrow = row.to(tl.int64) * Hq + heads                       # [G_PAD] (row, head) index
                if GROUPS == MAX_SPLITS:
                    _store_partial(wso_ptr, wsml_ptr, hrow, gi, m_i, l_i, acc, gmask, omask, dd, D, MAX_SPLITS)
                tl.debug_barrier()
                if GROUPS == 1:   # every split is this program's: its own stores, visible after the barrier
                    out = _combine_splits(nsplits, hrow, gmask, omask, dd, wso_ptr, wsml_ptr, G_PAD, D, MAX_SPLITS,
                                          CHUNK, INTERP)
                    tl.store(o_ptr + orow, out, mask=omask)
                else:
                    arrivals = nsplits       # programs with work: min(nsplits, GROUPS) (a plain nsplits when GROUPS
                    if GROUPS < MAX_SPLITS:  # is MAX_SPLITS keeps that kernel at its 80 registers, not 86)
                        arrivals = tl.minimum(nsplits, GROUPS)
                    cnt = tl.atomic_add(cnt_ptr + row.to(tl.int64) * Hkv + j, 1, sem="acq_rel", scope="gpu")
                    if cnt == arrivals - 1:
                        out = _combine_splits(nsplits, hrow, gmask, omask, dd, wso_ptr, wsml_ptr, G_PAD, D,
                                              MAX_SPLITS, CHUNK, INTERP)
                        tl.store(o_ptr + orow, out, mask=omask)
                        tl.store(cnt_ptr + row.to(tl.int64) * Hkv + j, 0)


def decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, page_table: torch.Tensor,
                     req_indices: torch.Tensor, positions: torch.Tensor, num_valid_rows: int | torch.Tensor, *,
                     out_cache_loc: torch.Tensor | None = None, pre_kv: bool | None = None,
                     out: torch.Tensor | None = None, workspace: DecodeAttentionWorkspace | None = None,
                     num_splits: int | None = None, block_n: int | None = None, sm_scale: float | None = None,
                     split_groups: int | None = None, kv_stages: int | None = None, use_pdl: bool = False,
                     pdl_trigger: str = "after_kv", check_values: bool = False,
                     fold_combine: bool = False) -> torch.Tensor | DeferredAttention:
    """Causal GQA attention of M decode / verify rows over the paged KV cache (page size 1).

    Matches `lowlat.reference.attention.paged_attention`.

    Parameters:
        q            [M, Hq, D] bf16, last dim contiguous (post-RoPE queries)
        k_cache, v_cache [S, Hkv, D] bf16, last dim contiguous; Hq must be a multiple of Hkv
        page_table   [B, C] int32, last dim contiguous: KV slot of each position of each request
        req_indices  [M] int32 (request of each row, 0..B-1); positions [M] int64 (0..C-1)
        num_valid_rows  int in 0..M, or a 1-element int32 device tensor (read in-kernel, for graphs)
        out_cache_loc  optional [M] int32: the KV slots the previous launch writes (the step's out_cache_loc,
                     as the attention prologue writes them). With it (and `pre_kv`), each program loads its
                     first block's page-table entries and K / V BEFORE `gdc_wait` (under PDL), and after it
                     loads again only the slots listed here; so under PDL the previous launch may write q and
                     the KV slots in out_cache_loc, and must not write positions, req_indices, page_table,
                     num_valid_rows, out_cache_loc or any other KV slot (it and every launch before it are lowlat kernels
                     that release their dependents only after their own wait, so those earlier writes are
                     complete). Same arithmetic with or without it.
        pre_kv       with out_cache_loc: None (default) loads early under PDL when the grid fits on the GPU at
                     once (`pre_kv_fits`); True always (tests, benches; also without PDL; it needs one
                     program per split, so a smaller explicit split_groups raises); False never
        out          optional preallocated [M, Hq, D] bf16 output
        workspace    optional `make_decode_workspace(max_rows >= M, Hq, Hkv, D, device)`; allocated
                     (not capturable) when None. Its num_splits / block_n fix the split partition.
        num_splits, block_n  only when workspace is None: most splits per (row, KV head) (default 32)
                     and tokens per inner block (default 64)
        sm_scale     softmax scale, a finite float > 0; default (None) 1/sqrt(D)
        split_groups programs per (row, KV head): a power of two in 1..num_splits; program g runs the row's splits
                     g, g + split_groups, g + 2 split_groups, ... (same arithmetic, so the same bits, for every
                     value). Fewer than num_splits: one loop over all of a program's blocks (Triton pipelines
                     its loads across split ends), every load after the PDL wait (no pre_kv). None: num_splits
                     with pre_kv=True and out_cache_loc, else `default_split_groups` (fewer programs only past
                     WIDE_GRID, at head_dim <= WIDE_MAX_HEAD_DIM)
        kv_stages    software-pipeline depth of the KV loop (Triton num_stages, 1..8): None takes
                     `default_kv_stages` (deeper where a program runs many splits, at D <= 64). Moves no
                     arithmetic (the same bits for every value)
        use_pdl      programmatic dependent launch (sm_90; ignored when interpreting)
        pdl_trigger  with PDL, when a program releases the next launch: "after_kv" (default) once its
                     KV loop is done, before its last stores / split combine (a grouped program has stored
                     its earlier splits' partials in the loop; programs without work release by exiting),
                     or "start" right after its `gdc_wait`. Same arithmetic either way; see the module
                     docstring for why "after_kv". No effect without PDL (use_pdl False,
                     not sm_90, or under the interpreter).
        check_values also check req_indices / positions / visible page-table values (host sync)
        fold_combine leave the split combine to the next launch (`lowlat.kernels.attn_combine`): every program
                     stores its split's partial (m, l, acc), also a row's single split's, and exits; nothing is
                     written to out, which the consumer (the output projection given the returned
                     DeferredAttention) fills with the same bits. The workspace must then stay untouched until
                     the consumer has run.
    Returns: out [M, Hq, D] bf16 (padding rows 0), or with fold_combine a DeferredAttention(workspace partials,
    positions, num_valid_rows as a 1-element int32 tensor (an int is put in one before the launch), out, block_n).
    Reads only: page_table[r, 0..positions[i]] for valid rows and the KV slots they name (of the KV cache
    and page table); positions / req_indices of every row, out_cache_loc (all M) with early KV.
    Raises: StepContractError naming the offending tensor / value (split_groups, kv_stages, num_splits, block_n and
    sm_scale too); ValueError for an unknown pdl_trigger.
    """
    require_runnable("q", q); require_runnable("k_cache", k_cache)
    if pdl_trigger not in PDL_TRIGGERS:
        raise ValueError(f"pdl_trigger={pdl_trigger!r}; expected one of {PDL_TRIGGERS}")
    dev = q.device
    check_tensor("q", q, dtype=torch.bfloat16, ndim=3, device=dev)
    m, hq, d = q.shape
    if m < 1:
        raise StepContractError("q has M=0 rows; a step needs at least one row")
    check_tensor("k_cache", k_cache, dtype=torch.bfloat16, ndim=3, shape=(None, None, ("D", d)), device=dev)
    s_slots, hkv, _ = k_cache.shape
    check_tensor("v_cache", v_cache, dtype=torch.bfloat16, ndim=3,
                 shape=(("S", s_slots), ("Hkv", hkv), ("D", d)), device=dev)
    if hq % hkv:
        raise StepContractError(f"Hq={hq} query heads must be a multiple of Hkv={hkv} KV heads (GQA)")
    if d < 16 or d & (d - 1):
        raise StepContractError(f"head_dim D={d} must be a power of two >= 16")
    check_tensor("page_table", page_table, dtype=torch.int32, ndim=2, device=dev)
    check_tensor("req_indices", req_indices, dtype=torch.int32, ndim=1, shape=(("M", m),), device=dev)
    check_tensor("positions", positions, dtype=torch.int64, ndim=1, shape=(("M", m),), device=dev)
    if out_cache_loc is not None:
        check_tensor("out_cache_loc", out_cache_loc, dtype=torch.int32, ndim=1, shape=(("M", m),), device=dev)
    nvr_int, nvr_t = check_num_valid_rows(num_valid_rows, m, dev)
    if sm_scale is not None and (isinstance(sm_scale, bool) or not isinstance(sm_scale, numbers.Real)
                                 or not math.isfinite(sm_scale) or sm_scale <= 0):
        raise StepContractError(f"sm_scale={sm_scale!r} must be a finite float > 0 (or None: 1/sqrt(D))")
    if not isinstance(fold_combine, bool):
        raise StepContractError(f"fold_combine={fold_combine!r} must be a bool")
    if out is None:
        out = torch.empty_like(q, memory_format=torch.contiguous_format)
    else:
        check_tensor("out", out, dtype=torch.bfloat16, ndim=3, shape=(("M", m), ("Hq", hq), ("D", d)), device=dev)
        if fold_combine and not out.is_contiguous():
            raise StepContractError("out must be contiguous with fold_combine (the consumer writes it as [M, Hq*D])")
    if workspace is None:
        workspace = make_decode_workspace(m, hq, hkv, d, dev,
                                          num_splits=MAX_SPLITS if num_splits is None else num_splits,
                                          block_n=BLOCK_N if block_n is None else block_n)
    else:
        if num_splits is not None or block_n is not None:
            raise StepContractError("num_splits / block_n come from the workspace when one is given")
        if (workspace.max_rows < m or tuple(workspace.partial_o.shape[1:]) != (hq, workspace.num_splits, d)
                or workspace.counters.shape[1] != hkv or workspace.counters.device != dev):
            raise StepContractError(
                f"workspace (max_rows={workspace.max_rows}, partial_o {tuple(workspace.partial_o.shape)}, "
                f"counters {tuple(workspace.counters.shape)}) does not fit M={m}, Hq={hq}, Hkv={hkv}, D={d} on {dev}")
    if check_values:
        _check_values(page_table, req_indices, positions, nvr_int if nvr_t is None else int(nvr_t.item()),
                      s_slots)
    if fold_combine and nvr_t is None:   # the consumer reads it as a tensor: made before this launch, so that it
        #                                  precedes the PDL chain (and this launch reads the same tensor)
        nvr_t = torch.full((1,), nvr_int, dtype=torch.int32, device=dev)

    if split_groups is None:    # an explicit pre_kv=True keeps one program per split (the early path's grid)
        early = bool(pre_kv) and out_cache_loc is not None
        split_groups = (workspace.num_splits if early
                        else default_split_groups(m, hkv, workspace.num_splits, head_dim=d))
    elif (isinstance(split_groups, bool) or not isinstance(split_groups, int) or split_groups < 1
          or split_groups > workspace.num_splits or split_groups & (split_groups - 1)):
        raise StepContractError(f"split_groups={split_groups!r} must be a power of two in 1..{workspace.num_splits} "
                                "(the workspace's num_splits)")
    if kv_stages is not None and (isinstance(kv_stages, bool) or not isinstance(kv_stages, int)
                                  or not 1 <= kv_stages <= 8):
        raise StepContractError(f"kv_stages={kv_stages!r} must be an int (not a bool) in 1..8 (Triton's num_stages)")
    group = hq // hkv
    scale = (d ** -0.5 if sm_scale is None else float(sm_scale)) * LOG2E
    interp = interpreting()
    pdl = bool(use_pdl) and pdl_supported(dev)
    extra = {"launch_pdl": True} if pdl else {}
    grid = (split_groups, hkv, m)
    programs = split_groups * hkv * m
    if split_groups < workspace.num_splits:
        if pre_kv and out_cache_loc is not None:     # (without out_cache_loc pre_kv has no effect, as before)
            raise StepContractError(f"pre_kv=True needs one program per split; split_groups={split_groups} < "
                                    f"num_splits={workspace.num_splits} loads every block after the wait")
        out_cache_loc = None
    if out_cache_loc is None:
        pre_kv = False
    elif pre_kv is None:
        pre_kv = pdl and pre_kv_fits(programs, d, group, m, dev)
    pre_kv = bool(pre_kv)
    if kv_stages is None:
        kv_stages = default_kv_stages(split_groups, workspace.num_splits, head_dim=d, pre_kv=pre_kv)
    _decode_attention_kernel[grid](
        q, k_cache, v_cache, page_table, req_indices, positions,
        nvr_t if nvr_t is not None else req_indices, nvr_int, out_cache_loc if pre_kv else req_indices, out,
        workspace.partial_o, workspace.partial_ml, workspace.counters,
        m, hq, hkv, scale,
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), v_cache.stride(0), v_cache.stride(1),
        page_table.stride(0), out.stride(0), out.stride(1),
        G=group, G_PAD=max(16, triton.next_power_of_2(group)), D=d, BLOCK_N=workspace.block_n,
        MAX_SPLITS=workspace.num_splits, GROUPS=split_groups, CHUNK=min(COMBINE_CHUNK, workspace.num_splits),
        NVR_FROM_PTR=nvr_t is not None, PRE_KV=pre_kv, LOC_PAD=max(16, triton.next_power_of_2(m)) if pre_kv else 16,
        USE_PDL=pdl,
        TRIGGER_AFTER_KV=pdl_trigger == "after_kv" or not pdl, INTERP=interp,   # without PDL: one specialization
        FOLD=bool(fold_combine), num_warps=4, num_stages=kv_stages, **extra)
    if fold_combine:
        return DeferredAttention(workspace.partial_o, workspace.partial_ml, positions, nvr_t, out, workspace.block_n)
    return out


def _check_values(page_table, req_indices, positions, n, num_slots) -> None:
    b, c = page_table.shape
    req, pos = req_indices[:n].cpu().long(), positions[:n].cpu()
    for name, t, hi in (("req_indices", req, b), ("positions", pos, c)):
        bad = (t < 0) | (t >= hi)
        if bad.any():
            i = int(bad.nonzero()[0, 0])
            raise StepContractError(f"{name}[{i}]={int(t[i])} outside [0, {hi})")
    pt = page_table.cpu()
    for i in range(n):
        slots = pt[req[i], : int(pos[i]) + 1]
        bad = (slots < 0) | (slots >= num_slots)
        if bad.any():
            k = int(bad.nonzero()[0, 0])
            raise StepContractError(
                f"page_table[{int(req[i])}, {k}]={int(slots[k])} outside [0, {num_slots}) (seen by row {i})")

