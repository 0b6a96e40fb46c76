"""The attention prologue with its QKV weights held in registers across the PDL wait (Gluon, sm_90, GPU only).

Matches `lowlat.reference.attn_prologue.attn_prologue` for the Llama family (no QKV bias, no QK-norm; QK-norm models
launch the same kernel with QK_NORM through `attn_prologue_cluster`, whose docstring says how):

    rstd     = 1 / sqrt(sum_k x[m, k]^2 / H + eps)                               fp32
    lo, hi   = rstd * sum_k bf16(W[row, k] g[k]) x[m, k]                          fp32 (mma.sync, bf16 operands)
    q, k     = (lo cos - hi sin, hi cos + lo sin)      cos / sin: `attn_prologue.rope_table` rows at positions
    q -> out_q [M, Hq, D] (every row); k, v -> k_cache / v_cache [out_cache_loc] (rows < num_valid_rows)

where g is the RMSNorm weight and (lo, hi) the two RoPE partners of a rotary index (rows head D + j and head D + D/2
+ j of the packed weight, `attn_prologue.pack_qkv`). Same formulas as `kernels/attn_prologue.py` except where g is
applied: here it is multiplied into the weights (one bf16 rounding of W g: in registers before the wait, or once at
build time by `fold_attn_norm`, the same bits), there into x (one rounding of x g, after the wait).

Why a second prologue: the split-K prologue pays its reduction's chain (arrival, partial loads, finisher) after the
PDL wait, ~4-5 us at Llama-3.2-1B's 12.6 MB of weights (7.8 us per kernel at 1 row, 38% of copy bandwidth). Here each
program loads its whole weight slice straight into mma.sync A-operand registers (no shared memory) BEFORE the wait,
with the first row block's positions, KV slots and cos / sin (step inputs: copied in before the step, never written
by a launch of it), so that after the wait one round trip (x) precedes the mma chain and the stores. Measured per
kernel (PDL-chained over rotating cold copies, `bench/explore/explore34.py`, session 25 call 3,
bench/results/session25/call3/explore34.json): 4.47 / 4.75 / 6.58 / 13.75 us at 1 / 6 / 16 / 48 rows against the
split-K prologue's 7.83 / 8.15 / 8.27 / 16.16 in the same run (67% of copy bandwidth at 1 row against 38%). This
launcher (call 4, `bench/bench_attn_prologue.py --models Llama-3.2-1B --rows 1 6 16 48`, one run): 4.50 / 4.67 / 6.59 /
13.94 us with g multiplied in registers (FusedModel's form since session 26, `fused_model.HELD_FOLD`), 4.69 / 5.64 /
6.38 / 13.92 on `fold_attn_norm`'s weights, against 7.75 / 8.02 / 8.16 / 16.01. Session 27 (explore36, call 4,
bench/results/session27/call4) moved the statistic's cross-warp sum into the partials' pass: 4.35-4.40 / 4.59-4.64 /
6.27-6.29 us at 1 / 6 / 16 rows against 4.41-4.45 / 4.71-4.72 / 6.58-6.59 before (68-69% of copy bandwidth at 1 row).

Tiling (fixed: a row's arithmetic must not depend on M): program p takes the 8 RoPE pairs p0..p0+7 (p0 = 8 p) of one
head, i.e. 16 weight rows (the mma's m: tile row t < 8 the lower-half row, t + 8 its upper partner, so a thread of
the mma accumulator holds both partners); 4 warps, H cut into 4 slices of H / 4 columns (one a warp, a batched
mma_v2 over [4, 16, H / 4] weights and [4, H / 4, 8] x), rows in blocks of 8 (the mma's n; masked rows zero), the
4 slices' partials summed in slice order through shared memory (each warp's sum of squares of its x slice with them:
one barrier after the wait), every block the same instructions: a row's output is
bitwise independent of M and of the other rows (row invariant), not the split-K prologue's bits. Weights per thread:
16 H / 128 bf16 (H 2048: 128 registers), hence H <= 2048 (`held_prologue_supported`).
"""

from __future__ import annotations

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import mma_v2

from lowlat.config import ModelConfig
from lowlat.errors import StepContractError
from lowlat.kernels._attn_common import (check_early_release, check_tensor, gluon_sm90_reason, pdl_release_early,
                                         pdl_supported, pdl_wait_then_release, require_runnable)
from lowlat.kernels._gemv import MAX_ROWS
from lowlat.kernels.attn_prologue import _check_values, check_prologue_writes, check_qkv_and_caches, check_rows_inputs

