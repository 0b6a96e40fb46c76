"""Session 38: the production held Llama prologue with the next launch released once this launch's x has landed
(xrel) or once its mma is done (mrel), instead of right after the wait (production).

explore52's stamps (session 38 calls 4-6, H100, the TMA form) put ~1.2-1.9 us between a launch's wait returning and
its x having landed, warm or cold, against a noop chain's whole period of ~1.1 us: x's loads wait behind weight
data arriving at the same SMs (the next launch's stream, released at the wait, or this launch's own when it starts
late). Releasing the next launch only once x has landed takes that stream off x's path; whether the next launch's
weights then land in time is what this measures. Same arithmetic, so the same bits as production (checked).
Released right after x's loads are issued: xissue (the held weights pass through the releasing asm so that ptxas
keeps every mma after it, which makes the release wait for the weights to land; with g multiplied in registers it
spills 524 bytes) and xissue2 (x's values OR-ed with the release's 0, so every use of x follows the release: on
folded weights the sm_90 SASS is the wait, x's 16 loads, the release, the 32 mma). `_f` variants run on
`fold_attn_norm`'s weights (the same bits).

`--stamps`: production's own 1-row chain stamped instead (a copy of its source with explore52's stamps: start, wait
returned, x's statistic done, mma done, end; `explore52.summarize_stamps`), to say where its period goes.

Measured (session 38, H100, bitwise production in every case): 1 row prod 5.10-5.21, xrel 7.04-7.07, mrel 6.88-7.28,
xissue_f 6.04-6.38 (prod_f 5.23-5.28); call 15: xissue2_f 6.09-6.16 against prod_f 5.16-5.22. Stamps of production
(H100 / H200, ns): lag 1584 / 1456, x 2160 / 1952, mma 544 / 544, epilogue 160 / 160.

    python bench/explore/explore54.py --rows 1,6,16 [--warm-x] --out e54.json
    python bench/explore/explore54.py --stamps [--warm-x] --out e54s.json
    env -u TRITON_INTERPRET .venv/bin/python bench/explore/explore54.py --sm90     # CPU: sm_90 compile
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from explore52 import HELPERS  # noqa: E402
from lowlat.kernels import attn_prologue_held as aph  # noqa: E402

VARIANTS = ("prod", "xissue", "xissue2", "xrel", "mrel")
X_LOAD = "        xb = gl.load(x_ptr + b * RB * K + boff, mask=bmask, other=0.0)\n"
HELPER = ("\n\nfrom gluon_asm import _release_now, _release_through, _release_when  # noqa: F401\n\n\n"
          "@gluon.jit\ndef _held_prologue_kernel(")
WAIT = "    pdl_wait_then_release(USE_PDL, EARLY_RELEASE)\n"
SSW = "        ssw = gl.sum(xf * xf, axis=1)\n"
MMA = "        acc = mma_v2(w, xb, gl.zeros([S, 16, RB], gl.float32, MMA))\n"


def released_source(src: str, where: str) -> str:
    """Production's source with the release moved from after the wait to after x's loads are issued (where
    "issue": x's requests enter the memory system before the next launch's weight loads), after x's statistic ("x":
    it needs every x element of the thread) or after the mma ("mma"), in the first row block."""
    from explore46 import edited

    out = edited(src, "\n\n@gluon.jit\ndef _held_prologue_kernel(", HELPER)
    out = edited(out, WAIT, "    pdl_wait_then_release(USE_PDL, True)            # the wait only\n")
    if where == "issue2":
        # the release asm has no input; x's values are OR-ed with its 0 (bitwise x), so every use of x (the mma, the
        # statistic) comes after the release while x's loads, issued before it in program order, stay ahead of it
        out = edited(out, X_LOAD, X_LOAD + "        if USE_PDL and b == 0:\n"
                                           "            rel = _release_now(bm)\n"
                                           "            xb = (xb.to(gl.int16, bitcast=True)"
                                           " | gl.expand_dims(gl.expand_dims(rel, 0), 1).to(gl.int16))"
                                           ".to(gl.bfloat16, bitcast=True)\n")
        return out
    if where == "issue":
        # the held weights pass through the release (an identity asm that also releases), so ptxas cannot hoist an
        # mma (which waits for x) above the release; x's loads are issued before it in program order
        out = edited(out, X_LOAD, X_LOAD + "        if USE_PDL and b == 0:\n"
                                           "            w = _release_through(w.to(gl.int16, bitcast=True))"
                                           ".to(gl.bfloat16, bitcast=True)\n")
        return out
    anchor, val = (SSW, "ssw") if where == "x" else (MMA, "acc")
    return edited(out, anchor, anchor + f"        if USE_PDL and b == 0:\n"
                                         f"            _release_when({val}.to(gl.int32, bitcast=True))\n")


STAMP_HELPERS = ("\n\n_TRACE = [None]      # the record buffer [N / 16, 8] int64 of the next launch (set by the "
                 "explore), or None\n\n\n" + HELPERS + "\n\n@gluon.jit\ndef _held_prologue_kernel(")
STAMP_EDITS = [
    ("\n\n@gluon.jit\ndef _held_prologue_kernel(", STAMP_HELPERS),
    ("                          EARLY_RELEASE: gl.constexpr = False):\n",
     "                          EARLY_RELEASE: gl.constexpr = False, tr_ptr=None, TRACE: gl.constexpr = False):\n"),
    ("    pdl_release_early(USE_PDL, EARLY_RELEASE)\n",
     "    L1: gl.constexpr = gl.BlockedLayout([1], [32], [Q], [0])\n    lane = gl.arange(0, 32 * Q, layout=L1)\n"
     "    if TRACE:\n        gl.static_assert(NMB == 1, 'TRACE: one row block')\n        t0 = _stamp(lane)\n"
     "    pdl_release_early(USE_PDL, EARLY_RELEASE)\n"),
    (WAIT, WAIT + "    if TRACE:\n        t1 = _stamp(lane)\n"),
    (SSW, SSW + "        if TRACE:\n            tx = _stamp(ssw.to(gl.int32, bitcast=True))\n"),
    (MMA, MMA + "        if TRACE:\n            tmm = _stamp(acc.to(gl.int32, bitcast=True))\n"),
    ("        gl.store(kvp + HALF, rhi, mask=wmask)\n", """        gl.store(kvp + HALF, rhi, mask=wmask)
    if TRACE:
        t3 = _stamp(lane)
        _store_record(tr_ptr, gl.program_id(0), gl.min(t0, axis=0), gl.min(t1, axis=0),
                      gl.max(gl.max(tx, axis=1), axis=0), gl.max(gl.max(gl.max(tmm, axis=2), axis=1), axis=0),
                      gl.max(t3, axis=0), lane, L1)
