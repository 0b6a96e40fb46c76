"""`lowlat bench`: time the fused kernels and the whole fused decode step against plain PyTorch.

    lowlat bench --out bench/results/fused_step_h200.json            (or python -m lowlat.bench ...)
        [--models SmolLM2-135M,Llama-3.2-1B] [--rows 1,6,8,16,48] [--ctx 512]
        [--sections tune,copy,kernels,step,compiled,moe,profile] [--budget-s 600] [--tune-budget-s 120]
        [--plans-out plans.json] [--tune-shapes residual:576x1536,...] [--tune-wide-rows 24,48]

What is timed (CUDA events around CUDA-graph replays, median of many, after warm-up):
  tune      (first, when asked) every candidate tile plan of each GEMV shape of the models' fused
            step (`lowlat.kernels._gemv.candidate_plans`), checked against the reference at 48 rows
            and for row invariance, timed at rows 1 and 6 as the step runs it; the fastest correct
            plan per shape, with the weight stream (preload / stages / pf_k; and bn for the residual
            kind, which it does not sum by) re-chosen at the row-block counts of --tune-wide-rows among
            the candidates of the same arithmetic (`by_row_blocks`),
            is written to --plans-out and used by the rest of the run (the format of
            $LOWLAT_GEMV_PLANS; `_gemv.TUNED_PLANS` records the committed choice).
  kernels   out_proj (x + attn Wo^T, as the fused step's dense layers run it; fused_held: the weights
            held in registers, with the sums of squares, as MoE layers run it on sm_90 by default
            (moe_out_proj "auto" -> "held"); fused_write_h: with the RMSNorm epilogue writing h, as MoE
            layers run it elsewhere or with moe_out_proj "norm_epilogue"), mlp (gate/up with the FFN norm
            computed in-kernel + SiLU*mul, then down + residual; also each launch alone: gate_up,
            down) and lm_head (final norm + LM head + argmax), each with PDL on, against its
            reference (lowlat.reference) under a CUDA graph. One graph replays many launches
            rotating over enough weight copies (>= 192 MB) that every launch reads its weights from
            HBM, not L2; the time is per launch.
  step      the whole decode step (embedding .. logits): FusedModel's captured graph, against a
            plain-PyTorch step built from the reference pieces (attention made capturable by masking
            a fixed C = ctx + 1 columns) under a CUDA graph. Each row is one request with `ctx`
            cached tokens (decode).
  compiled  the same plain-PyTorch kernels / step under torch.compile (inductor, dynamic shapes,
            compiled once per model) inside a CUDA graph.
  profile   where the fused step's time goes, launch by launch: the step's CUDA graph replayed under
            torch.profiler (CUPTI device timestamps, `benchmarking.kernel_trace`); each launch's cost IN
            THE STEP is its end minus the previous launch's end (under PDL a launch's weight prefetch and
            start overlap its predecessor, so this, not its duration, is what it adds); per role
            (attn_prologue, decode_attention, out_proj, gate_up, down, lm_head, moe_*) the median over
            layers and replays, its weight bytes and pct_of_copy = bytes / (cost x copy bandwidth). With
            `step` it profiles those graphs; with `moe` the Qwen3 layer's step too (its 622 MB LM head
            evicts the L2 between replays). Compare with `kernels`' self-chained per-launch times.
  moe       one Qwen3-30B-A3B layer (attention + MoE, lowlat.kernels.moe) through FusedModel, against the
            same layer in plain PyTorch under a CUDA graph (and, with `compiled` among the sections,
            under torch.compile + a CUDA graph); MoE there in the gathered-weights form (each row's
            top-k experts' weights indexed by expert id), the usual torch-native decode MoE.
HBM floor = bytes that must move (weights touched + KV read/written + activations in/out) / the
copy bandwidth measured in the same run (device-to-device copy, bytes read + written). Reported per
entry: us, GB/s (bytes / time), floor_us, frac_of_floor = floor_us / us.

Random weights of each model's shape (timing does not depend on their values). The JSON (device,
torch / triton versions, date, command) is rewritten after every entry, so a run cut short keeps what
it measured. Needs a CUDA GPU (Hopper for PDL).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import math
import os
import sys
import traceback
from types import SimpleNamespace
from typing import Any

from lowlat.benchmarking import Budget, copy_bandwidth, graph_time_us, replay_time_us, rotation_copies

DEFAULT_MODELS = ("SmolLM2-135M", "Llama-3.2-1B")
DEFAULT_ROWS = (1, 6, 8, 16, 48)
SECTIONS = ("tune", "copy", "kernels", "step", "compiled", "moe", "profile")
ROTATE_BYTES = 192 << 20          # weight bytes one timing graph cycles through (> 3x the H200's L2)
MIN_LAUNCHES = 8


class _Recorder:
    """The JSON document, rewritten atomically after every entry."""

    def __init__(self, path: str | None, meta: dict) -> None:
        self.path = path
        self.doc: dict[str, Any] = dict(meta, results=[], errors=[], skipped=[])

    def add(self, **entry) -> None:
        us, floor = entry.get("us"), entry.get("floor_us")
        if us and entry.get("bytes"):
            entry["GBps"] = round(entry["bytes"] / (us * 1e-6) / 1e9, 1)
        if us and floor:
            entry["frac_of_floor"] = round(floor / us, 3)
        for k in ("us", "floor_us"):
            if entry.get(k) is not None:
                entry[k] = round(entry[k], 2)
        self.doc["results"].append(entry)
        print("  " + " ".join(f"{k}={v}" for k, v in entry.items()), flush=True)
        self.save()

    def error(self, where: str, exc: BaseException) -> None:
        tb = traceback.format_exc(limit=6)
        self.doc["errors"].append({"where": where, "error": f"{type(exc).__name__}: {exc}"[:2000], "trace": tb[-3000:]})
        print(f"  ERROR in {where}: {type(exc).__name__}: {exc}", flush=True)
        self.save()

    def skip(self, where: str, why: str) -> None:
        self.doc["skipped"].append({"where": where, "why": why})
        print(f"  skipped {where}: {why}", flush=True)
        self.save()

    def save(self) -> None:
        if not self.path:
            return
        tmp = self.path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(self.doc, f, indent=1)
        os.replace(tmp, self.path)


# ------------------------------------------------------------------------------------------ timing
# ------------------------------------------------------------------------------------------ weights
def random_weights_on_device(cfg, device, *, seed: int = 0):
    """Random weights of cfg's shape generated on the device (std 1/sqrt(fan_in), norms ~1)."""
    import torch

    from lowlat.weights import LayerWeights, ModelWeights

    g = torch.Generator(device=device).manual_seed(seed)
    bf = torch.bfloat16

    def lin(o, i, *lead):
        return (torch.randn(*lead, o, i, generator=g, device=device) / i ** 0.5).to(bf)

    def norm(n):
        return (1.0 + 0.1 * torch.randn(n, generator=g, device=device)).to(bf)

    h, d = cfg.hidden_size, cfg.head_dim
    layers = []
    for _ in range(cfg.num_layers):
        lw = LayerWeights(attn_norm=norm(h), wq=lin(cfg.q_size, h), wk=lin(cfg.kv_size, h), wv=lin(cfg.kv_size, h),
                          wo=lin(h, cfg.q_size), mlp_norm=norm(h))
        if cfg.qkv_bias:
            lw.bq, lw.bk, lw.bv = ((0.1 * torch.randn(n, generator=g, device=device)).to(bf)
                                   for n in (cfg.q_size, cfg.kv_size, cfg.kv_size))
        if cfg.qk_norm:
            lw.q_norm, lw.k_norm = norm(d), norm(d)
        if cfg.is_moe:
            e, ie = cfg.num_experts, cfg.moe_intermediate_size
            lw.router = lin(e, h)
            lw.expert_gate, lw.expert_up, lw.expert_down = lin(ie, h, e), lin(ie, h, e), lin(h, ie, e)
            if cfg.shared_expert_intermediate_size:
                si = cfg.shared_expert_intermediate_size
                lw.shared_gate, lw.shared_up, lw.shared_down = lin(si, h), lin(si, h), lin(h, si)
        else:
            i = cfg.intermediate_size
            lw.w_gate, lw.w_up, lw.w_down = lin(i, h), lin(i, h), lin(h, i)
        layers.append(lw)
    embed = torch.randn(cfg.vocab_size, h, generator=g, device=device).to(bf)
    lm = embed if cfg.tie_word_embeddings else lin(cfg.vocab_size, h)
    return ModelWeights(embed=embed, layers=layers, final_norm=norm(h), lm_head=lm)


def _nbytes(*ts) -> int:
    return sum(t.numel() * t.element_size() for t in ts if t is not None)


def _copies(nbytes: int) -> int:
    return rotation_copies(nbytes, target_bytes=ROTATE_BYTES, min_copies=1, max_copies=256)