WARPS = 4          # warps a program
SLICES = 4         # K slices (one a warp)
ROW_BLOCK = 8      # rows a block (the mma's n)
MAX_HIDDEN = 2048  # 16 H / 128 bf16 weights a thread: 128 registers at 2048 (254-255 in all with g multiplied in
#                    registers, 166-216 on folded weights, no spill: sm_90 ptxas)
MIN_HIDDEN = 256   # H / 4 >= 64 columns a slice: narrower slices are replicated in the mma operand layout (the sm_90
#                    PTX loads the weights 2-4 times at H 64-128), a form the GPU tests do not cover


#: The paced form (`attn_prologue_held(..., pace=True)` on folded weights with early_release under PDL at 1 row):
#: the weights in chunks of PACE_COLUMNS columns of each K slice, at most PACE_WINDOW in flight a thread (so at H
#: >= 1024: more chunks than the window), maxnreg PACE_MAXNREG
#: (three programs an SM: 396 slots hold two launches of Llama-3.2-1B's 192). Why: a launch's x (loaded after its
#: wait) queues behind the next launch's weight requests, ~2 us on the H200 when all 64 KB a program are requested at
#: once (session 38's stamps); a window of 16 KB a program keeps the stream's bandwidth and shortens that queue.
#: Session 39 (bench/explore/explore56.py `c8w2_early_x2`, per kernel, H100, Llama-3.2-1B, 1 row): 4.76-4.96 us
#: against production's 4.97-5.21 in the same runs (calls 2-4); 32-column chunks were faster (4.59-4.72) but give
#: other bits than the one-call mma of 2+ row blocks (64-column chunks: the same bits), and the windows 1 and 3 of 8
#: chunks slower. At 6 / 8 rows the same form was slower than production (5.54-5.64 / 5.77-5.81 against 5.32-5.46 /
#: 5.45-6.34 us, calls 2-3), and at 3 / 4 rows too (session 40 call 3; at 2 rows 4.98-5.01 against 5.04-5.22): hence
#: 1 row only (PACE_MAX_ROWS). On the H100 the paced form is 4.98 us at 1 row against held_pdl's 5.18 in
#: `bench_attn_prologue.py` (session 40 call 1); in the decode step (explore26) it gained nothing.
PACE_COLUMNS = 64
PACE_MAX_ROWS = 1
PACE_WINDOW = 2
PACE_MAXNREG = 168
#: With pace=True, folded weights (attn_norm None) outside the paced form run the g-multiplied form with g = 1:
#: bf16(w 1) = w, the same bits, and ptxas's schedule of that form; the FOLD_G-off build trickles x's loads between the
#: mma at 2+ row blocks (session 39 call 4, explore56 `prod_f1` / `prod_f`, H100, Llama-3.2-1B, 16 / 48 rows:
#: 7.16-7.20 / 13.85-14.08 us with g = 1, 10.94-10.98 / 14.48-14.52 without; production 7.13-7.17 / 13.85-14.04).
_ONES: dict = {}


def _ones(hidden: int, device: torch.device) -> torch.Tensor:
    """A cached [hidden] bf16 tensor of ones on `device` (the folded weights' g). Made on first use, which must not be
    under CUDA-graph capture (its fill would only be recorded, and another graph could read it unfilled): raises
    StepContractError there (FusedModel and `benchmarking.capture_graph` run every launch eagerly first)."""
    key = (str(device), hidden)
    if key not in _ONES:
        if torch.device(device).type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise StepContractError("attn_prologue_held(pace=True) on folded weights: launch it once outside "
                                    f"CUDA-graph capture first (its ones vector of H={hidden} is made then)")
        _ONES[key] = torch.ones(hidden, dtype=torch.bfloat16, device=device)
    return _ONES[key]


def held_prologue_supported(cfg: ModelConfig, device: torch.device | str) -> str | None:
    """None where `attn_prologue_held` runs this model's prologue, else why not (the first reason found, the model's
    before the device's): it needs no QKV bias, no QK-norm, a head_dim that is a power of two in 16..128, a hidden
    size H that is a power of two in 256..2048 and a CUDA device of compute capability >= 9.0 (not the Triton
    interpreter: Gluon kernels do not run there)."""
    return held_prologue_model_reason(cfg) or gluon_sm90_reason(device)


