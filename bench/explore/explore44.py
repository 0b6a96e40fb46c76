"""Session 28: a held attention prologue with QK-norm for Qwen3-30B-A3B (D 128): the 8 programs of a head launched as
one thread-block cluster exchange their per-row partial sums of squares (a prototype, not production).

`kernels/attn_prologue_held.py` takes no QK-norm: a program holds 8 RoPE pairs (16 weight rows) of one head, and
the norm of a q / k head needs the sum of squares of all D outputs of a row, i.e. of the head's D / 16 programs.
explore38 (session 28 call 1) showed that 8 CTAs of one cluster can exchange values through global memory and
`barrier.cluster.arrive.release` / `wait.acquire` (bitwise correct; ~0.3 us an exchange a round). Gluon's mma_v2
refuses CGA layouts (Triton 3.6: its layout comparison fails on the cga_layout list), so the kernel is compiled as
usual (num_ctas 1) and LAUNCHED as clusters of 8: after its first launch the compiled kernel's packed launch
metadata says num_ctas 8, and Triton's launcher then asks cuLaunchKernelEx for cluster dimension 8 (grid x 8 CTAs,
PDL attribute kept). blockIdx.x (the program id) stays the program; a cluster is 8 consecutive programs = one head
at D 128.

The kernel is the production held prologue with these edits (`qk_norm_source`): the QK-norm weights of its 16 rows
loaded before the wait; after the slices' sum and x's rstd, a q / k program stores the per-row sum of its 16 outputs'
squares (fp32) to a scratch [programs, row blocks, 8], syncs the cluster and adds its head's 8 partial sums in
program order (every program of the head the same bits), then y = y rstd_head q_norm|k_norm before RoPE: the split-K
prologue's formulas (kernels/attn_prologue.py `_rope_epilogue`), another summation order. Timed per kernel like
`bench/bench_attn_prologue.py` (CUDA graphs over rotated cold copies, PDL on) against the split-K prologue
FusedModel runs for Qwen3 (A B C C B A); each checked against the float64 reference at the numerics policy
(`check_accuracy("attn_prologue", ...)`, what the GPU tests demand). held_cluster_folded_r168: `fold_attn_norm`'s
weights and maxnreg=168 (174 registers without: 2 programs an SM, 264 slots for 320 programs; 3 at 168, 16 bytes
spilled at 1 row block, none at 2).

Session 29 adds where the next launch is released (`ClusterProlog(release=)`: "late" after the wait as production,
"landed" once a thread's held weights are in its registers, `_common.landed_release_source`, "early" at the start)
and the production held prologue without QK-norm at Qwen3's shapes (plain_*: the same weights and grid, no exchange,
no cluster; timed, not checked: the reference has QK-norm), to split the one-wave form's time between the GEMV and
the exchange.

    python bench/explore/explore44.py --out results.json
"""

from __future__ import annotations

import argparse

import torch

from _common import (landed_release_source, module_from_source, prologue_rows, time_alternated,  # noqa: E402
                     times_line, write_results)
from explore37 import capped_source
from lowlat.benchmarking import rotation_copies
from lowlat.config import preset
from lowlat.kernels import attn_prologue_held as aph
from lowlat.kernels.attn_prologue import attn_prologue, make_prologue_workspace, pack_qkv, rope_table
from lowlat.numerics import check_accuracy
from lowlat.reference.attn_prologue import attn_prologue as reference
from lowlat.reference.rope import rope_inv_freq
from lowlat.weights import random_layer_weights

CLUSTER = 8
#: call 9 timed split_k and held_cluster; call 10 added held_cluster_folded_r168 (folded weights, maxnreg 168); call
#: 11 (--variants) the same with 16 K slices (24 bytes spilled at 1 row block, 80 at 2)
#: session 29 (call 1): the one-wave form released when its weights land / at its start; the plain held prologue
VARIANTS = ("split_k", "held_cluster", "held_cluster_folded_r168", "held_cluster_folded_r168_s16",
            "held_cluster_folded_r168_landed", "held_cluster_folded_r168_early", "plain_folded_r168",
            "plain_folded_r168_landed")