# ------------------------------------------------------------------------------------------ kernels
def bench_kernels(cfg, model: str, rows_list, device, bw, rec: _Recorder, budget: Budget, *,
                  variants=("fused", "fused_write_h", "reference_graph")) -> None:
    """out_proj, mlp, lm_head, each in the given variants: fused (as the fused step runs it: out_proj
    is the residual GEMV x + attn Wo^T; the MLP computes the FFN norm's rstd in its gate/up launch),
    fused_write_h (out_proj with the RMSNorm epilogue writing h, as MoE layers run it where the held GEMV does not),
    reference_graph, reference_compile_graph. With "fused", the MLP's two launches are also timed
    alone (ops gate_up, down) to check each GEMV against the bandwidth target, and where out_proj's plan splits K, at
    up to 16 rows, out_proj as the fused step runs it there: "fused_deferred" (its split partials only, the
    reduction left to gate/up: `out_proj.residual_gemv_deferred`), with gate/up as it then runs (op gate_up,
    "fused_deferred": the reduction's pre-pass over the partials first, `mlp.gate_up_act` given the DeferredX).
    The ops out_proj and down release the next launch as the fused step's dense layers do by default
    (`runtime.fused_model.early_release_launches(cfg)`: at their start where their weights exceed 8 MB,
    `out_proj.residual_gemv`'s early_release); the mlp op's down launch (`mlp`) always releases after its wait.
    With "fused", where `residual_gemv_held.held_residual_supported` takes out_proj's shape, also "fused_held" (the
    weights held in registers across the PDL wait: how MoE layers run out_proj on sm_90 by default
    (`FusedModel(moe_out_proj="auto")` -> "held"), with its partial sums of squares for the router's norm;
    informative for dense models, whose step runs "fused", and there without the sums)."""
    import torch

    from lowlat.kernels._gemv import GemvWorkspace, plan_gemv
    from lowlat.kernels.lm_head import lm_head
    from lowlat.kernels.mlp import gate_up_act, mlp
    from lowlat.kernels.out_proj import DeferredX, out_proj, residual_gemv, residual_gemv_deferred
    from lowlat.kernels.residual_gemv_held import held_residual_supported, residual_gemv_held
    from lowlat.reference import lm_head as ref_lm
    from lowlat.reference import out_proj as ref_op
    from lowlat.reference.mlp import swiglu_mlp
    from lowlat.runtime.fused_model import early_release_launches

    early_o, early_d = (name in early_release_launches(cfg) for name in ("out_proj", "down"))

    bf = torch.bfloat16
    h, q, i, v, eps = cfg.hidden_size, cfg.q_size, cfg.intermediate_size, cfg.vocab_size, cfg.rms_eps
    g = torch.Generator(device=device).manual_seed(1)

    def rnd(*shape, scale=1.0):
        return (scale * torch.randn(*shape, generator=g, device=device)).to(bf)

    ws = GemvWorkspace.create(max(h, i), device)
    nw = (1 + 0.1 * torch.randn(h, generator=g, device=device)).to(bf)
    compiled = "reference_compile_graph" in variants

    def run(op: str, rows: int, variant: str, fns: dict, n_launch: int, nbytes: int) -> None:
        where = f"{model}/{op}/rows={rows}/{variant}"
        if budget.left() < 5:
            rec.skip(where, "time budget")
            return
        try:
            us = graph_time_us(fns[variant], n_launch)
            rec.add(section="kernels", model=model, op=op, rows=rows, variant=variant, us=us, bytes=nbytes,
                    floor_us=nbytes / (bw * 1e9) * 1e6, launches_per_graph=n_launch)
        except Exception as e:                                   # noqa: BLE001 - recorded, run goes on
            rec.error(where, e)

    # ---- out_proj: x + attn Wo^T (the fused step), or with rstd and h (MoE layers)
    nc = _copies(h * q * 2)
    wos = [rnd(h, q, scale=q ** -0.5) for _ in range(nc)]
    plan_o = plan_gemv(h, q, kind="out_proj")
    plan_r = plan_gemv(h, q, kind="residual")
    cop = torch.compile(ref_op.out_proj, dynamic=True) if compiled else None
    for rows in rows_list:
        attn, x = rnd(rows, q), rnd(rows, h)
        xo, hh = torch.empty_like(x), torch.empty_like(x)
        rstd = torch.empty(rows, dtype=torch.float32, device=device)
        # MoE layers' held out_proj also writes x's partial sums of squares (the router's norm statistic)
        ssq = torch.empty(rows, h // 16, dtype=torch.float32, device=device) if cfg.is_moe else None
        deferrable = plan_r.split > 1 and rows <= 16
        parts = torch.empty(plan_r.split, rows, h, dtype=torch.float32, device=device) if deferrable else None
        fns = {
            "fused": lambda k: residual_gemv(attn, wos[k % nc], x, out=xo, workspace=ws, plan=plan_r, use_pdl=True,
                                             early_release=early_o),
            # the partial products only (the fused step's out_proj at 1 row block: its reduction runs in gate/up)
            "fused_deferred": lambda k: residual_gemv_deferred(attn, wos[k % nc], x, xo, partials=parts, workspace=ws,
                                                               plan=plan_r, use_pdl=True, early_release=early_o),
            "fused_write_h": lambda k: out_proj(attn, wos[k % nc], x, nw, eps, out=xo, h_out=hh, rstd_out=rstd,
                                                workspace=ws, plan=plan_o, use_pdl=True),
            "fused_held": lambda k: residual_gemv_held(attn, wos[k % nc], x, out=xo, sum_sq_out=ssq, use_pdl=True),
            "reference_graph": lambda k: ref_op.out_proj(attn, wos[k % nc], x, nw, eps),
            "reference_compile_graph": lambda k: cop(attn, wos[k % nc], x, nw, eps),
        }
        nbytes = h * q * 2 + _nbytes(attn, x, xo)
        for var in variants:
            run("out_proj", rows, var, fns, max(nc, MIN_LAUNCHES),
                nbytes + (_nbytes(hh, rstd) if var != "fused" else 0))
        if "fused" in variants and deferrable:
            run("out_proj", rows, "fused_deferred", fns, max(nc, MIN_LAUNCHES), h * q * 2 + _nbytes(attn, parts))
        if "fused" in variants and held_residual_supported(h, q, device) is None:
            run("out_proj", rows, "fused_held", fns, max(nc, MIN_LAUNCHES),
                nbytes + (_nbytes(ssq) if ssq is not None else 0))
    del wos

    # ---- mlp: x + down(silu(gate(h)) * up(h)), h = rms_norm(x) computed in the gate/up launch
    nc = _copies(3 * h * i * 2)
    gus = [torch.cat([rnd(i, h, scale=h ** -0.5), rnd(i, h, scale=h ** -0.5)]) for _ in range(nc)]
    wds = [rnd(h, i, scale=i ** -0.5) for _ in range(nc)]
    plans = (plan_gemv(i, h, kind="gate_up"), plan_gemv(h, i, kind="residual"))

    def ref_mlp(x, hn, gu, wd):
        return x + swiglu_mlp(hn, gu[:i], gu[i:], wd)

    cmlp = torch.compile(ref_mlp, dynamic=True) if compiled else None
    for rows in rows_list:
        x = rnd(rows, h)
        rstd = torch.rsqrt(x.float().pow(2).mean(-1) + eps)
        hn = (nw * (x.float() * rstd[:, None]).to(bf))
        xo, act = torch.empty_like(x), torch.empty(rows, i, dtype=bf, device=device)
        fns = {
            "fused": lambda k: mlp(x, gus[k % nc], wds[k % nc], x, norm_weight=nw, eps=eps, out=xo, act=act,
                                   workspace=ws, plans=plans, use_pdl=True),
            "gate_up": lambda k: gate_up_act(x, gus[k % nc], norm_weight=nw, eps=eps, out=act, workspace=ws,
                                             plan=plans[0], use_pdl=True),
            "down": lambda k: residual_gemv(act, wds[k % nc], x, out=xo, workspace=ws, plan=plans[1], use_pdl=True,
                                            early_release=early_d),
            "reference_graph": lambda k: ref_mlp(x, hn, gus[k % nc], wds[k % nc]),
            "reference_compile_graph": lambda k: cmlp(x, hn, gus[k % nc], wds[k % nc]),
        }
        nbytes = 3 * h * i * 2 + _nbytes(x, xo) + 2 * _nbytes(act)
        for var in variants:
            if var in fns:
                run("mlp", rows, var, fns, max(nc, MIN_LAUNCHES), nbytes)
        if "fused" in variants:                     # each launch alone: the per-GEMV bandwidth target
            for op, nb in (("gate_up", 2 * h * i * 2 + _nbytes(x, act)), ("down", h * i * 2 + _nbytes(act, x, xo))):
                run(op, rows, "fused", {"fused": fns[op]}, max(nc, MIN_LAUNCHES), nb)
            if plan_r.split > 1 and rows <= 16:     # gate/up after a deferred out_proj: the reduction's pre-pass too
                d = DeferredX(torch.randn(plan_r.split, rows, h, generator=g, device=device), x, torch.empty_like(x))
                run("gate_up", rows, "fused_deferred",
                    {"fused_deferred": lambda k, d=d: gate_up_act(d, gus[k % nc], norm_weight=nw, eps=eps, out=act,
                                                                  workspace=ws, plan=plans[0], use_pdl=True)},
                    max(nc, MIN_LAUNCHES), 2 * h * i * 2 + _nbytes(x, act, d.partials, d.out))
    del gus, wds

    # ---- lm_head: final norm + logits (fp32) + argmax
    nc = _copies(v * h * 2)
    lms = [rnd(v, h) for _ in range(nc)]
    plan_lm = plan_gemv(v, h, kind="lm_head")
    clm = torch.compile(ref_lm.lm_head, dynamic=True) if compiled else None
    for rows in rows_list:
        x = rnd(rows, h, scale=3.0)
        nvalid = torch.tensor([rows], dtype=torch.int32, device=device)
        logits = torch.empty(rows, v, dtype=torch.float32, device=device)
        tokens = torch.empty(rows, dtype=torch.int64, device=device)
        fns = {
            "fused": lambda k: lm_head(x, nw, lms[k % nc], nvalid, eps, logits_out=logits, tokens_out=tokens,
                                       workspace=ws, plan=plan_lm, use_pdl=True),
            "reference_graph": lambda k: ref_lm.lm_head(x, nw, lms[k % nc], rows, eps),
            "reference_compile_graph": lambda k: clm(x, nw, lms[k % nc], rows, eps),
        }
        nbytes = v * h * 2 + _nbytes(x, logits, tokens)
        for var in variants:
            if var in fns:
                run("lm_head", rows, var, fns, max(nc, MIN_LAUNCHES), nbytes)
    del lms


# ------------------------------------------------------------------------------------------ tune
class _GemvCase:
    """One GEMV shape of the fused step (kind, N, K) with rotating weight copies (cold L2), inputs per
    row count, a launcher for any plan and a correctness check against the reference. Kinds: residual
    (x + a W^T), out_proj (the same plus the RMSNorm epilogue writing h and rstd, as MoE layers run it),
    gate_up, lm_head."""

    def __init__(self, kind: str, n: int, k: int, eps: float, device, *, copies: int | None = None) -> None:
        import torch

        self.kind, self.n, self.k, self.eps, self.device = kind, n, k, eps, device
        g = torch.Generator(device=device).manual_seed(11)
        self.g = g
        rows_w = 2 * n if kind == "gate_up" else n
        self.wbytes = rows_w * k * 2
        self.nc = _copies(self.wbytes) if copies is None else copies
        scale = 1.0 if kind == "lm_head" else k ** -0.5
        self.w = [(scale * torch.randn(rows_w, k, generator=g, device=device)).to(torch.bfloat16)
                  for _ in range(self.nc)]
        self.nw = (1 + 0.1 * torch.randn(k, generator=g, device=device)).to(torch.bfloat16)
        # out_proj's RMSNorm weight is over its N outputs (the next layer's norm)
        self.nw_out = (1 + 0.1 * torch.randn(n, generator=g, device=device)).to(torch.bfloat16)
        from lowlat.kernels._gemv import GemvWorkspace
        self.ws = GemvWorkspace.create(max(n, 64), device)
        self._inputs: dict[int, dict] = {}

    def inputs(self, rows: int) -> dict:
        import torch

        if rows not in self._inputs:
            bf, dev, g = torch.bfloat16, self.device, self.g
            d = dict(x=(2 * torch.randn(rows, self.k, generator=g, device=dev)).to(bf),
                     nvalid=torch.tensor([rows], dtype=torch.int32, device=dev))
            if self.kind in ("residual", "out_proj"):
                d.update(res=torch.randn(rows, self.n, generator=g, device=dev).to(bf),
                         out=torch.empty(rows, self.n, dtype=bf, device=dev))
                if self.kind == "out_proj":
                    d.update(h=torch.empty(rows, self.n, dtype=bf, device=dev),
                             rstd=torch.empty(rows, dtype=torch.float32, device=dev))
            elif self.kind == "gate_up":
                d.update(out=torch.empty(rows, self.n, dtype=bf, device=dev))
            else:
                d.update(out=torch.empty(rows, self.n, dtype=torch.float32, device=dev),
                         tokens=torch.empty(rows, dtype=torch.int64, device=dev))
            self._inputs[rows] = d
        return self._inputs[rows]

    def launch(self, plan, rows: int, idx: int):
        from lowlat.kernels.lm_head import lm_head
        from lowlat.kernels.mlp import gate_up_act
        from lowlat.kernels.out_proj import out_proj, residual_gemv

        d, w = self.inputs(rows), self.w[idx % self.nc]
        if self.kind == "residual":
            return residual_gemv(d["x"], w, d["res"], out=d["out"], workspace=self.ws, plan=plan, use_pdl=True)
        if self.kind == "out_proj":         # h is the output the MoE reads (check() reads x too)
            return out_proj(d["x"], w, d["res"], self.nw_out, self.eps, out=d["out"], h_out=d["h"],
                            rstd_out=d["rstd"], workspace=self.ws, plan=plan, use_pdl=True).h
        if self.kind == "gate_up":
            return gate_up_act(d["x"], w, norm_weight=self.nw, eps=self.eps, out=d["out"], workspace=self.ws,
                               plan=plan, use_pdl=True)
        return lm_head(d["x"], self.nw, w, d["nvalid"], self.eps, logits_out=d["out"], tokens_out=d["tokens"],
                       workspace=self.ws, plan=plan, use_pdl=True).logits

    def check(self, plan, rows: int = 48, small: int | tuple[int, ...] = (6, 20)) -> None:
        """Within the numerics policy at `rows` rows (float64 oracle, bf16 baseline), and for each count in
        `small` the first rows bitwise equal to a launch of that many rows (row invariance across row-block
        counts: by default 1 and 2 row blocks against 3, so a plan whose weight stream depends on the row-block
        count, `GemvPlan.by_row_blocks`, runs every variant). Every output is poisoned (NaN) before each launch, so an
        output a plan leaves unwritten fails even where an earlier check of this case wrote it (the tuner checks every
        candidate on one case). Raises AssertionError (`lowlat.numerics`) on a violation."""
        import torch
        import torch.nn.functional as F

        from lowlat.numerics import check_accuracy, check_bitwise, poison
        from lowlat.reference import lm_head as ref_lm
        from lowlat.reference import out_proj as ref_op
        from lowlat.reference.rms_norm import rms_norm

        d = self.inputs(rows)
        for name in ("out", "h", "rstd"):
            if name in d:
                poison(d[name])
        got = self.launch(plan, rows, 0).clone()
        w, x = self.w[0], d["x"]
        if "oracle" not in d:               # float64 oracle and bf16 baseline, once per case
            if self.kind == "out_proj":     # (x, h) of the reference out_proj
                d["oracle_x"], d["oracle"] = ref_op.out_proj(x.double(), w.double(), d["res"].double(),
                                                             self.nw_out.double(), self.eps)
                d["baseline_x"], d["baseline"] = ref_op.out_proj(x, w, d["res"], self.nw_out, self.eps)
            elif self.kind == "residual":
                d["oracle"] = d["res"].double() + x.double() @ w.double().T
                d["baseline"] = d["res"] + F.linear(x, w)
            elif self.kind == "gate_up":
                def act(xx, ww, nw):
                    hh = rms_norm(xx, nw, self.eps)
                    return F.silu(F.linear(hh, ww[: self.n])) * F.linear(hh, ww[self.n:])
                d["oracle"], d["baseline"] = act(x.double(), w.double(), self.nw.double()), act(x, w, self.nw)
            else:
                d["oracle"] = ref_lm.lm_head(x.double(), self.nw.double(), w.double(), rows, self.eps)[0]
                d["baseline"] = ref_lm.lm_head(x, self.nw, w, rows, self.eps)[0]
        op, output = {"residual": ("residual_gemv", "out"), "out_proj": ("out_proj", "h"), "gate_up": ("mlp", "act"),
                      "lm_head": ("lm_head", "logits")}[self.kind]
        check_accuracy(op, got, d["oracle"], d["baseline"], output=output)
        if self.kind == "out_proj":
            check_accuracy(op, d["out"], d["oracle_x"], d["baseline_x"], output="x")
        for m in (small,) if isinstance(small, int) else small:
            ds = self.inputs(m)
            ds["x"].copy_(x[:m])
            if self.kind in ("residual", "out_proj"):
                ds["res"].copy_(d["res"][:m])
            for name in ("out", "h", "rstd"):      # a previous candidate's outputs must not fill a gap in this one's
                if name in ds:
                    poison(ds[name])
            part = self.launch(plan, m, 0)
            check_bitwise(self.kind, part, got[:m], output=f"rows_{m}_vs_{rows}")
        if got.is_cuda:
            torch.cuda.synchronize()


def pick_tuned(timed: list[tuple], rows_list) -> tuple:
    """The tuner's choice among `timed` = [(total us, label, GemvPlan, {rows: us}), ...] at the narrow widths
    rows_list: the fastest; but where a candidate with `by_row_blocks` launches the same plans as that winner at every
    row-block count timed, that one (its width-dependent weight stream was chosen in the step, at widths rows_list
    does not cover, and the two tie here up to noise). `tune_gemv`'s wide stage then re-decides the weight stream of
    the row-block counts it times (`compose_row_block_plan`) and keeps this plan's at the others (all of them when
    the stage is off or out of time). Returns (label, plan, {rows: us})."""
    from lowlat.kernels._gemv import row_blocks

    _, label, plan, us = min(timed, key=lambda t: t[0])
    blocks = {row_blocks(r) for r in rows_list}
    for _, other_label, other, other_us in timed:
        if other.by_row_blocks and all(other.at(b) == plan.at(b) for b in blocks):
            return other_label, other, other_us
    return label, plan, us


def _width_fields(kind: str | None) -> tuple:
    """The plan fields a `by_row_blocks` override may set for a kind: ROW_BLOCK_FIELDS, and bn for the kinds of
    BN_BY_ROW_BLOCKS_KINDS (session 17: bn moves no summation there)."""
    from lowlat.kernels._gemv import BN_BY_ROW_BLOCKS_KINDS, ROW_BLOCK_FIELDS

    return ROW_BLOCK_FIELDS + (("bn",) if kind in BN_BY_ROW_BLOCKS_KINDS else ())


def _arithmetic(plan, kind: str | None = None) -> tuple:
    """The fields of a GemvPlan that decide its bits, as (field, value): all but by_row_blocks and the fields an
    override may set for `kind` (`_width_fields`: the weight stream's, and bn for the residual / qkv kinds)."""
    from dataclasses import asdict

    skip = _width_fields(kind)
    return tuple((f, v) for f, v in asdict(plan).items() if f not in skip and f != "by_row_blocks")


def compose_row_block_plan(winner, wide_timed: dict, kind: str | None = None):
    """The narrow widths' winner (a GemvPlan) with its weight stream (and, for the residual / qkv kinds, its bn)
    re-chosen per wider row-block count.

    wide_timed: {row blocks (2 or 3): [(us, GemvPlan), ...]}, each plan's time (any unit, e.g. us summed over the
    timed rows of that many row blocks) as launched at that count (`plan.at(nmb)`). For each count, among the plans
    whose arithmetic there equals the winner's (`_arithmetic(plan.at(nmb), kind) == _arithmetic(winner.at(nmb),
    kind)`; others are ignored), the fastest one's `_width_fields(kind)` (preload, stages, pf_k; and bn for the
    kinds of BN_BY_ROW_BLOCKS_KINDS, session 18) become the winner's override for that count, if it is strictly
    faster than the winner's own launch there (a tie keeps it; so does a count with no timing of the winner's own
    launch: nothing to compare with); any other field the winner overrides at that count stays. Counts not in
    wide_timed keep the winner's `by_row_blocks`. Returns a GemvPlan in normal form (overrides equal to its base
    fields dropped), equal to `winner` when nothing else won. Pure: no GPU, no timing."""
    from dataclasses import replace

    fields = {nmb: dict(f) for nmb, f in winner.by_row_blocks}
    for nmb, timed in wide_timed.items():
        base = winner.at(nmb)
        same = [(us, p.at(nmb)) for us, p in timed if _arithmetic(p.at(nmb), kind) == _arithmetic(base, kind)]
        base_us = min((us for us, p in same if p == base), default=None)
        if base_us is None:
            continue
        us, best = min(same, key=lambda t: t[0])
        if us < base_us:
            fields[nmb] = {**fields.get(nmb, {}), **{f: getattr(best, f) for f in _width_fields(kind)}}
    return replace(winner, by_row_blocks=fields)


def _tune_row_blocks(case, timed: list[tuple], winner, rec: _Recorder, budget: Budget, where: str, record,
                     rows_list, wide_rows) -> tuple:
    """The tuner's wide stage for one shape: times, at each row count of wide_rows whose row-block count rows_list
    does not cover, every candidate of `timed` (`pick_tuned`'s list) that launches the winner's arithmetic there
    (each distinct launched plan once), records each time with record(rows, label, plan, us), composes the plan
    (`compose_row_block_plan`) and checks it (`_GemvCase.check`: every row-block count runs). Returns (plan,
    {rows: {label: us}}): the composed plan, or the winner when it equals it, fails its check (`rec.error`) or the
    budget runs short (`rec.skip`; the stage's timings are then dropped). A candidate whose timing raises is recorded
    with `rec.error` and left out."""
    from lowlat.kernels._gemv import row_blocks

    narrow = {row_blocks(r) for r in rows_list}
    counts: dict[int, list[int]] = {}
    for r in wide_rows:
        if row_blocks(r) not in narrow:
            counts.setdefault(row_blocks(r), []).append(r)
    wide_timed: dict[int, list] = {}
    wide_us: dict[int, dict] = {}
    for nmb, rows in sorted(counts.items()):
        launched = []
        for _, label, cand, _ in timed:
            p = cand.at(nmb)
            if _arithmetic(p, case.kind) != _arithmetic(winner.at(nmb), case.kind) or p in launched:
                continue
            launched.append(p)
            if budget.left() < 8:
                rec.skip(f"{where}/rows={','.join(map(str, wide_rows))}", "time budget (narrow winner kept)")
                return winner, {}
            try:
                us = {r: graph_time_us(lambda i, r=r: case.launch(cand, r, i), max(case.nc, MIN_LAUNCHES), iters=11)
                      for r in rows}
            except Exception as e:                                          # noqa: BLE001 - candidate dropped
                rec.error(f"{where}/{label}/rows={','.join(map(str, rows))}", e)
                continue
            wide_timed.setdefault(nmb, []).append((sum(us.values()), cand))
            for r, t in us.items():
                wide_us.setdefault(r, {})[label] = round(t, 2)
                record(r, label, cand, t)
    plan = compose_row_block_plan(winner, wide_timed, case.kind)
    if plan == winner:
        return winner, wide_us
    if budget.left() < 8:
        rec.skip(f"{where}/by_row_blocks", "time budget (narrow winner kept)")
        return winner, wide_us
    try:
        case.check(plan)
    except Exception as e:                                                  # noqa: BLE001 - winner kept
        rec.error(f"{where}/by_row_blocks", e)
        return winner, wide_us
    return plan, wide_us


def _tune_shape(case, candidates, rec: _Recorder, budget: Budget, where: str, bw: float, info: dict, *,
                rows_list=(1, 6), wide_rows=(24, 48)) -> dict | None:
    """Tune one GEMV shape: check (`_GemvCase.check`) and time every (label, plan) of `candidates` at rows_list, pick
    (`pick_tuned`), then re-choose the weight stream at the wider row-block counts of wide_rows (`_tune_row_blocks`;
    () skips it). Every time is recorded (section "tune", info's fields: model, op, n, k; plan: the candidate's
    describe(), launched: that of the plan its launch at those rows ran, `plan.at(row blocks)`: bn, n_tiles and
    programs may depend on the width). Returns the table entry {kind, n, k, label, model, plan (describe(),
    by_row_blocks included), us and default_us at rows_list ({rows: us}), wide_us ({rows: {label: us}})}, or None
    when no candidate passed."""
    from lowlat.kernels._gemv import row_blocks

    def record(r, label, plan, t):
        nbytes = case.wbytes + _nbytes(*(case.inputs(r).get(name) for name in ("x", "out", "h")))
        rec.add(section="tune", **info, rows=r, variant=label, us=t, bytes=nbytes,
                floor_us=nbytes / (bw * 1e9) * 1e6, plan=plan.describe(), launched=plan.at(row_blocks(r)).describe())

    timed = []
    for label, plan in candidates:
        if budget.left() < 8:
            rec.skip(f"{where}/{label}", "time budget")
            break
        try:
            case.check(plan)
            us = {r: graph_time_us(lambda i, r=r: case.launch(plan, r, i), max(case.nc, MIN_LAUNCHES), iters=11)
                  for r in rows_list}
        except Exception as e:                                              # noqa: BLE001 - candidate dropped
            rec.error(f"{where}/{label}", e)
            continue
        timed.append((sum(us.values()), label, plan, us))
        for r, t in us.items():
            record(r, label, plan, t)
    if not timed:
        return None
    label, winner, us = pick_tuned(timed, rows_list)
    plan, wide_us = _tune_row_blocks(case, timed, winner, rec, budget, where, record, rows_list, wide_rows)
    if plan != winner:
        label += "+by_row_blocks"
    entry = dict(kind=info["op"], n=info["n"], k=info["k"], label=label, model=info["model"], plan=plan.describe(),
                 us={str(r): round(t, 2) for r, t in us.items()},
                 default_us={str(r): round(t, 2) for r, t in timed[0][3].items()} if timed[0][1] == "default"
                 else None, wide_us={str(r): t for r, t in wide_us.items()})
    print(f"  [tune] {where}: {label} {entry['us']} (default {entry['default_us']}) wide {entry['wide_us']} "
          f"by_row_blocks {plan.by_row_blocks or '-'}", flush=True)
    return entry


def tune_shapes(models) -> list[tuple]:
    """The GEMV shapes `tune_gemv` tunes for presets `models`, in its order: [(model, kind, N, K, rms_eps)], every
    GEMV of the first model's fused step, then the later models' GEMVs with more than 8 MB of weights (largest
    first), each (kind, N, K) once. Raises KeyError for an unknown preset."""
    from lowlat.config import preset

    shapes = []
    for j, model in enumerate(models):
        cfg = preset(model)
        todo = [("out_proj" if cfg.is_moe else "residual", cfg.hidden_size, cfg.q_size),
                ("lm_head", cfg.vocab_size, cfg.hidden_size)]
        if not cfg.is_moe:
            todo[1:1] = [("gate_up", cfg.intermediate_size, cfg.hidden_size),
                         ("residual", cfg.hidden_size, cfg.intermediate_size)]
        if j:                    # later models: only the GEMVs under the bandwidth target (weights > 8 MB),
            todo = sorted([t for t in todo if t[1] * t[2] * (4 if t[0] == "gate_up" else 2) > 8 << 20],
                          key=lambda t: -t[1] * t[2])           # largest first
        for kind, n, k in todo:
            if all((kind, n, k) != t[1:4] for t in shapes):
                shapes.append((model, kind, n, k, cfg.rms_eps))
    return shapes


def tune_gemv(models, device, bw, rec: _Recorder, budget: Budget, plans_out: str | None, *,
              rows_list=(1, 6), wide_rows=(24, 48), only: set | None = None) -> list[dict]:
    """Time every candidate plan (`lowlat.kernels._gemv.candidate_plans`) of each GEMV shape of the
    first model's fused step and of the later models' GEMVs with more than 8 MB of weights, as the
    step runs them (PDL-chained launches over rotating weight copies); keep the fastest (us summed over
    rows_list, default 1 and 6 rows: one row block) among those that pass `_GemvCase.check` (`pick_tuned`).
    Then, for each row-block count of wide_rows (default 24 and 48 rows: 2 and 3 row blocks; () or counts
    rows_list covers: none) time the candidates that launch the winner's arithmetic there and let the fastest
    weight stream (preload / stages / pf_k) override the winner's at that count (`GemvPlan.by_row_blocks`,
    `compose_row_block_plan`), if the composed plan passes `_GemvCase.check` (else the winner, the error recorded).
    These are per-kernel times: the step can rank streams differently (session 17: SmolLM2's down, the proposed
    2-row-block stream was 13 us a step slower at 24 rows than the committed preload), so time a proposal in the
    step before committing it (`bench/explore/explore26.py` with a `bench/explore/plan_table.py` table).
    The candidates only vary the weight stream: bn by width (`_gemv.BN_BY_ROW_BLOCKS_KINDS`) is not proposed.
    Every time goes to rec (section "tune", per rows). Stops starting candidates when budget.left() < 8 s (a shape
    needs 15 s to start; a wide stage cut short keeps the narrow winner).
    only: a set of (kind, N, K) to tune (None: all of the above; others keep their current plans).
    Writes the chosen plans as JSON (the format of $LOWLAT_GEMV_PLANS / `plans_from_json`, by_row_blocks
    included), followed by the current table's entries of the shapes not tuned, to plans_out and points
    $LOWLAT_GEMV_PLANS at it, so later sections of this run use them. Returns the chosen entries (`_tune_shape`)."""
    import torch

    from lowlat.kernels._gemv import GemvPlan, candidate_plans, tuned_table

    shapes = [t for t in tune_shapes(models) if only is None or t[1:4] in only]
    chosen: list[dict] = []
    for model, kind, n, k, eps in shapes:
        where = f"{model}/tune/{kind}/{n}x{k}"
        if budget.left() < 15:
            rec.skip(where, "time budget (default plan kept)")
            continue
        try:
            case = _GemvCase(kind, n, k, eps, device)
        except Exception as e:                                              # noqa: BLE001
            rec.error(where, e)
            continue
        entry = _tune_shape(case, candidate_plans(kind, n, k), rec, budget, where, bw,
                            dict(model=model, op=kind, n=n, k=k), rows_list=rows_list, wide_rows=wide_rows)
        if entry is not None:
            chosen.append(entry)
        del case
        torch.cuda.empty_cache()
    rec.doc["tuned_plans"] = chosen
    rec.save()
    table = list(chosen)              # shapes not tuned here keep their current plans in the written table
    for (kind, n, k), fields in tuned_table().items():
        if all((kind, n, k) != (e["kind"], e["n"], e["k"]) for e in chosen):
            table.append(dict(kind=kind, n=n, k=k, label="kept", plan=GemvPlan(n=n, k=k, **fields).describe()))
    if plans_out:
        with open(plans_out, "w") as f:
            json.dump(table, f, indent=1)
        os.environ["LOWLAT_GEMV_PLANS"] = plans_out
    return chosen


# ------------------------------------------------------------------------------------------ step
def random_kv(cfg, num_layers: int, rows_max: int, ctx: int, device, *, seed: int = 7) -> SimpleNamespace:
    """Random bf16 K/V caches (`k_caches` / `v_caches`: num_layers x [S, Hkv, D]) with room for `rows_max`
    requests of ctx + 1 tokens (`_DecodeCase`'s slot layout) plus the dummy slot 0."""
    import torch

    shape = (1 + rows_max * (ctx + 1) + 1, cfg.num_kv_heads, cfg.head_dim)
    g = torch.Generator(device=device).manual_seed(seed)
    return SimpleNamespace(
        k_caches=[torch.randn(shape, generator=g, device=device).to(torch.bfloat16) for _ in range(num_layers)],
        v_caches=[torch.randn(shape, generator=g, device=device).to(torch.bfloat16) for _ in range(num_layers)])


class _DecodeCase:
    """`rows` requests with `ctx` cached tokens each, one decode row per request, on a random cache."""

    def __init__(self, cfg, rows: int, ctx: int, device, kv) -> None:
        import torch

        from lowlat.step import StepBatch

        c = ctx + 1
        slot = 1 + torch.arange(rows, device=device)[:, None] * c + torch.arange(c, device=device)[None, :]
        self.page_table = slot.to(torch.int32)                                  # [rows, C]
        g = torch.Generator(device=device).manual_seed(rows)
        self.step = StepBatch(
            input_ids=torch.randint(0, cfg.vocab_size, (rows,), generator=g, device=device),
            positions=torch.full((rows,), ctx, dtype=torch.int64, device=device),
            out_cache_loc=self.page_table[:, ctx].clone(),
            req_indices=torch.arange(rows, dtype=torch.int32, device=device),
            seq_lens=torch.full((rows,), c, dtype=torch.int32, device=device),
            page_table=self.page_table, num_valid_rows=rows)
        self.kv = kv


def _step_bytes(cfg, weights, rows: int, ctx: int) -> int:
    """Weights touched (all layers + LM head), KV read + written, logits written."""
    w = sum(_nbytes(*[t for t in vars(lw).values() if hasattr(t, "numel")]) for lw in weights.layers)
    w += _nbytes(weights.lm_head, weights.final_norm) + rows * cfg.hidden_size * 2
    kv = cfg.num_layers * rows * (ctx + 2) * 2 * cfg.kv_size * 2
    return w + kv + rows * cfg.vocab_size * 4


def _torch_step_fns(cfg, weights, ctx: int, rope_cos, rope_sin, compiled: bool, *, lm_head: bool = True):
    """A plain-PyTorch decode step from the reference pieces, capturable (no host syncs): attention
    over a fixed C = ctx + 1 page-table columns with a causal mask instead of paged_attention's
    data-dependent length; the QKV bias (Qwen2) and Qwen3's per-head QK RMSNorm when the config has them;
    MoE layers (plus the shared expert when there is one) in the gathered-weights form of torch-native
    decode MoE (router softmax -> top-k -> renormalise, then each row's top-k experts' weights indexed
    by expert id and applied with einsum: no host sync, no sort over tokens). Returns step(case) -> logits
    (or the last hidden state without `lm_head`); compiled pieces when `compiled`."""
    import torch
    import torch.nn.functional as F

    from lowlat.reference.mlp import swiglu_mlp
    from lowlat.reference.rms_norm import rms_norm
    from lowlat.reference.rope import apply_rope

    d, eps, c = cfg.head_dim, cfg.rms_eps, ctx + 1

    def pre(x, attn_norm, wq, wk, wv, bq, bk, bv, q_norm, k_norm, cos, sin):
        m = x.shape[0]
        hn = rms_norm(x, attn_norm, eps)
        q, k = F.linear(hn, wq, bq).view(m, -1, d), F.linear(hn, wk, bk).view(m, -1, d)
        if q_norm is not None:
            q, k = rms_norm(q, q_norm, eps), rms_norm(k, k_norm, eps)
        return apply_rope(q, cos, sin), apply_rope(k, cos, sin), F.linear(hn, wv, bv).view(m, -1, d)

    def attn(x, q, k_cache, v_cache, slots, visible, wo):
        m, hq, _ = q.shape
        kk, vv = k_cache[slots], v_cache[slots]                              # [M, C, Hkv, D]
        grp = hq // kk.shape[2]
        kk, vv = kk.repeat_interleave(grp, dim=2), vv.repeat_interleave(grp, dim=2)
        s = torch.einsum("mhd,mchd->mhc", q, kk) * d ** -0.5
        s = s.masked_fill(~visible[:, None, :], float("-inf"))
        p = torch.softmax(s.to(torch.promote_types(s.dtype, torch.float32)), dim=-1).to(q.dtype)
        o = torch.einsum("mhc,mchd->mhd", p, vv).reshape(m, -1)
        return x + F.linear(o, wo)

    def dense(x, mlp_norm, wg, wu, wd):
        return x + swiglu_mlp(rms_norm(x, mlp_norm, eps), wg, wu, wd)

    def moe(x, mlp_norm, router, eg, eu, ed, shared):
        h = rms_norm(x, mlp_norm, eps)
        acc = torch.promote_types(x.dtype, torch.float32)
        probs = torch.softmax((h @ router.T).to(acc), dim=-1)                # [M, E]
        gate, ids = torch.topk(probs, cfg.top_k, dim=-1)                     # [M, k]
        if cfg.norm_topk_prob:
            gate = gate / gate.sum(-1, keepdim=True)
        g = torch.einsum("mh,mkih->mki", h, eg[ids])                         # [M, k, Ie]
        u = torch.einsum("mh,mkih->mki", h, eu[ids])
        y = torch.einsum("mki,mkhi->mkh", F.silu(g) * u, ed[ids])           # [M, k, H]
        y = (gate[..., None] * y.to(acc)).sum(1).to(x.dtype)
        if shared is not None:                                               # Qwen2-MoE's shared expert
            y = y + swiglu_mlp(h, *shared)
        return x + y

    def head(x, final_norm, lm):
        logits = F.linear(rms_norm(x, final_norm, eps), lm)
        return logits.to(torch.promote_types(logits.dtype, torch.float32))

    if compiled:
        pre, attn, dense, moe, head = (torch.compile(f, dynamic=True) for f in (pre, attn, dense, moe, head))

    def step(case) -> torch.Tensor:
        st, kc, vc = case.step, case.kv.k_caches, case.kv.v_caches
        x = weights.embed[st.input_ids]
        cos, sin = rope_cos[st.positions], rope_sin[st.positions]
        slots = case.page_table[st.req_indices.long(), :c].long()
        visible = torch.arange(c, device=x.device)[None, :] <= st.positions[:, None]
        loc = st.out_cache_loc.long()
        for i, lw in enumerate(weights.layers):
            q, k, v = pre(x, lw.attn_norm, lw.wq, lw.wk, lw.wv, lw.bq, lw.bk, lw.bv, lw.q_norm, lw.k_norm, cos, sin)
            kc[i][loc] = k
            vc[i][loc] = v
            x = attn(x, q, kc[i], vc[i], slots, visible, lw.wo)
            if lw.router is not None:
                shared = (lw.shared_gate, lw.shared_up, lw.shared_down) if lw.shared_gate is not None else None
                x = moe(x, lw.mlp_norm, lw.router, lw.expert_gate, lw.expert_up, lw.expert_down, shared)
            else:
                x = dense(x, lw.mlp_norm, lw.w_gate, lw.w_up, lw.w_down)
        return head(x, weights.final_norm, weights.lm_head) if lm_head else x

    return step


def _bench_torch_steps(cfg, weights, rows_list, ctx: int, device, KV, rec: _Recorder, budget: Budget, *,
                       variants, where_prefix: str, lm_head: bool, record) -> None:
    """Time the plain-PyTorch step (`_torch_step_fns`) per width under a CUDA graph (compiled: False) and
    / or torch.compile + a CUDA graph (True), one `variants` entry each; record(rows, variant, us) adds
    the entry. Failures are recorded and the loop goes on."""
    import torch

    from lowlat.reference.rope import rope_cos_sin, rope_inv_freq

    inv = rope_inv_freq(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling, torch.float32).to(device)
    cos, sin = rope_cos_sin(torch.arange(ctx + 2, device=device), inv, torch.bfloat16)
    for comp in variants:
        variant = "reference_compile_graph" if comp else "reference_graph"
        try:
            step = _torch_step_fns(cfg, weights, ctx, cos, sin, comp, lm_head=lm_head)
        except Exception as e:                                              # noqa: BLE001
            rec.error(f"{where_prefix}/{variant}", e)
            continue
        for rows in rows_list:
            where = f"{where_prefix}/rows={rows}/{variant}"
            if budget.left() < (40 if comp and rows == rows_list[0] else 10):
                rec.skip(where, "time budget")
                continue
            try:
                case = _DecodeCase(cfg, rows, ctx, device, KV)
                record(rows, variant, graph_time_us(lambda _: step(case), 1, iters=20))
            except Exception as e:                                          # noqa: BLE001
                rec.error(where, e)


#: kernel name (CUPTI) -> role in the fused step; `_residual_gemv_kernel` is out_proj or down (`launch_roles`)
_ROLES = {"_attn_prologue_kernel": "attn_prologue", "_held_prologue_kernel": "attn_prologue",
          "_decode_attention_kernel": "decode_attention",
          "_gate_up_kernel": "gate_up", "_lm_head_kernel": "lm_head", "_router_logits_kernel": "moe_router",
          "_route_plan_kernel": "moe_route_plan", "_expert_gate_up_kernel": "moe_gate_up",
          "_expert_down_kernel": "moe_down", "_combine_kernel": "moe_combine"}


def launch_roles(names) -> list[str]:
    """The role of each launch of a fused step, from its kernel names in launch order: `_ROLES`, and a
    layer's first residual GEMV (`_residual_gemv_kernel` or `_held_residual_gemv_kernel`, after its attention
    prologue) is out_proj, its second down; anything else is "other:<name>"."""
    roles, gemvs = [], 0
    for n in names:
        if n.startswith(("_residual_gemv_kernel", "_held_residual_gemv_kernel")):
            roles.append("out_proj" if gemvs == 0 else "down")
            gemvs += 1
            continue
        role = next((r for k, r in _ROLES.items() if n.startswith(k)), None)
        if role == "attn_prologue":
            gemvs = 0
        roles.append(role or f"other:{n[:48]}")
    return roles


def role_bytes(cfg, role: str) -> int | None:
    """Weight bytes (bf16) one launch of `role` reads at any row count; None where it depends on the rows
    (the routed experts) or is not a GEMV."""
    h = cfg.hidden_size
    table = {"attn_prologue": (cfg.q_size + 2 * cfg.kv_size) * h * 2, "out_proj": h * cfg.q_size * 2,
             "gate_up": 2 * cfg.intermediate_size * h * 2, "down": h * cfg.intermediate_size * 2,
             "lm_head": cfg.vocab_size * h * 2, "moe_router": cfg.num_experts * h * 2}
    return table.get(role)


def launch_costs(trace, replays: int) -> dict[str, list[float]]:
    """Split a `kernel_trace` of `replays` replays of one graph into replays (equal kernel counts, same names
    in the same order, else ValueError) and give each launch's cost in the step: end_i - end_(i-1) (the
    first launch of a replay: its duration), collected per `launch_roles` role (µs; layers x replays)."""
    if isinstance(replays, bool) or not isinstance(replays, int) or replays < 1:
        raise ValueError(f"replays={replays!r} must be an int >= 1")
    n, rem = divmod(len(trace), replays)
    if n == 0 or rem:
        raise ValueError(f"{len(trace)} kernels in {replays} replays")
    names = [k[0] for k in trace[:n]]
    roles = launch_roles(names)
    out: dict[str, list[float]] = {}
    for r in range(replays):
        chunk = trace[r * n:(r + 1) * n]
        if [k[0] for k in chunk] != names:
            raise ValueError(f"replay {r} launched other kernels than replay 0")
        for i, (role, (_, start, end)) in enumerate(zip(roles, chunk)):
            out.setdefault(role, []).append(end - (chunk[i - 1][2] if i else start))
    return out


def profile_graph(run, replays: int, cfg, bw: float, rec: _Recorder, base: dict) -> None:
    """Record the per-role in-step launch costs (`launch_costs`) of `replays` calls of run() (a graph
    replay): section "profile", us = median cost, per_step_us = the role's total per replay, bytes /
    pct_of_copy where `role_bytes` knows."""
    import statistics

    from lowlat.benchmarking import kernel_trace

    trace = kernel_trace(run, iters=replays)
    for role, costs in launch_costs(trace, replays).items():
        us = statistics.median(costs)
        nbytes = role_bytes(cfg, role)
        rec.add(section="profile", **base, op=role, variant="fused_in_step", us=round(us, 2), launches=len(costs),
                per_step_us=round(sum(costs) / replays, 2), bytes=nbytes,
                pct_of_copy=None if nbytes is None else round(100 * nbytes / (us * 1e-6) / (bw * 1e9), 1))


def bench_step(cfg, model: str, weights, rows_list, ctx: int, device, bw, rec: _Recorder, budget: Budget, *,
               compiled: bool, fused: bool = True, eager_reference: bool = True, profile: bool = False) -> None:
    """The whole decode step per width: fused (with `profile`, each launch's cost in the step,
    `profile_graph`: where the step's time goes), the reference under CUDA graphs and, with `compiled`,
    under torch.compile + CUDA graphs. (Until session 11 the fused step also had a breakdown into graphs of
    some launches of every layer: at 6 rows their GPU time exceeded the whole step's by ~120 us, and their
    capture at 1 row changed the 6-row step graph's out_proj from 7.9 to 2.2 us a layer (NOTES.md, session
    11); the profile replaced them.)"""
    import torch

    from lowlat.runtime.fused_model import FusedModel

    KV = random_kv(cfg, cfg.num_layers, max(rows_list), ctx, device)

    if fused:
        fm = FusedModel(cfg, weights, device=device, widths=tuple(sorted(rows_list)), validate=False)
        for rows in rows_list:
            where = f"{model}/step/rows={rows}/fused"
            if budget.left() < 10:
                rec.skip(where, "time budget")
                continue
            try:
                case = _DecodeCase(cfg, rows, ctx, device, KV)
                fm.forward(case.step, KV)                                   # eager run + capture
                us = replay_time_us(fm._graphs[rows], iters=20, warmup=3)
                nbytes = _step_bytes(cfg, weights, rows, ctx)
                rec.add(section="step", model=model, op="decode_step", rows=rows, ctx=ctx, variant="fused", us=us,
                        bytes=nbytes, floor_us=nbytes / (bw * 1e9) * 1e6, pdl=fm.use_pdl)
            except Exception as e:                                          # noqa: BLE001
                rec.error(where, e)
                continue
            if profile:
                try:
                    profile_graph(fm._graphs[rows].replay, 10, cfg, bw, rec, dict(model=model, rows=rows, ctx=ctx))
                except Exception as e:                                      # noqa: BLE001
                    rec.error(f"{where}/profile", e)
        del fm
        torch.cuda.empty_cache()

    def record(rows, variant, us):
        nbytes = _step_bytes(cfg, weights, rows, ctx)
        rec.add(section="step", model=model, op="decode_step", rows=rows, ctx=ctx, variant=variant, us=us,
                bytes=nbytes, floor_us=nbytes / (bw * 1e9) * 1e6)

    _bench_torch_steps(cfg, weights, rows_list, ctx, device, KV, rec, budget, lm_head=True, record=record,
                       variants=([False] if eager_reference else []) + ([True] if compiled else []),
                       where_prefix=f"{model}/step")


def bench_moe_layer(rows_list, ctx: int, device, bw, rec: _Recorder, budget: Budget, *, compiled: bool = True,
                    profile: bool = False) -> None:
    """One Qwen3-30B-A3B layer (attention + MoE), LM head excluded: through FusedModel (with `profile`, each
    launch's cost in the layer, `profile_graph`, on the step graph, whose LM head evicts the L2 between
    replays), and the plain-PyTorch layer
    (`_torch_step_fns`) under a CUDA graph and, with `compiled`, under torch.compile + a CUDA graph."""
    import torch

    from lowlat.config import preset
    from lowlat.runtime.fused_model import FusedModel

    model = "Qwen3-30B-A3B(1 layer)"
    cfg = preset("Qwen3-30B-A3B").replace(num_layers=1)
    w = random_weights_on_device(cfg, device, seed=3)
    KV = random_kv(cfg, 1, max(rows_list), ctx, device)

    fm = FusedModel(cfg, w, device=device, widths=tuple(sorted(rows_list)), validate=False)
    lw = w.layers[0]
    attn_bytes = _nbytes(lw.attn_norm, lw.wq, lw.wk, lw.wv, lw.wo, lw.mlp_norm, lw.q_norm, lw.k_norm, lw.router)
    expert_bytes = 3 * cfg.moe_intermediate_size * cfg.hidden_size * 2
    floors: dict[int, tuple[int, int]] = {}
    for rows in rows_list:
        where = f"{model}/rows={rows}/fused"
        if budget.left() < 10:
            rec.skip(where, "time budget")
            continue
        try:
            case = _DecodeCase(cfg, rows, ctx, device, KV)
            fm.forward(case.step, KV)
            bufs = fm._bufs[rows]
            active = int(fm.moe_ws.bitmap[:rows].bool().any(0).sum())
            us = graph_time_us(lambda _: fm._run(bufs, KV.k_caches, KV.v_caches, include_lm_head=False), 1, iters=20)
            nbytes = attn_bytes + active * expert_bytes + rows * (ctx + 2) * 2 * cfg.kv_size * 2 + 4 * rows * cfg.hidden_size
            rec.add(section="moe", model=model, op="layer", rows=rows, ctx=ctx, variant="fused", us=us, bytes=nbytes,
                    floor_us=nbytes / (bw * 1e9) * 1e6, active_experts=active)
            floors[rows] = (nbytes, active)
            if profile:         # the step graph: the layer, then the 622 MB LM head (which evicts the L2)
                profile_graph(fm._graphs[rows].replay, 10, cfg, bw, rec,
                              dict(model=model, rows=rows, ctx=ctx, active_experts=active))
        except Exception as e:                                              # noqa: BLE001
            rec.error(where, e)
    del fm
    torch.cuda.empty_cache()

    # the same layer in plain PyTorch (lowlat.reference pieces; MoE in gathered-weights form) under a
    # CUDA graph, and under torch.compile + a CUDA graph; the same floor as the fused entry
    def record(rows, variant, us):
        nbytes, active = floors.get(rows, (None, None))
        rec.add(section="moe", model=model, op="layer", rows=rows, ctx=ctx, variant=variant, us=us, bytes=nbytes,
                floor_us=None if nbytes is None else nbytes / (bw * 1e9) * 1e6, active_experts=active)

    _bench_torch_steps(cfg, w, rows_list, ctx, device, KV, rec, budget, lm_head=False, record=record,
                       variants=(False, True) if compiled else (False,), where_prefix=model)


# ------------------------------------------------------------------------------------------ driver
def check_args(args: argparse.Namespace) -> str | None:
    """Why the arguments cannot run (one line naming the offending value), or None. Host-only, before any
    device work, so a bad value is refused at once (and on a machine without a GPU too) instead of after
    the copy-bandwidth measurement, or as per-entry errors of a run that exits 0."""
    from lowlat.config import PRESET_NAMES
    from lowlat.step import MAX_ROWS

    sections = [s.strip() for s in (args.sections or "").split(",") if s.strip()]
    bad = [s for s in sections if s not in SECTIONS]
    if bad or not sections:
        return f"--sections {args.sections!r}: unknown sections {bad}; known: {list(SECTIONS)}" if bad else \
            f"--sections {args.sections!r} names no section; known: {list(SECTIONS)}"
    for item in (args.rows or "").split(","):
        try:
            r = int(item)
        except ValueError:
            r = 0
        if not 1 <= r <= MAX_ROWS:
            return f"--rows: {item.strip()!r} is not a row count in 1..{MAX_ROWS}"
    models = [m.strip() for m in (args.models or "").split(",") if m.strip()]
    unknown = [m for m in models if m not in PRESET_NAMES]
    if unknown:
        return f"--models {args.models!r}: unknown presets {unknown}; known: {list(PRESET_NAMES)}"
    # the moe section (one Qwen3-30B-A3B layer, its profile too) and copy need no preset: --models "" skips the models
    # (compiled with moe: the MoE layer's torch.compile reference; its per-model parts need step / kernels anyway)
    per_model = {"tune", "kernels", "step"} | ({"profile", "compiled"} if "moe" not in sections else set())
    if not models and per_model & set(sections):
        return (f"--models {args.models!r} names no preset, but sections {sorted(per_model & set(sections))} run per "
                f"model: name one (e.g. --models {PRESET_NAMES[0]}) or keep to moe / copy; known: {list(PRESET_NAMES)}")
    if args.ctx < 1:
        return f"--ctx {args.ctx}: cached tokens per request must be at least 1"
    for flag, v in (("--budget-s", args.budget_s), ("--tune-budget-s", args.tune_budget_s)):
        if not math.isfinite(v) or v <= 0:
            return f"{flag} {v}: must be a finite number of seconds > 0"
    try:
        only = _parse_shapes(args.tune_shapes)
        _parse_rows(args.tune_wide_rows)
    except SystemExit as e:
        return str(e)
    if only and "tune" in sections:
        known = sorted({t[1:4] for t in tune_shapes(models)})
        missing = sorted(only - set(known))
        if missing:
            return (f"--tune-shapes {args.tune_shapes!r}: {[f'{k}:{n}x{kk}' for k, n, kk in missing]} not among the "
                    f"shapes tuned for --models {args.models!r}: {[f'{k}:{n}x{kk}' for k, n, kk in known]}")
    return None


def run(args: argparse.Namespace) -> int:
    """`lowlat bench`: 0 after the run (failed entries are in the JSON's "errors"); 2 when an argument is
    refused (`check_args`, printed with the offending value) or no CUDA GPU is visible."""
    import torch
    import triton

    why = check_args(args)
    if why is not None:
        print(f"lowlat bench: error: {why}", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("lowlat bench needs a CUDA GPU", file=sys.stderr)
        return 2
    dev = torch.device("cuda", torch.cuda.current_device())
    props = torch.cuda.get_device_properties(dev)
    sections = [s.strip() for s in args.sections.split(",") if s.strip()]
    rows_list = [int(r) for r in args.rows.split(",")]
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    meta = dict(
        device=props.name, sm_count=props.multi_processor_count,
        l2_bytes=getattr(props, "L2_cache_size", None), capability=f"sm_{props.major}{props.minor}",
        torch=torch.__version__, triton=triton.__version__, cuda=torch.version.cuda,
        date=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        command=" ".join(getattr(sys, "orig_argv", sys.argv)),
        rows=rows_list, ctx=args.ctx, models=models, sections=sections,
        method=("CUDA-graph replays queued back to back, each timed with CUDA events, median; per-kernel graphs "
                "rotate over >= 192 MB of "
                "weight copies (cold L2); floor = bytes / measured copy bandwidth (read + write)"))
    rec = _Recorder(args.out, meta)
    budget = Budget(args.budget_s)
    print(f"[bench] {props.name}, torch {torch.__version__}, triton {triton.__version__}", flush=True)
    bw = copy_bandwidth(dev) / 1e9
    rec.doc["copy_bandwidth_GBps"] = round(bw, 1)
    print(f"[bench] copy bandwidth {bw:.0f} GB/s (read + write)", flush=True)
    rec.save()

    from lowlat.config import preset

    if "tune" in sections:
        print(f"[bench] tune GEMV plans ({budget.left():.0f} s left)", flush=True)
        tb = Budget(min(args.tune_budget_s, budget.left()))
        try:
            tune_gemv(models, dev, bw, rec, tb, args.plans_out or (args.out + ".plans.json" if args.out else None),
                      only=_parse_shapes(args.tune_shapes), wide_rows=_parse_rows(args.tune_wide_rows))
        except Exception as e:                                              # noqa: BLE001 - recorded
            rec.error("tune", e)
        torch.cuda.empty_cache()
    # priority order (a run cut short by the budget keeps the most important numbers): the first
    # model's step (fused and reference graph), then its torch.compile step (the speed-up
    # target is measured against it in the same run), its kernels, the other models' steps and
    # kernels, the MoE layer, then the remaining torch.compile references (compiling costs the most)
    order: list[tuple[str, str | None]] = []
    for j, model in enumerate(models):
        order += [(t, model) for t in ("step", "kernels") if t in sections]
        if "profile" in sections and "step" not in sections:
            order.append(("profile", model))
        if j == 0 and "compiled" in sections and "step" in sections:
            order.insert(1, ("compiled_step", model))
    if "moe" in sections:
        order.append(("moe", None))
    if "compiled" in sections:
        order += [("compiled_step", m) for m in models[1:] if "step" in sections]
        order += [("compiled_kernels", m) for m in models if "kernels" in sections]
    for task, model in order:
        where = f"{model or 'Qwen3-30B-A3B'}/{task}"
        if budget.left() < 20:
            rec.skip(where, "time budget")
            continue
        print(f"[bench] {where} ({budget.left():.0f} s left)", flush=True)
        try:
            if task == "step":
                w = random_weights_on_device(preset(model), dev)
                bench_step(preset(model), model, w, rows_list, args.ctx, dev, bw, rec, budget, compiled=False,
                           profile="profile" in sections)
            elif task == "profile":
                w = random_weights_on_device(preset(model), dev)
                bench_step(preset(model), model, w, rows_list, args.ctx, dev, bw, rec, budget, compiled=False,
                           eager_reference=False, profile=True)
            elif task == "compiled_step":
                w = random_weights_on_device(preset(model), dev)
                bench_step(preset(model), model, w, rows_list, args.ctx, dev, bw, rec, budget, compiled=True,
                           fused=False, eager_reference=False)
            elif task == "kernels":
                bench_kernels(preset(model), model, rows_list, dev, bw, rec, budget)
            elif task == "compiled_kernels":
                bench_kernels(preset(model), model, rows_list, dev, bw, rec, budget,
                              variants=("reference_compile_graph",))
            elif task == "moe":
                bench_moe_layer(rows_list, args.ctx, dev, bw, rec, budget, compiled="compiled" in sections,
                                profile="profile" in sections)
        except Exception as e:                                              # noqa: BLE001 - recorded
            rec.error(where, e)
        w = None
        torch.cuda.empty_cache()
    _print_table(rec.doc)
    return 0


def _print_table(doc: dict) -> None:
    rows = doc["results"]
    print(f"\n[bench] {doc.get('device')} copy {doc.get('copy_bandwidth_GBps')} GB/s")
    print(f"{'model':24} {'op':12} {'rows':>4} {'variant':26} {'us':>9} {'GB/s':>7} {'floor_us':>9} {'frac':>6}")
    for r in rows:
        print(f"{r['model'][:24]:24} {r['op'][:12]:12} {r['rows']:>4} {r['variant'][:26]:26} {r.get('us', 0):>9} "
              f"{r.get('GBps', ''):>7} {r.get('floor_us', ''):>9} {r.get('frac_of_floor', ''):>6}")
    if doc["errors"]:
        print(f"[bench] {len(doc['errors'])} errors: " + "; ".join(e["where"] for e in doc["errors"]))


def _parse_shapes(text: str | None) -> set | None:
    """--tune-shapes "lm_head:49152x576,residual:2048x8192" -> {(kind, N, K)}; None when empty."""
    if not text:
        return None
    out = set()
    for item in text.split(","):
        try:
            kind, nk = item.strip().split(":")
            n, k = nk.lower().split("x")
            out.add((kind, int(n), int(k)))
        except ValueError:
            raise SystemExit(f"--tune-shapes: {item!r} is not KIND:NxK") from None
    return out


def _parse_rows(text: str | None) -> tuple[int, ...]:
    """--tune-wide-rows "24,48" -> (24, 48); () when empty. Raises SystemExit for a count outside 1..48."""
    out = []
    for item in (text or "").split(","):
        if not item.strip():
            continue
        try:
            r = int(item)
        except ValueError:
            r = 0
        if not 1 <= r <= 48:
            raise SystemExit(f"--tune-wide-rows: {item.strip()!r} is not a row count in 1..48")
        out.append(r)
    return tuple(out)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", default=None, help="JSON path (rewritten after every entry)")
    p.add_argument("--models", default=",".join(DEFAULT_MODELS), help="comma-separated presets")
    p.add_argument("--rows", default=",".join(map(str, DEFAULT_ROWS)), help="comma-separated row counts (1..48)")
    p.add_argument("--ctx", type=int, default=512, help="cached tokens per request in the step benchmark")
    p.add_argument("--sections", default=",".join(SECTIONS), help=f"comma-separated subset of {SECTIONS}")
    p.add_argument("--budget-s", type=float, default=600.0, help="stop starting new entries after this many s")
    p.add_argument("--tune-budget-s", type=float, default=120.0, help="most seconds the tune section may take")
    p.add_argument("--plans-out", default=None,
                   help="JSON path for the tuned GEMV plans (default <out>.plans.json); the rest of the run uses them")
    p.add_argument("--tune-shapes", default=None,
                   help="tune only these GEMV shapes, KIND:NxK comma-separated (e.g. lm_head:49152x576)")
    p.add_argument("--tune-wide-rows", default="24,48",
                   help="row counts at which the tuner re-chooses each winner's weight stream per row-block count "
                        "(by_row_blocks; counts of 1-16 rows are the narrow timing's); empty: off")


def add_subparser(sub) -> None:
    """Register `lowlat bench` on the CLI's subparsers (lowlat/cli.py `_EXTRA_COMMANDS`)."""
    from lowlat.cli import HelpWithDefaults

    b = sub.add_parser("bench", help="time the fused kernels and decode step vs PyTorch (needs a GPU)",
                       formatter_class=HelpWithDefaults)
    add_arguments(b)
    b.set_defaults(func=run)


def main(argv: list[str] | None = None) -> int:
    from lowlat.cli import HelpWithDefaults

    p = argparse.ArgumentParser(prog="python -m lowlat.bench", description=__doc__.splitlines()[0],
                                formatter_class=HelpWithDefaults)
    add_arguments(p)
    return run(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
