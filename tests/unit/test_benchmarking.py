"""lowlat.benchmarking, the timing utilities every benchmark shares: the CPU-checkable parts here (copy
counts for a cold L2, percentile summary, provenance, JSON output, budget); the CUDA timing itself on
the GPU (marked gpu)."""

from __future__ import annotations

import json
import sys

import pytest
import torch

from lowlat import benchmarking as bm


def test_importing_does_not_touch_cuda():
    import subprocess

    code = ("import sys, lowlat.benchmarking; "
            "assert 'triton' not in sys.modules; print('ok')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


@pytest.mark.parametrize("nbytes, kw, want", [
    (1, {}, 512),                                          # tiny launch: capped at max_copies
    (10 * 2**20, {}, 20),                                  # 200 MiB / 10 MiB
    (10 * 2**20 + 1, {}, 20),                              # rounds up only past a whole copy
    (3 * 2**20, {"target_bytes": 10 * 2**20}, 4),          # ceil(10 / 3)
    (2**30, {}, 2),                                        # bigger than the target: still >= 2 copies
    (2**30, {"min_copies": 1}, 1),
    (2**20, {"target_bytes": 192 << 20, "min_copies": 1, "max_copies": 256}, 192),
    (0, {"max_copies": 7}, 7),                             # 0 bytes does not divide by zero
])
def test_rotation_copies_reach_the_target_bytes_within_bounds(nbytes, kw, want):
    got = bm.rotation_copies(nbytes, **kw)
    assert got == want
    lo, hi = kw.get("min_copies", 2), kw.get("max_copies", 512)
    assert lo <= got <= hi
    if lo < got < hi:                                      # not clipped: one pass covers the target
        assert got * nbytes >= kw.get("target_bytes", 4 * bm.L2_BYTES) > (got - 1) * nbytes


def test_summarize_us_orders_percentiles():
    g = torch.Generator().manual_seed(1)
    times = (torch.rand(101, generator=g) * 50 + 1).tolist()
    s = bm.summarize_us(times)
    srt = sorted(times)
    assert s["samples"] == 101
    assert s["us_median"] == srt[50]
    assert s["us_p10"] == srt[10] and s["us_p90"] == srt[90]
    assert s["us_p10"] <= s["us_median"] <= s["us_p90"]
    for bad in ([], [1.0, float("nan"), 2.0]):      # [] was a StatisticsError; a NaN median sorts anywhere
        with pytest.raises(ValueError, match="at least one time and no NaN"):
            bm.summarize_us(bad)


def test_versions_names_device_versions_date_and_command():
    v = bm.versions()
    for key in ("device", "torch", "triton", "python", "date", "command"):
        assert v[key], key
    assert v["torch"] == torch.__version__
    assert v["date"].endswith("+00:00")                   # UTC
    if hasattr(sys, "orig_argv"):                          # Python >= 3.10: the command line as typed
        assert v["command"] == " ".join(sys.orig_argv)
    else:
        assert v["command"].endswith(" ".join(sys.argv))


def test_write_json_creates_parents_and_round_trips(tmp_path, capsys):
    path = tmp_path / "a" / "b.json"
    doc = {"x": 1.5, "rows": [1, 6]}
    bm.write_json(path, doc)
    assert json.loads(path.read_text()) == doc
    bm.write_json(None, doc)                               # no path: printed
    assert json.loads(capsys.readouterr().out) == doc


def test_budget_counts_down():
    assert 0 < bm.Budget(60).left() <= 60
    assert bm.Budget(-1).left() < 0


def test_time_variant_records_a_failed_variant_as_skipped_and_goes_on():
    def boom():
        raise ValueError("no such tile 7")

    results, skipped = [], []
    base = {"model": "m", "rows": 6, "bytes": 100, "floor_us": 1.0}
    assert bm.time_variant([boom, boom], base, "fused", results, skipped) is None
    assert results == []
    assert skipped == [{**base, "variant": "fused", "why": "ValueError: no such tile 7"}]


@pytest.mark.gpu
def test_gpu_timing_counts_every_launch_per_copy(device):
    """time_launches runs each launch in every replay (graph and eager), divides by the copies, and
    copy_bandwidth gives a positive, finite rate."""
    n, iters = 4, 5
    counters = torch.zeros(n, dtype=torch.int64, device=device)

    def launch(i):
        counters[i].add_(1)

    for graph in (True, False):
        counters.zero_()
        t = bm.time_launches(launch, n, graph=graph, iters=iters, warmup=2)
        torch.cuda.synchronize()
        # graph: an eager pass + a side-stream pass + warm-up + timed replays (the capture runs nothing)
        want = (2 + 2 + iters) if graph else (1 + 2 + iters)
        assert counters.tolist() == [want] * n
        assert t["copies"] == n and t["cuda_graph"] is graph and t["samples"] == iters
        assert 0 < t["us_p10"] <= t["us_median"] <= t["us_p90"]
    results, skipped = [], []
    base = {"bytes": 8 * n, "floor_us": 1.0}
    e = bm.time_variant([lambda i=i: launch(i) for i in range(n)], base, "v", results, skipped, iters=iters)
    assert skipped == [] and results == [e] and e["variant"] == "v"
    assert e["GBps"] == 8 * n / (e["us_median"] * 1e-6) / 1e9           # the same formula: exact
    assert e["pct_of_floor"] == 100 * 1.0 / e["us_median"]
    bw = bm.copy_bandwidth(device, nbytes=64 << 20, iters=5)
    assert 1e9 < bw < 1e14


def test_read_flush_returns_a_callable_that_sums_a_zero_buffer():
    """read_flush(nbytes) gives a callable (what event_times_us calls before every timed call) that reads
    its buffer and returns the zero sum: it writes nothing the next kernel would have to write back."""
    f = bm.read_flush(4096, "cpu")
    r = f()
    assert callable(f) and r.dim() == 0 and r.dtype == torch.float32 and r.item() == 0.0


@pytest.mark.gpu
def test_event_timing_flushes_before_every_call_by_callable_or_by_zeroing(device):
    """flush as a callable is called once per timed call (warm-up excluded); as a tensor it is zeroed."""
    calls = []
    runs = torch.zeros(1, dtype=torch.int64, device=device)
    t = bm.event_times_us(lambda: runs.add_(1), iters=6, warmup=2, flush=lambda: calls.append(1))
    torch.cuda.synchronize()
    assert len(calls) == 6 and len(t) == 6 and int(runs) == 8 and all(x > 0 for x in t)
    buf = torch.ones(1024, device=device)
    bm.event_times_us(lambda: runs.add_(1), iters=1, flush=buf)
    torch.cuda.synchronize()
    assert int(buf.abs().sum()) == 0


def test_spans_after_measures_from_each_markers_end_to_the_last_end_before_the_next_marker():
    """spans_after: one span per marker with kernels after it, from the marker's END (its output ready) to
    the LAST end among the kernels up to the next marker (not the last to start); kernels before the
    first marker and a marker with nothing after it give no span."""
    trace = [("early", 0.0, 1.0),
             ("norm_k", 1.0, 3.0), ("gemv", 3.5, 10.0), ("argmax", 10.5, 12.0), ("scatter", 11.0, 11.5),
             ("norm_k", 12.0, 14.0), ("draft", 13.0, 20.0),        # started under PDL before the norm ended
             ("norm_k", 21.0, 22.0)]
    assert bm.spans_after(trace, "norm") == [12.0 - 3.0, 20.0 - 14.0]
    assert bm.spans_after(trace, "absent") == []
    assert bm.spans_after([], "norm") == []


@pytest.mark.gpu
def test_gpu_kernel_trace_lists_the_graph_replays_kernels_in_order(device):
    """kernel_trace reports each kernel inside a CUDA-graph replay (CUPTI), once per call, in start order,
    with end >= start; spans_after over it gives one span per marked pair."""
    a = torch.randn(1 << 20, device=device)
    b = torch.empty_like(a)

    def pair(i):
        torch.mul(a, 2.0, out=b)                              # the marker's kernel: an elementwise mul
        torch.cumsum(b[:4096], 0)                              # a different kernel after it

    g = bm.capture_graph(pair, 3)
    trace = bm.kernel_trace(g.replay, iters=4, warmup=1)
    assert all(e >= s for _, s, e in trace) and [s for _, s, _ in trace] == sorted(s for _, s, _ in trace)
    mul = [n for n, _, _ in trace if "Mul" in n or "mul" in n]
    assert len(mul) == 3 * 4, [n for n, _, _ in trace]
    spans = bm.spans_after(trace, mul[0])
    assert len(spans) == 3 * 4 and all(s > 0 for s in spans)


def test_launch_roles_and_costs_of_a_fused_step_trace():
    """lowlat.bench's profile section: roles by kernel name (a layer's first residual GEMV is out_proj, its
    second down, reset at every attention prologue, split-K or held), each launch's cost = its end minus the previous
    end (the first of a replay: its duration), replays split by count and checked to launch the same kernels."""
    from lowlat import bench
    from lowlat.config import preset

    layer = ["_attn_prologue_kernel", "_decode_attention_kernel", "_residual_gemv_kernel", "_gate_up_kernel",
             "_residual_gemv_kernel"]
    names = ["void at::native::indexSelect"] + layer * 2 + ["_lm_head_kernel"]
    assert bench.launch_roles(names) == (["other:void at::native::indexSelect"]
                                         + ["attn_prologue", "decode_attention", "out_proj", "gate_up", "down"] * 2
                                         + ["lm_head"])
    held = ["_held_prologue_kernel"] + layer[1:]        # the held prologue (session 25) resets the count too
    assert bench.launch_roles(held * 2) == ["attn_prologue", "decode_attention", "out_proj", "gate_up", "down"] * 2
    moe = ["_attn_prologue_kernel", "_decode_attention_kernel", "_residual_gemv_kernel", "_router_logits_kernel",
           "_route_plan_kernel", "_expert_gate_up_kernel", "_expert_down_kernel", "_combine_kernel"]
    assert bench.launch_roles(moe)[2:] == ["out_proj", "moe_router", "moe_route_plan", "moe_gate_up", "moe_down",
                                           "moe_combine"]
    moe[2] = "_held_residual_gemv_kernel"               # MoE layers' out_proj with its weights held (session 26)
    assert bench.launch_roles(moe * 2)[2:9] == ["out_proj", "moe_router", "moe_route_plan", "moe_gate_up", "moe_down",
                                                "moe_combine", "attn_prologue"]
    # two replays of three launches; under PDL a launch starts before its predecessor ends
    trace = [("a", 0.0, 2.0), ("_residual_gemv_kernel", 1.0, 7.0), ("_gate_up_kernel", 6.5, 8.0),
             ("a", 20.0, 21.0), ("_residual_gemv_kernel", 20.5, 25.0), ("_gate_up_kernel", 24.0, 26.5)]
    costs = bench.launch_costs(trace, 2)
    assert costs == {"other:a": [2.0, 1.0], "out_proj": [5.0, 4.0], "gate_up": [1.0, 1.5]}
    with pytest.raises(ValueError, match="7 kernels in 2 replays"):
        bench.launch_costs(trace + [("a", 30.0, 31.0)], 2)
    with pytest.raises(ValueError, match="replay 1 launched other kernels"):
        bench.launch_costs(trace[:3] + [("b", 20.0, 21.0)] + trace[4:], 2)
    for replays in (0, -1, 2.0, True):          # 0 was a ZeroDivisionError
        with pytest.raises(ValueError, match=f"replays={replays!r} must be an int"):
            bench.launch_costs(trace, replays)
    cfg = preset("Llama-3.2-1B")
    assert bench.role_bytes(cfg, "attn_prologue") == (2048 + 2 * 512) * 2048 * 2       # 32 + 2 x 8 heads of 64
    assert bench.role_bytes(cfg, "out_proj") == 2048 * 2048 * 2
    assert bench.role_bytes(cfg, "down") == 2048 * 8192 * 2 and bench.role_bytes(cfg, "moe_gate_up") is None
