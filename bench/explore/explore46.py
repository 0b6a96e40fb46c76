"""Session 29: where Qwen3-30B-A3B's one-wave held prologue with QK-norm (explore44) spends the 1.2-1.4 us it takes
beyond the plain held prologue (call 1: 8.02-8.07 against 6.62-6.86 us per kernel at 1 row, 70% of copy bandwidth
needs 7.26).

All variants are `fold_attn_norm`'s weights under maxnreg=168 (three programs an SM: 320 programs in one wave),
released after the wait as production, per kernel like `bench/bench_attn_prologue.py` (CUDA graphs over rotated cold
copies, PDL on), A B .. B A:

    plain                the production held prologue at Qwen3's shapes (no QK-norm), launched as single CTAs
    plain_clustered      the same launched as clusters of 8 (explore44's launch): the cost of the cluster launch
    qk_cluster           explore44's held_cluster_folded_r168 (QK-norm, the head's 8 partial sums exchanged through
                         global memory across one barrier.cluster): checked against the float64 reference
    qk_nosync            the same source with the cluster barrier removed, single CTAs: the exchange's stores and
                         loads without its wait (the sums read are other programs' of whenever: timed only)
    qk_own               QK-norm from the program's own 16 outputs (no store, no barrier, no loads): the norm's
                         arithmetic and weights alone (timed only)
    qk_late              qk_cluster with the QK-norm weights loaded after the mma, over the exchange (not held
                         across the wait: fewer registers then; call 4)
    qk_own_nosum         qk_own without the sum over the program's outputs (each output scaled by its own square):
                         the cross-warp reduction's share (timed only; call 4)
    qk_rope_late         qk_cluster with the first row block's positions, KV slots and cos / sin loaded after the
                         wait (as the later row blocks' are): 4+ registers fewer across it, no spills under
                         maxnreg 168 at 1 row block (every other QK-norm variant spills 16 bytes; CPU compile; call 6)
    qk_rope_norm_late    the same with qk_late's norm weights after the mma (no spills; call 6)
    nosum_rope_late      qk_own_nosum with qk_rope_late's edit (no spills); nosum_const: its norm weights constants 1
                         (no loads); nosum_nobranch: every program takes the QK-norm path (no branch on is_v);
                         nosum_lean: the three together (timed only; prepared in session 29 for session 30: the
                         ~0.6 us between plain and qk_own is not the sum, the barriers or the norm weights' residency)

    python bench/explore/explore46.py --out results.json
"""

from __future__ import annotations

import argparse

import torch

from _common import (module_from_source, prologue_rows, time_alternated, times_line,  # noqa: E402
                     write_results)
from explore37 import capped_source
from explore44 import accuracy_verdict, launch_clustered, qk_norm_source, qwen3_case  # noqa: E402
from lowlat.kernels import attn_prologue_held as aph

SYNC = "            d = _cluster_sync(d)\n"
NORM_LOAD = '''    nlo = gl.expand_dims(gl.where(is_q, gl.load(qn_ptr + j0 + ti), gl.load(kn_ptr + j0 + ti)).to(gl.float32), 1)
    nhi = gl.expand_dims(gl.where(is_q, gl.load(qn_ptr + HALF + j0 + ti),
                                  gl.load(kn_ptr + HALF + j0 + ti)).to(gl.float32), 1)
'''
BRANCH = "        if not is_v:                                  # a whole head (cluster) takes this branch or none does\n"
LATE_LOAD = '''            nw = gl.where(is_q, qn_ptr, kn_ptr) + j0 + ti       # QK-norm weights: in flight over the exchange
            nlo = gl.expand_dims(gl.load(nw).to(gl.float32), 1)
            nhi = gl.expand_dims(gl.load(nw + HALF).to(gl.float32), 1)
'''
ROPE_PRE = "    loc0, cos0, sin0 = _rope_inputs(pos_ptr, loc_ptr, tab_ptr, tm, M, nvr, max_pos, j0 + ti, D, HALF)\n"
ROPE_SEL = '''        if b == 0:
            loc, cos, sin = loc0, cos0, sin0
        else:
            loc, cos, sin = _rope_inputs(pos_ptr, loc_ptr, tab_ptr, erow, M, nvr, max_pos, j0 + ti, D, HALF)
'''
ROPE_AFTER = "        loc, cos, sin = _rope_inputs(pos_ptr, loc_ptr, tab_ptr, erow, M, nvr, max_pos, j0 + ti, D, HALF)\n"
R2 = "            r2 = gl.expand_dims(1.0 / gl.sqrt(hs / D + eps), 0)\n"
EXCHANGE = '''            d = _st_f32(xs_ptr + (pid * NMB + b) * RB + tm, gl.sum(lo * lo + hi * hi, axis=0))
            d = _cluster_sync(d)
            first = hd * PH
            hs = gl.load(xs_ptr + (first * NMB + b) * RB + tm + d, cache_modifier=".cg")
            for r in gl.static_range(1, PH):                                    # the head's programs in order
                hs += gl.load(xs_ptr + ((first + r) * NMB + b) * RB + tm + d, cache_modifier=".cg")
'''


def edited(src: str, old: str, new: str) -> str:
    assert src.count(old) == 1, f"explore44's source changed: {old!r}"
    return src.replace(old, new)


