"""Session 40: a held attention prologue that splits K across a head's cluster instead of columns (Qwen3-30B-A3B's
QK-norm, also Llama-3.2-1B without it): x is read once a cluster, not once a program.

Why: the held prologues (production's, explore44 / 57's cluster forms) give each program 16 weight rows of the whole
K, so EVERY program loads all of x: 320 programs x M x 4 KB at Qwen3's H 2048 (20 MB of L2 reads at 16 rows, as much
as the weights; 60 MB at 48), which is where explore44's form loses to the split-K prologue from 16 rows (13.26
against 10.12 us on the H200) and why FusedModel cannot take it (row invariance: one form's bits at every width).

Here a head's CL = D / 16 programs (one thread-block cluster, launched as explore44's `launch_clustered`) each hold
the head's D weight rows over one K slice (KS = H / CL columns: D x KS bf16 = 64 KB a program, as production's), so
a program loads only its slice of x. After the wait, per row block:
  1. the mma of the held slice with x's slice: the head's D partial outputs, and x's slice's sum of squares, stored
     (fp32, .cg) to a scratch; a cluster barrier (release / acquire, `barrier.cluster`);
  2. program r takes the 8 RoPE pairs r*8..r*8+7 of the head: their CL partials and the CL partial sums of squares
     added in rank order (every program of the head the same order: deterministic), y = rstd sum; for a q / k head
     (QK-norm) the sum of its 16 outputs' squares stored, a second cluster barrier, the head's CL sums in rank order,
     y = y rstd_head q_norm|k_norm (the split-K prologue's formulas);
  3. RoPE, q / K / V stores (production's epilogue).
The two barriers are once a launch (every row block's step 1 before the first, step 2 before the second). Numerics:
another fp32 order than every other prologue, checked against the float64 reference at the numerics policy
(`explore44.accuracy_verdict`); row invariant by construction (a row's arithmetic does not depend on M).

    split_k       FusedModel's prologue for Qwen3 (kernels/attn_prologue.py)
    cluster       explore44's one-wave cluster form (held_cluster_folded_r168, released after the wait)
    ksplit        this form, maxnreg 168 (Qwen3: 320 programs, three an SM), released after the wait
    ksplit_nocap  the same without the register cap
    (Llama-3.2-1B, --model llama: prod, production's held prologue, against ksplit / ksplit_nocap without QK-norm)

    python bench/explore/explore58.py --rows 1,6,16,48 --out e58.json
    env -u TRITON_INTERPRET .venv/bin/python bench/explore/explore58.py --sm90     # CPU: registers / spills / PTX
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import mma_v2

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from lowlat.kernels._attn_common import pdl_release_early, pdl_wait_then_release  # noqa: E402
from lowlat.kernels.attn_prologue_held import _rope_inputs  # noqa: E402

RB = 8            # rows a block (the mma's n)
WARPS = 4
CAP = 168


@gluon.jit
def _cluster_sync(dep):
    """Every thread of the cluster's CTAs arrives (release: its stores before it visible) then waits (acquire);
    returns 0 an element of dep (one barrier a thread: dep must hold one element a thread), opaque, so that loads
    offset by it stay after the barrier; the memory clobber keeps the compiler's stores before it."""
    return gl.inline_asm_elementwise(
        "barrier.cluster.arrive.release.aligned; barrier.cluster.wait.acquire.aligned; mov.u32 $0, 0;",
        "=r,r,~{memory}", [dep], dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def _ksplit_prologue_kernel(x_ptr, w_ptr, tab_ptr, pos_ptr, loc_ptr, q_ptr, stride_qm, stride_qh,
                            kc_ptr, stride_kcs, stride_kch, vc_ptr, stride_vcs, stride_vch, qn_ptr, kn_ptr,
                            yp_ptr, sp_ptr, s2_ptr, M, nvr, Hq, Hkv, max_pos, eps,
                            K: gl.constexpr, D: gl.constexpr, NMB: gl.constexpr, QK_NORM: gl.constexpr,
                            USE_PDL: gl.constexpr, EARLY_RELEASE: gl.constexpr = False, Q: gl.constexpr = 4,
                            RB: gl.constexpr = 8):
    """See the module docstring. Grid (Hq + 2 Hkv) CL programs (CL = D / 16), launched as clusters of CL; w is
    `fold_attn_norm`'s [N, K]; x [M, K] contiguous; yp [programs, NMB, D, RB], sp / s2 [programs, NMB, RB] fp32
    scratch."""
    pdl_release_early(USE_PDL, EARLY_RELEASE)
    HALF: gl.constexpr = D // 2
    CL: gl.constexpr = HALF // 8                      # programs a head: 8 RoPE pairs each
    KS: gl.constexpr = K // CL
    MMA: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[Q, 1], instr_shape=[16, 8])
    LA: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=MMA, k_width=8)
    LB: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=MMA, k_width=8)
    LE: gl.constexpr = gl.BlockedLayout([1, 1], [4, 8], [Q, 1], [1, 0])        # [8, RB]: one element a thread
    pid = gl.program_id(0)
    hd = pid // CL
    rk = pid % CL
    first = hd * CL
    j0 = rk * 8
    ai = gl.arange(0, D, layout=gl.SliceLayout(1, LA))
    ak = gl.arange(0, KS, layout=gl.SliceLayout(0, LA))
    w = gl.load(w_ptr + gl.expand_dims(hd * D + ai, 1) * K + rk * KS + gl.expand_dims(ak, 0))     # [D, KS] held
    bk = gl.arange(0, KS, layout=gl.SliceLayout(1, LB))
    bm = gl.arange(0, RB, layout=gl.SliceLayout(0, LB))
    boff = gl.expand_dims(bm, 0) * K + rk * KS + gl.expand_dims(bk, 1)                            # [KS, RB]
    ci = gl.arange(0, D, layout=gl.SliceLayout(1, MMA))
    cm = gl.arange(0, RB, layout=gl.SliceLayout(0, MMA))
    ti = gl.arange(0, 8, layout=gl.SliceLayout(1, LE))
    tm = gl.arange(0, RB, layout=gl.SliceLayout(0, LE))
    jj = gl.expand_dims(j0 + ti, 1)
    is_q = hd < Hq
    is_v = hd >= Hq + Hkv
    kvh = gl.where(is_v, hd - Hq - Hkv, hd - Hq)
    loc0, cos0, sin0 = _rope_inputs(pos_ptr, loc_ptr, tab_ptr, tm, M, nvr, max_pos, j0 + ti, D, HALF)
    if QK_NORM:
        nlo = gl.expand_dims(gl.where(is_q, gl.load(qn_ptr + j0 + ti), gl.load(kn_ptr + j0 + ti)).to(gl.float32), 1)
        nhi = gl.expand_dims(gl.where(is_q, gl.load(qn_ptr + HALF + j0 + ti),
                                      gl.load(kn_ptr + HALF + j0 + ti)).to(gl.float32), 1)
    pdl_wait_then_release(USE_PDL, EARLY_RELEASE)
    # 1. every row block: the slice's partial outputs and x's partial sum of squares to the scratch
    for b in gl.static_range(NMB):
        brow = b * RB + bm
        xb = gl.load(x_ptr + b * RB * K + boff, mask=gl.expand_dims(brow < M, 0) & (boff >= 0), other=0.0)
        xf = xb.to(gl.float32)
        gl.store(sp_ptr + (pid * NMB + b) * RB + bm, gl.sum(xf * xf, axis=0), mask=brow < M,
                 cache_modifier=".cg")
        acc = mma_v2(w, xb, gl.zeros([D, RB], gl.float32, MMA))
        crow = b * RB + cm
        yoff = gl.expand_dims(ci, 1) * RB + gl.expand_dims(cm, 0)
        gl.store(yp_ptr + (pid * NMB + b) * D * RB + yoff, acc,
                 mask=gl.expand_dims(crow < M, 0) & (yoff >= 0), cache_modifier=".cg")
    t1 = _cluster_sync(gl.zeros([8, RB], gl.int32, LE))
    # 2. this program's 8 RoPE pairs: the CL partials in rank order, x's rstd
    los = ()
    his = ()
    for b in gl.static_range(NMB):
        erow = b * RB + tm
        emok = gl.expand_dims(erow < M, 0) & gl.expand_dims(ti >= 0, 1)
        loff = gl.expand_dims(j0 + ti, 1) * RB + gl.expand_dims(tm, 0) + t1
        soff = gl.expand_dims(tm, 0) + 0 * gl.expand_dims(ti, 1) + t1
        ylo = gl.zeros([8, RB], gl.float32, LE)
        yhi = gl.zeros([8, RB], gl.float32, LE)
        ss = gl.zeros([8, RB], gl.float32, LE)
        for r in gl.static_range(CL):                                                # the head's ranks in order
            base = ((first + r) * NMB + b)
            ylo += gl.load(yp_ptr + base * D * RB + loff, mask=emok, other=0.0, cache_modifier=".cg")
            yhi += gl.load(yp_ptr + base * D * RB + HALF * RB + loff, mask=emok, other=0.0, cache_modifier=".cg")
            ss += gl.load(sp_ptr + base * RB + soff, mask=emok, other=0.0, cache_modifier=".cg")
        rstd = 1.0 / gl.sqrt(ss / K + eps)
        lo = ylo * rstd
        hi = yhi * rstd
        if QK_NORM:
            if not is_v:                                  # a whole head (cluster) takes this branch or none does
                gl.store(s2_ptr + (pid * NMB + b) * RB + tm, gl.sum(lo * lo + hi * hi, axis=0), mask=erow < M,
                         cache_modifier=".cg")
        los = los + (lo,)
        his = his + (hi,)
    t2 = gl.zeros([8, RB], gl.int32, LE)
    if QK_NORM:
        if not is_v:
            t2 = _cluster_sync(t2)
    # 3. the QK-norm (q / k heads), RoPE, the stores
    for b in gl.static_range(NMB):
        erow = b * RB + tm
        lo = los[b]
        hi = his[b]
        if QK_NORM:
            if not is_v:
                soff = gl.expand_dims(tm, 0) + 0 * gl.expand_dims(ti, 1) + t2
                emok = gl.expand_dims(erow < M, 0) & gl.expand_dims(ti >= 0, 1)
                hs = gl.zeros([8, RB], gl.float32, LE)
                for r in gl.static_range(CL):                                        # the head's ranks in order
                    hs += gl.load(s2_ptr + ((first + r) * NMB + b) * RB + soff, mask=emok, other=0.0,
                                  cache_modifier=".cg")
                r2 = 1.0 / gl.sqrt(hs / D + eps)
                lo = lo * r2 * nlo
                hi = hi * r2 * nhi
        if b == 0:
            loc, cos, sin = loc0, cos0, sin0
        else:
            loc, cos, sin = _rope_inputs(pos_ptr, loc_ptr, tab_ptr, erow, M, nvr, max_pos, j0 + ti, D, HALF)
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


