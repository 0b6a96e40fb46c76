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
    nosum_smem           (session 33) qk_own_nosum with the QK-norm weights staged in shared memory before the wait
                         (loaded, q / k selected, stored: `NORM_SMEM`) and read from it after the mma where they are
                         first used (no register held across the wait for them; timed only)
    qk_smem              qk_cluster with the same edit (clustered; checked against the float64 reference)
    qk_smem_rope_late    qk_smem with qk_rope_late's edit (checked)
    nosum_cpasync        nosum_smem with the weights copied by cp.async (`NORM_CPASYNC`: no wait on the loads before
                         the PDL wait; a bar.sync more after it); qk_cpasync: qk_cluster so (checked)

With --sm90 nothing runs: each variant is compiled for sm_90 on this machine (no GPU needed; TRITON_INTERPRET unset)
at each --rows under maxnreg 168 and its registers, spills, shared memory, PTX registers held across the wait and
the SASS around the wait (`sass_around_wait`) are printed (and written to --out):

    python bench/explore/explore46.py --out results.json
    env -u TRITON_INTERPRET python bench/explore/explore46.py --sm90 --rows 1,6 --variants plain,qk_own_nosum,nosum_smem
"""

from __future__ import annotations

import argparse
import re
import sys

import torch

from _common import (module_from_source, prologue_rows, time_alternated, times_line,  # noqa: E402
                     write_results)
from explore37 import capped_source
from explore44 import accuracy_verdict, launch_clustered, qk_norm_source, qwen3_case  # noqa: E402
from lowlat.kernels import attn_prologue_held as aph

SYNC = "            d = _cluster_sync(d)\n"
NORM_LOAD = ("    nlo = gl.expand_dims(gl.where(is_q, gl.load(qn_ptr + j0 + ti), gl.load(kn_ptr + j0 + ti))"
             ".to(gl.float32), 1)\n"
             "    nhi = gl.expand_dims(gl.where(is_q, gl.load(qn_ptr + HALF + j0 + ti),\n"
             "                                  gl.load(kn_ptr + HALF + j0 + ti)).to(gl.float32), 1)\n")
BRANCH = ("        if not is_v:                                  "
          "# a whole head (cluster) takes this branch or none does\n")
LATE_LOAD = ("            nw = gl.where(is_q, qn_ptr, kn_ptr) + j0 + ti       "
             "# QK-norm weights: in flight over the exchange\n"
             "            nlo = gl.expand_dims(gl.load(nw).to(gl.float32), 1)\n"
             "            nhi = gl.expand_dims(gl.load(nw + HALF).to(gl.float32), 1)\n")
ROPE_PRE = "    loc0, cos0, sin0 = _rope_inputs(pos_ptr, loc_ptr, tab_ptr, tm, M, nvr, max_pos, j0 + ti, D, HALF)\n"
ROPE_SEL = '''        if b == 0:
            loc, cos, sin = loc0, cos0, sin0
        else:
            loc, cos, sin = _rope_inputs(pos_ptr, loc_ptr, tab_ptr, erow, M, nvr, max_pos, j0 + ti, D, HALF)
'''
ROPE_AFTER = ("        loc, cos, sin = _rope_inputs(pos_ptr, loc_ptr, tab_ptr, erow, M, nvr, max_pos, j0 + ti, D, "
              "HALF)\n")
R2 = "            r2 = gl.expand_dims(1.0 / gl.sqrt(hs / D + eps), 0)\n"
EXCHANGE = '''            d = _st_f32(xs_ptr + (pid * NMB + b) * RB + tm, gl.sum(lo * lo + hi * hi, axis=0))
            d = _cluster_sync(d)
            first = hd * PH
            hs = gl.load(xs_ptr + (first * NMB + b) * RB + tm + d, cache_modifier=".cg")
            for r in gl.static_range(1, PH):                                    # the head's programs in order
                hs += gl.load(xs_ptr + ((first + r) * NMB + b) * RB + tm + d, cache_modifier=".cg")
'''
NORM_USE = '''            lo = lo * r2 * nlo
            hi = hi * r2 * nhi
'''
#: session 33: the QK-norm weights staged in shared memory before the wait (a program's 2 x 8 bf16: loaded, q / k
#: selected, stored; no register held across the wait for them) and read back where they are first used, after the
#: mma (the block loop's first thread_barrier orders every thread's stores before those reads). Two allocations: one
#: of 16 took a bar.sync between its halves' stores before the wait (Triton's membar pass)
NORM_SMEM = '''    nlo_s = gl.allocate_shared_memory(gl.bfloat16, [8], gl.SwizzledSharedLayout(1, 1, 1, [0]))
    nhi_s = gl.allocate_shared_memory(gl.bfloat16, [8], gl.SwizzledSharedLayout(1, 1, 1, [0]))
    nlo_s.store(gl.where(is_q, gl.load(qn_ptr + j0 + ti), gl.load(kn_ptr + j0 + ti)))
    nhi_s.store(gl.where(is_q, gl.load(qn_ptr + HALF + j0 + ti), gl.load(kn_ptr + HALF + j0 + ti)))
'''
NORM_SMEM_USE = '''            lo = lo * r2 * gl.expand_dims(nlo_s.load(gl.SliceLayout(1, LE)).to(gl.float32), 1)
            hi = hi * r2 * gl.expand_dims(nhi_s.load(gl.SliceLayout(1, LE)).to(gl.float32), 1)
'''
#: the same staged by cp.async (16 bytes a half, no register and no wait on the load before the PDL wait), waited for
#: (wait_group 0) before the block loop's first thread_barrier (Triton's membar pass adds a bar.sync after it)
NORM_CPASYNC = '''    nlo_s = gl.allocate_shared_memory(gl.bfloat16, [8], gl.SwizzledSharedLayout(1, 1, 1, [0]))
    nhi_s = gl.allocate_shared_memory(gl.bfloat16, [8], gl.SwizzledSharedLayout(1, 1, 1, [0]))
    nt = gl.arange(0, 8, layout=gl.BlockedLayout([8], [32], [Q], [0]))
    nw = gl.max_contiguous(gl.multiple_of(gl.where(is_q, qn_ptr, kn_ptr) + j0 + nt, [8]), [8])
    async_copy.async_copy_global_to_shared(nlo_s, nw)
    async_copy.async_copy_global_to_shared(nhi_s, nw + HALF)
    async_copy.commit_group()
'''
MMA_IMPORT = "from triton.experimental.gluon.language.nvidia.ampere import mma_v2\n"
PART_STORE = "        part.store(acc)\n"


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


def smem_norm(src: str) -> str:
    """Session 33's edit: the QK-norm weights staged in shared memory before the wait, read after the mma."""
    return edited(edited(src, NORM_LOAD, NORM_SMEM), NORM_USE, NORM_SMEM_USE)