HELPERS = '''

@gluon.jit
def _st_f32(ptr, val):
    """st.global of an fp32 a thread-element; returns 0, opaque to the compiler (orders what uses it after it)."""
    return gl.inline_asm_elementwise("st.global.cg.f32 [$1], $2; mov.u32 $0, 0;", "=r,l,r",
                                     [ptr.to(gl.int64, bitcast=True), val], dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def _cluster_sync(dep):
    """Every thread of the cluster's CTAs arrives (release) then waits (acquire); returns 0, opaque."""
    return gl.inline_asm_elementwise(
        "barrier.cluster.arrive.release.aligned; barrier.cluster.wait.acquire.aligned; mov.u32 $0, 0;",
        "=r,r", [dep], dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def _held_prologue_kernel('''
EDITS = [
    ("\n\n@gluon.jit\ndef _held_prologue_kernel(", HELPERS),
    ("M, Hq, Hkv, max_pos, eps, K: gl.constexpr,",
     "M, Hq, Hkv, max_pos, eps, qn_ptr, kn_ptr, xs_ptr, K: gl.constexpr,"),
    ('''    loc0, cos0, sin0 = _rope_inputs(pos_ptr, loc_ptr, tab_ptr, tm, M, nvr, max_pos, j0 + ti, D, HALF)
''', '''    loc0, cos0, sin0 = _rope_inputs(pos_ptr, loc_ptr, tab_ptr, tm, M, nvr, max_pos, j0 + ti, D, HALF)
    nlo = gl.expand_dims(gl.where(is_q, gl.load(qn_ptr + j0 + ti), gl.load(kn_ptr + j0 + ti)).to(gl.float32), 1)
    nhi = gl.expand_dims(gl.where(is_q, gl.load(qn_ptr + HALF + j0 + ti),
                                  gl.load(kn_ptr + HALF + j0 + ti)).to(gl.float32), 1)
    PH: gl.constexpr = HALF // 8                      # programs a head (one cluster at D 128)
    pid = gl.program_id(0)
'''),
    ('''        hi = gl.sum(hi3, axis=0) * rstd
''', '''        hi = gl.sum(hi3, axis=0) * rstd
        if not is_v:                                  # a whole head (cluster) takes this branch or none does
            d = _st_f32(xs_ptr + (pid * NMB + b) * RB + tm, gl.sum(lo * lo + hi * hi, axis=0))
            d = _cluster_sync(d)
            first = hd * PH
            hs = gl.load(xs_ptr + (first * NMB + b) * RB + tm + d, cache_modifier=".cg")
            for r in gl.static_range(1, PH):                                    # the head's programs in order
                hs += gl.load(xs_ptr + ((first + r) * NMB + b) * RB + tm + d, cache_modifier=".cg")
            r2 = gl.expand_dims(1.0 / gl.sqrt(hs / D + eps), 0)
            lo = lo * r2 * nlo
            hi = hi * r2 * nhi
'''),
]


def qk_norm_source(src: str) -> str:
    for old, new in EDITS:
        assert src.count(old) == 1, f"the production source changed: {old!r}"
        src = src.replace(old, new)
    return src


