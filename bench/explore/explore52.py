"""Session 38: Llama-3.2-1B's held attention prologue with its weights held in SHARED MEMORY (TMA, before the PDL
wait) instead of registers, and the next launch released at the program's start.

explore51 (session 38 call 1, H100) measured the chain's structure with a stand-in kernel: holding 12.6 MB of weights
in registers and releasing after the wait (the production prologue's form) gives 5.13-5.57 us a launch (the
production prologue 5.21); releasing at the start does not help there (5.38), but weights held in shared memory by
TMA (64 KB a program, 31 registers: 3 programs an SM) with the release at the start gave **4.33-4.35 us: 98% of the
copy floor (4.24)**, against 5.04 with the release after the wait. Here the production kernel's work is put on that
structure:

    weights   `fold_attn_norm`'s bf16(W g) (the bits production computes in registers), rows permuted at build so that
              program p's 16 rows (8 RoPE pairs of one head: the lower rows, then their partners) are consecutive:
              the TMA view [S, N, K / S] (strides [K / S, K, 1]) in boxes [S, 16, 64], one mbarrier, all issued
              before the wait (8 boxes a program at K 2048, 64 KB)
    release   at the program's start (EARLY) or right after the wait
    after     x's statistic exactly as production (the whole x block, the same sum); the mma in K chunks of 64
              columns, A read from shared memory, accumulating in the same order as production's one mma_v2 call
              (HMMA k-steps in order into one fp32 accumulator); the same epilogue (slices summed in order, rstd,
              RoPE, stores)

So a row's output should be production's bits (checked bitwise here, and within the numerics policy against
float64). Variants: prod (production, release after the wait), tma (release at the start), tma_late (after the
wait). Timed per kernel as the bench times it (`LlamaPrologueCase`, rotated cold copies, PDL), A B C C B A.

Measured (session 38 calls 2-6 H100, 13-14 H200; bench/results/session38): not taken. Every form within the policy,
tma1p bitwise production; none faster than production at 1 row (H200, 10 timings: prod 4.30-4.45, tma1 4.14-4.59
bimodal, median 4.54; tma0 4.87-4.96), 0.5-1.9 us slower at 16 rows. Stamps: lag 1.4-2.9 us, x 1.2-1.9, mma from
shared memory 0.7-1.4. tma1's two modes are a state of the GPU, not of a graph (`--probe`, calls 16-18: the first
graph timed again later is slow too; SM clock 1980 MHz throughout); the cause is not known.

    python bench/explore/explore52.py --rows 1,6,16,48 --out e52.json
    env -u TRITON_INTERPRET .venv/bin/python bench/explore/explore52.py --sm90     # CPU: sm_90 compile
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch
from triton.experimental.gluon import language as gl

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

S, BK, RB = 4, 64, 8


def permuted_rows(n: int, d: int) -> torch.Tensor:
    """perm [N] int64: row i of the permuted weight is row perm[i] of the packed one; program p's 16 rows are
    8 p .. 8 p + 7's lower RoPE partners (head hd = 8 p // (D / 2), rotary index j0 + t) then their upper ones."""
    half = d // 2
    p = torch.arange(n // 16).repeat_interleave(16)
    t = torch.arange(16).repeat(n // 16)
    p0 = p * 8
    return (p0 // half) * d + p0 % half + t % 8 + (t // 8) * half


def tma_weight(qkv_weight: torch.Tensor, attn_norm: torch.Tensor, d: int) -> torch.Tensor:
    """bf16(W g) with its rows permuted (`permuted_rows`), contiguous [N, H]."""
    from lowlat.kernels.attn_prologue_held import fold_attn_norm

    folded = fold_attn_norm(qkv_weight, attn_norm)
    return folded[permuted_rows(folded.shape[0], d).to(folded.device)].contiguous()


def tma_descriptor(w: torch.Tensor, S: int = S):
    """The TMA descriptor of the permuted weight w [N, K]: view [S, N, K / S], strides [K / S, K, 1], boxes
    [S, 16, BK]."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    n, k = w.shape
    kq = k // S
    layout = gl.NVMMASharedLayout.get_default_for([S, 16, BK], gl.bfloat16)
    return TensorDescriptor(w, [S, n, kq], [kq, k, 1], [S, 16, BK], layout)


#: the generated kernels' import of the shared inline-asm helpers (explore54's edited production copies use it too)
HELPERS = "from gluon_asm import _release_when, _stamp, _store_record  # noqa: F401"
#: weight chunks read from shared memory ahead of the mma chain (`kernel_source`)
READ_AHEAD = 2

#: the kernel's source, NS = K / (S BK) chunks written out by `kernel_source` (a loop would issue chunk s + 1's x load
#: only after chunk s's mma, which waits for chunk s: one L2 round trip a chunk, session 38 call 2's first form)
KERNEL = '''
import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import mma_v2
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma

from lowlat.kernels._attn_common import pdl_release_early, pdl_wait_then_release
from lowlat.kernels.attn_prologue_held import _rope_inputs


{HELPERS}@gluon.jit
def _tma_prologue_kernel(x_ptr, w_desc, tab_ptr, pos_ptr, loc_ptr, nvr_ptr, nvr_int, q_ptr,
                         stride_qm, stride_qh, kc_ptr, stride_kcs, stride_kch, vc_ptr, stride_vcs, stride_vch,
                         M, Hq, Hkv, max_pos, eps, K: gl.constexpr, D: gl.constexpr, NMB: gl.constexpr,
                         NVR_FROM_PTR: gl.constexpr, USE_PDL: gl.constexpr, REL: gl.constexpr,
                         Q: gl.constexpr = 4, S: gl.constexpr = 4, RB: gl.constexpr = 8, BK: gl.constexpr = 64,
                         tr_ptr=None, TRACE: gl.constexpr = False):
    """Production's `_held_prologue_kernel` (FOLD_G off: w is `tma_weight`'s) with the weights in shared memory and
    x in NS chunks of BK columns a slice, every chunk's load issued before the first mma (`kernel_source`). REL:
    the next launch released at the program's start (0), after the wait (1), once x has landed (2), after the mma
    (3). TRACE (1 row block only): %globaltimer stamps (start, wait returned, x landed, mma done, end) and the SM,
    one record of 8 int64 a program at tr_ptr."""
    L1: gl.constexpr = gl.BlockedLayout([1], [32], [Q], [0])
    lane = gl.arange(0, 32 * Q, layout=L1)
    if TRACE:
        gl.static_assert(NMB == 1, "TRACE: one row block")
        t0 = _stamp(lane)
    pdl_release_early(USE_PDL, REL == 0)
    HALF: gl.constexpr = D // 2
    KQ: gl.constexpr = K // S
    NS: gl.constexpr = KQ // BK
    MMA: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[Q, 1, 1], instr_shape=[1, 16, 8])
    LA: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=MMA, k_width=8)
    LB: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=MMA, k_width=8)
    LE3: gl.constexpr = gl.BlockedLayout([1, 1, 1], [1, 4, 8], [1, Q, 1], [2, 1, 0])   # [1, 8, RB]: a half
    LE: gl.constexpr = gl.SliceLayout(0, LE3)                                       # [8, RB]
    pid = gl.program_id(0)
    w_smem = gl.allocate_shared_memory(gl.bfloat16, [NS, S, 16, BK], w_desc.layout)
    bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    mbarrier.init(bar, count=1)
    mbarrier.expect(bar, NS * S * 16 * BK * 2)
    for s in gl.static_range(NS):
        tma.async_copy_global_to_shared(w_desc, [0, pid * 16, s * BK], bar, w_smem.index(s))
    p0 = pid * 8
    hd = p0 // HALF                                   # head of the packed weight: q heads, then k, then v
    j0 = p0 % HALF
    bq = gl.arange(0, S, layout=gl.SliceLayout(1, gl.SliceLayout(2, LB)))
    bk = gl.arange(0, KQ, layout=gl.SliceLayout(0, gl.SliceLayout(2, LB)))
    bkc = gl.arange(0, BK, layout=gl.SliceLayout(0, gl.SliceLayout(2, LB)))
    bm = gl.arange(0, RB, layout=gl.SliceLayout(0, gl.SliceLayout(1, LB)))
    bcol = gl.expand_dims(gl.expand_dims(bq, 1), 2) * KQ + gl.expand_dims(gl.expand_dims(bk, 0), 2)   # [S, KQ, 1]
    boff = gl.expand_dims(gl.expand_dims(bm, 0), 1) * K + bcol
    ccol = gl.expand_dims(gl.expand_dims(bq, 1), 2) * KQ + gl.expand_dims(gl.expand_dims(bkc, 0), 2)  # [S, BK, 1]
    coff = gl.expand_dims(gl.expand_dims(bm, 0), 1) * K + ccol
    ti = gl.arange(0, 8, layout=gl.SliceLayout(1, LE))
    tm = gl.arange(0, RB, layout=gl.SliceLayout(0, LE))
    jj = gl.expand_dims(j0 + ti, 1)
    part = gl.allocate_shared_memory(gl.float32, [S, 16, RB], gl.SwizzledSharedLayout(1, 1, 1, [2, 1, 0]))
    ssp = gl.allocate_shared_memory(gl.float32, [S, RB], gl.SwizzledSharedLayout(1, 1, 1, [1, 0]))
    is_q = hd < Hq
    is_v = hd >= Hq + Hkv
    kvh = gl.where(is_v, hd - Hq - Hkv, hd - Hq)
    if NVR_FROM_PTR:
        nvr = gl.load(nvr_ptr)
    else:
        nvr = nvr_int
    loc0, cos0, sin0 = _rope_inputs(pos_ptr, loc_ptr, tab_ptr, tm, M, nvr, max_pos, j0 + ti, D, HALF)
    pdl_wait_then_release(USE_PDL, REL != 1)
    if TRACE:
        t1 = _stamp(lane)
    for b in gl.static_range(NMB):
        brow = b * RB + bm
        cmask = gl.expand_dims(gl.expand_dims(brow < M, 0), 1) & (coff >= 0)
{XLOADS}        erow = b * RB + tm
        if b == 0:
            loc, cos, sin = loc0, cos0, sin0
        else:
            loc, cos, sin = _rope_inputs(pos_ptr, loc_ptr, tab_ptr, erow, M, nvr, max_pos, j0 + ti, D, HALF)
{SSW}        if b == 0:
            if TRACE:
                tx = _stamp(ssw.to(gl.int32, bitcast=True))
            if USE_PDL and REL == 2:
                _release_when(ssw.to(gl.int32, bitcast=True))
        acc = gl.zeros([S, 16, RB], gl.float32, MMA)
{MMAS}        if b == 0:
            if TRACE:
                tmm = _stamp(acc.to(gl.int32, bitcast=True))
            if USE_PDL and REL == 3:
                _release_when(acc.to(gl.int32, bitcast=True))
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
        lo = gl.sum(lo3, axis=0) * rstd
        hi = gl.sum(hi3, axis=0) * rstd
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
    mbarrier.invalidate(bar)
    if TRACE:
        t3 = _stamp(lane)
        _store_record(tr_ptr, pid, gl.min(t0, axis=0), gl.min(t1, axis=0), gl.max(gl.max(tx, axis=1), axis=0),
                      gl.max(gl.max(gl.max(tmm, axis=2), axis=1), axis=0), gl.max(t3, axis=0), lane, L1)
'''


def kernel_source(ns: int, prod_ssw: bool) -> str:
    """KERNEL with its ns x chunks' loads (all first), then (the weights' mbarrier waited once) the first READ_AHEAD
    weight chunks read from shared memory, x's statistic, and the ns mma in K order, chunk c + READ_AHEAD read after
    mma c (in the source; ptxas schedules the reads itself: 2 and 8 ahead compile to the same SASS). The statistic:
    with prod_ssw production's (x's whole block loaded once more in production's layout, the same sum: production's
    bits), else from the chunks (chunk sums added in chunk order: other bits)."""
    xl = "".join(f"        xc{c} = gl.load(x_ptr + b * RB * K + coff + {c} * BK, mask=cmask, other=0.0)\n"
                 for c in range(ns))
    xl += "        if b == 0:\n            mbarrier.wait(bar, 0)\n"
    pf = READ_AHEAD
    xl += "".join(f"        a{c} = w_smem.index({c}).load(LA)\n" for c in range(min(pf, ns)))
    if prod_ssw:
        ssw = ("        bmask = gl.expand_dims(gl.expand_dims(brow < M, 0), 1) & (boff >= 0)\n"
               "        xf = gl.load(x_ptr + b * RB * K + boff, mask=bmask, other=0.0).to(gl.float32)\n"
               "        ssw = gl.sum(xf * xf, axis=1)\n")
    else:
        ssw = "".join(f"        xf{c} = xc{c}.to(gl.float32)\n" for c in range(ns))
        ssw += "        ssw = gl.sum(xf0 * xf0, axis=1)\n" + "".join(
            f"        ssw += gl.sum(xf{c} * xf{c}, axis=1)\n" for c in range(1, ns))
    mm = "".join(f"        acc = mma_v2(a{c}, xc{c}, acc)\n"
                 + (f"        a{c + pf} = w_smem.index({c + pf}).load(LA)\n" if c + pf < ns else "") for c in range(ns))
    return KERNEL.format(XLOADS=xl, SSW=ssw, MMAS=mm, HELPERS=HELPERS + "\n\n\n")


_MODS: dict = {}


def kernel_for(ns: int, prod_ssw: bool):
    """The generated kernel (`kernel_source`; one module each)."""
    key = (ns, prod_ssw)
    if key not in _MODS:
        from _common import module_from_source

        _MODS[key] = module_from_source(f"e52_tma_{ns}_{int(prod_ssw)}", kernel_source(*key))
    return _MODS[key]._tma_prologue_kernel


def tma_prologue(x, w_desc, positions, out_cache_loc, m, k_cache, v_cache, table, cfg, out_q, rel: int,
                 prod_ssw: bool, trace=None, warps: int = 4):
    """The launcher (the explore's inputs only: no checks): q into out_q, K / V into the caches; rel: the release
    point (the kernel's REL); trace: a [N / 16, 8] int64 record buffer (stamps, 1 row block); warps: 4, or 8 (8 K
    slices, one a warp: w_desc must be `tma_descriptor(w, 8)`'s; not production's arithmetic)."""
    from lowlat.kernels.attn_prologue_held import ROW_BLOCK

    n = w_desc.shape[1]
    hq, hkv = out_q.shape[1], k_cache.shape[1]
    kernel_for(x.shape[1] // (warps * BK), prod_ssw)[(n // 16,)](
        x, w_desc, table, positions, out_cache_loc, out_cache_loc, m, out_q, out_q.stride(0), out_q.stride(1),
        k_cache, k_cache.stride(0), k_cache.stride(1), v_cache, v_cache.stride(0), v_cache.stride(1),
        m, hq, hkv, table.shape[0], float(cfg.rms_eps), K=x.shape[1], D=cfg.head_dim,
        NMB=(m + ROW_BLOCK - 1) // ROW_BLOCK, NVR_FROM_PTR=False, USE_PDL=True, REL=rel, Q=warps,
        S=warps, RB=ROW_BLOCK, BK=BK, tr_ptr=trace, TRACE=trace is not None, num_warps=warps, launch_pdl=True)
    return out_q


#: variant -> (the release point REL, production's statistic, warps = K slices)
TMA_VARIANTS = {"tma0": (0, False, 4), "tma1": (1, False, 4), "tma1p": (1, True, 4), "w8_0": (0, False, 8),
                "w8_1": (1, False, 8)}


def summarize_stamps(tr: torch.Tensor) -> dict:
    """A stamped 1-row chain's records [launches, programs, 8] (CPU int64: t0 start, t1 wait returned, tx x landed,
    tm mma done, t3 end, SM, 1) -> ns medians over launches 2 .. L - 2: the period (last t3 minus the previous
    launch's), lag (first wait return after the previous launch's last t3), x / mma / epilogue spans (program
    medians) and the post-wait span, the first start before the previous launch's end."""
    t0, t1, tx, tm, t3 = (tr[:, :, i] for i in range(5))
    end = t3.max(1).values
    rows = []
    for j in range(2, tr.shape[0] - 1):
        med = lambda x: float(x.double().median())                    # noqa: E731  (int64 differences first)
        rows.append(dict(period=float(end[j] - end[j - 1]), lag=float(t1[j].min() - end[j - 1]),
                         x=med(tx[j] - t1[j]), mma=med(tm[j] - tx[j]), epilogue=med(t3[j] - tm[j]),
                         post_wait=med(t3[j] - t1[j]), post_wait_max=float((t3[j] - t1[j]).max()),
                         wait_spread=float(t1[j].max() - t1[j].min()), first_start=float(t0[j].min() - end[j - 1]),
                         last_start=float(t0[j].max() - end[j - 1])))
    return {k: statistics.median(r[k] for r in rows) for k in rows[0]}


