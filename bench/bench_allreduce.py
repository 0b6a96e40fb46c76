"""Latency of lowlat's push + rank-ordered all-reduce on emulated ranks (lowlat.comm.EmulatedGroup).

    python bench/bench_allreduce.py --out bench/results/allreduce_h200.json [--budget-s 90]
    python bench/bench_allreduce.py --smoke      # CPU interpreter, one tiny case: the script runs

World 2, 4, 8 x rows 1, 6, 8, 16, 48 x hidden 576, 2048, 4096, 8192, bf16, on ONE GPU: every rank's
blocks run in one grid and push into the other ranks' receive buffers on the same device, so this
measures the protocol's latency (push, release flag, acquire poll, ordered sum) and the kernel, not
NVLink. Each call = a device epoch bump (`add_`, a separate tiny kernel) + the all-reduce kernel;
STEPS calls are captured in one CUDA graph, and the time per call is the median over replays / STEPS,
with the epoch bump's own time (a graph of STEPS bumps) reported alongside. Data stays in L2 (a
decode step reduces partials it just produced). The floor is the emulated bytes (every rank's tile
written into every rank's slot, read back, plus inputs and outputs) / the measured copy bandwidth.

Deadline cost: the same kernel compiled with USE_DEADLINE=False (no clock reads, a constexpr) at
rows 1 and 48, hidden 576 and 8192. Every configuration is first checked bitwise against
lowlat.reference.tp.ordered_sum.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))     # run from a checkout, installed or not

from lowlat.benchmarking import copy_bandwidth, time_launches, versions, write_json  # noqa: E402

WORLDS = (2, 4, 8)
ROWS = (1, 6, 8, 16, 48)
HIDDEN = (576, 2048, 4096, 8192)
DEADLINE_CASES = [(r, h) for r in (1, 48) for h in (576, 8192)]
STEPS, REPLAYS = 20, 25


def graph_time_us(fn, steps: int = STEPS, replays: int = REPLAYS) -> float:
    """Median time of one fn() call (µs): a CUDA graph of `steps` calls, replayed `replays` times."""
    return time_launches(lambda _: fn(), steps, iters=replays, warmup=1)["us_median"]


def bench_case(world: int, rows: int, hidden: int, use_deadline: bool, bw: float) -> dict:
    from lowlat.comm.emulated import EmulatedGroup
    from lowlat.comm.testing import assert_bits_equal, make_partials, reference

    g = EmulatedGroup(world, hidden, max_rows=rows, device="cuda", deadline=5.0)
    parts = make_partials(world, rows, hidden, seed=rows * 7 + hidden, device="cuda")
    out = torch.full_like(parts, float("nan"))
    t0 = time.monotonic()
    g.all_reduce(parts, out, use_deadline=use_deadline)          # compile + check
    first_s = time.monotonic() - t0
    ref = reference(parts)
    for r in range(world):
        assert_bits_equal("ordered_all_reduce", out[r].cpu(), ref, output=f"rank{r}")
    us = graph_time_us(lambda: g.all_reduce(parts, out, check=False, use_deadline=use_deadline))
    g.sync_epoch()
    g.check()
    for r in range(world):
        assert_bits_equal("ordered_all_reduce", out[r].cpu(), ref, output=f"replayed_rank{r}")
    elem = parts.element_size()
    moved = (2 * world * world + 2 * world) * rows * hidden * elem
    plan = g.last_plan
    return {"world": world, "rows": rows, "hidden": hidden, "use_deadline": use_deadline,
            "us_per_call": round(us, 3), "emulated_bytes": moved, "floor_us": round(moved / bw * 1e6, 3),
            "gbps": round(moved / (us * 1e-6) / 1e9, 1), "tiles_per_rank": plan.n_tiles,
            "block_h": plan.block_h, "chunk_rows": plan.chunk, "blocks": plan.n_tiles * world,
            "first_call_s": round(first_s, 2), "bitwise_vs_reference": True}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--budget-s", type=float, default=1e9, help="stop starting new cases after this")
    ap.add_argument("--smoke", action="store_true")
    a = ap.parse_args()
    if a.smoke:
        import os

        os.environ.setdefault("TRITON_INTERPRET", "1")
        from lowlat.comm.emulated import EmulatedGroup
        from lowlat.comm.testing import assert_bits_equal, make_partials, reference

        g = EmulatedGroup(3, 600, max_rows=2, device="cpu", deadline=5.0)
        parts = make_partials(3, 2, 600, seed=0)
        out = g.all_reduce(parts)
        assert_bits_equal("ordered_all_reduce", out[0], reference(parts))
        print("smoke ok")
        return
    start = time.monotonic()
    bw = copy_bandwidth()
    report = {**versions(), "copy_bandwidth_Bps": bw, "steps_per_graph": STEPS, "replays": REPLAYS,
              "cases": [], "errors": []}
    from lowlat.comm.emulated import EmulatedGroup

    bump = EmulatedGroup(2, 576, max_rows=1, device="cuda")
    report["epoch_bump_us"] = round(graph_time_us(lambda: bump.bufs.epoch.add_(1)), 3)
    todo = [(w, r, h, True) for w in WORLDS for h in HIDDEN for r in ROWS]
    todo += [(w, r, h, False) for w in WORLDS for r, h in DEADLINE_CASES]
    for w, r, h, dl in todo:
        if time.monotonic() - start > a.budget_s:
            report["errors"].append(f"budget reached: skipped world={w} rows={r} hidden={h} deadline={dl}")
            continue
        try:
            res = bench_case(w, r, h, dl, bw)
            report["cases"].append(res)
            print(json.dumps(res), flush=True)
        except Exception as e:  # noqa: BLE001 - recorded, the sweep goes on
            report["errors"].append(f"world={w} rows={r} hidden={h} deadline={dl}: {type(e).__name__}: {e}")
            print(report["errors"][-1], flush=True)
        if a.out:
            write_json(a.out, report)
    with_dl = {(c["world"], c["rows"], c["hidden"]): c["us_per_call"] for c in report["cases"] if c["use_deadline"]}
    report["deadline_cost_us"] = [
        {"world": c["world"], "rows": c["rows"], "hidden": c["hidden"],
         "with": with_dl.get((c["world"], c["rows"], c["hidden"])), "without": c["us_per_call"]}
        for c in report["cases"] if not c["use_deadline"]]
    if a.out:
        write_json(a.out, report)
    print(json.dumps({"epoch_bump_us": report["epoch_bump_us"], "deadline_cost_us": report["deadline_cost_us"],
                      "errors": report["errors"]}, indent=1))


if __name__ == "__main__":
    main()
