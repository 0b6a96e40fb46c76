"""Session-11 exploration (issue 3): does the benches' timing charge the host's graph launch to the kernels?

`lowlat.benchmarking.event_times_us` waits for every timed call before launching the next (sync_each), so the
span between its two events includes the time from the host's `cudaGraphLaunch` to the graph's first kernel
(the GPU is idle when the first event runs); that was the benches' timing until session 11, whose bisect
(bench/results/session11/call2) saw the SmolLM2 step graph (152 launches) take 42-91 us more per replay that
way under a profiling driver. This driver runs an existing bench unchanged except that every
`event_times_us` call either queues its calls back to back ("b2b": sync_each=False, one wait at the end; the
events still bracket each call; now the default) or waits for each ("synced": sync_each=True, the old
default), so the two timings of the same kernels can be compared:

    python bench/explore/explore23.py b2b|synced lowlat.bench --sections kernels --models Llama-3.2-1B ...
    python bench/explore/explore23.py b2b|synced bench_attn_prologue --models Llama-3.2-1B ...
"""
from __future__ import annotations

import importlib
import runpy
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lowlat import benchmarking  # noqa: E402


def main() -> None:
    mode, target, args = sys.argv[1], sys.argv[2], sys.argv[3:]
    if mode not in ("b2b", "synced"):
        raise SystemExit(f"mode must be b2b or synced, not {mode!r}")
    orig = benchmarking.event_times_us
    sync = mode == "synced"

    def timed(run, *, iters, warmup=0, per=1, flush=None, sync_each=False):
        # b2b with a flush too: the stream runs flush, event, call, event in order; the host has queued the
        # graph while the flush ran
        return orig(run, iters=iters, warmup=warmup, per=per, flush=flush, sync_each=sync)
    benchmarking.event_times_us = timed
    for name in list(sys.modules):              # modules that imported the function by name
        mod = sys.modules[name]
        if name.startswith(("lowlat", "bench")) and getattr(mod, "event_times_us", None) is orig:
            mod.event_times_us = timed
    sys.argv = [target, *args]
    if target == "lowlat.bench":
        importlib.import_module("lowlat.bench").main()
    else:
        runpy.run_path(str(Path(__file__).resolve().parents[1] / f"{target}.py"), run_name="__main__")


if __name__ == "__main__":
    main()