class KSplitProlog:
    """`_ksplit_prologue_kernel` launched as clusters of D / 16 (`explore44.launch_clustered`) on `fold_attn_norm`'s
    weights; maxnreg a register cap or None; release "late" (after the wait) or "early" (at the start)."""

    def __init__(self, maxnreg: int | None = CAP, release: str = "late"):
        self.maxnreg, self.early = maxnreg, release == "early"
        self.seen = set()

    @staticmethod
    def scratch(n: int, d: int, dev) -> tuple:
        """(yp, sp, s2): fp32 scratch for N packed weight rows at head_dim d and up to 48 rows, NaN."""
        programs = n // d * (d // 16)
        return (torch.full((programs * 6 * d * RB,), float("nan"), device=dev),
                torch.full((programs * 6 * RB,), float("nan"), device=dev),
                torch.full((programs * 6 * RB,), float("nan"), device=dev))

    def __call__(self, x, wf, qn, kn, pos, loc, nvr: int, kc, vc, table, cfg, out_q, scratch, use_pdl=True):
        from explore44 import launch_clustered

        m, h = x.shape
        d = cfg.head_dim
        cl = d // 16
        qk = qn is not None
        yp, sp, s2 = scratch
        args = (x, wf, table, pos, loc, out_q, out_q.stride(0), out_q.stride(1), kc, kc.stride(0), kc.stride(1),
                vc, vc.stride(0), vc.stride(1), qn if qk else x, kn if qk else x, yp, sp, s2, m, nvr, out_q.shape[1],
                kc.shape[1], table.shape[0], float(cfg.rms_eps))
        kw = dict(K=h, D=d, NMB=(m + RB - 1) // RB, QK_NORM=qk, USE_PDL=use_pdl, EARLY_RELEASE=self.early, Q=WARPS,
                  RB=RB, num_warps=WARPS, launch_pdl=use_pdl, **({"maxnreg": self.maxnreg} if self.maxnreg else {}))
        programs = wf.shape[0] // d * cl
        launch_clustered(_ksplit_prologue_kernel, programs, m, self.seen, args, kw, cluster=cl)
        return out_q


