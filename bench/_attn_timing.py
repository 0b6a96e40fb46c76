"""Timing helpers of bench_attn_prologue.py and bench_decode_attention.py (not a library module).

Method: R calls, each on its own copy of the inputs (rotated so that R * bytes-per-call exceeds the
L2 cache: every call starts cold), are captured back to back in one CUDA graph; the graph is
replayed after warm-up and each replay is timed with CUDA events. Reported: median (and p10 / p90)
of per-call time = replay time / R. Calls that cannot be captured (host syncs) are timed the same
way without a graph. The HBM floor is bytes / measured device-to-device copy bandwidth.
"""

from __future__ import annotations

import datetime
import json
import platform
import signal
import statistics
import sys
import time

import torch

L2_BYTES = 50 * 2**20          # H100 / H200 L2
COLD_TARGET = 4 * L2_BYTES     # rotate through at least this many bytes


def copies_for(bytes_per_call: int, max_copies: int = 512) -> int:
    return int(max(2, min(max_copies, -(-COLD_TARGET // max(bytes_per_call, 1)))))


def copy_bandwidth(nbytes: int = 2**30) -> float:
    """Device-to-device copy bandwidth in bytes/s, counting read + write (median of 10)."""
    src = torch.empty(nbytes // 2, dtype=torch.bfloat16, device="cuda").normal_()
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    times = []
    for _ in range(10):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        dst.copy_(src)
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b) * 1e-3)
    del src, dst
    return 2 * nbytes / statistics.median(times)


def _stats(per_call_us: list[float]) -> dict:
    s = sorted(per_call_us)
    return {"us_median": statistics.median(s), "us_p10": s[len(s) // 10], "us_p90": s[(9 * len(s)) // 10],
            "samples": len(s)}


def time_calls(calls, *, graph: bool = True, replays: int = 30, warmup: int = 3) -> dict:
    """Per-call time of `calls` (list of R zero-argument callables, one per input copy)."""
    for c in calls:          # compile / autotune outside the graph
        c()
    torch.cuda.synchronize()
    r = len(calls)
    if graph:
        g = torch.cuda.CUDAGraph()
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for c in calls:
                c()
        torch.cuda.current_stream().wait_stream(s)
        torch.cuda.synchronize()
        with torch.cuda.graph(g):
            for c in calls:
                c()
        run = g.replay
    else:
        def run():
            for c in calls:
                c()
    for _ in range(warmup):
        run()
    torch.cuda.synchronize()
    per = []
    for _ in range(replays):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        run()
        b.record()
        torch.cuda.synchronize()
        per.append(a.elapsed_time(b) * 1e3 / r)
    out = _stats(per)
    out["copies"] = r
    out["cuda_graph"] = graph
    return out


def environment() -> dict:
    import triton

    p = torch.cuda.get_device_properties(0)
    return {"device": p.name, "sm_count": p.multi_processor_count, "capability": f"sm_{p.major}{p.minor}",
            "torch": torch.__version__, "triton": triton.__version__, "cuda": torch.version.cuda,
            "python": platform.python_version(),
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "command": " ".join([sys.executable.split("/")[-1]] + sys.argv)}


def exit_on_sigterm() -> None:
    """Turn SIGTERM (e.g. from `timeout`) into SystemExit so `finally:` still writes the results."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(124))


class Budget:
    """Wall-clock budget: optional measurements are skipped (and recorded as skipped) once spent."""

    def __init__(self, seconds: float) -> None:
        self.end = time.monotonic() + seconds

    def left(self) -> float:
        return self.end - time.monotonic()


def write(path: str | None, payload: dict) -> None:
    text = json.dumps(payload, indent=1)
    if path:
        with open(path, "w") as f:
            f.write(text + "\n")
    else:
        print(text)
