"""Session-13 measurement (issue 3): the fused decode step with the PRODUCTION kernels (no instrumentation) and the
decode attention's PDL trigger where `--attn-trigger` says: "after_kv" (lowlat's default since session 13) or
"start" (right after its wait, lowlat until session 12).

Session 13's sm_placement run (bench/results/session13/call1) showed what the early trigger does: out_proj's 36
programs, made resident while the attention grid still held the GPU, landed on 23 SMs at 6 rows (widths 1,6) and on
6-9 SMs at 12-48 rows (a server's widths 1..48), against 36 SMs with the trigger after the KV loop or none. This
times the same steps as `lowlat bench --sections step` does (random weights, ctx 512, a FusedModel of the widths
in --order, captured in that order, `replay_time_us` of 20 replays after 3 warm-up), and each launch role's cost in
the step (end minus the previous launch's end, median over layers and 10 replays: `lowlat.bench.launch_costs`).

    python bench/explore/explore26.py --model SmolLM2-135M --order 1,6 --attn-trigger after_kv [--layers N] [--out F]

--layers N: the preset cut to its first N layers (Qwen3-30B-A3B: the whole model would be ~60 GB of random weights).
--pre-kv auto|on|off (session 14): FusedModel passes the step's out_cache_loc to the decode attention, which then
loads each program's first KV block before the PDL wait where its grid fits on the GPU at once (auto, lowlat's
default since session 14), at every width (on: pre_kv=True), or never (off: every load after the wait, as until
session 13). --chunk N: the attention's COMBINE_CHUNK (splits the combining program folds per round trip; 1 = one
split at a time, as until session 13). Neither moves the arithmetic (the fold
adds one split at a time whatever the chunk; call 1-3's intermediate summed a chunk with tl.sum, a different order).
--prologue-pdl off (session 15): the attention prologue launched WITHOUT PDL, so its programs start only once the
previous down projection has finished (with PDL they start as down releases them and load their first weights
while down still streams). Tells how much of down's in-step cost is the next prologue's early loads.
--prologue-maxnreg N (session 17): the prologue's launches capped at N registers a thread (more of its programs fit
beside the previous launch's).
--attn-target N [--attn-min-groups F] (session 18): the decode attention's split groups by the rule calls 1-3 timed
(programs per (row, KV head) halved from num_splits while the grid exceeds N programs, not below F, default 1) in
place of `default_split_groups`; 1000000 keeps one program per split at every width (as until session 17). Moves no
arithmetic: the logits checksum is the same for every N.
--kv-stages S (session 19): the decode attention's KV loop pipeline depth (KV_STAGES and GROUPED_KV_STAGES: every
launch without the early first block); moves no arithmetic.
--defer N|on|off (session 20), --defer-down N|on|off (session 21): FusedModel's defer / defer_down (the split-K
reduction of out_proj / down left to the next launch up to N rows; on = 16, off = 0); move no arithmetic.
--fold N|on|off (session 22): FusedModel's fold (the decode attention's split combine left to the output projection up
to N rows; on = 16, off = 0); moves no arithmetic.
--early-release NAMES|off|auto (session 23): FusedModel's early_release (comma-separated among out_proj, down: those release
the next launch at their start; auto, the default since session 24: those over 8 MB of weights); moves no arithmetic.
--held-prologue auto|on|off (session 25): FusedModel's held_prologue (the attention prologue with its weights held in
registers across the wait, `kernels/attn_prologue_held.py`; auto, the default: where the model allows it); it has its
own bits, so the logits checksum differs between on and off (each is row invariant).
--held-fold build|registers (session 26): fused_model.HELD_FOLD (the held prologue's norm weight multiplied into the
weights at build or in the kernel's registers; the same bits).
--held-maxnreg N (session 28): the held prologue launched with maxnreg=N (168 on folded weights: three programs an SM,
no spills at 1-8 rows); moves no arithmetic.
--cluster-prologue (session 40): FusedModel(cluster_prologue=True), QK-norm models' `attn_prologue_cluster` (its own
bits).
--moe-out-proj auto|held|split_k|norm_epilogue (session 26): FusedModel's moe_out_proj (MoE layers' output
projection: the held residual GEMV, the split-K one, both with the RMSNorm in the MoE's router launch, or the
RMSNorm epilogue in out_proj as before); each has its own bits.
--plan-d JSON: fields of FusedModel's down-projection plan replaced, as `dataclasses.replace` (no plan check; its
`by_row_blocks` cleared unless the JSON names it, so the given fields hold at every width), for
the experiment on down's packing at 24-48 rows (NOTES "Left"; session13f.sh, call6). warps / stages / preload / pf_k move
no arithmetic (`_gemv.GemvPlan`); split does and bn may, so compare logits only for the former.

Prints a summary (`summary`): per width the step time (us) and role costs (us, median; out_proj sum: its total per
step), and a logits checksum of the last width (the trigger moves no arithmetic: equal across triggers); --out
writes the whole record as JSON. (Until the session-13 review it printed that JSON line and each device script
summarised it with its own inline Python; the calls' printed output is in bench/results/session13/.)
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="SmolLM2-135M")
    p.add_argument("--order", default="1,6")
    p.add_argument("--attn-trigger", default="after_kv", choices=["after_kv", "start"])
    p.add_argument("--ctx", type=int, default=512)
    p.add_argument("--layers", type=int, default=None, help="the preset with this many layers (default: all)")
    p.add_argument("--plan-d", default=None, help="JSON fields replaced in FusedModel's down-projection plan")
    p.add_argument("--pre-kv", default="auto", choices=["auto", "on", "off"])
    p.add_argument("--chunk", type=int, default=None, help="decode attention's COMBINE_CHUNK (power of two)")
    p.add_argument("--prologue-pdl", default="on", choices=["on", "off"])
    p.add_argument("--prologue-maxnreg", type=int, default=0, help="register cap of the prologue's launches (0: none)")
    p.add_argument("--attn-target", type=int, default=None, help="split groups: halve while the grid exceeds N")
    p.add_argument("--attn-min-groups", type=int, default=1, help="with --attn-target: at least this many groups")
    p.add_argument("--kv-stages", type=int, default=None,
                   help="decode attention's KV-loop pipeline depth for every launch without the early first block "
                        "(KV_STAGES and GROUPED_KV_STAGES; session 19; default: the kernel's rule)")
    p.add_argument("--defer", default=None,
                   help="FusedModel(defer=N): out_proj's split-K reduction in the gate/up launch up to N rows; on = 16, "
                        "off = 0 (session 20; default: FusedModel's)")
    p.add_argument("--defer-down", default=None,
                   help="FusedModel(defer_down=N): the down projection's split-K reduction in the next layer's "
                        "prologue up to N rows; on = 16, off = 0 (session 21; default: FusedModel's)")
    p.add_argument("--fold", default=None,
                   help="FusedModel(fold=N): the decode attention's split combine in the output projection up to N "
                        "rows; on = 16, off = 0 (session 22; default: FusedModel's)")
    p.add_argument("--early-release", default=None,
                   help="FusedModel(early_release=...): comma-separated among out_proj, down (those release the next "
                        "launch at their start), off, or auto (session 23; default: FusedModel's, auto since "
                        "session 24)")
    p.add_argument("--held-prologue", default=None, choices=["auto", "on", "off"])
    p.add_argument("--moe-out-proj", default=None, choices=["auto", "held", "split_k", "norm_epilogue"])
    p.add_argument("--held-fold", default=None, choices=["build", "registers"])
    p.add_argument("--cluster-prologue", action="store_true",
                   help="FusedModel(cluster_prologue=True): QK-norm models' attn_prologue_cluster (session 40)")
    p.add_argument("--held-maxnreg", type=int, default=0, help="register cap of the held prologue's launches (0: none)")
    p.add_argument("--out", default=None)
    a = p.parse_args()

    import torch

    from lowlat.bench import _DecodeCase, launch_costs, random_kv, random_weights_on_device
    from lowlat.benchmarking import kernel_trace, replay_time_us
    from lowlat.config import preset
    from lowlat.kernels import decode_attention as da
    from lowlat.runtime.fused_model import FusedModel

    da.decode_attention.__kwdefaults__["pdl_trigger"] = a.attn_trigger     # FusedModel passes none
    if a.chunk:
        da.COMBINE_CHUNK = a.chunk
    if a.kv_stages:                     # every launch without the early first block (call 2's meaning)
        da.KV_STAGES = da.GROUPED_KV_STAGES = a.kv_stages
    if a.attn_target:
        def target_rule(rows, num_kv_heads, num_splits=da.MAX_SPLITS, *, head_dim):
            g = num_splits
            while g > min(a.attn_min_groups, num_splits) and g * num_kv_heads * rows > a.attn_target:
                g //= 2
            return g
        da.default_split_groups = target_rule
    if a.pre_kv != "auto":                  # FusedModel imports decode_attention from the module at each _run
        plain, force = da.decode_attention, a.pre_kv == "on"

        def forced(*args, out_cache_loc=None, **kw):
            return plain(*args, out_cache_loc=out_cache_loc if force else None, pre_kv=force or None, **kw)
        da.decode_attention = forced
    if a.prologue_pdl == "off":         # FusedModel imports attn_prologue from the module at each _run
        from lowlat.kernels import attn_prologue as ap
        plain_pro = ap.attn_prologue

        def no_pdl(*args, use_pdl=False, **kw):
            return plain_pro(*args, use_pdl=False, **kw)
        ap.attn_prologue = no_pdl
    if a.prologue_maxnreg:              # session 17: the attention prologue launched with maxnreg
        from lowlat.kernels import attn_prologue as ap
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from explore27 import capped
        ap._attn_prologue_kernel = capped(ap._attn_prologue_kernel, a.prologue_maxnreg)
    if a.held_maxnreg:                  # session 28: the held prologue with three programs an SM
        from lowlat.kernels import attn_prologue_held as aph
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from explore27 import capped
        aph._held_prologue_kernel = capped(aph._held_prologue_kernel, a.held_maxnreg)
    dev = torch.device("cuda")
    order = [int(x) for x in a.order.split(",")]
    cfg = preset(a.model)
    if a.layers:
        cfg = cfg.replace(num_layers=a.layers)
    w = random_weights_on_device(cfg, dev)
    kv = random_kv(cfg, cfg.num_layers, max(order), a.ctx, dev)
    defer = {name: int({"on": 16, "off": 0}.get(v, v))
             for name, v in (("defer", a.defer), ("defer_down", a.defer_down), ("fold", a.fold)) if v is not None}
    if a.early_release is not None:
        defer["early_release"] = {"off": (), "auto": "auto"}.get(a.early_release, tuple(a.early_release.split(",")))
    if a.held_prologue is not None:
        defer["held_prologue"] = {"auto": "auto", "on": True, "off": False}[a.held_prologue]
    if a.moe_out_proj is not None:
        defer["moe_out_proj"] = a.moe_out_proj
    if a.cluster_prologue:
        defer["cluster_prologue"] = True
    if a.held_fold is not None:                 # read by FusedModel at build
        import lowlat.runtime.fused_model as fmod
        fmod.HELD_FOLD = a.held_fold
    fm = FusedModel(cfg, w, device=dev, widths=tuple(sorted(set(order))), validate=False, **defer)
    if a.plan_d:                     # GemvPlan fields that move no arithmetic (warps, stages) keep the logits
        fm.plan_down = dataclasses.replace(fm.plan_down, **{"by_row_blocks": (), **json.loads(a.plan_d)})
    out = dict(model=a.model, layers=cfg.num_layers, order=order, attn_trigger=a.attn_trigger, ctx=a.ctx,
               pre_kv=a.pre_kv, chunk=da.COMBINE_CHUNK,
               attn_target=a.attn_target, attn_min_groups=a.attn_min_groups, prologue_pdl=a.prologue_pdl,
               prologue_maxnreg=a.prologue_maxnreg, held_maxnreg=a.held_maxnreg, kv_stages=a.kv_stages or "default",
               defer=fm.defer,
               defer_down=fm.defer_down, fold=fm.fold, early_release=fm.early_release, plan_down=str(fm.plan_down),
               held_prologue=fm.held_prologue, moe_out_proj=fm.moe_out_proj, held_folded=fm._held_folded,
               cluster_prologue=fm.cluster_prologue, widths={})
    for rows in order:
        fm.forward(_DecodeCase(cfg, rows, a.ctx, dev, kv).step, kv)
        g = fm._graphs[rows]
        us = replay_time_us(g, iters=20, warmup=3)
        costs = launch_costs(kernel_trace(g.replay, iters=10), 10)
        roles = {r: round(statistics.median(c), 2) for r, c in costs.items()}
        roles["out_proj_sum"] = round(sum(costs["out_proj"]) / 10, 1)
        out["widths"][rows] = dict(step_us=round(us, 1), roles=roles)
    logits = fm.forward(_DecodeCase(cfg, order[-1], a.ctx, dev, kv).step, kv).double()
    out["logits_check"] = [logits.sum().item(), logits.abs().sum().item(), logits.argmax(-1).tolist()[:8]]
    print(summary(out))
    if a.out:
        Path(a.out).write_text(json.dumps(out, indent=1))


def summary(out: dict) -> str:
    """The run as the device scripts print it: a header (model, layers, trigger, down plan, logits checksum),
    then per width the step time and each launch role's cost (us)."""
    lines = [f"{out['model']} {out['layers']} layers {out['attn_trigger']} pre_kv {out.get('pre_kv', 'off')} "
             f"chunk {out.get('chunk', 1)} attn_target {out.get('attn_target', '-')} "
             f"min {out.get('attn_min_groups', '-')} kv_stages {out.get('kv_stages', 'default')} "
             f"prologue_pdl {out.get('prologue_pdl', 'on')} defer {out.get('defer', 'off')} defer_down "
             f"{out.get('defer_down', 'off')} fold {out.get('fold', 0)} early_release={','.join(out.get('early_release', ())) or 'off'} "
             f"held_prologue {out.get('held_prologue', False)} held_folded {out.get('held_folded')} "
             f"moe_out_proj {out.get('moe_out_proj')} "
             f"down "
             f"{out['plan_down'].replace('GemvPlan', '')} logits {[round(x, 3) for x in out['logits_check'][:2]]}"]
    for w, v in out["widths"].items():
        r = v["roles"]
        roles = " ".join(f"{k} {x:.2f}" for k, x in r.items() if k != "out_proj_sum" and not k.startswith("other"))
        lines.append(f"  r{w:<3} step {v['step_us']:7.1f} us | out_proj sum {r['out_proj_sum']} | {roles}")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
