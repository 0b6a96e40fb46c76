"""Session 39: the held Llama prologue with its weight stream paced (a window of K chunks in flight a thread), so
that x's loads, issued after the wait, do not queue behind a whole launch's weight requests.

Session 38's stamps (explore54 `--stamps`, production's own chain, H200) put ~1.95 us between a launch's wait
returning and its x (4 KB, cold) having landed, against 0.54 us of mma and 0.16 of epilogue; and a stand-in holding
the same weights in registers, three programs an SM, released at its start but with no x to load (explore51
`reg_early`) ran at 3.29-3.34 us (92% of the floor) where the real prologue in that form (explore45
`folded_r168_early`) takes ~4.4. The model tried here: the next launch issues all 64 KB of a program's weight loads
at once, so the memory system holds far more requests than its bandwidth needs (Little's law: ~bandwidth x
latency, ~20-25 KB an SM), and x's requests wait behind all of them. Pacing the stream keeps its bandwidth while
shortening that queue.

How: the weights ([S, 16, K / S] a program, `fold_attn_norm`'s, maxnreg 168: three programs an SM) are loaded in CH
chunks along each slice's K; chunk c's addresses depend on chunk c - WIN's loaded values (an asm `and` with a
runtime 0, `zero`; the offsets keep their 8-wide contiguity by `max_contiguous` / `multiple_of`, so the loads stay
16-byte vectors), so a thread has at most WIN chunks in flight: ptxas must wait for chunk c - WIN before issuing
chunk c. After the wait, x is loaded in the same chunks and the mma runs as CH chained `mma_v2` over the chunks
(the same k16 steps in the same order as production's one call, so the same accumulators); x's statistic is summed
chunk by chunk (another fp32 order than production's: q within the numerics policy, not bitwise; its max relative
difference from production is printed).

    prod          production (g multiplied in registers, two programs an SM, released after the wait)
    prod_f        the same on `fold_attn_norm`'s weights (the same bits)
    prod_paced    production's own paced form since session 39 (`attn_prologue_held(..., pace=True)` on folded
                  weights, released at the start: c8w2_early_x2 at H 2048 and 1 row; g = 1 past it)
    prod_f1       production's g-in-registers form on `fold_attn_norm`'s weights with g = 1 (bf16(w 1) = w: the same
                  bits; production's schedule, which the folded form's 2-row-block build lacks)
    f168_early    `fold_attn_norm`'s weights, maxnreg 168, released at the start (explore45's folded_r168_early)
    c{CH}w{WIN}_{early|late}[_x2][_g|_gl][_nocap]   paced, released at the start or after the wait (WIN = CH: chunked,
                  not paced); _x2: x also loaded whole for production's statistic (production's bits); _g: g
                  multiplied in registers (production's weights); _gl: g loaded and multiplied after the wait;
                  _nocap: no maxnreg

    python bench/explore/explore56.py --rows 1,6,16 --variants prod,f168_early,c8w2_early --out e56.json
    env -u TRITON_INTERPRET .venv/bin/python bench/explore/explore56.py --sm90     # CPU: sm_90 registers / spills
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from lowlat.kernels import attn_prologue_held as aph  # noqa: E402

CAP = 168          # maxnreg: three programs an SM (396 slots >= 2 launches of 192)
DEFAULT_VARIANTS = "prod,f168_early,c8w8_early,c8w1_early,c8w2_early,c8w3_early,c16w4_early,c8w2_late"

W_LOAD = """    w = gl.load(w_ptr + aoff)
    if FOLD_G:
        w = (w.to(gl.float32) * gl.load(g_ptr + acol + 0 * aoff).to(gl.float32)).to(gl.bfloat16)
"""
BOFF = "    boff = gl.expand_dims(gl.expand_dims(bm, 0), 1) * K + bcol\n"
X_LOAD = """        bmask = gl.expand_dims(gl.expand_dims(brow < M, 0), 1) & (boff >= 0)
        xb = gl.load(x_ptr + b * RB * K + boff, mask=bmask, other=0.0)
"""
XF = "        xf = xb.to(gl.float32)\n"
SSW_MMA = """        ssw = gl.sum(xf * xf, axis=1)
        acc = mma_v2(w, xb, gl.zeros([S, 16, RB], gl.float32, MMA))