VARIANTS = {"ksplit": dict(maxnreg=CAP), "ksplit_nocap": dict(maxnreg=None), "ksplit_early": dict(release="early")}


def device_run(model: str, rows: list, rounds: int, out: str | None, variants: list) -> None:
    from _common import prologue_rows, times_line, write_results
    from explore44 import checked_times, nan_outputs, qwen3_copies, split_k_launch
    from lowlat.kernels import attn_prologue_held as aph

    dev = torch.device("cuda")
    if model == "qwen3":
        from explore57 import prologs

        cfg, lw, w0, table, inv, r, ws, wfs, pws = qwen3_copies(dev)
        held = prologs([v for v in variants if v == "cluster"])
        cl_scratch = torch.full((w0.shape[0] // 16 * 6 * 8,), float("nan"), device=dev)
    else:
        cfg, lw, w0, table, inv, r, ws, wfs = llama_copies(dev)
    n, h = w0.shape[0], cfg.hidden_size
    qk = cfg.qk_norm
    ks = {v: KSplitProlog(**VARIANTS[v]) for v in variants if v in VARIANTS}
    scratch = KSplitProlog.scratch(n, cfg.head_dim, dev)
    results = []
    for m in rows:
        xs, pos, locs = prologue_rows(m, h, r, dev)
        kcs, vcs, qs = nan_outputs(variants, r, m, cfg, dev)
        fns = {}
        for v in variants:
            if v == "split_k":
                fns[v] = split_k_launch((xs, pos, locs), ws, lw, m, kcs, vcs, qs, table, cfg, pws)
            elif v == "cluster":
                fns[v] = lambda i: held["cluster"](xs[i % r], wfs[i % r], None, lw.q_norm, lw.k_norm, pos,
                                                   locs[i % r], m, kcs["cluster"], vcs["cluster"], table, cfg,
                                                   qs["cluster"][i % r], cl_scratch)
            elif v == "prod":
                fns[v] = lambda i: aph.attn_prologue_held(xs[i % r], ws[i % r], lw.attn_norm, pos, locs[i % r], m,
                                                          kcs["prod"], vcs["prod"], table, cfg=cfg,
                                                          out_q=qs["prod"][i % r], use_pdl=True)
            else:
                fns[v] = (lambda p, v: lambda i: p(xs[i % r], wfs[i % r], lw.q_norm if qk else None,
                                                   lw.k_norm if qk else None, pos, locs[i % r], m, kcs[v], vcs[v],
                                                   table, cfg, qs[v][i % r], scratch))(ks[v], v)
        written, verdict, times = checked_times(fns, r, m, kcs, vcs, qs, (xs, pos), w0, lw, inv, cfg, rounds)
        print(f"  r{m:<3} us (min/max of {2 * rounds}) {times_line(times)} | every element written {written} | "
              f"{verdict}", flush=True)
        results.append(dict(rows=m, us=times, every_element_written=written, accuracy=verdict))
        torch.cuda.empty_cache()
    write_results(out, results, explore="explore58", model=cfg.name, rounds=rounds,
                  launch="per-kernel bench (rotated cold copies, PDL on; ksplit / cluster forms as clusters)")


def llama_copies(dev):
    """Llama-3.2-1B's prologue inputs as `explore44.qwen3_copies` gives Qwen3's: (cfg, lw, w0, table, inv, r, ws: r
    copies of w0, wfs: their `fold_attn_norm`)."""
    from lowlat.benchmarking import rotation_copies
    from lowlat.config import preset
    from lowlat.kernels import attn_prologue_held as aph
    from lowlat.kernels.attn_prologue import pack_qkv, rope_table
    from lowlat.reference.rope import rope_inv_freq
    from lowlat.weights import random_layer_weights

    cfg = preset("Llama-3.2-1B")
    lw = random_layer_weights(cfg.replace(intermediate_size=16), generator=torch.Generator().manual_seed(0),
                              device=dev)
    w0 = pack_qkv(lw)
    inv = rope_inv_freq(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling, torch.float64).to(dev)
    r = rotation_copies(w0.numel() * 2)
    ws = [w0.clone() for _ in range(r)]
    return cfg, lw, w0, rope_table(cfg, 4096, dev), inv, r, ws, [aph.fold_attn_norm(w, lw.attn_norm) for w in ws]


def sm90_spec(m: int, model: str, maxnreg: int | None) -> dict:
    """The kernel's spec for tests/unit/compile_sm90.py at `model`'s shapes (Qwen3-30B-A3B: H 2048, D 128, QK-norm;
    Llama-3.2-1B: H 2048, D 64) and m rows, as Triton's launcher specialises it (M, nvr constants at 1)."""
    d = 128 if model == "qwen3" else 64
    pointers = {a: "*bf16" for a in ("x_ptr", "w_ptr", "q_ptr", "kc_ptr", "vc_ptr", "qn_ptr", "kn_ptr")}
    pointers.update(tab_ptr="*fp32", pos_ptr="*i64", loc_ptr="*i32", yp_ptr="*fp32", sp_ptr="*fp32", s2_ptr="*fp32")
    constexprs = {"K": 2048, "D": d, "NMB": (m + RB - 1) // RB, "QK_NORM": model == "qwen3", "USE_PDL": True,
                  "EARLY_RELEASE": False, "Q": WARPS, "RB": RB, **({"M": 1, "nvr": 1} if m == 1 else {})}
    return {"constexprs": constexprs, "pointers": pointers, "scalars": {"eps": "fp32"},
            "divisible": ["stride_qm", "stride_qh", "stride_kcs", "stride_kch", "stride_vcs", "stride_vch", "Hq",
                          "max_pos"], "num_warps": WARPS, "ptx": True, "launch_pdl": True,
            **({"maxnreg": maxnreg} if maxnreg else {})}


def scratch_order(ptx: str) -> str:
    """The kernel PTX's global stores (s), cluster barriers (|) and .cg loads (l) in order, runs written "sxN"."""
    import re

    body = ptx[ptx.index(".entry"):]
    marks = {"st.global": "s", "barrier.cluster.arrive": "|", "ld.global.cg": "l"}
    order = ""
    for line in body.splitlines():
        t = re.sub(r"^@!?%p\d+\s+", "", line.strip())
        order += next((c for op, c in marks.items() if t.startswith(op)), "")
    return re.sub(r"(.)\1+", lambda g: f"{g.group(1)}x{len(g.group(0))}", order)


def sm90_rows(model: str, rows: list, caps: tuple = (CAP, None)) -> list:
    """sm_90 compile (CPU) at each width under each register cap in `caps` (None: none): registers, spills and
    `scratch_order`."""
    import os
    import tempfile

    from llama_prologue_sm90 import _compiler

    tmp = tempfile.mkdtemp()
    out = []
    for cap in caps:
        for m in rows:
            info = _compiler()(_ksplit_prologue_kernel, dict(sm90_spec(m, model, cap),
                                                            dump=os.path.join(tmp, f"{model}_{m}_{cap}")))
            row = dict(model=model, rows=m, maxnreg=cap, registers=info["registers"], spill_bytes=info["spill_bytes"],
                       order=scratch_order(info["ptx"]))
            print("  " + " ".join(f"{k} {v}" for k, v in row.items()), flush=True)
            out.append(row)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="qwen3", choices=("qwen3", "llama"))
    ap.add_argument("--rows", default="1,6,16,48")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--variants", default=None, help="default: split_k,cluster,ksplit (qwen3) / prod,ksplit (llama)")
    ap.add_argument("--sm90", action="store_true")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    rows = [int(x) for x in a.rows.split(",")]
    if a.sm90:
        sm90_rows(a.model, rows)
        return
    variants = (a.variants or ("split_k,cluster,ksplit" if a.model == "qwen3" else "prod,ksplit")).split(",")
    known = {*VARIANTS, *(("split_k", "cluster") if a.model == "qwen3" else ("prod",))}
    if not set(variants) <= known:
        raise SystemExit(f"--model {a.model} takes the variants {sorted(known)}, not {sorted(set(variants) - known)}")
    device_run(a.model, rows, a.rounds, a.out, variants)


if __name__ == "__main__":
    main()
