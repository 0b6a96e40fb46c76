"""explore49 (session 36, prepared without a device): Qwen3-30B-A3B's QK-norm and RoPE moved from the attention
prologue into the decode attention kernel, to estimate whether the prologue can drop them.

Why: the prologue with QK-norm misses the target (70% of copy bandwidth at 1 row = 7.26 us on an H200; production's
split-K prologue takes ~9.7 us), while the plain held prologue without the norm (kernels/attn_prologue_held.py, as
Llama runs it) takes ~6.7-7.0 us at Qwen3's shapes. Every way of keeping the norm in the prologue lost ~1 us or more
(the norm sums a whole head of 128 outputs, which 8 programs share). Here the prologue would write q and this step's
new K raw (the projections, un-normalised and un-rotated; V final as now), and the attention applies

    y = w * x / sqrt(mean(x^2) + eps)  (fp32; w = q_norm or k_norm [D]),  then RoPE (HF rotate-half) at the position:
    out[d] = y[d] cos - y[d + D/2] sin (d < D/2),  y[d] cos + y[d - D/2] sin (d >= D/2),  cos / sin from the
    prologue's fp32 table (`attn_prologue.rope_table`: [P, D], cos | sin halves), rounded once to bf16

(the production prologue's epilogue formulas, `attn_prologue._rope_epilogue`, from a bf16 raw input) to q after it
loads it (per row and q head, at the row's position) and to every K row of this step's new positions as it loads
them (`_attend_fresh`, at the K row's own position t). Which positions are new: those of the request's rows in this
step, i.e. t >= new_start = the least position of a valid row of the same request (the step contract's rows of a
request are consecutive positions, and its out_cache_loc slots appear in a read context only at their own request
and position; this is the set of out_cache_loc slots that production's PRE_KV path compares, found once per program
from positions / req_indices instead of a [BLOCK_N, M] slot compare per block). A split's positions before
new_start run production's blocks unchanged (the last one masked at new_start); a split without new positions pays
a few scalar ops; the new positions are loaded again in FRESH_N-row tiles with their rotate-half partner columns,
transformed, and attended last (the online softmax's order changes, not the split partition).

The kernel does NOT write the transformed K back: in a verify step rows i+1.. of a request read row i's new slot in
the same launch (other programs), so a write-back would race with their reads (a row could normalise twice). Each
reader transforms the raw K it sees on the fly, and a small launch after the attention (`_k_writeback_kernel`,
`k_writeback`: one program per row, every KV head of its slot) stores the normalised, rotated K in place for later
steps; later it could be folded into the out_proj launch, which runs after the attention completes.

    qknorm_source(src)     decode_attention.py's text with the edits (each must apply exactly once: ValueError
                           naming it otherwise); `decode_attention(..., qk_norm=(q_norm, k_norm, cos_sin_table, eps))`
                           then takes raw q and a cache whose new slots hold raw K. Supported: one program per split
                           (split_groups = num_splits; what the fused model runs at D 128, so Qwen3 at every width),
                           with or without PRE_KV and PDL (fold_combine untested). A smaller split_groups raises.
    load_variant()         the edited module (`decode_attention_qknorm`), imported from a file of its own; it also
                           holds `k_writeback(k_cache, out_cache_loc, positions, num_valid_rows, k_norm, table, eps)`
    python bench/explore/explore49.py --out X.json      (GPU) per kernel at Qwen3-30B-A3B's heads (Hq 32, Hkv 4,
        D 128), rows 1 / 6 / 16 (decode rows: each its own request), contexts 512 / 4096, with the fused model's
        options (out_cache_loc, pre_kv by `pre_kv_fits` (1 row: early KV; 6, 16: not), one program per split, no
        fold, PDL, nvalid a device tensor), CUDA graphs over rotated cold copies as bench_decode_attention.py's
        fused_pdl, alternated A B C C B A (`time_alternated`): `production` on final q / cache, `qknorm` on raw q /
        raw new slots, `qknorm_wb` = qknorm + the write-back launch. One line per case, JSON to --out.
    python bench/explore/explore49.py --sm90            (no GPU; TRITON_INTERPRET unset) production and the variant
        compiled for sm_90 at those shapes (tests/unit/compile_sm90.py): registers, spills, shared memory.

What the next session should compare: at 1 row, production's split-K prologue (~9.7 us) against the plain held
prologue (~6.7-7.0 us) plus (qknorm - production) plus the write-back launch (qknorm_wb - qknorm, or its share once
folded into out_proj); likewise at 6 / 16 rows. The prologue writing raw q / K is the plain held prologue with its
RoPE off for q / K (not built here).

The new positions are attended after the split's blocks, FRESH_N = 16 at a time (`_attend_fresh`, outside the
pipelined loop: the blocks stop at new_start, so a row's last block is cut there); the first form, the transform of a
whole [64, 128] K block inside the loop behind a uniform branch, compiled for sm_90 to 255 registers with 410-800
bytes of spills and 82-87 KB of shared memory (against production's 126-148, 0, 39 KB).

sm_90 compile on the CPU (`--sm90`, session 36, Triton 3.6, Qwen3's G 8 / D 128, BLOCK_N 64, 32 splits, one program
per split, PDL, nvalid a tensor, num_warps 4, num_stages 3), registers / spill bytes / shared memory:
    1 row (PRE_KV)          production 148 / 0 / 39168    qknorm 168 / 0 / 39168   (3 programs an SM either way)
    6, 16 rows (no PRE_KV)  production 126 / 0 / 39168    qknorm 154 / 0 / 39168   (4 -> 3 programs an SM)
    k_writeback (Hkv 4)     32 / 0 / 256
So at 6 / 16 rows (768 / 2048 programs, past one wave) the variant loses a quarter of the resident programs; at 1
row (128 programs) occupancy does not bind. PRE_KV_PROGRAMS_PER_SM[128] = 3 still holds for the variant.

Not covered: the grouped path (split_groups < num_splits: D <= 64 models only), the prologue writing raw q / K, the
write-back folded into out_proj, a GPU run. Row invariance: a row's result now depends on its request's other rows in
the step (they say which slots hold raw K; their least position also cuts the row's blocks, so the sum order moves),
so production's "row alone equals row among others" (test_decode_attention_rows_bitwise_invariant_small takes verify
rows alone) holds only across requests: a production form must restate it. New positions are found by position, not
by slot: a request whose step rows skipped a position (not refused by StepBatch.validate) would have that old slot
transformed again.

Tested on the CPU (tests/unit/test_explore_attn_qknorm.py): attention outputs within the numerics policy of the
float64 reference (raw q / K -> QK-norm -> RoPE -> paged attention), the write-back's slots likewise, every other
slot bitwise untouched; mutation-checked (see that file).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PRODUCTION = ROOT / "lowlat" / "kernels" / "decode_attention.py"

HELPERS = '''@triton.jit
def _qk_norm_rope(x, xp, pos, w_ptr, tab_ptr, eps, max_pos, D: tl.constexpr):
    """explore49: QK-norm then RoPE of rows x [R, D] (bf16, raw projections; xp: the same rows at the rotate-half
    partner columns (d + D/2) % D) at positions pos [R] int32 (or [1]: one position for every row), as the
    prologue's epilogue computes them from fp32:
    y = x rstd w (rstd = 1 / sqrt(mean(x^2) + eps), `rstd_of`), out = y cos -+ y_partner sin with the fp32 table's
    cos / sin (0 outside the table). Returns fp32 [R, D]."""
    HALF: tl.constexpr = D // 2
    dd = tl.arange(0, D)
    part = (dd + HALF) % D
    xf = x.to(tl.float32)
    r = rstd_of(tl.sum(xf * xf, axis=1), D, eps)
    y = xf * r[:, None] * tl.load(w_ptr + dd).to(tl.float32)[None, :]
    yp = xp.to(tl.float32) * r[:, None] * tl.load(w_ptr + part).to(tl.float32)[None, :]
    ok = ((pos >= 0) & (pos < max_pos))[:, None]
    tab = tab_ptr + pos.to(tl.int64)[:, None] * D + (dd % HALF)[None, :]
    cos = tl.load(tab, mask=ok, other=0.0)
    sin = tl.load(tab + HALF, mask=ok, other=0.0)
    return tl.where((dd < HALF)[None, :], y * cos - yp * sin, y * cos + yp * sin)


@triton.jit
def _attend_fresh(qd, m_i, l_i, acc, t0, end, req, j, kc_ptr, vc_ptr, pt_ptr, qk_scale,
                  stride_kcs, stride_kch, stride_vcs, stride_vch, stride_pt, qkn, D: tl.constexpr,
                  FRESH_N: tl.constexpr, INTERP: tl.constexpr):
    """explore49: one online-softmax step over FRESH_N positions t0.. (those < end) that this step writes: their K
    is raw, so it is normalised and rotated at its own position t first (the partner columns loaded again)."""
    _, tab_ptr, eps, max_pos, _ = qkn
    kn_ptr = qkn[0]
    slot, tmask, kv, vv = _kv_tiles(t0, end, True, req, j, kc_ptr, vc_ptr, pt_ptr, stride_kcs, stride_kch,
                                    stride_vcs, stride_vch, stride_pt, D, FRESH_N)
    dd = tl.arange(0, D)
    kp = tl.load(kc_ptr + slot[:, None] * stride_kcs + j * stride_kch + ((dd + D // 2) % D)[None, :],
                 mask=tmask[:, None], other=0.0)
    kv = to_bf16(_qk_norm_rope(kv, kp, t0 + tl.arange(0, FRESH_N), kn_ptr, tab_ptr, eps, max_pos, D), INTERP)
    return _attend_tiles(qd, m_i, l_i, acc, kv, vv, tmask, qk_scale, INTERP)


@triton.jit
def _k_writeback_kernel(kc_ptr, loc_ptr, pos_ptr, nvr_ptr, nvr_int, kn_ptr, tab_ptr, eps, max_pos, Hkv,
                        stride_kcs, stride_kch, HKV_PAD: tl.constexpr, D: tl.constexpr, NVR_FROM_PTR: tl.constexpr,
                        USE_PDL: tl.constexpr, INTERP: tl.constexpr):
    """explore49: row i < num_valid_rows's new K (every KV head of slot out_cache_loc[i]) normalised and rotated at
    positions[i], in place. After the wait (the attention has read the raw K); a barrier between the loads and the
    stores (a thread's stores overwrite its partners' columns)."""
    row = tl.program_id(0)
    if USE_PDL:
        gdc_wait()
        gdc_launch_dependents()
    if NVR_FROM_PTR:
        nvr = tl.load(nvr_ptr)
    else:
        nvr = nvr_int
    if row < nvr:
        h = tl.arange(0, HKV_PAD)
        hm = (h < Hkv)[:, None]
        dd = tl.arange(0, D)
        loc = tl.load(loc_ptr + row).to(tl.int64)
        pos = tl.load(pos_ptr + row).to(tl.int32)
        base = kc_ptr + loc * stride_kcs + h[:, None] * stride_kch
        x = tl.load(base + dd[None, :], mask=hm, other=0.0)
        xp = tl.load(base + ((dd + D // 2) % D)[None, :], mask=hm, other=0.0)
        y = to_bf16(_qk_norm_rope(x, xp, tl.zeros([HKV_PAD], dtype=tl.int32) + pos, kn_ptr, tab_ptr, eps, max_pos,
                                  D), INTERP)
        tl.debug_barrier()
        tl.store(base + dd[None, :], y, mask=hm)


def check_qk_norm(qk_norm, d: int, dev) -> tuple:
    """explore49: (q_norm, k_norm, cos_sin_table, eps) checked (bf16 [D], bf16 [D], fp32 [P, D] contiguous, a finite
    float > 0); returns the kernel's arguments (q_norm, k_norm, table, eps, P)."""
    q_norm, k_norm, table, eps = qk_norm
    check_tensor("q_norm", q_norm, dtype=torch.bfloat16, ndim=1, shape=(("D", d),), device=dev)
    check_tensor("k_norm", k_norm, dtype=torch.bfloat16, ndim=1, shape=(("D", d),), device=dev)
    check_tensor("cos_sin_table", table, dtype=torch.float32, ndim=2, shape=(None, ("D", d)), device=dev)
    if not table.is_contiguous() or not (isinstance(eps, float) and math.isfinite(eps) and eps > 0):
        raise StepContractError("explore49: cos_sin_table must be contiguous and eps a finite float > 0")
    return q_norm, k_norm, table, eps, table.shape[0]