"""),
    ("        EARLY_RELEASE=early_release, num_warps=WARPS,\n",
     "        EARLY_RELEASE=early_release, num_warps=WARPS, tr_ptr=_TRACE[0], TRACE=_TRACE[0] is not None,\n"),
]


def stamped_source(src: str) -> str:
    """Production's source with explore52's stamps (1 row block; the record buffer from the module's _TRACE[0])."""
    from explore46 import edited

    for old, new in STAMP_EDITS:
        src = edited(src, old, new)
    return src


def stamp_run(warm_x: bool, out: str | None) -> None:
    """Production's 1-row chain stamped (its stamped copy, the same launches as the timing)."""
    from _common import LlamaPrologueCase, module_from_source, stamp_chain, write_results
    from explore47 import launches
    from explore52 import summarize_stamps

    mod = module_from_source("e54_stamped", stamped_source(open(aph.__file__).read()))
    case = LlamaPrologueCase(torch.device("cuda"))
    r = case.r
    xs, pos, locs = case.rows(1)
    if warm_x:
        xs = [xs[0]] * r
    fns, _, _ = launches(case, 1, {"stamped": mod}, (xs, pos, locs))
    tr = torch.zeros(r, case.w0.shape[0] // 16, 8, dtype=torch.int64, device=case.dev)

    def fn(i):
        mod._TRACE[0] = tr[i % r]
        try:
            fns["stamped"](i)
        finally:
            mod._TRACE[0] = None
    res = stamp_chain(fn, r, tr, summarize_stamps, "prod")
    write_results(out, [dict(rows=1, stamps=res)], explore="explore54 --stamps", model=case.cfg.name, warm_x=warm_x)


def modules() -> dict:
    from _common import module_from_source

    src = open(aph.__file__).read()
    return {"prod": aph, "xissue": module_from_source("e54_xissue", released_source(src, "issue")),
            "xissue2": module_from_source("e54_xissue2", released_source(src, "issue2")),
            "xrel": module_from_source("e54_xrel", released_source(src, "x")),
            "mrel": module_from_source("e54_mrel", released_source(src, "mma"))}


def folded_launches(case, m: int, mods: dict, rows, wfs: list):
    """explore47's `launches` on `fold_attn_norm`'s weights (attn_norm None: the same bits), variants named
    `<module>_f`."""
    xs, pos, locs = rows
    cfg, r = case.cfg, case.r
    caches = {v + "_f": (case.cache(m, float("nan")), case.cache(m, float("nan"))) for v in mods}
    qs = {v + "_f": [case.q_out(m) for _ in range(r)] for v in mods}

    def fn(v):
        mod, (kc, vc) = mods[v], caches[v + "_f"]
        return lambda i: mod.attn_prologue_held(xs[i % r], wfs[i % r], None, pos, locs[i % r], m, kc, vc, case.table,
                                                cfg=cfg, out_q=qs[v + "_f"][i % r], use_pdl=True)
    return {v + "_f": fn(v) for v in mods}, qs, caches


def device_run(rows: list, rounds: int, out: str | None, warm_x: bool, variants: list) -> None:
    from _common import LlamaPrologueCase, run_checked, time_alternated, times_line, write_results
    from explore47 import launches

    all_mods = modules()
    case = LlamaPrologueCase(torch.device("cuda"))
    r = case.r
    wfs = [aph.fold_attn_norm(w, case.lw.attn_norm) for w in case.ws]
    results = []
    for m in rows:
        xs, pos, locs = case.rows(m)
        if warm_x:
            xs = [xs[0]] * r
        mods = {v: all_mods[v] for v in variants if not v.endswith("_f")}
        fns, qs, caches = launches(case, m, mods, (xs, pos, locs))
        fmods = {v[:-2]: all_mods[v[:-2]] for v in variants if v.endswith("_f")}
        ffns, fqs, fcaches = folded_launches(case, m, fmods, (xs, pos, locs), wfs)
        fns.update(ffns), qs.update(fqs), caches.update(fcaches)
        fns = {v: fns[v] for v in variants}
        base = variants[0]
        written, same = run_checked(fns, qs, caches, r, base)
        times = time_alternated(fns, max(r, 8), rounds=rounds)
        print(f"  r{m:<3} us (min/max of {2 * rounds}) {times_line(times)} | every element written "
              + " ".join(f"{v} {w}" for v, w in written.items()) + f" | bitwise = {base}: "
              + " ".join(f"{v} {x}" for v, x in same.items()), flush=True)
        results.append(dict(rows=m, us=times, every_element_written=written, bitwise_baseline=base,
                            bitwise_equal_to_baseline=same))
        torch.cuda.empty_cache()
    write_results(out, results, explore="explore54", model=case.cfg.name, warm_x=warm_x, rounds=rounds,
                  launch="per-kernel bench (LlamaPrologueCase, num_valid_rows int M, 4096-position table, PDL on)")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default="1,6,16")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--warm-x", action="store_true")
    ap.add_argument("--sm90", action="store_true")
    ap.add_argument("--stamps", action="store_true", help="production's 1-row chain stamped, not timed")
    ap.add_argument("--variants", default="prod,xrel,mrel", help="among " + ", ".join(VARIANTS) + " and each with "
                    "_f (on fold_attn_norm's weights); the first is the bitwise baseline")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    rows = [int(x) for x in a.rows.split(",")]
    if a.sm90:
        from explore47 import sm90_rows

        for row in sm90_rows(list(VARIANTS), rows, modules()):
            print({k: row[k] for k in ("variant", "rows", "registers", "spill_bytes")}, flush=True)
    elif a.stamps:
        stamp_run(a.warm_x, a.out)
    else:
        device_run(rows, a.rounds, a.out, a.warm_x, a.variants.split(","))


if __name__ == "__main__":
    main()