"""
WAIT = "    pdl_wait_then_release(USE_PDL, EARLY_RELEASE)\n"
LAUNCH = "        EARLY_RELEASE=early_release, num_warps=WARPS,\n"


def paced_source(src: str, ch: int, win: int, whole_x: bool = False, fold_g: bool | str = False,
                 cap: int | None = CAP) -> str:
    """Production's source with the weights loaded in `ch` K chunks a slice, chunk c's addresses depending on chunk
    c - `win`'s values (win >= ch: no dependency), x in the same chunks, the mma chained over them; launched with
    maxnreg `cap` (None: none) and a runtime `zero` argument. whole_x: x also loaded whole as production loads it, its
    statistic production's (`gl.sum` over the whole slice: production's bits); else summed chunk by chunk. fold_g: g
    multiplied into each chunk in registers before the wait (attn_norm given; "late": g loaded and multiplied after the
    wait, beside x); else folded weights (attn_norm None)."""
    from explore46 import edited

    # production's kernel takes `zero` and has `_zero_after` since session 39 (its own paced form, PACE, is this
    # generator's c8w2_early_x2; the generator keeps the forms production does not take)
    lines = [f"    gl.static_assert({'' if fold_g else 'not '}FOLD_G, 'paced: the fold form built')",
             f"    KC: gl.constexpr = KQ // {ch}",
             "    akc = gl.arange(0, KC, layout=gl.SliceLayout(0, gl.SliceLayout(1, LA)))",
             "    acolc = gl.expand_dims(gl.expand_dims(aq, 1), 2) * KQ + gl.expand_dims(gl.expand_dims(akc, 0), 1)",
             "    aoffc = gl.expand_dims(gl.expand_dims(wrow, 0), 2) * K + acolc"]
    for c in range(ch):
        off, goff = f"aoffc + {c} * KC", f"acolc + {c} * KC + 0 * aoffc"
        if c >= win:
            lines.append(f"    wd{c} = _zero_after(wr{c - win}.to(gl.int16, bitcast=True), zero)")
            off, goff = (f"gl.max_contiguous(gl.multiple_of({o} + wd{c}, [1, 1, 8]), [1, 1, 8])" for o in (off, goff))
        lines.append(f"    wr{c} = gl.load(w_ptr + {off})")
        if fold_g is True:   # g's chunk paced with the weights' (all of g up front spills 104 bytes under maxnreg 168)
            lines.append(f"    w{c} = (wr{c}.to(gl.float32) * gl.load(g_ptr + {goff}).to(gl.float32)).to(gl.bfloat16)")
        else:
            lines.append(f"    w{c} = wr{c}")
    out = edited(src, W_LOAD, "\n".join(lines) + "\n")
    if fold_g == "late":
        out = edited(out, WAIT, WAIT + "".join(
            f"    w{c} = (wr{c}.to(gl.float32) * gl.load(g_ptr + acolc + {c} * KC + 0 * aoffc).to(gl.float32))"
            f".to(gl.bfloat16)\n" for c in range(ch)))
    out = edited(out, BOFF, BOFF + "    bkc = gl.arange(0, KQ // %d, layout=gl.SliceLayout(0, gl.SliceLayout(2, LB)))\n"
                 "    boffc = gl.expand_dims(gl.expand_dims(bm, 0), 1) * K + gl.expand_dims(gl.expand_dims(bq, 1), 2) "
                 "* KQ + gl.expand_dims(gl.expand_dims(bkc, 0), 2)\n" % ch)
    xl = (X_LOAD.splitlines() if whole_x else []) + [
        "        cmask = gl.expand_dims(gl.expand_dims(brow < M, 0), 1) & (boffc >= 0)"]
    xl += [f"        x{c} = gl.load(x_ptr + b * RB * K + boffc + {c} * (KQ // {ch}), mask=cmask, other=0.0)"
           for c in range(ch)]
    out = edited(out, X_LOAD, "\n".join(xl) + "\n")
    sl = []
    if whole_x:
        sl.append("        ssw = gl.sum(xf * xf, axis=1)")
    else:
        out = edited(out, XF, "")
        for c in range(ch):
            sl.append(f"        xf = x{c}.to(gl.float32)")
            sl.append(f"        ssw {'=' if c == 0 else '+='} gl.sum(xf * xf, axis=1)")
    sl.append("        acc = gl.zeros([S, 16, RB], gl.float32, MMA)")
    sl += [f"        acc = mma_v2(w{c}, x{c}, acc)" for c in range(ch)]
    out = edited(out, SSW_MMA, "\n".join(sl) + "\n")
    capped = "" if cap is None else f" maxnreg={cap},"
    out = edited(out, LAUNCH, f"        EARLY_RELEASE=early_release, num_warps=WARPS,{capped}\n")
    return out


def parse_variant(v: str):
    """(chunks, window, early, whole_x, fold_g, capped) of a paced variant's name
    c{CH}w{WIN}_{early|late}[_x2][_g|_gl][_nocap], else None (fold_g True, "late" or False)."""
    m = re.fullmatch(r"c(\d+)w(\d+)_(early|late)((?:_x2|_gl|_g|_nocap)*)", v)
    if m is None:
        return None
    opts = m.group(4)
    return (int(m.group(1)), int(m.group(2)), m.group(3) == "early", "_x2" in opts,
            "late" if "_gl" in opts else "_g" in opts, "_nocap" not in opts)


def modules(variants: list) -> dict:
    """{variant: (module, folded weights? (True, False or "ones": folded, g a ones vector), early release)}."""
    from _common import module_from_source
    from explore37 import capped_source

    src = open(aph.__file__).read()
    out = {}
    for v in variants:
        if v == "prod":
            out[v] = (aph, False, False)
        elif v == "prod_f":
            out[v] = (aph, True, False)
        elif v == "prod_f1":
            out[v] = (aph, "ones", False)
        elif v == "prod_paced":
            out[v] = (aph, True, True)
        elif v == "f168_early":
            out[v] = (module_from_source("e56_f168", capped_source(src, CAP)), True, True)
        else:
            ch, win, early, whole_x, fold_g, capped = parse_variant(v)
            name = "e56_" + v.replace("_early", "").replace("_late", "")
            out[v] = (module_from_source(name, paced_source(src, ch, win, whole_x, fold_g, CAP if capped else None)),
                      not fold_g, early)
    return out


def device_run(rows: list, rounds: int, out: str | None, variants: list) -> None:
    from _common import LlamaPrologueCase, max_rel_diff, run_checked, time_alternated, times_line, write_results

    mods = modules(variants)
    case = LlamaPrologueCase(torch.device("cuda"))
    cfg, r = case.cfg, case.r
    wfs = [aph.fold_attn_norm(w, case.lw.attn_norm) for w in case.ws]
    ones = torch.ones_like(case.lw.attn_norm)
    results = []
    for m in rows:
        xs, pos, locs = case.rows(m)
        caches = {v: (case.cache(m, float("nan")), case.cache(m, float("nan"))) for v in variants}
        qs = {v: [case.q_out(m) for _ in range(r)] for v in variants}

        def fn(v):
            mod, folded, early = mods[v]
            wl, g = (wfs, ones if folded == "ones" else None) if folded else (case.ws, case.lw.attn_norm)
            kc, vc = caches[v]
            kw = dict(pace=True) if v == "prod_paced" else {}
            return lambda i: mod.attn_prologue_held(xs[i % r], wl[i % r], g, pos, locs[i % r], m, kc, vc, case.table,
                                                    cfg=cfg, out_q=qs[v][i % r], use_pdl=True, early_release=early,
                                                    **kw)
        fns = {v: fn(v) for v in variants}
        written, same = run_checked(fns, qs, caches, r, variants[0])
        diff = {v: max(max_rel_diff(a, b) for a, b in zip(qs[v], qs[variants[0]])) for v in variants}
        times = time_alternated(fns, max(r, 8), rounds=rounds)
        print(f"  r{m:<3} us (min/max of {2 * rounds}) {times_line(times)} | every element written "
              + " ".join(f"{v} {w}" for v, w in written.items()) + f" | bitwise = {variants[0]}: "
              + " ".join(f"{v} {x}" for v, x in same.items()) + " | max rel diff q "
              + " ".join(f"{v} {x:.2g}" for v, x in diff.items()), flush=True)
        results.append(dict(rows=m, us=times, every_element_written=written, bitwise_baseline=variants[0],
                            bitwise_equal_to_baseline=same, max_rel_diff_q=diff))
        torch.cuda.empty_cache()
    write_results(out, results, explore="explore56", model=cfg.name, rounds=rounds,
                  launch="per-kernel bench (LlamaPrologueCase, num_valid_rows int M, 4096-position table, PDL on)")


def sm90_rows(variants: list, rows: list) -> list:
    """sm_90 compile (CPU) of each variant at each width as its launch specialises it (`llama_prologue_sm90`'s
    `launch_spec`; `zero` 16-divisible as 0 is): registers, spills
    and the SASS around the wait (`compiled_row`)."""
    import os
    import tempfile

    from llama_prologue_sm90 import MODEL, compiled_row, launch_spec
    from lowlat.config import preset

    cfg = preset(MODEL)
    tmp = tempfile.mkdtemp()
    out = []
    for v, (mod, folded, early) in modules(variants).items():
        for m in rows:
            spec = launch_spec(cfg, m, aph.SLICES, not folded or (v == "prod_paced" and m > aph.PACE_MAX_ROWS), "timed")
            spec["constexprs"]["EARLY_RELEASE"] = early and not (v == "prod_paced" and m > aph.PACE_MAX_ROWS)
            pv = parse_variant(v)
            if v == "prod_paced" and m <= aph.PACE_MAX_ROWS:
                spec["constexprs"].update(PACE=cfg.hidden_size // aph.SLICES // aph.PACE_COLUMNS,
                                          PACE_WIN=aph.PACE_WINDOW)
                spec["maxnreg"] = aph.PACE_MAXNREG
            if v == "f168_early" or (pv and pv[5]):  # prod_f: folded, uncapped
                spec["maxnreg"] = CAP
            if pv:
                spec["divisible"].append("zero")
            out.append(compiled_row(mod._held_prologue_kernel, spec, os.path.join(tmp, f"{v}_{m}"), variant=v,
                                    rows=m))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default="1,6,16")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--variants", default=DEFAULT_VARIANTS, help="prod, f168_early, c{CH}w{WIN}_{early|late}; the "
                    "first is the bitwise / difference baseline")
    ap.add_argument("--sm90", action="store_true")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    rows = [int(x) for x in a.rows.split(",")]
    variants = a.variants.split(",")
    if a.sm90:
        sm90_rows(variants, rows)
    else:
        device_run(rows, a.rounds, a.out, variants)


if __name__ == "__main__":
    main()