class Launch:
    """A held-prologue module's kernel launched like explore44's ClusterProlog (grid N / 16 programs, or N / 16 / 8
    clusters of 8 after a first plain launch patches the compiled kernel's packed metadata); qk: the kernel takes the
    QK-norm weights and the partial sums' scratch."""

    def __init__(self, name: str, src: str, clustered: bool, qk: bool):
        self.mod = module_from_source(name, capped_source(src, 168))
        self.clustered, self.qk, self.seen = clustered, qk, set()

    def __call__(self, x, w, qn, kn, pos, loc, kc, vc, table, cfg, out_q, scratch):
        m, n = x.shape[0], w.shape[0]
        k = self.mod._held_prologue_kernel
        args = [x, w, w, table, pos, loc, loc, m, out_q, out_q.stride(0), out_q.stride(1), kc, kc.stride(0),
                kc.stride(1), vc, vc.stride(0), vc.stride(1), m, out_q.shape[1], kc.shape[1], table.shape[0],
                float(cfg.rms_eps)]
        if self.qk:
            args += [qn, kn, scratch]
        kw = dict(K=x.shape[1], D=cfg.head_dim, NMB=(m + 7) // 8, NVR_FROM_PTR=False, USE_PDL=True, FOLD_G=False,
                  Q=4, S=4, RB=8, num_warps=4, launch_pdl=True, maxnreg=168)
        if self.clustered:
            launch_clustered(k, n // 16, m, self.seen, args, kw)
        else:
            k[(n // 16,)](*args, **kw)
        return out_q


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default="1,6")
    ap.add_argument("--variants", default="plain,plain_clustered,qk_cluster,qk_nosync,qk_own",
                    help="among plain, plain_clustered, qk_cluster, qk_nosync, qk_own, qk_late, qk_own_nosum, "
                    "qk_rope_late, qk_rope_norm_late, nosum_rope_late, nosum_const, nosum_nobranch, nosum_lean")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    dev = torch.device("cuda")
    cfg, lw, w0, table, inv, r = qwen3_case(dev)
    n = w0.shape[0]
    hq, hkv, d, h = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.hidden_size
    wfs = [aph.fold_attn_norm(w0.clone(), lw.attn_norm) for _ in range(r)]
    scratch = torch.full((n // 16 * 6 * 8,), float("nan"), device=dev)
    src = open(aph.__file__).read()
    qsrc = qk_norm_source(src)
    own = '''            hs = gl.sum(lo * lo + hi * hi, axis=0) * PH
'''
    nosum = "            hs = (lo * lo + hi * hi) * (PH * 8)\n"
    launches = {"plain": Launch("e46_plain", src, False, False),
                "plain_clustered": Launch("e46_plain_c", src, True, False),
                "qk_cluster": Launch("e46_qk", qsrc, True, True),
                "qk_nosync": Launch("e46_qk_nosync", edited(qsrc, SYNC, ""), False, True),
                "qk_own": Launch("e46_qk_own", edited(qsrc, EXCHANGE, own), False, True),
                "qk_late": Launch("e46_qk_late", edited(edited(qsrc, NORM_LOAD, ""), BRANCH, BRANCH + LATE_LOAD), True,
                                  True),
                "qk_own_nosum": Launch("e46_qk_own_nosum", edited(edited(qsrc, EXCHANGE, nosum), R2,
                                                                   "            r2 = 1.0 / gl.sqrt(hs / D + eps)\n"),
                                       False, True)}
    rope_late = edited(edited(qsrc, ROPE_PRE, ""), ROPE_SEL, ROPE_AFTER)
    launches["qk_rope_late"] = Launch("e46_qk_rope_late", rope_late, True, True)
    launches["qk_rope_norm_late"] = Launch("e46_qk_rope_norm_late", edited(edited(rope_late, NORM_LOAD, ""), BRANCH,
                                                                           BRANCH + LATE_LOAD), True, True)
    nosum_src = edited(edited(qsrc, EXCHANGE, nosum), R2, "            r2 = 1.0 / gl.sqrt(hs / D + eps)\n")
    lean = {"rope_late": lambda t: edited(edited(t, ROPE_PRE, ""), ROPE_SEL, ROPE_AFTER),
            "const": lambda t: edited(t, NORM_LOAD, "    nlo = 1.0\n    nhi = 1.0\n"),
            "nobranch": lambda t: edited(t, BRANCH, "        if M > 0:\n")}
    for tag, edit in lean.items():
        launches[f"nosum_{tag}"] = Launch(f"e46_nosum_{tag}", edit(nosum_src), False, True)
    launches["nosum_lean"] = Launch("e46_nosum_lean", lean["nobranch"](lean["const"](lean["rope_late"](nosum_src))),
                                    False, True)
    launches = {v: launches[v] for v in args.variants.split(",")}
    results = []
    for m in [int(x) for x in args.rows.split(",")]:
        xs, pos, locs = prologue_rows(m, h, r, dev)
        caches = {v: [torch.full((r * m + 1, hkv, d), float("nan"), dtype=torch.bfloat16, device=dev)
                      for _ in range(2)] for v in launches}
        qs = {v: [torch.full((m, hq, d), float("nan"), dtype=torch.bfloat16, device=dev) for _ in range(r)]
              for v in launches}
        fns = {v: (lambda v: lambda i: launches[v](xs[i % r], wfs[i % r], lw.q_norm, lw.k_norm, pos, locs[i % r],
                                                   *caches[v], table, cfg, qs[v][i % r], scratch))(v)
               for v in launches}
        for v in fns:
            for i in range(r):
                fns[v](i)
        torch.cuda.synchronize()
        verdict = {v: accuracy_verdict((qs[v][0], caches[v][0][1:m + 1], caches[v][1][1:m + 1]), xs[0], w0, lw, pos,
                                       inv, cfg) for v in launches if v.startswith("qk_") and launches[v].clustered}
        times = time_alternated(fns, max(r, 8), rounds=2)
        print(f"  r{m:<3} us (min/max of 4) {times_line(times)} | {verdict}", flush=True)
        results.append(dict(rows=m, us=times, accuracy=verdict))
    write_results(args.out, results, model=cfg.name)


if __name__ == "__main__":
    main()
