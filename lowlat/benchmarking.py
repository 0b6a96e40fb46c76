"""Timing utilities shared by every benchmark (`bench/bench_*.py`, `lowlat.bench`).

Method (design.md, "Benchmarks"): a benchmark captures N launches back to back in one CUDA graph,
replays it after warm-up and times every replay with a pair of CUDA events, the replays queued back to
back (the host waits once at the end, so its graph launch is not in the timed span: when the host waited
before every replay it added 0.8-5% to a per-kernel graph's time and 2-10 us to the 152-launch SmolLM2 step
graph, 42-91 us when the host was busier, bench/results/session11/call2 and call3); the reported time is per launch
(replay time / N), median over replays (p10 / p90 alongside). Weights or inputs that must come
from HBM rather than L2 are rotated over enough copies (`rotation_copies`) that one replay touches
more bytes than the L2 holds, so every launch starts cold. The HBM floor of a launch is the bytes it
must move over `copy_bandwidth()`, the device-to-device copy bandwidth measured in the same run
(bytes read + written). `versions()` is the provenance every results JSON carries.

All CUDA work happens inside the functions (torch is imported lazily), so importing this module on a
CPU-only machine is harmless; the timing functions themselves need a CUDA device.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import platform
import signal
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable, Sequence

#: L2 cache of an H100 / H200 (bytes).
L2_BYTES = 50 * 2**20


# ------------------------------------------------------------------------------------ provenance
def versions() -> dict:
    """Provenance of a measurement: the fields every `bench/results/*.json` starts with.

    Returns a dict: device (CUDA device name, else the CPU's name or "cpu"), and on CUDA sm_count,
    capability ("sm_90"), l2_bytes and cuda (toolkit version); torch, triton and python versions; date
    (UTC, ISO 8601, seconds); command (the command line as typed, `sys.orig_argv`).
    """
    import torch

    try:
        import triton

        triton_version = triton.__version__
    except ImportError:                  # a CPU box without triton can still describe itself
        triton_version = None
    out: dict[str, Any] = {}
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(torch.cuda.current_device())
        out.update(device=p.name, sm_count=p.multi_processor_count, capability=f"sm_{p.major}{p.minor}",
                   l2_bytes=getattr(p, "L2_cache_size", None), cuda=torch.version.cuda)
    else:
        out["device"] = platform.processor() or "cpu"
    argv = getattr(sys, "orig_argv", None) or [Path(sys.executable).name, *sys.argv]
    out.update(torch=torch.__version__, triton=triton_version, python=platform.python_version(),
               date=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"), command=" ".join(argv))
    return out


# ------------------------------------------------------------------------------------ bandwidth
def copy_bandwidth(device=None, *, nbytes: int = 2**30, iters: int = 20, warmup: int = 3) -> float:
    """Device-to-device copy bandwidth in bytes/s, counting bytes read + written.

    `nbytes` (default 1 GiB) are copied `warmup` times untimed, then `iters` times, each copy timed with
    CUDA events; returns 2 * nbytes / median copy time (s). device: a CUDA device (default: current).
    """
    import torch

    device = torch.device("cuda") if device is None else torch.device(device)
    src = torch.empty(nbytes, dtype=torch.uint8, device=device).random_(0, 255)
    dst = torch.empty_like(src)
    for _ in range(warmup):
        dst.copy_(src)
    torch.cuda.synchronize(device)
    times = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        dst.copy_(src)
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e-3)
    del src, dst
    return 2 * nbytes / statistics.median(times)


# ------------------------------------------------------------------------------------ cold L2
def rotation_copies(bytes_per_launch: int, *, target_bytes: int = 4 * L2_BYTES, min_copies: int = 2,
                    max_copies: int = 512) -> int:
    """How many copies of a launch's inputs to rotate over so that one pass touches >= target_bytes.

    ceil(target_bytes / bytes_per_launch), clipped to [min_copies, max_copies]. With the default target
    (4x the L2) every launch of a timing graph reads its copy from HBM, not L2.
    """
    return int(max(min_copies, min(max_copies, math.ceil(target_bytes / max(bytes_per_launch, 1)))))


# ------------------------------------------------------------------------------------ timing
def summarize_us(times_us: Sequence[float]) -> dict:
    """{"us_median", "us_p10", "us_p90", "samples"} of a list of times in µs. Raises ValueError for no
    sample or a NaN one (a summary of nothing, or a median NaN sorts anywhere, would be a made-up number)."""
    s = sorted(times_us)
    if not s or any(t != t for t in s):
        raise ValueError(f"summarize_us needs at least one time and no NaN, got {list(times_us)[:8]}")
    return {"us_median": statistics.median(s), "us_p10": s[len(s) // 10], "us_p90": s[(9 * len(s)) // 10],
            "samples": len(s)}


def event_times_us(run: Callable[[], Any], *, iters: int, warmup: int = 0, per: int = 1, flush=None,
                   sync_each: bool = False) -> list[float]:
    """Time `iters` calls of run() with CUDA events; returns µs per call / `per`.

    warmup: untimed calls first. flush: a tensor zeroed (outside the timed span) before every call, to
    evict the L2 (it leaves the L2 full of dirty lines, which the timed call then writes back to HBM),
    or a callable called there instead (e.g. `read_flush`: evicts with clean lines). sync_each: wait for
    every call before launching the next, so each span also holds the host's launch of the call (the GPU
    is idle when the first event runs); by default (False) all calls are queued back to back and the host
    waits once at the end, so host launch gaps stay out of the timed spans.
    """
    import torch

    for _ in range(warmup):
        run()
    torch.cuda.synchronize()
    events = []
    for _ in range(iters):
        if callable(flush):
            flush()
        elif flush is not None:
            flush.zero_()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        run()
        b.record()
        if sync_each:
            b.synchronize()
        events.append((a, b))
    torch.cuda.synchronize()
    return [a.elapsed_time(b) * 1e3 / per for a, b in events]


def read_flush(nbytes: int, device) -> Callable[[], Any]:
    """An L2 flush that only reads: each call sums a zero-filled buffer of `nbytes` (more than the L2), so
    the L2 ends up holding clean lines of that buffer and the next kernel's reads evict without write-back
    (a zeroing flush leaves dirty lines whose write-back the next kernel pays for)."""
    import torch

    buf = torch.zeros(nbytes // 4, dtype=torch.float32, device=device)
    return lambda: buf.sum()


def capture_graph(launch: Callable[[int], Any], n: int):
    """A CUDA graph of launch(0), ..., launch(n - 1) back to back (torch.cuda.CUDAGraph).

    Every launch first runs once eagerly on the current stream and once on a side stream (compilation,
    autotuning and lazy allocations happen outside the capture), then the n launches are captured.
    """
    import torch

    for i in range(n):
        launch(i)
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for i in range(n):
            launch(i)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for i in range(n):
            launch(i)
    return g


def kernel_trace(run: Callable[[], Any], *, iters: int, warmup: int = 2) -> list[tuple[str, float, float]]:
    """Every GPU kernel, memset and memcpy of `iters` calls of run() as (name, start µs, end µs), in start order.

    Device timestamps from torch.profiler (CUPTI), which reports the kernels inside a CUDA-graph replay one
    by one; under PDL a kernel's start is when its programs became resident, not when its wait returned,
    so compare end times (`spans_after`). warmup: untimed calls first.
    """
    import tempfile

    import torch
    from torch.profiler import ProfilerActivity, profile

    for _ in range(warmup):
        run()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            run()
        torch.cuda.synchronize()
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        prof.export_chrome_trace(f.name)
        trace = json.loads(Path(f.name).read_text())
    ev = [e for e in trace["traceEvents"] if e.get("cat") in ("kernel", "gpu_memset", "gpu_memcpy")]
    return sorted(((e["name"], float(e["ts"]), float(e["ts"]) + float(e["dur"])) for e in ev), key=lambda k: k[1])


def spans_after(trace: Sequence[tuple[str, float, float]], marker: str) -> list[float]:
    """For each kernel whose name starts with `marker`: the µs from its end to the last end among the kernels
    that follow it, up to the next marker (what those kernels add to a chain after the marker's output is
    ready). Segments without a following kernel are skipped."""
    spans, mark_end, last = [], None, None
    for name, _start, end in list(trace) + [(marker, 0.0, 0.0)]:
        if name.startswith(marker):
            if mark_end is not None and last is not None:
                spans.append(last - mark_end)
            mark_end, last = end, None
        elif mark_end is not None:
            last = end if last is None else max(last, end)
    return spans


def time_launches(launch: Callable[[int], Any], n: int, *, graph: bool = True, iters: int = 30,
                  warmup: int = 3) -> dict:
    """Per-launch time of launch(0..n-1) (launch i uses input copy i: cold L2 with `rotation_copies`).

    graph=True: the n launches are captured in one CUDA graph (`capture_graph`) and each of `iters`
    replays (after `warmup` untimed ones) is timed with CUDA events; graph=False (launches that cannot
    be captured, e.g. host syncs): the same with the n launches issued eagerly. Returns
    `summarize_us` of replay time / n, plus "copies": n and "cuda_graph": graph.
    """
    if graph:
        run = capture_graph(launch, n).replay
    else:
        for i in range(n):               # compile / autotune before timing
            launch(i)

        def run():
            for i in range(n):
                launch(i)
    out = summarize_us(event_times_us(run, iters=iters, warmup=warmup, per=n))
    out.update(copies=n, cuda_graph=graph)
    return out


def graph_time_us(launch: Callable[[int], Any], n: int, *, iters: int = 15, warmup: int = 2) -> float:
    """Median µs per launch of a CUDA graph holding launch(0..n-1) (`time_launches`' us_median)."""
    return time_launches(launch, n, iters=iters, warmup=warmup)["us_median"]


def replay_time_us(g, *, iters: int = 15, warmup: int = 2) -> float:
    """Median µs of one replay of an already captured CUDA graph `g` (event-timed, after warm-up)."""
    return statistics.median(event_times_us(g.replay, iters=iters, warmup=warmup))


def time_variant(calls: Sequence[Callable[[], Any]], base: dict, variant: str, results: list, skipped: list, *,
                 graph: bool = True, iters: int = 30) -> dict | None:
    """Time one variant of a sweep entry and record it; returns the result entry, or None if it failed.

    calls: R zero-argument callables, call i on input copy i (`time_launches`). base: the entry's
    fields, with "bytes" (that one call must move) and "floor_us" (bytes / copy bandwidth). On success
    {**base, "variant", **stats, "GBps": bytes / us_median (1e9 B/s), "pct_of_floor": 100 * floor_us /
    us_median} is appended to results; an exception is appended to skipped as {**base, "variant",
    "why"} (a failed variant does not stop the sweep).
    """
    try:
        t = time_launches(lambda i: calls[i](), len(calls), graph=graph, iters=iters)
    except Exception as e:  # noqa: BLE001 - recorded, the sweep goes on
        skipped.append({**base, "variant": variant, "why": f"{type(e).__name__}: {e}"[:300]})
        return None
    entry = {**base, "variant": variant, **t, "GBps": base["bytes"] / (t["us_median"] * 1e-6) / 1e9,
             "pct_of_floor": 100 * base["floor_us"] / t["us_median"]}
    results.append(entry)
    return entry


# ------------------------------------------------------------------------------------ run control
class Budget:
    """Wall-clock budget (s): optional measurements are skipped (and recorded as skipped) once spent."""

    def __init__(self, seconds: float) -> None:
        self.end = time.monotonic() + seconds

    def left(self) -> float:
        """Seconds left (negative once spent)."""
        return self.end - time.monotonic()


def exit_on_sigterm() -> None:
    """Turn SIGTERM (e.g. from `timeout`) into SystemExit(124) so `finally:` blocks still write results."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(124))


def write_json(path: str | Path | None, payload: dict) -> None:
    """Write payload as indented JSON to path (parent folders created), or print it when path is None."""
    text = json.dumps(payload, indent=1)
    if path:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(text + "\n")
    else:
        print(text)