def device_run(rows: list, rounds: int, out: str | None, warm_x: bool = False) -> None:
    """Check each TMA variant against prod (bitwise, every element written, the numerics policy against float64),
    time them all A B .. B A at each width, then stamp each TMA variant's 1-row chain."""
    from _common import LlamaPrologueCase, run_checked, stamp_chain, time_alternated, times_line, write_results
    from explore44 import accuracy_verdict
    from explore47 import launches
    from lowlat.kernels import attn_prologue_held as aph
    from lowlat.reference.rope import rope_inv_freq

    case = LlamaPrologueCase(torch.device("cuda"))
    cfg, lw, r = case.cfg, case.lw, case.r
    inv = rope_inv_freq(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling, torch.float64).to(case.dev)
    tws = [tma_weight(w, lw.attn_norm, cfg.head_dim) for w in case.ws]
    descs = {q: [tma_descriptor(w, q) for w in tws] for q in (4, 8)}
    n_prog = tws[0].shape[0] // 16
    results, stamps = [], {}
    for m in rows:
        xs, pos, locs = case.rows(m)
        if warm_x:                      # one x for every copy: in L2, as the previous launch of a step leaves it
            xs = [xs[0]] * r
        fns, qs, caches = launches(case, m, {"prod": aph}, (xs, pos, locs))
        for v, (rel, pssw, q) in TMA_VARIANTS.items():
            caches[v] = (case.cache(m, float("nan")), case.cache(m, float("nan")))
            qs[v] = [case.q_out(m) for _ in range(r)]
            fns[v] = (lambda i, v=v, rel=rel, p=pssw, q=q: tma_prologue(
                xs[i % r], descs[q][i % r], pos, locs[i % r], m, caches[v][0], caches[v][1], case.table, cfg,
                qs[v][i % r], rel, p, warps=q))
        written, same = run_checked(fns, qs, caches, r, "prod")
        loc = locs[0].long()
        verdict = {v: accuracy_verdict((qs[v][0], caches[v][0][loc], caches[v][1][loc]), xs[0], case.w0, lw, pos,
                                       inv, cfg) for v in fns}
        times = time_alternated(fns, max(r, 8), rounds=rounds)
        print(f"  r{m:<3} us (min/max of {2 * rounds}) {times_line(times)} | every element written "
              + " ".join(f"{v} {w}" for v, w in written.items()) + " | " + "; ".join(
                  f"{v} {x}" for v, x in verdict.items()) + " | bitwise = prod: "
              + " ".join(f"{v} {x}" for v, x in same.items()), flush=True)
        results.append(dict(rows=m, us=times, every_element_written=written, accuracy=verdict, bitwise_prod=same))
        if m == 1:
            for v, (rel, pssw, q) in TMA_VARIANTS.items():
                tr = torch.zeros(r, n_prog, 8, dtype=torch.int64, device=case.dev)
                fn = (lambda i, v=v, rel=rel, p=pssw, q=q: tma_prologue(
                    xs[i % r], descs[q][i % r], pos, locs[i % r], m, caches[v][0], caches[v][1], case.table, cfg,
                    qs[v][i % r], rel, p, tr[i % r], warps=q))
                stamps[v] = stamp_chain(fn, r, tr, summarize_stamps, v)
        torch.cuda.empty_cache()
    write_results(out, results, explore="explore52", model=cfg.name, stamps_1row=stamps, warm_x=warm_x,
                  launch="per-kernel bench (LlamaPrologueCase, num_valid_rows int M, 4096-position table, PDL on)",
                  rounds=rounds)


