"""Session 38: the production held Llama prologue chained by a READY FLAG instead of the PDL wait.

explore54's stamps of production's own 1-row chain (session 38 call 9, H100) put 1.6 us between the previous launch's
last store and this launch's first wait return (the PDL grid completion: 1.2 us in a chain of empty launches,
explore51's noop), then 1.5-2.2 us until x has landed, 0.5 us of mma and 0.2 of epilogue. A flag written by the
producer right after its stores could be seen sooner than the grid's completion. Here each program, after its
stores, waits at a thread barrier and one thread adds 1 to a counter with release semantics (red.release.gpu); the
next launch, instead of griddepcontrol.wait, has one thread spin (ld.acquire.gpu) until the counter reaches
epoch x programs (epoch = its index in the chain; the chain's first launch zeroes the counter), then a thread barrier.
The launch keeps the PDL attribute so that it can be resident early; it is released (griddepcontrol.launch_dependents)
at the program's start (flag_early: the spinning programs must be resident) or after its flag wait (flag_late).
No deadlock: a dependent launch starts only once every program of its primary has started.

Not production: in the decode step the prologue's producer (the previous layer's down projection, or its deferred
reduction) would have to publish the flag, and the epochs would have to come from the step. Same arithmetic as
production: bits checked equal.

Measured (session 38 call 11, H100): not taken. 1 / 6 rows prod 5.09-5.23 / 5.45-5.50, flag_late 6.47-6.72 /
6.98-7.01, flag_early 5.99-6.19 / 6.27-6.33; bitwise production, counters exact (17 x 192).

    python bench/explore/explore55.py --rows 1,6 --out e55.json
    env -u TRITON_INTERPRET .venv/bin/python bench/explore/explore55.py --sm90     # CPU: sm_90 compile
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from lowlat.kernels import attn_prologue_held as aph  # noqa: E402

VARIANTS = ("prod", "flag_late", "flag_early")
HELPERS = '''

_FLAG = [None, 0, 0]   # the next launch's (counter [1] int32, epoch, FLAG constexpr), set by the explore


@gluon.jit
def _spin_acquire(ptr, target, lane):
    """Thread lane 0 spins (ld.acquire.gpu) until the int32 at ptr reaches target; returns 0 (opaque)."""
    return gl.inline_asm_elementwise(
        "{ .reg .pred p, q; .reg .s32 v; setp.ne.s32 q, $3, 0; @q bra DONE${:uid}; LOOP${:uid}: "
        "ld.acquire.gpu.global.s32 v, [$1]; setp.lt.s32 p, v, $2; @p bra LOOP${:uid}; DONE${:uid}: mov.b32 $0, 0; }",
        "=r,l,r,r", [ptr.to(gl.int64, bitcast=True), target, lane], dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def _publish(ptr, lane):
    """Thread lane 0 adds 1 to the int32 at ptr with release semantics (gpu scope); returns 0 (opaque)."""
    return gl.inline_asm_elementwise(
        "{ .reg .pred q; setp.eq.s32 q, $2, 0; @q red.release.gpu.global.add.s32 [$1], 1; mov.b32 $0, 0; }",
        "=r,l,r", [ptr.to(gl.int64, bitcast=True), lane], dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def _held_prologue_kernel('''
EDITS = [
    ("\n\n@gluon.jit\ndef _held_prologue_kernel(", HELPERS),
    ("                          EARLY_RELEASE: gl.constexpr = False):\n",
     "                          EARLY_RELEASE: gl.constexpr = False, flag_ptr=None, epoch=0, NPROG: gl.constexpr = 1,\n"
     "                          FLAG: gl.constexpr = False):\n"),
    ("    pdl_release_early(USE_PDL, EARLY_RELEASE)\n",
     "    L1: gl.constexpr = gl.BlockedLayout([1], [32], [Q], [0])\n    lane = gl.arange(0, 32 * Q, layout=L1)\n"
     "    pdl_release_early(USE_PDL, EARLY_RELEASE)\n"),
    ("    pdl_wait_then_release(USE_PDL, EARLY_RELEASE)\n",
     "    if FLAG:\n"
     "        _spin_acquire(flag_ptr + lane * 0, lane * 0 + epoch * NPROG, lane)\n"
     "        gl.thread_barrier()\n"
     "        if not EARLY_RELEASE:\n"
     "            pdl_release_early(USE_PDL, True)\n"
     "    else:\n"
     "        pdl_wait_then_release(USE_PDL, EARLY_RELEASE)\n"),
    ("        gl.store(kvp + HALF, rhi, mask=wmask)\n",
     "        gl.store(kvp + HALF, rhi, mask=wmask)\n"
     "    if FLAG:\n"
     "        gl.thread_barrier()\n"
     "        _publish(flag_ptr + lane * 0, lane)\n"),
    ("        EARLY_RELEASE=early_release, num_warps=WARPS,\n",
     "        EARLY_RELEASE=early_release, num_warps=WARPS, flag_ptr=_FLAG[0], epoch=_FLAG[1], NPROG=n // 16,\n"
     "        FLAG=bool(_FLAG[2]),\n"),
]


def flag_source(src: str) -> str:
    from explore46 import edited

    for old, new in EDITS:
        src = edited(src, old, new)
    return src


def flag_module():
    from _common import module_from_source

    return module_from_source("e55_flag", flag_source(open(aph.__file__).read()))


def device_run(rows: list, rounds: int, out: str | None) -> None:
    from _common import LlamaPrologueCase, run_checked, time_alternated, times_line, write_results
    from explore47 import launches

    mod = flag_module()
    case = LlamaPrologueCase(torch.device("cuda"))
    r = case.r
    n = max(r, 8)
    results = []
    for m in rows:
        xs, pos, locs = inputs = case.rows(m)
        base, qs, caches = launches(case, m, {"prod": aph, "flag_late": mod, "flag_early": mod}, inputs)
        flags = {v: torch.zeros(1, dtype=torch.int32, device=case.dev) for v in VARIANTS[1:]}
        fns = {"prod": base["prod"]}
        for v in VARIANTS[1:]:
            early = v == "flag_early"
            kc, vc = caches[v]

            def fn(i, v=v, early=early, kc=kc, vc=vc):
                if i == 0:
                    flags[v].zero_()
                mod._FLAG[:] = [flags[v], i, True]
                try:
                    mod.attn_prologue_held(xs[i % r], case.ws[i % r], case.lw.attn_norm, pos, locs[i % r], m, kc, vc,
                                           case.table, cfg=case.cfg, out_q=qs[v][i % r], use_pdl=True,
                                           early_release=early)
                finally:
                    mod._FLAG[:] = [None, 0, False]
            fns[v] = fn
        written, same = run_checked(fns, qs, caches, n, "prod")
        counts = {v: int(flags[v].item()) for v in flags}
        times = time_alternated(fns, n, rounds=rounds)
        print(f"  r{m:<3} us (min/max of {2 * rounds}) {times_line(times)} | every element written "
              + " ".join(f"{v} {w}" for v, w in written.items()) + " | bitwise = prod: "
              + " ".join(f"{v} {x}" for v, x in same.items()) + f" | counters after {n} launches: {counts}",
              flush=True)
        results.append(dict(rows=m, us=times, every_element_written=written, bitwise_prod=same, counters=counts))
        torch.cuda.empty_cache()
    write_results(out, results, explore="explore55", model=case.cfg.name, rounds=rounds,
                  launch="per-kernel bench (LlamaPrologueCase, num_valid_rows int M, 4096-position table, PDL on)")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default="1,6")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--sm90", action="store_true")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    rows = [int(x) for x in a.rows.split(",")]
    if a.sm90:
        sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests" / "unit"))
        import llama_prologue_sm90 as lp
        from compile_sm90 import compile_for_sm90
        from lowlat.config import preset

        mod = flag_module()
        for m in rows:
            for flag, early in ((False, False), (True, False), (True, True)):
                spec = lp.launch_spec(preset("Llama-3.2-1B"), m, aph.SLICES, True, "timed")
                spec["constexprs"].update(FLAG=flag, EARLY_RELEASE=early, NPROG=192)
                spec["pointers"]["flag_ptr"] = "*i32"
                spec["ptx"] = True
                res = compile_for_sm90(mod._held_prologue_kernel, spec)
                ptx = res["ptx"]
                print(dict(rows=m, flag=flag, early=early, registers=res["registers"], spill_bytes=res["spill_bytes"],
                           wait="griddepcontrol.wait" in ptx, spin="ld.acquire.gpu" in ptx,
                           publish="red.release.gpu" in ptx), flush=True)
    else:
        device_run(rows, a.rounds, a.out)


if __name__ == "__main__":
    main()
