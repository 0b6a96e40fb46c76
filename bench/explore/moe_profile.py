"""Where the time of one Qwen3-30B-A3B MoE block goes: every launch's duration inside the CUDA graph.

    python bench/explore/moe_profile.py --out moe_profile.json [--rows 1,6] [--variants default plan_w4 ...]

For each row count, with and without PDL, cold L2 (a 512 MB read before every replay: "cold"; a 512 MB
zeroing write: "cold_write", which leaves dirty lines for the replay to write back) and warm L2:
`moe_forward` captured in a CUDA graph (as bench/bench_moe.py does), replayed under torch.profiler;
the kernels' device timestamps (CUPTI) give, per launch, the median duration, the median end time
relative to the block's first kernel start ("end_us", so end_i - end_{i-1} is what launch i adds to
the block), and the block's span (first kernel start to last kernel end). The event-timed median of a
replay (bench_moe's number) is recorded beside it. --variants names the MoEKernelConfig variants to
profile (VARIANTS; one that changes a field the imported lowlat lacks is skipped: PYTHONPATH pointing at
another checkout profiles that one).
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
from pathlib import Path

import torch

# lowlat from PYTHONPATH when it names another checkout (a baseline), else from this one; imported before
# bench_moe, which puts this checkout first on sys.path
sys.path.append(str(Path(__file__).resolve().parents[2]))
from lowlat.benchmarking import copy_bandwidth, kernel_trace, read_flush, versions, write_json  # noqa: E402
from lowlat.config import preset  # noqa: E402
from lowlat.kernels import moe as kmoe  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench_moe import FLUSH_BYTES, block_case, capture, moe_layer_weights, time_replays  # noqa: E402

KERNELS = ("_router_logits_kernel", "_route_plan_kernel", "_expert_gate_up_kernel", "_expert_down_kernel",
           "_combine_kernel")


def kernel_spans(graph, flush, replays: int) -> list[list[tuple[str, float, float]]]:
    """Per replay, the MoE kernels as (name, start µs, end µs), from CUPTI (`benchmarking.kernel_trace`);
    flush (a callable, a tensor to zero, or None) runs before every replay and is left out."""
    def run():
        if callable(flush):
            flush()
        elif flush is not None:
            flush.zero_()
        graph.replay()

    out, cur = [], []
    for full, start, end in kernel_trace(run, iters=replays, warmup=0):
        name = next((k for k in KERNELS if full.startswith(k)), None)
        if name is None or (cur and name == KERNELS[0]):
            if cur:
                out.append(cur)
            cur = []
        if name is not None:
            cur.append((name, start, end))
    if cur:
        out.append(cur)
    return out


def summarize(replays: list[list[tuple[str, float, float]]]) -> dict:
    if not replays:
        return {"replays": 0, "span_us": float("nan"), "kernels": []}
    n = statistics.mode(len(r) for r in replays)
    keep = [r for r in replays if len(r) == n]
    per = []
    for i in range(n):
        per.append({"kernel": keep[0][i][0],
                    "dur_us": statistics.median(r[i][2] - r[i][1] for r in keep),
                    "start_us": statistics.median(r[i][1] - r[0][1] for r in keep),
                    "end_us": statistics.median(r[i][2] - r[0][1] for r in keep)})
    return {"replays": len(keep), "span_us": statistics.median(r[-1][2] - r[0][1] for r in keep),
            "kernels": per}


#: --variants: MoEKernelConfig fields changed from the defaults, by name
VARIANTS = {
    "default": {},
    "bn16_bnh64_s3_w4": dict(BN=16, BNH=64, num_stages=3, num_warps=4),
    "bn32_bnh32_s3_w4": dict(BN=32, BNH=32, num_stages=3, num_warps=4),
    "bn16_bnh32_s4_w4": dict(BN=16, BNH=32, num_stages=4, num_warps=4),
    "bn32_bnh64_s4_w4": dict(BN=32, BNH=64, num_stages=4, num_warps=4),
    "bn64_bnh64_s4_w8": dict(BN=64, BNH=64, num_stages=4, num_warps=8),
    "plan_w4": dict(plan_warps=4),
    "plan_w2": dict(plan_warps=2),
    "plan_w1": dict(plan_warps=1),
    "bn32_bk128_s5": dict(BN=32, BK=128, num_stages=5),
    "bn16_bk128_s6": dict(BN=16, BK=128, num_stages=6),
    "bn16_bk128_s5": dict(BN=16, BK=128, num_stages=5),
    "bn32_bk64_s8": dict(BN=32, BK=64, num_stages=8),
    "bn32_bk256_s3": dict(BN=32, BK=256, num_stages=3),
    "bn32_s4_bki256": dict(BN=32, num_stages=4, BKI=256),
    "bn32_s5_bnh32": dict(BN=32, num_stages=5, BNH=32),
}


def variants(base, names):
    fields = {f.name for f in dataclasses.fields(base)}
    for name in names:
        change = {k: v for k, v in VARIANTS[name].items() if k in fields}
        if len(change) == len(VARIANTS[name]):          # a field this lowlat lacks: skip the variant
            yield name, dataclasses.replace(base, **change)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--rows", default="1,6")
    ap.add_argument("--replays", type=int, default=60)
    ap.add_argument("--variants", nargs="*", default=["default"], choices=sorted(VARIANTS))
    ap.add_argument("--label", default="")
    args = ap.parse_args(argv)
    print("lowlat.kernels.moe from", kmoe.__file__, flush=True)
    device = torch.device("cuda")
    cfg = preset("Qwen3-30B-A3B")
    lw = moe_layer_weights(cfg, device, 0)
    hidden, ie, e = cfg.hidden_size, cfg.moe_intermediate_size, cfg.num_experts
    bw = copy_bandwidth(device)
    flush = read_flush(FLUSH_BYTES, device)
    write_flush = torch.empty(FLUSH_BYTES, dtype=torch.uint8, device=device)
    base = kmoe.MoEKernelConfig.for_shapes(hidden, e, ie)
    g = torch.Generator(device=device).manual_seed(1)
    results = []
    for m in (int(r) for r in args.rows.split(",")):
        case = block_case(cfg, lw, m, g, bw)
        h, x, ws, out, active, floor_us = case.h, case.x, case.ws, case.out, case.active, case.floor_us
        for name, c in variants(base, args.variants):
            for use_pdl in (False, True):
                try:
                    graph = capture(h, x, lw, cfg, ws, out, use_pdl, c)
                except Exception as exc:  # a variant that does not build: recorded, not fatal
                    results.append({"rows": m, "variant": name, "use_pdl": use_pdl, "error": repr(exc)[:300]})
                    continue
                row = {"rows": m, "variant": name, "config": dataclasses.asdict(c), "use_pdl": use_pdl,
                       "active_experts": active, "floor_us": floor_us}
                for l2, fl in (("cold", flush), ("cold_write", write_flush), ("warm", None)):
                    row[l2] = summarize(kernel_spans(graph, fl, args.replays))
                    row[l2]["event_median_us"] = time_replays(graph.replay, fl, 100)["median_us"]
                results.append(row)
                ends = [0.0] + [k["end_us"] for k in row["cold"]["kernels"]]
                ks = " ".join(f"{k['kernel'][1:-7]} +{b - a:.1f}"
                              for k, a, b in zip(row["cold"]["kernels"], ends, ends[1:]))
                print(f"M={m} {name:22s} pdl={int(use_pdl)} floor {floor_us:5.1f} | cold span "
                      f"{row['cold']['span_us']:5.1f} event {row['cold']['event_median_us']:5.1f} "
                      f"({100 * floor_us / row['cold']['event_median_us']:4.1f}%) | write-flush event "
                      f"{row['cold_write']['event_median_us']:5.1f} | warm span "
                      f"{row['warm']['span_us']:5.1f} | adds: {ks}", flush=True)
    write_json(args.out, {"bench": "moe_profile", "label": args.label, "lowlat": kmoe.__file__, "model": cfg.name,
                          **versions(),
                          "copy_bandwidth_tbps": bw / 1e12, "results": results})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
