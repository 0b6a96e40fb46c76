"""Session-10 exploration (issue 3): why SmolLM2-135M's output projection costs the fused step 7.9 us per layer at
6 rows but 2.2 us at 1 row (session10/call6 `lowlat bench --sections profile`; self-chained it takes 2.1 us at
both). The step graph is profiled launch by launch (CUPTI, `benchmarking.kernel_trace`) for launch variants of
the attention -> out_proj -> gate_up hand-offs; per role: the median cost in the step (end - previous end), the
median start relative to the previous launch's end (negative: resident early under PDL) and the duration.

    python bench/explore/explore21.py --out $OUT/explore21.json [--rows 1 6] [--models SmolLM2-135M]
"""
from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402

from lowlat import bench as lb  # noqa: E402
from lowlat.benchmarking import kernel_trace, replay_time_us  # noqa: E402


def variant_patches(name: str, fm, fused_model_mod, attn_mod):
    """Apply launch variant `name` to FusedModel fm (before its first step); returns an undo callable."""
    from lowlat.kernels._gemv import default_plan

    undo = []
    if name == "attn_nopdl":
        orig = attn_mod.decode_attention

        def no_pdl(*a, **k):
            k["use_pdl"] = False
            return orig(*a, **k)
        attn_mod.decode_attention = no_pdl
        undo.append(lambda: setattr(attn_mod, "decode_attention", orig))
    elif name in ("oproj_nopdl", "down_nopdl"):
        orig = fused_model_mod.residual_gemv
        which = {id(L.wo) for L in fm.layers} if name == "oproj_nopdl" else {id(L.w_down) for L in fm.layers}

        def maybe(x, w, *a, **k):
            if id(w) in which:
                k["use_pdl"] = False
            return orig(x, w, *a, **k)
        fused_model_mod.residual_gemv = maybe
        undo.append(lambda: setattr(fused_model_mod, "residual_gemv", orig))
    elif name == "oproj_pf0":
        fm.plan_o = dataclasses.replace(fm.plan_o, pf_k=0)
    elif name == "oproj_default_plan":
        fm.plan_o = default_plan(fm.plan_o.n, fm.plan_o.k)
    elif name != "default":
        raise ValueError(name)
    return lambda: [u() for u in undo]


VARIANTS = ("default", "attn_nopdl", "oproj_nopdl", "oproj_pf0", "oproj_default_plan", "down_nopdl")


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=None)
    p.add_argument("--rows", type=int, nargs="+", default=[1, 6])
    p.add_argument("--models", nargs="+", default=["SmolLM2-135M"])
    p.add_argument("--ctx", type=int, default=512)
    p.add_argument("--variants", nargs="+", default=list(VARIANTS))
    a = p.parse_args()
    import lowlat.kernels.decode_attention as attn_mod
    import lowlat.runtime.fused_model as fused_model_mod
    from lowlat.config import preset

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _common import Recorder

    rec = Recorder(a.out)
    dev = torch.device("cuda")
    for model in a.models:
        cfg = preset(model)
        w = lb.random_weights_on_device(cfg, dev)
        kv = lb.random_kv(cfg, cfg.num_layers, max(a.rows), a.ctx, dev)
        for var in a.variants:
            fm = fused_model_mod.FusedModel(cfg, w, device=dev, widths=tuple(sorted(a.rows)), validate=False)
            undo = variant_patches(var, fm, fused_model_mod, attn_mod)
            try:
                for rows in a.rows:
                    case = lb._DecodeCase(cfg, rows, a.ctx, dev, kv)
                    fm.forward(case.step, kv)
                    g = fm._graphs[rows]
                    us = replay_time_us(g, iters=20, warmup=3)
                    trace = kernel_trace(g.replay, iters=8)
                    n = len(trace) // 8
                    roles = lb.launch_roles([k[0] for k in trace[:n]])
                    per: dict[str, dict[str, list]] = {}
                    for r in range(8):
                        ch = trace[r * n:(r + 1) * n]
                        for i in range(1, n):
                            d = per.setdefault(roles[i], {"cost": [], "start": [], "dur": []})
                            d["cost"].append(ch[i][2] - ch[i - 1][2])
                            d["start"].append(ch[i][1] - ch[i - 1][2])
                            d["dur"].append(ch[i][2] - ch[i][1])
                    rec(dict(model=model, rows=rows, variant=var, step_us=round(us, 2),
                             roles={k: {f: round(statistics.median(v[f]), 2) for f in v} for k, v in per.items()}))
                    print(model, rows, var, round(us, 1), {k: round(statistics.median(v["cost"]), 2)
                                                          for k, v in per.items()}, flush=True)
            except Exception as exc:                                           # noqa: BLE001
                torch.cuda.synchronize()
                rec.error(f"{model}/{var}", exc)
            finally:
                undo()
            del fm
            torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