def cpasync_norm(src: str) -> str:
    """`smem_norm` with the weights copied by cp.async (`NORM_CPASYNC`)."""
    src = edited(edited(src, NORM_LOAD, NORM_CPASYNC), NORM_USE, NORM_SMEM_USE)
    src = edited(src, MMA_IMPORT, MMA_IMPORT.replace("import mma_v2", "import async_copy, mma_v2"))
    return edited(src, PART_STORE, "        async_copy.wait_group(0)\n" + PART_STORE)


def variant_sources(src: str) -> dict:
    """{variant: (kernel module source, launched as clusters of 8, takes the QK-norm arguments)} from the production
    held prologue's source `src` (every edit asserted to apply once)."""
    qsrc = qk_norm_source(src)
    own = "            hs = gl.sum(lo * lo + hi * hi, axis=0) * PH\n"
    nosum_src = edited(edited(qsrc, EXCHANGE, "            hs = (lo * lo + hi * hi) * (PH * 8)\n"), R2,
                       "            r2 = 1.0 / gl.sqrt(hs / D + eps)\n")
    norm_late = lambda t: edited(edited(t, NORM_LOAD, ""), BRANCH, BRANCH + LATE_LOAD)      # noqa: E731
    rope_late = lambda t: edited(edited(t, ROPE_PRE, ""), ROPE_SEL, ROPE_AFTER)          # noqa: E731
    out = {"plain": (src, False, False), "plain_clustered": (src, True, False), "qk_cluster": (qsrc, True, True),
           "qk_nosync": (edited(qsrc, SYNC, ""), False, True), "qk_own": (edited(qsrc, EXCHANGE, own), False, True),
           "qk_late": (norm_late(qsrc), True, True), "qk_own_nosum": (nosum_src, False, True),
           "qk_rope_late": (rope_late(qsrc), True, True), "qk_rope_norm_late": (norm_late(rope_late(qsrc)), True, True)}
    lean = {"rope_late": rope_late, "const": lambda t: edited(t, NORM_LOAD, "    nlo = 1.0\n    nhi = 1.0\n"),
            "nobranch": lambda t: edited(t, BRANCH, "        if M > 0:\n")}
    for tag, edit in lean.items():
        out[f"nosum_{tag}"] = (edit(nosum_src), False, True)
    out["nosum_lean"] = (lean["nobranch"](lean["const"](lean["rope_late"](nosum_src))), False, True)
    out["nosum_smem"] = (smem_norm(nosum_src), False, True)
    out["qk_smem"] = (smem_norm(qsrc), True, True)
    out["qk_smem_rope_late"] = (smem_norm(rope_late(qsrc)), True, True)
    out["nosum_cpasync"] = (cpasync_norm(nosum_src), False, True)
    out["qk_cpasync"] = (cpasync_norm(qsrc), True, True)
    return out