def held_prologue_model_reason(cfg: ModelConfig) -> str | None:
    """`held_prologue_supported`'s reasons of the model alone (None: the model's shapes are taken; the device is not
    asked), e.g. for the CPU compile check of what FusedModel runs on an sm_90 GPU."""
    h, d = cfg.hidden_size, cfg.head_dim
    if cfg.qkv_bias or cfg.qk_norm:
        return "QKV bias / QK-norm: not in this kernel (the Llama family's prologue only)"
    if d & (d - 1) or not 16 <= d <= 128:
        return f"head_dim {d}: needs a power of two in 16..128 (the GPU tests' range)"
    if h & (h - 1) or not MIN_HIDDEN <= h <= MAX_HIDDEN:
        return f"hidden_size {h}: needs a power of two in {MIN_HIDDEN}..{MAX_HIDDEN} (weights held in registers)"
    return None


def fold_attn_norm(qkv_weight: torch.Tensor, attn_norm: torch.Tensor) -> torch.Tensor:
    """bf16(W g): the packed QKV weight [N, H] with the RMSNorm weight [H] multiplied into its columns, each product
    rounded once to bf16 (round to nearest even), exactly what `attn_prologue_held` computes in registers when given
    attn_norm; passing this weight with attn_norm=None gives the same bits and saves the kernel g's loads. bf16
    tensors on one device; raises StepContractError for other dtypes or shapes."""
    check_tensor("qkv_weight", qkv_weight, dtype=torch.bfloat16, ndim=2)
    check_tensor("attn_norm", attn_norm, dtype=torch.bfloat16, ndim=1, shape=(("H", qkv_weight.shape[1]),),
                 device=qkv_weight.device)
    return (qkv_weight.float() * attn_norm.float()).to(torch.bfloat16).contiguous()


@gluon.jit
def _rope_inputs(pos_ptr, loc_ptr, tab_ptr, erow, M, nvr, max_pos, j, D: gl.constexpr, HALF: gl.constexpr):
    """Rows erow's KV slots (int64; 0 past M or num_valid_rows) and the cos / sin [8, RB] of rotary indices j at
    their positions (0 past M or outside the table)."""
    emok = erow < M
    pos = gl.load(pos_ptr + erow, mask=emok, other=0)
    loc = gl.load(loc_ptr + erow, mask=emok & (erow < nvr), other=0).to(gl.int64)
    ok = gl.expand_dims(emok & (pos >= 0) & (pos < max_pos), 0) & gl.expand_dims(j >= 0, 1)
    tab = tab_ptr + gl.expand_dims(pos, 0) * D + gl.expand_dims(j, 1)
    return loc, gl.load(tab, mask=ok, other=0.0), gl.load(tab + HALF, mask=ok, other=0.0)


@gluon.jit
def _zero_after(v, zero):
    """int32 v & zero an element (v int16, zero a runtime int 0): 0, but only once v has landed, so that an address
    offset by it makes its load wait for v's (the paced weight stream's window)."""
    return gl.inline_asm_elementwise("{ .reg .b32 t; cvt.u32.u16 t, $1; and.b32 $0, t, $2; }", "=r,h,r", [v, zero],
                                     dtype=gl.int32, is_pure=True, pack=1)