def probe_run(graphs: int, replays: int, out: str | None) -> None:
    """Is tma1's bimodal 1-row time (calls 13-14) a property of a captured graph or of a replay? For prod and tma1:
    `graphs` fresh captures of the chain (as `time_alternated` makes one a timing), each replayed `replays` times
    back to back; prints each graph's replay times (us a launch) as min / median / max; the first graph of each is
    kept and timed again at the end (a graph's own property, or the process's state?)."""
    import time

    from _common import LlamaPrologueCase, write_results
    from explore47 import launches
    from lowlat.benchmarking import capture_graph, event_times_us
    from lowlat.kernels import attn_prologue_held as aph

    case = LlamaPrologueCase(torch.device("cuda"))
    cfg, lw, r = case.cfg, case.lw, case.r
    n = max(r, 8)
    descs = [tma_descriptor(tma_weight(w, lw.attn_norm, cfg.head_dim)) for w in case.ws]
    xs, pos, locs = inputs = case.rows(1)
    fns, qs, caches = launches(case, 1, {"prod": aph}, inputs)
    kc, vc = case.cache(1, float("nan")), case.cache(1, float("nan"))
    q1 = [case.q_out(1) for _ in range(r)]
    fns["tma1"] = lambda i: tma_prologue(xs[i % r], descs[i % r], pos, locs[i % r], 1, kc, vc, case.table, cfg,
                                         q1[i % r], 1, False)
    res = {v: [] for v in fns}
    again, first = {}, {}

    def timed(label, v, g):
        t = sorted(event_times_us(g.replay, iters=replays, warmup=2, per=n))
        print(f"  {label} {v:5s} min {t[0]:.2f} median {t[len(t) // 2]:.2f} max {t[-1]:.2f} "
              f"(ended at unix {time.time():.2f})", flush=True)
        return t
    for g_i in range(graphs):
        for v, fn in fns.items():
            g = capture_graph(fn, n)
            res[v].append(timed(f"graph {g_i}", v, g))
            if g_i == 0:
                first[v] = g                    # kept, and timed again at the end
    for v, g in first.items():
        again[v] = timed("graph 0 again", v, g)
    write_results(out, [dict(variant=v, graphs=t, first_graph_again=again.get(v)) for v, t in res.items()],
                  explore="explore52 --probe",
                  model=cfg.name, replays=replays)