class ClusterProlog:
    """The edited kernel launched as clusters of CLUSTER programs (see the module docstring)."""

    def __init__(self, fold_g: bool = True, maxnreg: int | None = None, slices: int = 4, release: str = "late"):
        """fold_g: g multiplied in registers (FusedModel's HELD_FOLD "registers"), else the weights given are
        `fold_attn_norm`'s; maxnreg: a register cap (168: three programs an SM, 396 slots for 320 programs); slices:
        K slices (4: one a warp; 16: four mma chains a warp, explore40); release: "late" (after the wait),
        "landed" (once the weights are in registers) or "early" (at the start)."""
        src = qk_norm_source(open(aph.__file__).read())
        self.mod = module_from_source(f"aph_qk_norm_{fold_g}_{maxnreg}_{slices}_{release}",
                                      landed_release_source(src) if release == "landed" else src)
        self.fold_g, self.maxnreg, self.slices, self.early = fold_g, maxnreg, slices, release == "early"
        self.clustered = set()

    def __call__(self, x, w, g, qn, kn, pos, loc, nvr, kc, vc, table, cfg, out_q, scratch, use_pdl=True):
        m = x.shape[0]
        n = w.shape[0]
        nmb = (m + 7) // 8
        k = self.mod._held_prologue_kernel
        args = (x, w, g, table, pos, loc, loc, nvr, out_q, out_q.stride(0), out_q.stride(1), kc, kc.stride(0),
                kc.stride(1), vc, vc.stride(0), vc.stride(1), m, out_q.shape[1], kc.shape[1], table.shape[0],
                float(cfg.rms_eps), qn, kn, scratch)
        kw = dict(K=x.shape[1], D=cfg.head_dim, NMB=nmb, NVR_FROM_PTR=False, USE_PDL=use_pdl, FOLD_G=self.fold_g, Q=4,
                  S=self.slices, RB=8, EARLY_RELEASE=self.early, num_warps=4, launch_pdl=use_pdl,
                  **({"maxnreg": self.maxnreg} if self.maxnreg else {}))
        launch_clustered(k, n // 16, m, self.clustered, args, kw)
        return out_q


def launch_clustered(kernel, programs: int, m: int, seen: set, args, kw, cluster: int = CLUSTER) -> None:
    """`programs` programs of `kernel` launched as clusters of `cluster`. A width's first launch (m not in `seen`)
    compiles it with a plain launch (its sums are wrong, nothing hangs; Triton specialises M: 1, multiples of 16)
    and patches the compiled kernels' packed launch metadata to num_ctas `cluster` (see the module docstring)."""
    if m not in seen:
        kernel[(programs,)](*args, **kw)
        for caches in kernel.device_caches.values():
            for ck in caches[0].values():
                md = ck.packed_metadata
                if md[1] == 1:
                    ck.packed_metadata = (md[0], cluster, md[2])
        seen.add(m)
    kernel[(programs // cluster,)](*args, **kw)


def qwen3_case(dev):
    """Qwen3-30B-A3B's prologue inputs (session 28-29 explores): (cfg, one layer's random weights (seed 0), the packed
    QKV weight, the RoPE table of 4096 positions, the float64 inverse frequencies, r: rotated copies per launch)."""
    cfg = preset("Qwen3-30B-A3B")
    lw = random_layer_weights(cfg.replace(num_experts=0, top_k=0, moe_intermediate_size=0, intermediate_size=16),
                              generator=torch.Generator().manual_seed(0), device=dev)
    w0 = pack_qkv(lw)
    inv = rope_inv_freq(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling, torch.float64).to(dev)
    return cfg, lw, w0, rope_table(cfg, 4096, dev), inv, rotation_copies(w0.numel() * 2)


def accuracy_verdict(got, x, w0, lw, pos, inv, cfg) -> str:
    """"within policy" or "FAILED ..." (printed, not raised: a prototype's finding): got = (q, k rows, v rows) of
    input x [m, H] at KV slots 1..m against the float64 reference (and the bf16 one: the policy's baseline),
    `check_accuracy("attn_prologue", ...)` as the GPU tests demand."""
    m, dev = x.shape[0], x.device
    ref = {}
    for dt in (torch.float64, torch.bfloat16):
        kc, vc = (torch.zeros(m + 1, cfg.num_kv_heads, cfg.head_dim, dtype=dt, device=dev) for _ in range(2))
        qn, kn = (None if t is None else t.to(dt) for t in (lw.q_norm, lw.k_norm))    # None: no QK-norm (Llama)
        q = reference(x.to(dt), w0.to(dt), None, lw.attn_norm.to(dt), qn, kn, pos,
                      torch.arange(1, m + 1, dtype=torch.int32, device=dev), m, kc, vc,
                      inv if dt == torch.float64 else inv.float(), eps=cfg.rms_eps)
        ref[dt] = (q, kc[1:], vc[1:])
    try:
        for name, a, o, b in zip(("q", "k_cache", "v_cache"), got, ref[torch.float64], ref[torch.bfloat16]):
            check_accuracy("attn_prologue", a, o, b, output=name)
    except AssertionError as e:
        return f"FAILED {str(e)[:160]}"
    return "within policy"


def qwen3_copies(dev):
    """`qwen3_case` and what the per-kernel explores time it on: (cfg, lw, w0, table, inv, r, ws: r copies of w0,
    wfs: their `fold_attn_norm`, pws: the split-K prologue's workspace)."""
    cfg, lw, w0, table, inv, r = qwen3_case(dev)
    ws = [w0.clone() for _ in range(r)]
    return (cfg, lw, w0, table, inv, r, ws, [aph.fold_attn_norm(w, lw.attn_norm) for w in ws],
            make_prologue_workspace(w0, cfg.head_dim))


def split_k_launch(rows: tuple, ws: list, lw, m: int, kcs: dict, vcs: dict, qs: dict, table, cfg, pws):
    """FusedModel's split-K prologue for Qwen3 as a timed launch(i) (the Qwen3 explores' baseline, variant "split_k"):
    copy i % r of `prologue_rows`' rows = (xs, positions, locs) and of the weights `ws`, PDL on, into `nan_outputs`'
    split_k outputs; pws: `qwen3_copies`' workspace."""
    from lowlat.kernels.attn_prologue import attn_prologue

    xs, pos, locs = rows
    r = len(xs)
    return lambda i: attn_prologue(xs[i % r], ws[i % r], None, lw.attn_norm, lw.q_norm, lw.k_norm, pos, locs[i % r], m,
                                   kcs["split_k"], vcs["split_k"], table, cfg=cfg, out_q=qs["split_k"][i % r],
                                   workspace=pws, use_pdl=True)


def nan_outputs(variants, r: int, m: int, cfg, dev):
    """({variant: K cache}, {variant: V cache}, {variant: r q outputs}) at width m, all NaN: caches of r m + 1 slots
    [slots, Hkv, D], q [m, Hq, D], bf16."""
    hq, hkv, d = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    kcs = {v: torch.full((r * m + 1, hkv, d), float("nan"), dtype=torch.bfloat16, device=dev) for v in variants}
    vcs = {v: torch.full((r * m + 1, hkv, d), float("nan"), dtype=torch.bfloat16, device=dev) for v in variants}
    qs = {v: [torch.full((m, hq, d), float("nan"), dtype=torch.bfloat16, device=dev) for _ in range(r)]
          for v in variants}
    return kcs, vcs, qs


def checked_times(fns: dict, r: int, m: int, kcs: dict, vcs: dict, qs: dict, rows, w0, lw, inv, cfg, rounds: int):
    """Qwen3 prologue variants `fns` {variant: launch(i)} at width m run (the first launch alone: a clustered form's
    first launch of a width compiles it unclustered), then ({variant: every element written: no NaN in its r q
    outputs `qs` nor its caches' `kcs` / `vcs` slots 1..}, {variant: `accuracy_verdict` of copy 0}, {variant: us} of
    `time_alternated` over max(r, 8) launches, `rounds` rounds). rows: (xs, positions) the launches read."""
    from _common import time_alternated

    xs, pos = rows
    for v in fns:
        fns[v](0)
        for i in range(r):
            fns[v](i)
    torch.cuda.synchronize()
    written = {v: not (bool(kcs[v][1:].isnan().any()) or bool(vcs[v][1:].isnan().any())
                       or any(bool(q.isnan().any()) for q in qs[v])) for v in fns}
    verdict = {v: accuracy_verdict((qs[v][0], kcs[v][1:m + 1], vcs[v][1:m + 1]), xs[0], w0, lw, pos, inv, cfg)
               for v in fns}
    return written, verdict, time_alternated(fns, max(r, 8), rounds=rounds)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default="1,6,16,48")
    ap.add_argument("--variants", default=",".join(VARIANTS[:3]), help=f"among {VARIANTS}")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    dev = torch.device("cuda")
    cfg, lw, w0, table, inv, r = qwen3_case(dev)
    n = w0.shape[0]
    hq, hkv, d, h = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.hidden_size
    ws = [w0.clone() for _ in range(r)]
    wfs = [aph.fold_attn_norm(w, lw.attn_norm) for w in ws]
    pws = make_prologue_workspace(w0, d)
    held = ClusterProlog()
    held_r168 = ClusterProlog(fold_g=False, maxnreg=168)        # session 28 call 10
    held_r168_s16 = ClusterProlog(fold_g=False, maxnreg=168, slices=16)        # call 11
    held_r168_landed = ClusterProlog(fold_g=False, maxnreg=168, release="landed")      # session 29
    held_r168_early = ClusterProlog(fold_g=False, maxnreg=168, release="early")
    src = open(aph.__file__).read()
    plain = {"plain_folded_r168": module_from_source("aph_plain_r168", capped_source(src, 168)),
             "plain_folded_r168_landed": module_from_source("aph_plain_r168_landed",
                                                            landed_release_source(capped_source(src, 168)))}
    cfg_plain = cfg.replace(qk_norm=False)
    clustered = {"held_cluster": (held, ws), "held_cluster_folded_r168": (held_r168, wfs),
                 "held_cluster_folded_r168_s16": (held_r168_s16, wfs),
                 "held_cluster_folded_r168_landed": (held_r168_landed, wfs),
                 "held_cluster_folded_r168_early": (held_r168_early, wfs)}
    scratch = torch.full((n // 16 * 6 * 8,), float("nan"), device=dev)
    results = []
    for m in [int(x) for x in args.rows.split(",")]:
        xs, pos, locs = prologue_rows(m, h, r, dev)
        kcs = {v: torch.full((r * m + 1, hkv, d), float("nan"), dtype=torch.bfloat16, device=dev)
               for v in VARIANTS}
        vcs = {v: torch.full((r * m + 1, hkv, d), float("nan"), dtype=torch.bfloat16, device=dev)
               for v in VARIANTS}
        qs = {v: [torch.full((m, hq, d), float("nan"), dtype=torch.bfloat16, device=dev) for _ in range(r)]
              for v in VARIANTS}
        fns = {"split_k": lambda i: attn_prologue(xs[i % r], ws[i % r], None, lw.attn_norm, lw.q_norm, lw.k_norm,
                                                  pos, locs[i % r], m, kcs["split_k"], vcs["split_k"], table,
                                                  cfg=cfg, out_q=qs["split_k"][i % r], workspace=pws, use_pdl=True)}
        for v, (prolog, wl) in clustered.items():
            fns[v] = (lambda prolog, wl, v: lambda i: prolog(
                xs[i % r], wl[i % r], lw.attn_norm, lw.q_norm, lw.k_norm, pos, locs[i % r], m, kcs[v], vcs[v], table,
                cfg, qs[v][i % r], scratch))(prolog, wl, v)
        for v, mod in plain.items():
            fns[v] = (lambda mod, v: lambda i: mod.attn_prologue_held(
                xs[i % r], wfs[i % r], None, pos, locs[i % r], m, kcs[v], vcs[v], table, cfg=cfg_plain,
                out_q=qs[v][i % r], use_pdl=True))(mod, v)
        fns = {v: fns[v] for v in args.variants.split(",")}
        for v in fns:
            fns[v](0)                           # the held form's first launch of a width compiles (unclustered)
            for i in range(r):
                fns[v](i)
        torch.cuda.synchronize()
        verdict = {v: "timed only (no QK-norm)" if v.startswith("plain") else
                   accuracy_verdict((qs[v][0], kcs[v][1:m + 1], vcs[v][1:m + 1]), xs[0], w0, lw, pos, inv, cfg)
                   for v in fns}
        times = time_alternated(fns, max(r, 8))
        line = times_line(times)
        print(f"  r{m:<3} us (min/max of 2) {line} | {verdict}", flush=True)
        results.append(dict(rows=m, us=times, accuracy=verdict))
    write_results(args.out, results, model=cfg.name)


if __name__ == "__main__":
    main()