def k_writeback(k_cache, out_cache_loc, positions, num_valid_rows, k_norm, cos_sin_table, eps, *, use_pdl=False):
    """explore49: k_cache [S, Hkv, D] bf16 at out_cache_loc[:num_valid_rows] (int32 [M]) normalised with k_norm
    (bf16 [D]) and rotated at positions (int64 [M]) with cos_sin_table (fp32 [P, D]), in place (one launch, M
    programs)."""
    dev = k_cache.device
    m = out_cache_loc.shape[0]
    check_tensor("k_cache", k_cache, dtype=torch.bfloat16, ndim=3, device=dev)
    _, hkv, d = k_cache.shape
    check_tensor("out_cache_loc", out_cache_loc, dtype=torch.int32, ndim=1, shape=(("M", m),), device=dev)
    check_tensor("positions", positions, dtype=torch.int64, ndim=1, shape=(("M", m),), device=dev)
    _, k_norm, table, eps, max_pos = check_qk_norm((k_norm, k_norm, cos_sin_table, eps), d, dev)
    nvr_int, nvr_t = check_num_valid_rows(num_valid_rows, m, dev)
    pdl = bool(use_pdl) and pdl_supported(dev)
    extra = {"launch_pdl": True} if pdl else {}
    _k_writeback_kernel[(m,)](
        k_cache, out_cache_loc, positions, nvr_t if nvr_t is not None else out_cache_loc, nvr_int, k_norm, table,
        eps, max_pos, hkv, k_cache.stride(0), k_cache.stride(1), HKV_PAD=max(2, triton.next_power_of_2(hkv)), D=d,
        NVR_FROM_PTR=nvr_t is not None, USE_PDL=pdl, INTERP=interpreting(), num_warps=4, **extra)


