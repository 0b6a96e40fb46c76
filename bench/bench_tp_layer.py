"""Latency of the TP-sharded fused decoder layer on emulated ranks (lowlat.runtime.tp_fused_layer), the
reduction overlapped with the GEMV (PDL) vs serial, next to the TP-1 fused layer.

    python bench/bench_tp_layer.py --out bench/results/tp_layer_h200.json [--budget-s 85]
    python bench/bench_tp_layer.py --smoke      # CPU interpreter, tiny config, 1 iteration: the script runs

Models: SmolLM2-135M- and Llama-3.2-1B-shaped random layers (lowlat.config presets), decode rows 1, 6,
48 (one request per row, ctx 512 cached tokens each), worlds:
  1      the TP-1 fused layer (`FusedModel._run` without the LM head: five PDL-chained launches per
         layer, the fused step's own path); the TP layer itself is not timed at world 1;
  2/3/4  `TPFusedLayer` on an `EmulatedGroup`: ALL N RANKS RUN ON ONE GPU, so the time is N ranks'
         work serialized on one device (N prologues, N attentions, N gate/up GEMVs, and the two
         push + reduce grids covering every rank), not the latency of an N-GPU layer;
         variants overlap (each reduce launched as the push GEMV's PDL dependent) and serial.
A world that does not divide the query heads, the KV heads or the FFN width is skipped and listed
under "skipped" (SmolLM2-135M: 9 query / 3 KV heads, so world 2 and 4 are skipped; world 3 is timed).

Method (lowlat.benchmarking): the layer is built `copies` times with different random weights (as
consecutive layers of a model; `rotation_copies` of one layer's weight bytes, so one replay streams
more than the L2 holds and every layer reads its weights from HBM), all sharing one group and one
per-rank KV cache; a CUDA graph holds one `launch` of every copy (device epoch bumps included) and
the time per layer is the median replay time / copies (p10 / p90 alongside). Before timing, every
(world, rows) case is run eagerly in both modes: ranks bitwise equal, overlap bitwise equal to
serial; after the replays the first copy's output is compared with its eager output again and the
abort words must be clear. The graph keeps the abort floor of its capture, which is harmless here
(no fault, no abort word is ever written).
Breakdown per (world, rows), serial launches, same graph method:
  reduce_pair_us  the layer's two reduce launches alone (norm + no norm), every flag already set
                  (they re-reduce the last collective's slots): the cost of the reductions with no
                  waiting, data in L2;
  push_pair_us    the two push GEMV launches of one layer (with their epoch bumps), weights rotated.
Failures are recorded under "errors" and the sweep goes on; `--budget-s` stops starting new cases.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))     # run from a checkout, installed or not

MODELS = ("Llama-3.2-1B", "SmolLM2-135M")
WORLDS = (1, 2, 3, 4)
ROWS = (1, 6, 48)
CTX = 512
REPLAYS = 20
MAX_COPIES = 32
PAIR_REPS = 20
ONE_GPU_NOTE = ("all {n} ranks run on one GPU: the time is {n} ranks' work serialized on one device, "
                "not a multi-GPU latency")


# ------------------------------------------------------------------------------------------ helpers
class Timer:
    """Per-launch time of launch(0..n-1): CUDA graph + events on a GPU (`time_launches`); in smoke mode
    (CPU interpreter) one eager pass timed on the host, just to exercise the code."""

    def __init__(self, smoke: bool, replays: int) -> None:
        self.smoke, self.replays = smoke, replays

    def __call__(self, launch, n: int) -> dict:
        if self.smoke:
            t0 = time.perf_counter()
            for i in range(n):
                launch(i)
            us = (time.perf_counter() - t0) * 1e6 / n
            return {"us_median": us, "us_p10": us, "us_p90": us, "samples": 1, "copies": n, "cuda_graph": False}
        from lowlat.benchmarking import time_launches

        return time_launches(launch, n, iters=self.replays, warmup=2)


def layer_weight_bytes(cfg) -> int:
    h, i = cfg.hidden_size, cfg.intermediate_size
    return 2 * (h * (cfg.q_size + 2 * cfg.kv_size) + cfg.q_size * h + 3 * h * i + 2 * h)


def has_time(rec, budget, where: str) -> bool:
    """True while the budget lasts; else records `where` as skipped."""
    if budget.left() > 0:
        return True
    rec.skip(where, "time budget")
    return False


def stats(t: dict, copies: int) -> dict:
    return {"us_per_layer": round(t["us_median"], 2), "us_p10": round(t["us_p10"], 2), "us_p90": round(t["us_p90"], 2),
            "replays": t["samples"], "layer_copies": copies, "cuda_graph": t["cuda_graph"]}


# ------------------------------------------------------------------------------------------ world 1
def bench_tp1(cfg, model: str, weights, copies: int, rows_list, ctx: int, device, timer: Timer, rep,
              budget) -> None:
    """The TP-1 fused layer: FusedModel over `copies` layers, LM head excluded, time / copies."""
    import torch

    from lowlat.bench import _DecodeCase, random_kv
    from lowlat.runtime.fused_model import FusedModel

    kv = random_kv(cfg, 1, max(rows_list), ctx, device)
    pool = SimpleNamespace(k_caches=kv.k_caches * copies, v_caches=kv.v_caches * copies)
    fm = FusedModel(cfg, weights, device=device, widths=tuple(sorted(rows_list)), use_cuda_graphs=False,
                    validate=False)
    for rows in rows_list:
        where = f"{model}/world=1/rows={rows}/tp1_fused_layer"
        if not has_time(rep, budget, where):
            continue
        try:
            fm.forward(_DecodeCase(cfg, rows, ctx, device, pool).step, pool)   # inputs into the static buffers
            bufs = fm._bufs[fm.width_for(rows)]
            t = timer(lambda _: fm._run(bufs, pool.k_caches, pool.v_caches, include_lm_head=False), 1)
            per = {**t, **{key: t[key] / copies for key in ("us_median", "us_p10", "us_p90")}}
            rep.add(model=model, world=1, rows=rows, ctx=ctx, variant="tp1_fused_layer", overlap=None,
                    pdl=fm.use_pdl, launches_per_layer=5, **stats(per, copies),
                    note="TP-1 fused layer (FusedModel._run, LM head excluded; + one embedding gather per "
                         "replay, amortized over the copies)")
        except Exception as e:                                              # noqa: BLE001
            rep.error(where, e)
    del fm
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


# ------------------------------------------------------------------------------------------ world N
def bench_tp(cfg, model: str, weights, copies: int, world: int, rows_list, ctx: int, device, timer: Timer,
             rep, budget, *, breakdown: bool = True) -> None:
    import torch

    from lowlat.bench import _DecodeCase, random_kv
    from lowlat.comm.emulated import EmulatedGroup
    from lowlat.kernels._gemv import pdl_available
    from lowlat.kernels.tp_layer import partial_gemv_push, reduce_residual_norm
    from lowlat.runtime.tp_fused_layer import STAGE_NAMES, TPFusedLayer, shard_kv_cache

    n, hdim = world, cfg.hidden_size
    group = EmulatedGroup(n, hdim, max_rows=max(rows_list), dtype=torch.bfloat16, device=device, deadline=5.0,
                          stage_names=STAGE_NAMES)
    layers = [TPFusedLayer(cfg, lw, n, device=device, group=group, max_rows=max(rows_list))
              for lw in weights.layers[:copies]]
    pdl_ok = pdl_available(torch.device(device))
    kv = random_kv(cfg, 1, max(rows_list), ctx, device)
    kc, vc = shard_kv_cache(kv.k_caches[0], n), shard_kv_cache(kv.v_caches[0], n)
    del kv
    note = ONE_GPU_NOTE.format(n=n)
    g = torch.Generator(device=device).manual_seed(11)
    for rows in rows_list:
        base = f"{model}/world={n}/rows={rows}"
        if not has_time(rep, budget, base):
            continue
        try:
            step = _DecodeCase(cfg, rows, ctx, device, None).step
            x = torch.randn(rows, hdim, generator=g, device=device).to(torch.bfloat16)
            x3 = x.unsqueeze(0).expand(n, -1, -1)
            eager = {}
            for ov in (False, True):                    # correctness first, both modes, eager
                for L in layers:
                    L.overlap = ov
                out = layers[0].forward(x, step, kc, vc)
                if not all(torch.equal(out[r], out[0]) for r in range(n)):
                    raise AssertionError(f"overlap={ov}: ranks differ")
                eager[ov] = out
            same = torch.equal(eager[True], eager[False])
            if not same:
                rep.error(f"{base}/check", AssertionError("overlap output != serial output (bitwise)"))
        except Exception as e:                                              # noqa: BLE001
            rep.error(f"{base}/eager", e)
            continue
        outs = [torch.empty(n, rows, hdim, dtype=torch.bfloat16, device=device) for _ in range(copies)]
        for ov in (True, False):
            where = f"{base}/{'overlap' if ov else 'serial'}"
            if ov and not pdl_ok and not timer.smoke:    # (smoke: run the path anyway, serial underneath)
                rep.skip(where, "PDL not available here: overlap falls back to serial")
                continue
            if not has_time(rep, budget, where):
                continue
            try:
                for L in layers:
                    L.overlap = ov
                t = timer(lambda i: layers[i].launch(x3, step, kc, vc, outs[i]), copies)
                group.sync_epoch()
                aborts = int(group.ctrl[:, 0].ne(0).sum())
                replay_ok = torch.equal(outs[0], eager[ov])
                rep.add(model=model, world=n, rows=rows, ctx=ctx,
                        variant="tp_layer_overlap" if ov else "tp_layer_serial",
                        overlap=layers[0].overlap, launches_per_layer=3 * n + 6, **stats(t, copies),
                        bitwise_ranks_equal=True, bitwise_overlap_eq_serial=same, replay_eq_eager=replay_ok,
                        abort_words=aborts, note=note)
                if aborts or not replay_ok:
                    rep.error(where, AssertionError(f"abort words set: {aborts}, replay == eager: {replay_ok}"))
            except Exception as e:                                          # noqa: BLE001
                rep.error(where, e)
        if not breakdown or not has_time(rep, budget, f"{base}/breakdown"):
            continue
        try:
            L0 = layers[0]
            for L in layers:
                L.overlap = False
            L0.forward(x, step, kc, vc)                 # last collective complete: its flags are set
            bufs, epoch = group.bufs, group.epoch
            x1, h, out = L0._x1[:, :rows], L0._h[:, :rows], outs[0]

            def reduce_pair(_):
                reduce_residual_norm(bufs, x3, x1, stage=1, abort_floor=epoch, deadline_ns=group.deadline.ns,
                                     spin_limit=group.spin_limit, norm_weight=L0.mlp_norm, eps=cfg.rms_eps, h_out=h)
                reduce_residual_norm(bufs, x1, out, stage=2, abort_floor=epoch, deadline_ns=group.deadline.ns,
                                     spin_limit=group.spin_limit)

            t = timer(reduce_pair, PAIR_REPS if not timer.smoke else 1)
            rep.add(model=model, world=n, rows=rows, ctx=ctx, variant="reduce_pair", overlap=False,
                    us_per_layer=round(t["us_median"], 2), us_p10=round(t["us_p10"], 2), us_p90=round(t["us_p90"], 2),
                    note="the layer's two reduce launches, every flag already set, no waiting; " + note)
            if int(group.ctrl[:, 0].ne(0).sum()):
                rep.error(f"{base}/reduce_pair", AssertionError("a reduce launch aborted (flags were not set)"))

            def push_pair(i):
                Li = layers[i]
                bufs.epoch.add_(1)
                partial_gemv_push(bufs, Li._attn[:, :rows].reshape(n, rows, -1), Li.wo)
                bufs.epoch.add_(1)
                partial_gemv_push(bufs, Li._act[:, :rows], Li.w_down)

            t = timer(push_pair, copies)
            group.sync_epoch()
            rep.add(model=model, world=n, rows=rows, ctx=ctx, variant="push_pair", overlap=False, **stats(t, copies),
                    note="the layer's two push GEMV launches + their epoch bumps, weights rotated; " + note)
        except Exception as e:                                              # noqa: BLE001
            rep.error(f"{base}/breakdown", e)
    del layers, group
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


# ------------------------------------------------------------------------------------------ driver
def summary(doc: dict) -> list[dict]:
    """overlap vs serial per (model, world, rows), and the TP-1 time alongside."""
    t = {(e["model"], e["world"], e["rows"], e["variant"]): e.get("us_per_layer") for e in doc["results"]}
    rows = []
    for (model, world, r, var), us in t.items():
        if var != "tp_layer_serial":
            continue
        ov = t.get((model, world, r, "tp_layer_overlap"))
        rows.append({"model": model, "world": world, "rows": r, "serial_us": us, "overlap_us": ov,
                     "saved_us": None if ov is None else round(us - ov, 2),
                     "reduce_pair_us": t.get((model, world, r, "reduce_pair")),
                     "tp1_fused_us": t.get((model, 1, r, "tp1_fused_layer"))})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--budget-s", type=float, default=85.0, help="stop starting new cases after this")
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--worlds", default=",".join(map(str, WORLDS)))
    ap.add_argument("--rows", default=",".join(map(str, ROWS)))
    ap.add_argument("--ctx", type=int, default=CTX)
    ap.add_argument("--no-breakdown", action="store_true", help="skip the reduce-pair / push-pair timings")
    ap.add_argument("--smoke", action="store_true", help="CPU interpreter, tiny config, one eager pass per case")
    a = ap.parse_args()
    if a.smoke:
        os.environ.setdefault("TRITON_INTERPRET", "1")
    import torch

    from lowlat.bench import _Recorder, random_weights_on_device
    from lowlat.benchmarking import Budget, exit_on_sigterm, rotation_copies, versions
    from lowlat.config import preset
    from lowlat.errors import UnsupportedConfigError

    exit_on_sigterm()
    worlds = [int(w) for w in a.worlds.split(",")]
    rows_list = [int(r) for r in a.rows.split(",")]
    if a.smoke:
        from lowlat.testing import tiny_config

        device, ctx, timer = torch.device("cpu"), 8, Timer(True, 1)
        rows_list = [r for r in rows_list if r <= 2] or [1]
        # H 256 (two column tiles), 4 query / 2 KV heads: worlds 1 and 2 run, 3 and 4 are skipped
        models = {"tiny": tiny_config(hidden_size=256, num_heads=4, num_kv_heads=2, head_dim=32,
                                      intermediate_size=96, num_layers=1)}
    else:
        if not torch.cuda.is_available():
            sys.exit("needs a CUDA GPU (or --smoke)")
        device, ctx, timer = torch.device("cuda", torch.cuda.current_device()), a.ctx, Timer(False, REPLAYS)
        models = {m: preset(m) for m in a.models.split(",")}
    meta = {**versions(), "ctx": ctx, "rows": rows_list, "worlds": worlds, "replays": timer.replays,
            "max_layer_copies": MAX_COPIES, "smoke": a.smoke,
            "method": "CUDA graph of one launch per layer copy (weights rotated past L2), median replay / copies",
            "emulated_ranks_note": "world N >= 2: all N ranks run on ONE GPU (N ranks' work serialized), "
                                   "not a multi-GPU latency"}
    rep, budget = _Recorder(str(a.out) if a.out else None, meta), Budget(a.budget_s)
    try:
        for model, cfg0 in models.items():
            copies = 2 if a.smoke else min(MAX_COPIES, rotation_copies(layer_weight_bytes(cfg0)))
            cfg = cfg0.replace(num_layers=copies)
            try:
                weights = random_weights_on_device(cfg, device, seed=1)
            except Exception as e:                                          # noqa: BLE001
                rep.error(f"{model}/weights", e)
                continue
            for world in worlds:
                if not has_time(rep, budget, f"{model}/world={world}"):
                    continue
                try:
                    if world == 1:
                        bench_tp1(cfg, model, weights, copies, rows_list, ctx, device, timer, rep, budget)
                    else:
                        bench_tp(cfg, model, weights, copies, world, rows_list, ctx, device, timer, rep,
                                 budget, breakdown=not a.no_breakdown)
                except UnsupportedConfigError as e:                         # the model does not shard N ways
                    rep.skip(f"{model}/world={world}", str(e))
                except Exception as e:                                      # noqa: BLE001
                    rep.error(f"{model}/world={world}", e)
            del weights
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
    finally:
        rep.doc["summary"] = summary(rep.doc)
        rep.save()
        print(json.dumps({"summary": rep.doc["summary"], "skipped": rep.doc["skipped"],
                          "errors": rep.doc["errors"]}, indent=1))
    if a.smoke:
        assert not rep.doc["errors"], rep.doc["errors"]
        assert any(e["variant"] == "tp_layer_serial" for e in rep.doc["results"]), rep.doc["results"]
        print("smoke ok")


if __name__ == "__main__":
    main()