def sm90_spec(m: int, qk: bool) -> dict:
    """tests/unit/compile_sm90.py's spec of the kernel as `Launch` launches it at Qwen3-30B-A3B's shapes (H 2048, D
    128, Hq 32, Hkv 4, a 4096-position table) and m rows: Triton's launcher specialises M and num_valid_rows = m to
    constants at m = 1, the strides, Hq and max_pos as divisible by 16, every pointer as 16-byte aligned."""
    pointers = {a: "*bf16" for a in ("x_ptr", "w_ptr", "g_ptr", "q_ptr", "kc_ptr", "vc_ptr")}
    pointers.update(tab_ptr="*fp32", pos_ptr="*i64", loc_ptr="*i32", nvr_ptr="*i32")
    if qk:
        pointers.update(qn_ptr="*bf16", kn_ptr="*bf16", xs_ptr="*fp32")
    constexprs = {"K": 2048, "D": 128, "NMB": (m + 7) // 8, "NVR_FROM_PTR": False, "USE_PDL": True, "FOLD_G": False,
                  "Q": 4, "S": 4, "RB": 8, **({"M": 1, "nvr_int": 1} if m == 1 else {})}
    return {"constexprs": constexprs, "pointers": pointers, "scalars": {"eps": "fp32"},
            "divisible": ["stride_qm", "stride_qh", "stride_kcs", "stride_kch", "stride_vcs", "stride_vch", "Hq",
                          "max_pos"], "num_warps": 4, "maxnreg": 168, "launch_pdl": True, "ptx": True}


def live_across_wait(ptx: str) -> dict:
    """PTX virtual registers defined before `griddepcontrol.wait` (not by ld.param: ptxas reads kernel parameters
    from the constant bank) and read after it, in 32-bit registers (b64 counted 2; 16-bit 1: a 32-bit register each
    in SASS) and predicates: what the program holds across the wait before ptxas allocates registers."""
    import re

    body = ptx[ptx.index(".entry"):]
    head, _, tail = body.partition("griddepcontrol.wait")
    regs = re.compile(r"%(rd|fd|rs|r|f|p|h)(\d+)")
    defined, param = set(), set()
    for line in head.splitlines():
        t = line.strip()
        if not t or t.startswith((".reg", "//", ".entry", ".param", ".maxnreg", ".reqntid")):
            continue
        found = regs.findall(t)
        defined.update(found)
        if t.startswith("ld.param") and found:
            param.add(found[0])
    used = set(regs.findall(tail))
    held = (defined - param) & used
    return {"regs32": sum(2 if k in ("rd", "fd") else 1 for k, _ in held if k != "p"),
            "preds": sum(k == "p" for k, _ in held)}