'''

#: the variant's: with QK_NORM the split's positions before new_start run production's blocks (cut at new_start:
#: the last one masked there, the first one's TILE0 mask too), then its new positions in FRESH_N-position tiles
#: (`_attend_fresh`), outside the pipelined loop and in smaller tiles than BLOCK_N (the transform of a whole
#: [64, 128] block inside the loop took 255 registers and spilled on sm_90)
SPLIT_PARTIAL = '''@triton.jit
def _split_partial(qd, start, end, req, j, kc_ptr, vc_ptr, pt_ptr, qk_scale,
                   stride_kcs, stride_kch, stride_vcs, stride_vch, stride_pt, k0, v0, tmask0,
                   G_PAD: tl.constexpr, D: tl.constexpr, BLOCK_N: tl.constexpr, TILE0: tl.constexpr,
                   INTERP: tl.constexpr, qkn=0, QK_NORM: tl.constexpr = False, FRESH_N: tl.constexpr = 16):
    """(m, l, acc) of the split of positions start..end-1: the online softmax from scratch, a block at a time;
    with TILE0 its first block comes from the K / V tiles given (loaded before the PDL wait). QK_NORM (explore49):
    positions >= new_start (raw K) are left out of the blocks and attended after them, FRESH_N at a time."""
    m_i = tl.full([G_PAD], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([G_PAD], dtype=tl.float32)
    acc = tl.zeros([G_PAD, D], dtype=tl.float32)
    first = start
    if QK_NORM:
        cut = tl.maximum(start, tl.minimum(end, qkn[4]))
    else:
        cut = end
    if TILE0:
        if QK_NORM:   # its new positions are the tail's; a tile left empty is skipped (an all -inf step is NaN)
            tmask0 = tmask0 & (start + tl.arange(0, BLOCK_N) < cut)
            if start < cut:
                m_i, l_i, acc = _attend_tiles(qd, m_i, l_i, acc, k0, v0, tmask0, qk_scale, INTERP)
        else:
            m_i, l_i, acc = _attend_tiles(qd, m_i, l_i, acc, k0, v0, tmask0, qk_scale, INTERP)
        first = start + BLOCK_N
    if INTERP:  # the interpreter (numpy >= 2.4) cannot take tensor bounds in range(): while
        t0 = first
        while t0 < cut:
            m_i, l_i, acc = _attend_block(qd, m_i, l_i, acc, t0, cut, req, j, kc_ptr, vc_ptr, pt_ptr, qk_scale,
                                          stride_kcs, stride_kch, stride_vcs, stride_vch, stride_pt, D, BLOCK_N,
                                          INTERP)
            t0 += BLOCK_N
        if QK_NORM:
            t0 = cut
            while t0 < end:
                m_i, l_i, acc = _attend_fresh(qd, m_i, l_i, acc, t0, end, req, j, kc_ptr, vc_ptr, pt_ptr, qk_scale,
                                              stride_kcs, stride_kch, stride_vcs, stride_vch, stride_pt, qkn, D,
                                              FRESH_N, INTERP)
                t0 += FRESH_N
    else:
        for t0 in range(first, cut, BLOCK_N):
            m_i, l_i, acc = _attend_block(qd, m_i, l_i, acc, t0, cut, req, j, kc_ptr, vc_ptr, pt_ptr, qk_scale,
                                          stride_kcs, stride_kch, stride_vcs, stride_vch, stride_pt, D, BLOCK_N,
                                          INTERP)
        if QK_NORM:
            for t0 in tl.range(cut, end, FRESH_N, num_stages=1):
                m_i, l_i, acc = _attend_fresh(qd, m_i, l_i, acc, t0, end, req, j, kc_ptr, vc_ptr, pt_ptr, qk_scale,
                                              stride_kcs, stride_kch, stride_vcs, stride_vch, stride_pt, qkn, D,
                                              FRESH_N, INTERP)
    return m_i, l_i, acc
'''

#: (name, production's text, the edited text): each must occur exactly once in production
EDITS = [
    ("import", "from lowlat.kernels.attn_combine import DeferredAttention\n",
     "from lowlat.kernels.attn_combine import DeferredAttention\nfrom lowlat.kernels._gemv import rstd_of\n"),
    ("kernel arguments", "stride_pt, stride_om, stride_oh,\n        G: tl.constexpr,",
     "stride_pt, stride_om, stride_oh,\n        qn_ptr, kn_ptr, tab_ptr, eps, max_pos,\n        G: tl.constexpr,"),
    ("kernel constexprs", "        INTERP: tl.constexpr, FOLD: tl.constexpr = False):\n",
     "        INTERP: tl.constexpr, FOLD: tl.constexpr = False, QK_NORM: tl.constexpr = False,\n"
     "        NEW_PAD: tl.constexpr = 16):\n"),
    ("new_start", "    req = tl.load(req_ptr + row).to(tl.int64)\n", '''    req = tl.load(req_ptr + row).to(tl.int64)
    if QK_NORM:   # explore49: this step's new positions of the row's request are t >= new_start (their K is raw)
        li = tl.arange(0, NEW_PAD)
        lok = li < tl.minimum(nvr, M)
        rq = tl.load(req_ptr + li, mask=lok, other=-1).to(tl.int64)
        rp = tl.load(pos_ptr + li, mask=lok, other=0).to(tl.int32)
        new_start = tl.min(tl.where(lok & (rq == req), rp, 2147483647), axis=0)
        qkn = (kn_ptr, tab_ptr, eps, max_pos, new_start)
    else:
        qkn = 0
'''),
    ("q", "            qd = to_dot(qv, INTERP)\n",
     '''            if QK_NORM:   # explore49: q loaded raw; QK-norm, RoPE at its position
                qp = tl.load(q_ptr + row.to(tl.int64) * stride_qm + heads[:, None] * stride_qh
                             + ((dd + D // 2) % D)[None, :], mask=omask, other=0.0)
                qv = to_bf16(_qk_norm_rope(qv, qp, tl.zeros([1], dtype=tl.int32) + pos, qn_ptr, tab_ptr, eps,
                                           max_pos, D), INTERP)
            qd = to_dot(qv, INTERP)
'''),
    ("split_partial call", "tmask0, G_PAD, D, BLOCK_N, PRE_KV, INTERP)\n",
     "tmask0, G_PAD, D, BLOCK_N, PRE_KV, INTERP, qkn, QK_NORM)\n"),
    ("launcher signature", "                     fold_combine: bool = False) -> torch.Tensor | DeferredAttention:\n",
     "                     fold_combine: bool = False,\n                     qk_norm: tuple | None = None)"
     " -> torch.Tensor | DeferredAttention:\n"),
    ("launcher arguments", "    _decode_attention_kernel[grid](\n",
     '''    if qk_norm is not None:   # explore49: raw q / new K
        if split_groups < workspace.num_splits:
            raise StepContractError("explore49: qk_norm runs one program per split (split_groups = num_splits)")
        qk_args = check_qk_norm(qk_norm, d, dev)
    else:
        qk_args = (q, q, q, 1.0, 0)
    _decode_attention_kernel[grid](
'''),
    ("launcher kernel arguments", "        page_table.stride(0), out.stride(0), out.stride(1),\n",
     "        page_table.stride(0), out.stride(0), out.stride(1), *qk_args,\n"),
    ("launcher constexprs", "        FOLD=bool(fold_combine), num_warps=4,",
     "        FOLD=bool(fold_combine), QK_NORM=qk_norm is not None, NEW_PAD=max(16, triton.next_power_of_2(m)),\n"
     "        num_warps=4,"),
]


def function_text(src: str, name: str) -> str:
    """The text of `@triton.jit def name(` in src up to the next top-level definition; ValueError unless the head
    occurs exactly once."""
    head = f"@triton.jit\ndef {name}("
    if src.count(head) != 1:
        raise ValueError(f"explore49 edit {name!r} occurs {src.count(head)} times in decode_attention.py (needs 1)")
    start = src.index(head)
    return src[start:src.index("\n\n\n", start) + 1]


def qknorm_source(src: str) -> str:
    """`src` (lowlat/kernels/decode_attention.py's text) with explore49's edits (production's `_split_partial`
    replaced whole by SPLIT_PARTIAL, the helpers before it, then EDITS); ValueError naming the edit that does not
    occur exactly once (production changed: update EDITS)."""
    src = src.replace(function_text(src, "_split_partial"), HELPERS + SPLIT_PARTIAL)
    for name, old, new in EDITS:
        n = src.count(old)
        if n != 1:
            raise ValueError(f"explore49 edit {name!r} occurs {n} times in decode_attention.py (needs 1): "
                             f"{old.strip()[:80]!r}")
        src = src.replace(old, new)
    return src


def load_variant(name: str = "decode_attention_qknorm", src: str | None = None):
    """The edited lowlat.kernels.decode_attention (`qknorm_source`, of `src` or the tree's text) as module `name`."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _common import module_from_source

    return module_from_source(name, qknorm_source(PRODUCTION.read_text() if src is None else src))


# ----------------------------------------------------------------------------------------------- GPU timing
ROWS = (1, 6, 16)
CTXS = (512, 4096)


def time_case(var, cfg, m: int, ctx: int, dev) -> dict:
    """production / qknorm / qknorm_wb at m decode rows (each its own request, ctx cached tokens) of Qwen3's heads,
    over R rotated copies (`rotation_copies` of the bytes one launch moves): copy i's requests read old slots
    1 + i m L .. and their new slot from the production block (final K) or the variant block (raw K)."""
    import torch

    from _common import max_rel_diff, time_alternated
    from bench_decode_attention import bytes_moved
    from lowlat.benchmarking import rotation_copies
    from lowlat.kernels import decode_attention as prod
    from lowlat.kernels.attn_prologue import rope_table
    from lowlat.reference.rms_norm import rms_norm
    from lowlat.reference.rope import apply_rope, rope_cos_sin, rope_inv_freq

    hq, hkv, d, eps = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, float(cfg.rms_eps)
    nbytes = bytes_moved(hq, hkv, d, m, ctx)
    r = rotation_copies(nbytes)
    L = ctx + 1
    old = r * m * L
    kc = torch.randn(old + 2 * r * m + 1, hkv, d, device=dev).bfloat16()
    vc = torch.randn_like(kc)
    table = rope_table(cfg, 8192, dev)
    qn = (1 + 0.2 * torch.randn(d, device=dev)).bfloat16()
    kn = (1 + 0.2 * torch.randn(d, device=dev)).bfloat16()
    req = torch.arange(m, dtype=torch.int32, device=dev)
    pos = torch.full((m,), ctx, dtype=torch.int64, device=dev)
    nvalid = torch.full((1,), m, dtype=torch.int32, device=dev)
    pts, locs = {"p": [], "v": []}, {"p": [], "v": []}
    for i in range(r):
        pt = torch.arange(1 + i * m * L, 1 + (i + 1) * m * L, dtype=torch.int32, device=dev).view(m, L)
        for key, off in (("p", old + 1), ("v", old + 1 + r * m)):
            loc = torch.arange(off + i * m, off + (i + 1) * m, dtype=torch.int32, device=dev)
            p2 = pt.clone()
            p2[:, ctx] = loc
            pts[key].append(p2)
            locs[key].append(loc)
    # production's new slots hold the final K of the variant's raw K (the write-back's transform) and the same V
    kc[old + 1 + r * m:] = (torch.randn(r * m, hkv, d, device=dev) * 3 + 0.5).bfloat16()
    kc[old + 1: old + 1 + r * m] = kc[old + 1 + r * m:]
    vc[old + 1: old + 1 + r * m] = vc[old + 1 + r * m:]
    for i in range(r):
        var.k_writeback(kc, locs["p"][i], pos, m, kn, table, eps)
    qraw = [(torch.randn(m, hq, d, device=dev) * 3).bfloat16() for _ in range(r)]
    # production's q: the reference's QK-norm and RoPE in fp32, rounded once to bf16 (as the prologue does)
    inv_freq = rope_inv_freq(d, cfg.rope_theta, cfg.rope_scaling, torch.float32).to(dev)
    cos, sin = rope_cos_sin(pos, inv_freq, torch.float32)
    qfin = [apply_rope(rms_norm(q.float(), qn.float(), eps), cos, sin).bfloat16() for q in qraw]
    outs = {v: [torch.empty(m, hq, d, dtype=torch.bfloat16, device=dev) for _ in range(r)]
            for v in ("production", "qknorm", "qknorm_wb")}
    wsp = prod.make_decode_workspace(m, hq, hkv, d, dev)
    wsv = var.make_decode_workspace(m, hq, hkv, d, dev)
    qk = (qn, kn, table, eps)
    pre = prod.pre_kv_fits(prod.MAX_SPLITS * hkv * m, d, hq // hkv, m, dev)

    def production(i):
        prod.decode_attention(qfin[i], kc, vc, pts["p"][i], req, pos, nvalid, out_cache_loc=locs["p"][i],
                              out=outs["production"][i], workspace=wsp, use_pdl=True)

    def qknorm(i, key="qknorm"):
        var.decode_attention(qraw[i], kc, vc, pts["v"][i], req, pos, nvalid, out_cache_loc=locs["v"][i],
                             out=outs[key][i], workspace=wsv, use_pdl=True, qk_norm=qk)

    def qknorm_wb(i):
        qknorm(i, "qknorm_wb")
        var.k_writeback(kc, locs["v"][i], pos, nvalid, kn, table, eps, use_pdl=True)

    production(0)
    qknorm(0)
    torch.cuda.synchronize()
    diff = max_rel_diff(outs["qknorm"][0], outs["production"][0])
    nan = bool(outs["qknorm"][0].isnan().any())
    times = time_alternated({"production": production, "qknorm": qknorm, "qknorm_wb": qknorm_wb}, r)
    return dict(rows=m, ctx=ctx, copies=r, pre_kv=pre, bytes=nbytes, max_rel_diff_vs_production=round(diff, 4),
                nan=nan, times=times)


def time_main(out: str | None, rows, ctxs) -> None:
    import torch

    from _common import times_line, write_results
    from lowlat.config import preset

    sys.path.insert(0, str(ROOT / "bench"))
    dev = torch.device("cuda")
    cfg = preset("Qwen3-30B-A3B")
    var = load_variant()
    results = []
    for ctx in ctxs:
        for m in rows:
            try:
                res = time_case(var, cfg, m, ctx, dev)
            except Exception as exc:                                       # noqa: BLE001
                torch.cuda.synchronize()
                res = dict(rows=m, ctx=ctx, error=f"{type(exc).__name__}: {exc}"[:400])
                print(f"rows {m} ctx {ctx}: {res['error']}", flush=True)
            else:
                print(f"rows {m:2d} ctx {ctx:5d} pre_kv {res['pre_kv']!s:5} "
                      f"rel_diff {res['max_rel_diff_vs_production']}"
                      f" nan {res['nan']}  {times_line(res['times'])}", flush=True)
            results.append(res)
            write_results(out, results, explore="explore49", model="Qwen3-30B-A3B",
                          method="CUDA graph of R launches on rotated copies, PDL, A B C C B A (time_alternated)")
            torch.cuda.empty_cache()


# ----------------------------------------------------------------------------------------------- sm_90 compile
def sm90_spec(pre_kv: bool, qk: bool) -> dict:
    """The attention kernel's compile spec as the fused model launches it at Qwen3-30B-A3B's heads (G 8, D 128, one
    program per split, PDL, nvalid a tensor, M <= 16), with or without the QK_NORM edit."""
    from lowlat.kernels.decode_attention import BLOCK_N, COMBINE_CHUNK, MAX_SPLITS

    consts = dict(G=8, G_PAD=16, D=128, BLOCK_N=BLOCK_N, MAX_SPLITS=MAX_SPLITS, GROUPS=MAX_SPLITS, CHUNK=COMBINE_CHUNK,
                  NVR_FROM_PTR=True, PRE_KV=pre_kv, LOC_PAD=16, USE_PDL=True, TRIGGER_AFTER_KV=True, INTERP=False)
    pointers = dict(q_ptr="*bf16", kc_ptr="*bf16", vc_ptr="*bf16", pt_ptr="*i32", req_ptr="*i32", pos_ptr="*i64",
                    nvr_ptr="*i32", loc_ptr="*i32", o_ptr="*bf16", wso_ptr="*fp32", wsml_ptr="*fp32", cnt_ptr="*i32")
    scalars = {"qk_scale": "fp32"}
    if qk:
        consts.update(QK_NORM=True, NEW_PAD=16)
        pointers.update(qn_ptr="*bf16", kn_ptr="*bf16", tab_ptr="*fp32")
        scalars.update(eps="fp32")
    return {"constexprs": consts, "pointers": pointers, "scalars": scalars, "launch_pdl": True, "num_stages": 3,
            "divisible": ["stride_qm", "stride_qh", "stride_kcs", "stride_kch", "stride_vcs", "stride_vch",
                          "stride_om", "stride_oh"]}


def sm90_main(out: str | None) -> list:
    """Production and the variant (and the write-back kernel) compiled for sm_90 on this machine: registers,
    spill bytes, shared memory (TRITON_INTERPRET must be unset)."""
    if os.environ.get("TRITON_INTERPRET"):
        raise SystemExit("--sm90 compiles: run it with TRITON_INTERPRET unset (env -u TRITON_INTERPRET ...)")
    sys.path.insert(0, str(ROOT / "tests" / "unit"))
    from compile_sm90 import compile_for_sm90

    from lowlat.kernels import decode_attention as prod

    var = load_variant()
    table = []
    for label, pre_kv in (("rows 1 (pre_kv)", True), ("rows 6 / 16 (no pre_kv)", False)):
        for name, fn, qk in (("production", prod._decode_attention_kernel, False),
                             ("qknorm", var._decode_attention_kernel, True)):
            info = compile_for_sm90(fn, sm90_spec(pre_kv, qk))
            row = dict(kernel=name, case=label, registers=info["registers"], spill_bytes=info["spill_bytes"],
                       shared=info["shared"])
            table.append(row)
            print("  " + " ".join(f"{k} {v}" for k, v in row.items()), flush=True)
    wb = {"constexprs": dict(HKV_PAD=4, D=128, NVR_FROM_PTR=True, USE_PDL=True, INTERP=False),
          "pointers": dict(kc_ptr="*bf16", loc_ptr="*i32", pos_ptr="*i64", nvr_ptr="*i32", kn_ptr="*bf16",
                           tab_ptr="*fp32"), "scalars": {"eps": "fp32"}, "launch_pdl": True,
          "divisible": ["stride_kcs", "stride_kch"]}
    info = compile_for_sm90(var._k_writeback_kernel, wb)
    row = dict(kernel="k_writeback", case="Hkv 4", registers=info["registers"], spill_bytes=info["spill_bytes"],
               shared=info["shared"])
    table.append(row)
    print("  " + " ".join(f"{k} {v}" for k, v in row.items()), flush=True)
    if out:
        import json

        import triton
        with open(out, "w") as f:
            json.dump(dict(device="none: compiled for sm_90 on the CPU", triton=triton.__version__,
                           model="Qwen3-30B-A3B", results=table), f, indent=1)
    return table


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=None)
    ap.add_argument("--rows", type=int, nargs="+", default=list(ROWS))
    ap.add_argument("--ctxs", type=int, nargs="+", default=list(CTXS))
    ap.add_argument("--sm90", action="store_true", help="no GPU: compile production and the variant for sm_90")
    a = ap.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    sys.path.insert(0, str(ROOT))
    if a.sm90:
        sm90_main(a.out)
    else:
        time_main(a.out, a.rows, a.ctxs)


if __name__ == "__main__":
    main()