@gluon.jit
def _store_cg_f32(ptr, val):
    """st.global.cg of an fp32 an element (straight to L2, where the cluster's other programs read it); returns 0 an
    element, opaque, so that what is offset by it comes after the store."""
    return gl.inline_asm_elementwise("st.global.cg.f32 [$1], $2; mov.u32 $0, 0;", "=r,l,r",
                                     [ptr.to(gl.int64, bitcast=True), val], dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def _cluster_barrier(dep, size):
    """Trap unless the launch's clusters have `size` programs (`attn_prologue_cluster.launch_as_clusters` not taken:
    a plain launch would sum another head's programs), then every thread of the cluster arrives (release: its stores
    before it visible to the cluster) and waits (acquire); returns 0 an element of dep, opaque (loads offset by it stay
    after the barrier). dep must hold one element a thread (one barrier a thread)."""
    return gl.inline_asm_elementwise(
        "{ .reg .pred p; .reg .b32 n; mov.u32 n, %cluster_nctarank; setp.ne.u32 p, n, $2; @p trap; "
        "barrier.cluster.arrive.release.aligned; barrier.cluster.wait.acquire.aligned; mov.u32 $0, 0; }",
        "=r,r,r", [dep, dep * 0 + size], dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def _held_prologue_kernel(x_ptr, w_ptr, g_ptr, tab_ptr, pos_ptr, loc_ptr, nvr_ptr, nvr_int, q_ptr,
                          stride_qm, stride_qh, kc_ptr, stride_kcs, stride_kch, vc_ptr, stride_vcs, stride_vch,
                          M, Hq, Hkv, max_pos, eps, K: gl.constexpr, D: gl.constexpr, NMB: gl.constexpr,
                          NVR_FROM_PTR: gl.constexpr, USE_PDL: gl.constexpr, FOLD_G: gl.constexpr = True,
                          Q: gl.constexpr = 4, S: gl.constexpr = 4, RB: gl.constexpr = 8,
                          PACE: gl.constexpr = 0, PACE_WIN: gl.constexpr = 2, zero=0,
                          QK_NORM: gl.constexpr = False, qnorm_ptr=0, knorm_ptr=0, hsum_ptr=0,
                          CHUNK_STAT: gl.constexpr = False,
                          EARLY_RELEASE: gl.constexpr = False):
    """See the module docstring. Grid (Hq + 2 Hkv) D / 16 programs of Q warps; NMB = ceil(M / RB) row blocks; x
    contiguous (row stride K: a runtime stride cost the 2-row-block launch 12 bytes of spills at K 2048). FOLD_G:
    multiply g into the weights here (else w is `fold_attn_norm`'s, g unread). EARLY_RELEASE: the next launch
    released at the program's start, not after the wait (`attn_prologue_held`'s early_release). PACE > 0 (folded
    weights; one row block from `attn_prologue_held`, every count from `attn_prologue_cluster`): the weights loaded
    in PACE chunks of each slice's K, chunk c's addresses offset by `_zero_after` of chunk c - PACE_WIN's values
    (zero: a runtime 0), so that a thread has at most PACE_WIN chunks in flight; x is loaded whole (the statistic)
    and in the same chunks, and the mma runs chunk after chunk (64-column chunks: the same k16 steps in the same
    order as the one call, the same bits; 32-column chunks' operand layout gives others). The unpaced form's
    whole-slice weight load and mma, kept in the source beside the paced ones, then have no use and are not compiled
    (dead code; the sm_90 CPU test checks the loads before the wait).
    QK_NORM (`attn_prologue_cluster`: Qwen3's QK-norm; launched as clusters of a head's HALF / 8 programs): the q / k
    norm weights of the program's rows (qnorm_ptr / knorm_ptr [D]) loaded before the wait; per row block a q / k
    program stores the sum of its 16 outputs' squares (after x's rstd) to hsum_ptr [programs, NMB, RB] (fp32, .cg),
    syncs the cluster, adds its head's partial sums in program order and scales y by rstd_head q_norm|k_norm before
    RoPE (the split-K prologue's formulas). CHUNK_STAT (with PACE): x's statistic summed chunk by chunk, not from x
    loaded whole (whose load is then dead)."""
    pdl_release_early(USE_PDL, EARLY_RELEASE)
    HALF: gl.constexpr = D // 2
    MMA: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[Q, 1, 1], instr_shape=[1, 16, 8])
    LA: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=MMA, k_width=8)
    LB: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=MMA, k_width=8)
    LE3: gl.constexpr = gl.BlockedLayout([1, 1, 1], [1, 4, 8], [1, Q, 1], [2, 1, 0])   # [1, 8, RB]: a half
    LE: gl.constexpr = gl.SliceLayout(0, LE3)                                       # [8, RB]
    KQ: gl.constexpr = K // S
    p0 = gl.program_id(0) * 8
    hd = p0 // HALF                                   # head of the packed weight: q heads, then k, then v
    j0 = p0 % HALF
    aq = gl.arange(0, S, layout=gl.SliceLayout(1, gl.SliceLayout(2, LA)))
    at = gl.arange(0, 16, layout=gl.SliceLayout(0, gl.SliceLayout(2, LA)))
    ak = gl.arange(0, KQ, layout=gl.SliceLayout(0, gl.SliceLayout(1, LA)))
    wrow = hd * D + j0 + at % 8 + (at // 8) * HALF
    acol = gl.expand_dims(gl.expand_dims(aq, 1), 2) * KQ + gl.expand_dims(gl.expand_dims(ak, 0), 1)   # [S, 1, KQ]
    aoff = gl.expand_dims(gl.expand_dims(wrow, 0), 2) * K + acol
    bq = gl.arange(0, S, layout=gl.SliceLayout(1, gl.SliceLayout(2, LB)))
    bk = gl.arange(0, KQ, layout=gl.SliceLayout(0, gl.SliceLayout(2, LB)))
    bm = gl.arange(0, RB, layout=gl.SliceLayout(0, gl.SliceLayout(1, LB)))
    bcol = gl.expand_dims(gl.expand_dims(bq, 1), 2) * KQ + gl.expand_dims(gl.expand_dims(bk, 0), 2)   # [S, KQ, 1]
    boff = gl.expand_dims(gl.expand_dims(bm, 0), 1) * K + bcol
    ti = gl.arange(0, 8, layout=gl.SliceLayout(1, LE))
    tm = gl.arange(0, RB, layout=gl.SliceLayout(0, LE))
    jj = gl.expand_dims(j0 + ti, 1)
    part = gl.allocate_shared_memory(gl.float32, [S, 16, RB], gl.SwizzledSharedLayout(1, 1, 1, [2, 1, 0]))
    ssp = gl.allocate_shared_memory(gl.float32, [S, RB], gl.SwizzledSharedLayout(1, 1, 1, [1, 0]))
    is_q = hd < Hq
    is_v = hd >= Hq + Hkv
    kvh = gl.where(is_v, hd - Hq - Hkv, hd - Hq)
    # before the wait: the weights with g multiplied in (held: [S, 16, KQ] in the A layout), the step inputs
    w = gl.load(w_ptr + aoff)
    if FOLD_G:
        w = (w.to(gl.float32) * gl.load(g_ptr + acol + 0 * aoff).to(gl.float32)).to(gl.bfloat16)
    gl.static_assert(PACE > 0 or not CHUNK_STAT, "CHUNK_STAT: the paced form's chunks")
    if PACE > 0:
        gl.static_assert(not FOLD_G, "PACE: folded weights")
        KC: gl.constexpr = KQ // PACE
        akc = gl.arange(0, KC, layout=gl.SliceLayout(0, gl.SliceLayout(1, LA)))
        aoffc = gl.expand_dims(gl.expand_dims(wrow, 0), 2) * K + gl.expand_dims(gl.expand_dims(aq, 1), 2) * KQ + \
            gl.expand_dims(gl.expand_dims(akc, 0), 1)                               # [S, 16, KC]
        ws = ()
        for c in gl.static_range(PACE):
            off = aoffc + c * KC
            if c >= PACE_WIN:   # 0, once chunk c - PACE_WIN has landed; the offsets stay 8-wide vectors (16 bytes)
                off = gl.max_contiguous(gl.multiple_of(
                    off + _zero_after(ws[c - PACE_WIN].to(gl.int16, bitcast=True), zero), [1, 1, 8]), [1, 1, 8])
            ws = ws + (gl.load(w_ptr + off),)
        bkc = gl.arange(0, KC, layout=gl.SliceLayout(0, gl.SliceLayout(2, LB)))
        boffc = gl.expand_dims(gl.expand_dims(bm, 0), 1) * K + gl.expand_dims(gl.expand_dims(bq, 1), 2) * KQ + \
            gl.expand_dims(gl.expand_dims(bkc, 0), 2)                               # [S, KC, RB]
    if NVR_FROM_PTR:
        nvr = gl.load(nvr_ptr)
    else:
        nvr = nvr_int
    loc0, cos0, sin0 = _rope_inputs(pos_ptr, loc_ptr, tab_ptr, tm, M, nvr, max_pos, j0 + ti, D, HALF)
    if QK_NORM:                                       # the q / k norm weights of the program's 16 rows
        nrm = gl.where(is_q, qnorm_ptr, knorm_ptr) + j0 + ti
        nrm_lo = gl.expand_dims(gl.load(nrm).to(gl.float32), 1)
        nrm_hi = gl.expand_dims(gl.load(nrm + HALF).to(gl.float32), 1)
        PH: gl.constexpr = HALF // 8                  # programs a head: one cluster
        first = hd * PH
    pdl_wait_then_release(USE_PDL, EARLY_RELEASE)
    for b in gl.static_range(NMB):
        brow = b * RB + bm
        bmask = gl.expand_dims(gl.expand_dims(brow < M, 0), 1) & (boff >= 0)
        xb = gl.load(x_ptr + b * RB * K + boff, mask=bmask, other=0.0)
        if PACE > 0:
            cmask = gl.expand_dims(gl.expand_dims(brow < M, 0), 1) & (boffc >= 0)
            xs = ()
            for c in gl.static_range(PACE):
                xs = xs + (gl.load(x_ptr + b * RB * K + boffc + c * KC, mask=cmask, other=0.0),)
        erow = b * RB + tm
        if b == 0:
            loc, cos, sin = loc0, cos0, sin0
        else:
            loc, cos, sin = _rope_inputs(pos_ptr, loc_ptr, tab_ptr, erow, M, nvr, max_pos, j0 + ti, D, HALF)
        xf = xb.to(gl.float32)
        # each warp's share of the statistic [S, RB], stored beside its mma partials and added in slice order after
        # the same barrier: one cross-warp pass after the wait, not a reduction of its own first (session 27,
        # explore36: q observed bitwise equal to the two-pass form's, -0.05 / -0.1 / -0.3 us at 1 / 6 / 16 rows; its
        # slice order need not be the cross-warp gl.sum's, so equal bits are not guaranteed, and nothing relies on them)
        ssw = gl.sum(xf * xf, axis=1)
        acc = mma_v2(w, xb, gl.zeros([S, 16, RB], gl.float32, MMA))
        if PACE > 0:
            if CHUNK_STAT:                            # x's statistic chunk by chunk (x loaded whole unused)
                xc = xs[0].to(gl.float32)
                ssw = gl.sum(xc * xc, axis=1)
                for c in gl.static_range(1, PACE):
                    xc = xs[c].to(gl.float32)
                    ssw += gl.sum(xc * xc, axis=1)
            acc = gl.zeros([S, 16, RB], gl.float32, MMA)
            for c in gl.static_range(PACE):
                acc = mma_v2(ws[c], xs[c], acc)
        if b > 0:
            gl.thread_barrier()                                                     # the last block's reads done
        part.store(acc)
        ssp.store(ssw)
        gl.thread_barrier()
        lo3 = gl.zeros([1, 8, RB], gl.float32, LE3)
        hi3 = gl.zeros([1, 8, RB], gl.float32, LE3)
        for sl in gl.static_range(S):                                               # the slices in order
            lo3 += part.slice(sl, 1, dim=0).slice(0, 8, dim=1).load(LE3)
            hi3 += part.slice(sl, 1, dim=0).slice(8, 8, dim=1).load(LE3)
        ss2 = ssp.slice(0, 1, dim=0).load(LE)
        for sl in gl.static_range(1, S):                                            # the slices in order
            ss2 += ssp.slice(sl, 1, dim=0).load(LE)
        rstd = 1.0 / gl.sqrt(ss2 / K + eps)                                         # [1, RB]
        lo = gl.sum(lo3, axis=0) * rstd                                             # (a size-1 axis: exact)
        hi = gl.sum(hi3, axis=0) * rstd
        if QK_NORM:
            if not is_v:                              # a whole head (cluster) takes this branch or none does
                dep = _store_cg_f32(hsum_ptr + (gl.program_id(0) * NMB + b) * RB + tm,
                                    gl.sum(lo * lo + hi * hi, axis=0))
                dep = _cluster_barrier(dep, PH)
                hs = gl.load(hsum_ptr + (first * NMB + b) * RB + tm + dep, cache_modifier=".cg")
                for r in gl.static_range(1, PH):      # the head's programs in order
                    hs += gl.load(hsum_ptr + ((first + r) * NMB + b) * RB + tm + dep, cache_modifier=".cg")
                rh = gl.expand_dims(1.0 / gl.sqrt(hs / D + eps), 0)
                lo = lo * rh * nrm_lo
                hi = hi * rh * nrm_hi
        rlo = gl.where(is_v, lo, lo * cos - hi * sin).to(gl.bfloat16)
        rhi = gl.where(is_v, hi, hi * cos + lo * sin).to(gl.bfloat16)
        emask = gl.expand_dims(erow < M, 0) & gl.expand_dims(ti >= 0, 1)
        qp = q_ptr + gl.expand_dims(erow, 0).to(gl.int64) * stride_qm + hd * stride_qh + jj
        gl.store(qp, rlo, mask=emask & is_q)
        gl.store(qp + HALF, rhi, mask=emask & is_q)
        wmask = emask & gl.expand_dims(erow < nvr, 0) & (hd >= Hq)
        kvp = gl.where(is_v, vc_ptr + gl.expand_dims(loc, 0) * stride_vcs + kvh * stride_vch,
                       kc_ptr + gl.expand_dims(loc, 0) * stride_kcs + kvh * stride_kch) + jj
        gl.store(kvp, rlo, mask=wmask)
        gl.store(kvp + HALF, rhi, mask=wmask)


def attn_prologue_held(x: torch.Tensor, qkv_weight: torch.Tensor, attn_norm: torch.Tensor | None,
                       positions: torch.Tensor, out_cache_loc: torch.Tensor, num_valid_rows: int | torch.Tensor,
                       k_cache: torch.Tensor,
                       v_cache: torch.Tensor, cos_sin_table: torch.Tensor, *, cfg: ModelConfig,
                       out_q: torch.Tensor | None = None, use_pdl: bool = False,
                       check_values: bool = False, early_release: bool = False, pace: bool = False) -> torch.Tensor:
    """RMSNorm -> QKV projection -> RoPE -> KV write in one launch, the weights held in registers across the PDL wait.

    Matches `lowlat.reference.attn_prologue.attn_prologue` (numerics policy of lowlat/numerics.py; g multiplied into
    the weights, see the module docstring) for models without QKV bias or QK-norm (`held_prologue_supported`).

    Parameters:
        x             [M, H] bf16 (M = 1..48), contiguous: the layer's input rows (pre-norm)
        qkv_weight    [N, H] bf16 contiguous, N = (Hq + 2 Hkv) D (`attn_prologue.pack_qkv`), or with attn_norm None
                      `fold_attn_norm(pack_qkv(...), attn_norm)` (the norm weight already multiplied in: same bits)
        attn_norm     [H] bf16, or None: qkv_weight MUST then be `fold_attn_norm`'s (the kernel cannot tell; an
                      unfolded weight with None silently drops the norm weight)
        positions     [M] int64 (a position outside the table rotates by cos = sin = 0, as `attn_prologue`)
        out_cache_loc [M] int32, KV slot each valid row writes
        num_valid_rows  int in 0..M, or a 1-element int32 device tensor (read in-kernel, for graphs)
        k_cache, v_cache [S, Hkv, D] bf16, last dim contiguous
        cos_sin_table [P, D] float32 contiguous (`attn_prologue.rope_table`)
        cfg           gives head_dim (D) and rms_eps; head counts come from the shapes (TP shards work)
        out_q         optional preallocated [M, Hq, D] bf16 output (last dim contiguous)
        use_pdl       wait for the previous launch (gdc_wait) after the weight loads, release the next right after it.
                      BEFORE the wait the launch also reads positions, out_cache_loc, a device num_valid_rows and the
                      cos / sin table (the first 8 rows'): the previous launch must not write them (the split-K
                      prologue reads them after its wait). FusedModel copies them in before the step.
        check_values  also check positions (in the table) / out_cache_loc (valid rows' in 1..S-1 and distinct)
                      values (host sync; not under capture)
        early_release (a bool; under PDL) release the next launch at the start of every program instead of right after
                      the wait: the next launch may then start before this launch's predecessor is complete, so it must
                      read before its own wait nothing that predecessor (or any launch of the step before it) writes.
                      FusedModel's successor, `decode_attention`, reads there only the step inputs (positions, request
                      indices, out_cache_loc, num_valid_rows, the page table) and KV slots written by earlier steps.
                      Same bits either way. With g multiplied in registers, slower where measured (Llama-3.2-1B per
                      kernel, session 28's explore39: 5.26 against 4.39 us at 1 row, 29.3 against 13.4 at 48); with pace
                      on folded weights at 1 row and H >= 1024 it runs the paced form (see pace). Off in FusedModel
                      unless named (`FusedModel(early_release=(..., "attn_prologue"))`).
        pace          (a bool) on folded weights (attn_norm None) with early_release under PDL at 1 row and
                      H >= 1024, the paced form (PACE_MAXNREG: three programs an SM; the weights requested a window
                      at a time, so that the next launch's stream leaves room for this launch's x); elsewhere the
                      next launch released after the wait whatever early_release allows (its early release measured
                      slower there, see early_release) and folded weights run the g-multiplied form with g = 1
                      (`_ones`: FOLD_G off trickles x's loads at 2+ row blocks). The same bits as pace=False in every
                      case (GPU tests).
    Returns: q [M, Hq, D] bf16, post-RoPE, every row (padding rows computed like valid ones).
    Mutates: k_cache, v_cache at out_cache_loc[:num_valid_rows]; padding rows write nothing.
    Raises: StepContractError naming the offending tensor / value, nothing launched (out_q allocated at most): M
        outside 1..48, H not cfg.hidden_size, x not contiguous, a tensor of another dtype / shape / device, N not
        (Hq + 2 Hkv) D, num_valid_rows outside 0..M, cfg.rms_eps not a finite float > 0, out_q / k_cache /
        v_cache overlapping one another or an input (`attn_prologue.check_prologue_writes`), with check_values a
        position outside the table or a slot outside 1..S-1 or two valid rows' equal slots, an early_release or
        pace that is not a bool, then a model or device the kernel does not take; with pace on folded weights outside
        the paced form, a first such launch under CUDA-graph capture (`_ones`)
        (`held_prologue_supported`'s reason).
    """
    nvr_int, nvr_t, out_q, hq, hkv = checked_inputs(x, qkv_weight, {"attn_norm": attn_norm}, positions, out_cache_loc,
                                                    num_valid_rows, k_cache, v_cache, cos_sin_table, cfg, out_q,
                                                    check_values)
    m, hidden = x.shape
    d = cfg.head_dim
    n = qkv_weight.shape[0]
    dev = x.device
    check_early_release(early_release)
    if not isinstance(pace, bool):
        raise StepContractError(f"pace={pace!r} must be a bool")
    why = held_prologue_supported(cfg, dev)
    if why is not None:
        raise StepContractError(f"the held prologue cannot run here: {why}")
    pdl = bool(use_pdl) and pdl_supported(dev)
    chunks = hidden // SLICES // PACE_COLUMNS
    paced = pace and attn_norm is None and early_release and pdl and m <= PACE_MAX_ROWS and chunks > PACE_WINDOW
    if pace and not paced:
        early_release = False           # after the wait: the early release measured slower outside the paced form
        if attn_norm is None:           # folded weights times ones: the same bits, the g-multiplied form's schedule
            attn_norm = _ones(hidden, x.device)
    form = dict(zero=0, **(dict(PACE=chunks, PACE_WIN=PACE_WINDOW, maxnreg=PACE_MAXNREG) if paced else {}))
    _held_prologue_kernel[(n // 16,)](
        x, qkv_weight, qkv_weight if attn_norm is None else attn_norm, cos_sin_table, positions, out_cache_loc,
        nvr_t if nvr_t is not None else out_cache_loc, nvr_int, out_q, out_q.stride(0), out_q.stride(1),
        k_cache, k_cache.stride(0), k_cache.stride(1), v_cache, v_cache.stride(0), v_cache.stride(1),
        m, hq, hkv, cos_sin_table.shape[0], float(cfg.rms_eps), K=hidden, D=d, NMB=(m + ROW_BLOCK - 1) // ROW_BLOCK,
        NVR_FROM_PTR=nvr_t is not None, USE_PDL=pdl, FOLD_G=attn_norm is not None, Q=WARPS, S=SLICES, RB=ROW_BLOCK,
        EARLY_RELEASE=early_release, num_warps=WARPS,
        launch_pdl=pdl, **form)
    return out_q


def checked_inputs(x, qkv_weight, norms: dict, positions, out_cache_loc, num_valid_rows, k_cache, v_cache,
                   cos_sin_table, cfg: ModelConfig, out_q, check_values: bool) -> tuple:
    """The held prologues' input checks (`attn_prologue_held`, `attn_prologue_cluster.attn_prologue_cluster`):
    norms {name: a [H] (attn_norm) or [D] (q_norm / k_norm) bf16 weight or None}. Returns (num_valid_rows as an int
    or None, as a device tensor or None, out_q (allocated where None), Hq, Hkv); raises StepContractError as
    `attn_prologue_held` documents, nothing launched."""
    require_runnable("x", x); require_runnable("qkv_weight", qkv_weight)
    dev = x.device if isinstance(x, torch.Tensor) else None
    check_tensor("x", x, dtype=torch.bfloat16, ndim=2, device=dev)
    m, hidden = x.shape
    if not 1 <= m <= MAX_ROWS:
        raise StepContractError(f"x has M={m} rows; the held prologue takes 1..{MAX_ROWS}")
    if hidden != cfg.hidden_size:
        raise StepContractError(f"x has H={hidden} columns; cfg.hidden_size is {cfg.hidden_size}")
    if not x.is_contiguous():
        raise StepContractError(f"x must be contiguous (the kernel takes its row stride to be H), got strides "
                                f"{x.stride()}")
    d = cfg.head_dim
    _, hkv, hq = check_qkv_and_caches(qkv_weight, k_cache, v_cache, hidden, d, dev)
    for name, t in norms.items():
        if t is not None:
            size = ("H", hidden) if name == "attn_norm" else ("D", d)
            check_tensor(name, t, dtype=torch.bfloat16, ndim=1, shape=(size,), device=dev)
    nvr_int, nvr_t, out_q = check_rows_inputs(positions, out_cache_loc, cos_sin_table, num_valid_rows, out_q, m, hq,
                                              d, dev)
    check_prologue_writes(cfg.rms_eps, out_q, k_cache, v_cache,
                          {"x": x, "qkv_weight": qkv_weight, **norms, "positions": positions,
                           "out_cache_loc": out_cache_loc, "cos_sin_table": cos_sin_table, "num_valid_rows": nvr_t})
    if check_values:
        _check_values(positions, out_cache_loc, nvr_int if nvr_t is None else int(nvr_t.item()),
                      cos_sin_table.shape[0], k_cache.shape[0])
    return nvr_int, nvr_t, out_q, hq, hkv