def sm90_spec(m: int, rel: int, q: int = 4, d: int = 64, **pointers) -> dict:
    """tests/unit/compile_sm90.py's spec of the generated kernel at width m (K 2048, head_dim d, q warps = K slices,
    release point rel) as the launcher specialises it (M and num_valid_rows constants, pointers aligned); extra
    pointer types by name (explore53's QK-norm kernel's qn_ptr / kn_ptr / xs_ptr, a trace's tr_ptr)."""
    desc = (f"tensordesc<bf16[{q}, 16, 64],NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=3, "
            "transposed=False, fp4_padded=False, cga_layout=[])>")
    return dict(constexprs=dict(K=2048, D=d, NMB=(m + RB - 1) // RB, NVR_FROM_PTR=False, USE_PDL=True, REL=rel, Q=q,
                                S=q, RB=RB, BK=BK, M=m, nvr_int=m),
                pointers=dict(x_ptr="*bf16", w_desc=desc, tab_ptr="*fp32", pos_ptr="*i64", loc_ptr="*i32",
                              nvr_ptr="*i32", q_ptr="*bf16", kc_ptr="*bf16", vc_ptr="*bf16", **pointers),
                scalars=dict(eps="fp32"), num_warps=q, launch_pdl=True, divisible=[])


def sm90_report(rows: list) -> list:
    """The kernel's sm_90 build at each width (CPU): registers, spills, shared memory."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests" / "unit"))
    from compile_sm90 import compile_for_sm90

    out = []
    for m in rows:
        for v, (rel, prod_ssw, q) in TMA_VARIANTS.items():
            r = compile_for_sm90(kernel_for(2048 // (q * BK), prod_ssw), sm90_spec(m, rel, q))
            out.append(dict(rows=m, variant=v, registers=r["registers"],
                            spill_bytes=r["spill_bytes"], shared=r["shared"]))
            print(out[-1], flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default="1,6,16,48")
    ap.add_argument("--rounds", type=int, default=2, help="A B C C B A rounds")
    ap.add_argument("--sm90", action="store_true", help="no GPU: compile for sm_90 and report")
    ap.add_argument("--warm-x", action="store_true", help="one x for every copy (warm in L2), weights still rotated")
    ap.add_argument("--probe", type=int, default=0, help="that many fresh graphs of prod and tma1 at 1 row, each "
                    "replayed --replays times (`probe_run`)")
    ap.add_argument("--replays", type=int, default=40)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    rows = [int(x) for x in a.rows.split(",")]
    if a.sm90:
        sm90_report(rows)
    elif a.probe:
        probe_run(a.probe, a.replays, a.out)
    else:
        device_run(rows, a.rounds, a.out, a.warm_x)


if __name__ == "__main__":
    main()
