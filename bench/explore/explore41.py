"""Session 28: the held kernels' activation rows copied to shared memory (cp.async) after the wait, so that every
load of a row block leaves in one round trip.

The sm_90 SASS of `kernels/attn_prologue_held.py` (Llama-3.2-1B, 1 row block) shows, after the wait, 8 of x's 16
16-byte loads a thread, then the first mma.sync, then the other loads interleaved with the mma chain: ptxas places
loads next to their use, so the later loads leave only once the first mma's operands have arrived, i.e. x takes two or
more dependent round trips (a thread barrier after the load does not change it: the mma has no memory effects and
moves above it). `kernels/residual_gemv_held.py` (Qwen3-30B-A3B's out_proj, K 4096) does the same (10 of 16 first).
"cpasync": every thread's loads of the block are `cp.async` copies into a shared [S, K / S, RB] buffer (no register
destinations: all issued at once), the step's other loads of that block (RoPE inputs past the first block; the
residual) issued next, then `cp.async.wait_group 0`, a CTA barrier and the operand read from shared memory. The same
arithmetic and bits as production (the same operands reach the same mma). Per kernel like explore40, A B B A, the
outputs compared bitwise with production.

    python bench/explore/explore41.py --out results.json
"""

from __future__ import annotations

import torch

from _common import LlamaPrologueCase, module_from_source, time_alternated, times_line  # noqa: E402 (repo first)
from explore40 import compare_out_proj, kernels_main
from lowlat.kernels import attn_prologue_held as aph
from lowlat.kernels import residual_gemv_held as rgh

IMPORT = "from triton.experimental.gluon.language.nvidia.ampere import mma_v2\n"
IMPORT_CP = "from triton.experimental.gluon.language.nvidia.ampere import async_copy, mma_v2\n"
XS = "    xs = gl.allocate_shared_memory(gl.bfloat16, [S, KQ, RB], gl.SwizzledSharedLayout(8, 1, 8, [1, 2, 0]))\n"
COPY = "        async_copy.async_copy_global_to_shared(xs, {src}, mask={mask})\n        async_copy.commit_group()\n"
READ = "        async_copy.wait_group(0)\n        gl.thread_barrier()\n        {dst} = xs.load(LB)\n"

PRO_ALLOC = "    ssp = gl.allocate_shared_memory(gl.float32, [S, RB], gl.SwizzledSharedLayout(1, 1, 1, [1, 0]))\n"
PRO_OLD = '''        xb = gl.load(x_ptr + b * RB * K + boff, mask=bmask, other=0.0)
        erow = b * RB + tm
        if b == 0:
            loc, cos, sin = loc0, cos0, sin0
        else:
            loc, cos, sin = _rope_inputs(pos_ptr, loc_ptr, tab_ptr, erow, M, nvr, max_pos, j0 + ti, D, HALF)
'''
PRO_NEW = (COPY.format(src="x_ptr + b * RB * K + boff", mask="bmask") + '''        erow = b * RB + tm
        if b == 0:
            loc, cos, sin = loc0, cos0, sin0
        else:
            loc, cos, sin = _rope_inputs(pos_ptr, loc_ptr, tab_ptr, erow, M, nvr, max_pos, j0 + ti, D, HALF)
''' + READ.format(dst="xb"))

RG_ALLOC = ("    w = gl.load(w_ptr + woff)" + " " * 55 + "# held: [S, 16, KQ] in LA\n")
RG_OLD = '''        ab = gl.load(a_ptr + b * RB * K + boff, mask=amask, other=0.0)
        # the residual as slice 0's accumulator start (0 for the other slices): its loads leave with a's
        cmask = cq0 & gl.expand_dims(gl.expand_dims(b * RB + cm < M, 0), 1)
        acc = gl.load(res_ptr + b * RB * N + coff, mask=cmask, other=0.0).to(gl.float32)
'''
RG_NEW = (COPY.format(src="a_ptr + b * RB * K + boff", mask="amask") + '''\
        cmask = cq0 & gl.expand_dims(gl.expand_dims(b * RB + cm < M, 0), 1)
        acc = gl.load(res_ptr + b * RB * N + coff, mask=cmask, other=0.0).to(gl.float32)
''' + READ.format(dst="ab"))


def cpasync_source(src: str, alloc: str, old: str, new: str) -> str:
    for s in (IMPORT, alloc, old):
        assert src.count(s) == 1, f"the production source changed: {s!r}"
    return src.replace(IMPORT, IMPORT_CP).replace(alloc, alloc + XS).replace(old, new)


def prologue_cpasync():
    return module_from_source("aph_cpasync", cpasync_source(open(aph.__file__).read(), PRO_ALLOC, PRO_OLD, PRO_NEW))


def residual_cpasync():
    return module_from_source("rgh_cpasync", cpasync_source(open(rgh.__file__).read(), RG_ALLOC, RG_OLD, RG_NEW))


def prologue(rows_list, results):
    mods = {"production": aph, "cpasync": prologue_cpasync()}
    case = LlamaPrologueCase(torch.device("cuda"))
    cfg, lw, r = case.cfg, case.lw, case.r
    for m in rows_list:
        xs, pos, locs = case.rows(m)
        kcs = {v: case.cache(m, float("nan")) for v in mods}
        vcs = {v: case.cache(m, float("nan")) for v in mods}
        qs = {v: [case.q_out(m) for _ in range(r)] for v in mods}

        def fn(v):
            return lambda i: mods[v].attn_prologue_held(xs[i % r], case.ws[i % r], lw.attn_norm, pos, locs[i % r], m,
                                                        kcs[v], vcs[v], case.table, cfg=cfg, out_q=qs[v][i % r],
                                                        use_pdl=True)
        fns = {v: fn(v) for v in mods}
        for v in mods:
            for i in range(r):
                fns[v](i)
        torch.cuda.synchronize()
        same = (all(torch.equal(qs["production"][i], qs["cpasync"][i]) for i in range(r))
                and torch.equal(kcs["production"][1:], kcs["cpasync"][1:])
                and torch.equal(vcs["production"][1:], vcs["cpasync"][1:])
                and not qs["cpasync"][0].isnan().any().item())
        times = time_alternated(fns, max(r, 8))
        line = times_line(times)
        print(f"  prologue r{m:<3} us (min/max of 2) {line} | q / K / V bitwise equal: {same}", flush=True)
        results.append(dict(kernel="attn_prologue_held", model=cfg.name, rows=m, us=times, bitwise=same))


def out_proj(rows_list, results):
    mods = {"production": rgh, "cpasync": residual_cpasync()}
    compare_out_proj(mods, rows_list, results, "out / sums bitwise equal:", lambda outs, sss: (
        torch.equal(outs["production"], outs["cpasync"]) and torch.equal(sss["production"], sss["cpasync"])
        and not outs["cpasync"].isnan().any().item()))


def main() -> None:
    kernels_main({"prologue": prologue, "out_proj": out_proj})


if __name__ == "__main__":
    main()