def sass_around_wait(sass: str) -> dict:
    """The sm_90 SASS around the PDL wait (ACQBULK): local-memory spill stores before / after it, spill loads, and
    how many 16-byte global loads (the held weights') before it issue after its first STL / STS: such a store waits
    for its value's load to land, so weight loads behind it issue a memory latency later."""
    lines = [ln for ln in sass.splitlines() if re.match(r"\s*/\*[0-9a-f]{4,}\*/", ln)]
    wait = next(i for i, ln in enumerate(lines) if "ACQBULK" in ln)
    head, tail = lines[:wait], lines[wait + 1:]
    store = next((i for i, ln in enumerate(head) if re.search(r"\b(STL|STS)", ln)), len(head))
    return {"stl_before": sum("STL" in ln for ln in head), "stl_after": sum("STL" in ln for ln in tail),
            "ldl": sum("LDL" in ln for ln in lines), "sts_before": sum(" STS" in ln for ln in head),
            "ldg128_after_store": sum("LDG.E.128" in ln for ln in head[store:])}


def sm90_table(variants: list, rows: list) -> list:
    """Each variant compiled for sm_90 on this machine (no GPU: Triton's bundled ptxas, TRITON_INTERPRET unset) at
    each row count under maxnreg 168: registers, spill bytes (ptxas -v), shared memory, PTX registers held across the
    wait (`live_across_wait`), global loads / bar.sync before / after the wait."""
    import os
    import tempfile
    from pathlib import Path

    if os.environ.get("TRITON_INTERPRET"):
        raise SystemExit("--sm90 compiles: run it with TRITON_INTERPRET unset (env -u TRITON_INTERPRET ...)")
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests" / "unit"))
    from compile_sm90 import compile_for_sm90

    sources = variant_sources(open(aph.__file__).read())
    out = []
    tmp = tempfile.mkdtemp()
    for v in variants:
        src, _, qk = sources[v]
        kernel = module_from_source(f"e46_sm90_{v}", capped_source(src, 168))._held_prologue_kernel
        for m in rows:
            info = compile_for_sm90(kernel, dict(sm90_spec(m, qk), dump=os.path.join(tmp, f"{v}_{m}")))
            ptx = info.pop("ptx")
            head, _, tail = ptx.partition("griddepcontrol.wait")
            row = dict(variant=v, rows=m, registers=info["registers"], spill_bytes=info["spill_bytes"],
                       shared=info["shared"], **live_across_wait(ptx), ld_global_before=head.count("ld.global"),
                       ld_global_after=tail.count("ld.global"), ld_shared_after=tail.count("ld.shared"),
                       bar_sync=ptx.count("bar.sync"),
                       **sass_around_wait(open(os.path.join(tmp, f"{v}_{m}.sass")).read()))
            print("  " + " ".join(f"{k} {x}" for k, x in row.items()), flush=True)
            out.append(row)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default="1,6")
    ap.add_argument("--variants", default="plain,plain_clustered,qk_cluster,qk_nosync,qk_own",
                    help="among plain, plain_clustered, qk_cluster, qk_nosync, qk_own, qk_late, qk_own_nosum, "
                    "qk_rope_late, qk_rope_norm_late, nosum_rope_late, nosum_const, nosum_nobranch, nosum_lean, "
                    "nosum_smem, qk_smem, qk_smem_rope_late, nosum_cpasync, qk_cpasync")
    ap.add_argument("--out", default=None)
    ap.add_argument("--sm90", action="store_true", help="no GPU: compile the variants for sm_90 and print / write "
                    "their registers, spills, shared memory and registers held across the wait (`sm90_table`)")
    args = ap.parse_args()
    if args.sm90:
        rows = [int(x) for x in args.rows.split(",")]
        table = sm90_table(args.variants.split(","), rows)
        if args.out:
            import json

            import triton
            with open(args.out, "w") as f:
                json.dump(dict(device="none: compiled for sm_90 on the CPU", triton=triton.__version__,
                               model="Qwen3-30B-A3B", maxnreg=168, results=table), f, indent=1)
        return
    dev = torch.device("cuda")
    cfg, lw, w0, table, inv, r = qwen3_case(dev)
    n = w0.shape[0]
    hq, hkv, d, h = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.hidden_size
    wfs = [aph.fold_attn_norm(w0.clone(), lw.attn_norm) for _ in range(r)]
    scratch = torch.full((n // 16 * 6 * 8,), float("nan"), device=dev)
    sources = variant_sources(open(aph.__file__).read())
    launches = {v: Launch(f"e46_{v}", *sources[v]) for v in args.variants.split(",")}
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
