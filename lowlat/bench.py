"""`lowlat bench`: time the fused kernels and the whole fused decode step against plain PyTorch.

    lowlat bench --out bench/results/fused_step_h200.json            (or python -m lowlat.bench ...)
        [--models SmolLM2-135M,Llama-3.2-1B] [--rows 1,6,8,16,48] [--ctx 512]
        [--sections copy,kernels,step,compiled,moe] [--budget-s 600]

What is timed (CUDA events around CUDA-graph replays, median of many, after warm-up):
  kernels   out_proj (+ residual, rstd for the FFN norm), mlp (gate/up + SiLU*mul, down + residual,
            RMSNorm on load) and lm_head (final norm + LM head + argmax), each as the fused step runs
            it (PDL on), against its reference (lowlat.reference) under a CUDA graph. One graph
            replays many launches rotating over enough weight copies (>= 192 MB) that every launch
            reads its weights from HBM, not L2; the time is per launch.
  step      the whole decode step (embedding .. logits): FusedModel's captured graph, against a
            plain-PyTorch step built from the reference pieces (attention made capturable by masking
            a fixed C = ctx + 1 columns) under a CUDA graph. Each row is one request with `ctx`
            cached tokens (decode).
  compiled  the same plain-PyTorch kernels / step under torch.compile (inductor, dynamic shapes,
            compiled once per model) inside a CUDA graph.
  moe       one Qwen3-30B-A3B layer (attention + MoE, lowlat.kernels.moe) through FusedModel.
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
import statistics
import sys
import time
import traceback
from types import SimpleNamespace
from typing import Any, Callable

DEFAULT_MODELS = ("SmolLM2-135M", "Llama-3.2-1B")
DEFAULT_ROWS = (1, 6, 8, 16, 48)
SECTIONS = ("copy", "kernels", "step", "compiled", "moe")
ROTATE_BYTES = 192 << 20          # weight bytes one timing graph cycles through (> 3x the H200's L2)
MIN_LAUNCHES = 8


class _Budget:
    def __init__(self, seconds: float) -> None:
        self.t0, self.seconds = time.perf_counter(), seconds

    def left(self) -> float:
        return self.seconds - (time.perf_counter() - self.t0)


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
def _graph_time_us(launch: Callable[[int], Any], n_launch: int, *, iters: int = 15, warmup: int = 2) -> float:
    """Median µs per launch of a CUDA graph holding launch(0..n_launch-1)."""
    import torch

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for i in range(n_launch):           # compile / warm up outside the capture
            launch(i)
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for i in range(n_launch):
            launch(i)
    return _replay_time_us(g, iters=iters, warmup=warmup) / n_launch


def _replay_time_us(g, *, iters: int = 15, warmup: int = 2) -> float:
    import torch

    for _ in range(warmup):
        g.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        g.replay()
        e1.record()
        e1.synchronize()
        times.append(e0.elapsed_time(e1) * 1e3)
    return statistics.median(times)


def copy_bandwidth_GBps(device) -> float:
    """Device-to-device copy of 1 GiB, counting bytes read + written (median of 20)."""
    import torch

    n = 1 << 30
    src = torch.empty(n, dtype=torch.uint8, device=device).random_(0, 255)
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    torch.cuda.synchronize()
    times = []
    for _ in range(20):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        dst.copy_(src)
        e1.record()
        e1.synchronize()
        times.append(e0.elapsed_time(e1) * 1e-3)
    del src, dst
    return 2 * n / statistics.median(times) / 1e9


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
    return max(1, min(256, math.ceil(ROTATE_BYTES / max(nbytes, 1))))


# ------------------------------------------------------------------------------------------ kernels
def bench_kernels(cfg, model: str, rows_list, device, bw, rec: _Recorder, budget: _Budget, *,
                  variants=("fused", "fused_write_h", "reference_graph")) -> None:
    """out_proj, mlp, lm_head, each in the given variants: fused (as the fused step runs it),
    fused_write_h (out_proj also writing h), reference_graph, reference_compile_graph."""
    import torch

    from lowlat.kernels._gemv import GemvWorkspace, plan_gemv
    from lowlat.kernels.lm_head import lm_head
    from lowlat.kernels.mlp import mlp
    from lowlat.kernels.out_proj import out_proj
    from lowlat.reference import lm_head as ref_lm
    from lowlat.reference import out_proj as ref_op
    from lowlat.reference.mlp import swiglu_mlp

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
            us = _graph_time_us(fns[variant], n_launch)
            rec.add(section="kernels", model=model, op=op, rows=rows, variant=variant, us=us, bytes=nbytes,
                    floor_us=nbytes / (bw * 1e9) * 1e6, launches_per_graph=n_launch)
        except Exception as e:                                   # noqa: BLE001 - recorded, run goes on
            rec.error(where, e)

    # ---- out_proj: x + attn Wo^T, rstd (h is normalised on load by the MLP kernel)
    nc = _copies(h * q * 2)
    wos = [rnd(h, q, scale=q ** -0.5) for _ in range(nc)]
    plan_o = plan_gemv(h, q)
    cop = torch.compile(ref_op.out_proj, dynamic=True) if compiled else None
    for rows in rows_list:
        attn, x = rnd(rows, q), rnd(rows, h)
        xo, hh = torch.empty_like(x), torch.empty_like(x)
        rstd = torch.empty(rows, dtype=torch.float32, device=device)
        fns = {
            "fused": lambda k: out_proj(attn, wos[k % nc], x, nw, eps, out=xo, rstd_out=rstd, write_h=False,
                                        workspace=ws, plan=plan_o, use_pdl=True),
            "fused_write_h": lambda k: out_proj(attn, wos[k % nc], x, nw, eps, out=xo, h_out=hh, rstd_out=rstd,
                                                workspace=ws, plan=plan_o, use_pdl=True),
            "reference_graph": lambda k: ref_op.out_proj(attn, wos[k % nc], x, nw, eps),
            "reference_compile_graph": lambda k: cop(attn, wos[k % nc], x, nw, eps),
        }
        nbytes = h * q * 2 + _nbytes(attn, x, xo) + rows * 4
        for var in variants:
            run("out_proj", rows, var, fns, max(nc, MIN_LAUNCHES), nbytes + (_nbytes(hh) if var != "fused" else 0))
    del wos

    # ---- mlp: x + down(silu(gate(h)) * up(h)), h = rms_norm(x) on load
    nc = _copies(3 * h * i * 2)
    gus = [torch.cat([rnd(i, h, scale=h ** -0.5), rnd(i, h, scale=h ** -0.5)]) for _ in range(nc)]
    wds = [rnd(h, i, scale=i ** -0.5) for _ in range(nc)]
    plans = (plan_gemv(i, h, pair=True), plan_gemv(h, i))

    def ref_mlp(x, hn, gu, wd):
        return x + swiglu_mlp(hn, gu[:i], gu[i:], wd)

    cmlp = torch.compile(ref_mlp, dynamic=True) if compiled else None
    for rows in rows_list:
        x = rnd(rows, h)
        rstd = torch.rsqrt(x.float().pow(2).mean(-1) + eps)
        hn = (nw * (x.float() * rstd[:, None]).to(bf))
        xo, act = torch.empty_like(x), torch.empty(rows, i, dtype=bf, device=device)
        fns = {
            "fused": lambda k: mlp(x, gus[k % nc], wds[k % nc], x, norm_weight=nw, rstd=rstd, out=xo, act=act,
                                   workspace=ws, plans=plans, use_pdl=True),
            "reference_graph": lambda k: ref_mlp(x, hn, gus[k % nc], wds[k % nc]),
            "reference_compile_graph": lambda k: cmlp(x, hn, gus[k % nc], wds[k % nc]),
        }
        nbytes = 3 * h * i * 2 + _nbytes(x, xo) + 2 * _nbytes(act)
        for var in variants:
            if var in fns:
                run("mlp", rows, var, fns, max(nc, MIN_LAUNCHES), nbytes)
    del gus, wds

    # ---- lm_head: final norm + logits (fp32) + argmax
    nc = _copies(v * h * 2)
    lms = [rnd(v, h) for _ in range(nc)]
    plan_lm = plan_gemv(v, h, split=1)
    clm = torch.compile(ref_lm.lm_head, dynamic=True) if compiled else None
    for rows in rows_list:
        x = rnd(rows, h, scale=3.0)
        nvalid = torch.tensor([rows], dtype=torch.int32, device=device)
        logits = torch.empty(rows, v, dtype=torch.float32, device=device)
        tokens = torch.empty(rows, dtype=torch.int64, device=device)
        fns = {
            "fused": lambda k: lm_head(x, nw, lms[k % nc], nvalid, eps, logits_out=logits, tokens_out=tokens,
                                       workspace=ws, plan=plan_lm, use_pdl=True),
            "reference_graph": lambda k: ref_lm.lm_head(x, nw, lms[k % nc], eps, rows),
            "reference_compile_graph": lambda k: clm(x, nw, lms[k % nc], eps, rows),
        }
        nbytes = v * h * 2 + _nbytes(x, logits, tokens)
        for var in variants:
            if var in fns:
                run("lm_head", rows, var, fns, max(nc, MIN_LAUNCHES), nbytes)
    del lms


# ------------------------------------------------------------------------------------------ step
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


def _torch_step_fns(cfg, weights, ctx: int, rope_cos, rope_sin, compiled: bool):
    """A plain-PyTorch decode step from the reference pieces, capturable (no host syncs): attention
    over a fixed C = ctx + 1 page-table columns with a causal mask instead of paged_attention's
    data-dependent length. Returns step(case) -> logits; compiled pieces when `compiled`."""
    import torch
    import torch.nn.functional as F

    from lowlat.reference.mlp import swiglu_mlp
    from lowlat.reference.rms_norm import rms_norm
    from lowlat.reference.rope import apply_rope

    d, eps, c = cfg.head_dim, cfg.rms_eps, ctx + 1

    def pre(x, attn_norm, wq, wk, wv, cos, sin):
        m = x.shape[0]
        hn = rms_norm(x, attn_norm, eps)
        q = apply_rope(F.linear(hn, wq).view(m, -1, d), cos, sin)
        k = apply_rope(F.linear(hn, wk).view(m, -1, d), cos, sin)
        return q, k, F.linear(hn, wv).view(m, -1, d)

    def post(x, q, k_cache, v_cache, slots, visible, wo, mlp_norm, wg, wu, wd):
        m, hq, _ = q.shape
        kk, vv = k_cache[slots], v_cache[slots]                              # [M, C, Hkv, D]
        grp = hq // kk.shape[2]
        kk, vv = kk.repeat_interleave(grp, dim=2), vv.repeat_interleave(grp, dim=2)
        s = torch.einsum("mhd,mchd->mhc", q, kk) * d ** -0.5
        s = s.masked_fill(~visible[:, None, :], float("-inf"))
        p = torch.softmax(s.float(), dim=-1).to(q.dtype)
        o = torch.einsum("mhc,mchd->mhd", p, vv).reshape(m, -1)
        x = x + F.linear(o, wo)
        return x + swiglu_mlp(rms_norm(x, mlp_norm, eps), wg, wu, wd)

    def head(x, final_norm, lm):
        return F.linear(rms_norm(x, final_norm, eps), lm).float()

    if compiled:
        pre, post, head = (torch.compile(f, dynamic=True) for f in (pre, post, head))

    def step(case) -> torch.Tensor:
        st, kc, vc = case.step, case.kv.k_caches, case.kv.v_caches
        x = weights.embed[st.input_ids]
        cos, sin = rope_cos[st.positions], rope_sin[st.positions]
        slots = case.page_table[st.req_indices.long(), :c].long()
        visible = torch.arange(c, device=x.device)[None, :] <= st.positions[:, None]
        loc = st.out_cache_loc.long()
        for i, lw in enumerate(weights.layers):
            q, k, v = pre(x, lw.attn_norm, lw.wq, lw.wk, lw.wv, cos, sin)
            kc[i][loc] = k
            vc[i][loc] = v
            x = post(x, q, kc[i], vc[i], slots, visible, lw.wo, lw.mlp_norm, lw.w_gate, lw.w_up, lw.w_down)
        return head(x, weights.final_norm, weights.lm_head)

    return step


def bench_step(cfg, model: str, weights, rows_list, ctx: int, device, bw, rec: _Recorder, budget: _Budget, *,
               compiled: bool, fused: bool = True, eager_reference: bool = True) -> None:
    import torch

    from lowlat.reference.rope import rope_cos_sin, rope_inv_freq
    from lowlat.runtime.fused_model import FusedModel

    rows_max = max(rows_list)
    slots = 1 + rows_max * (ctx + 1) + 1
    shape = (slots, cfg.num_kv_heads, cfg.head_dim)
    g = torch.Generator(device=device).manual_seed(7)
    KV = SimpleNamespace(
        k_caches=[torch.randn(shape, generator=g, device=device).to(torch.bfloat16) for _ in range(cfg.num_layers)],
        v_caches=[torch.randn(shape, generator=g, device=device).to(torch.bfloat16) for _ in range(cfg.num_layers)])

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
                us = _replay_time_us(fm._graphs[rows], iters=20, warmup=3)
                nbytes = _step_bytes(cfg, weights, rows, ctx)
                rec.add(section="step", model=model, op="decode_step", rows=rows, ctx=ctx, variant="fused", us=us,
                        bytes=nbytes, floor_us=nbytes / (bw * 1e9) * 1e6, pdl=fm.use_pdl)
            except Exception as e:                                          # noqa: BLE001
                rec.error(where, e)
        del fm
        torch.cuda.empty_cache()

    inv = rope_inv_freq(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling, torch.float32).to(device)
    cos, sin = rope_cos_sin(torch.arange(ctx + 2, device=device), inv, torch.bfloat16)
    for comp in ([False] if eager_reference else []) + ([True] if compiled else []):
        variant = "reference_compile_graph" if comp else "reference_graph"
        try:
            step = _torch_step_fns(cfg, weights, ctx, cos, sin, comp)
        except Exception as e:                                              # noqa: BLE001
            rec.error(f"{model}/step/{variant}", e)
            continue
        for rows in rows_list:
            where = f"{model}/step/rows={rows}/{variant}"
            if budget.left() < (40 if comp and rows == rows_list[0] else 10):
                rec.skip(where, "time budget")
                continue
            try:
                case = _DecodeCase(cfg, rows, ctx, device, KV)
                us = _graph_time_us(lambda _: step(case), 1, iters=20)
                nbytes = _step_bytes(cfg, weights, rows, ctx)
                rec.add(section="step", model=model, op="decode_step", rows=rows, ctx=ctx, variant=variant, us=us,
                        bytes=nbytes, floor_us=nbytes / (bw * 1e9) * 1e6)
            except Exception as e:                                          # noqa: BLE001
                rec.error(where, e)


def bench_moe_layer(rows_list, ctx: int, device, bw, rec: _Recorder, budget: _Budget) -> None:
    """One Qwen3-30B-A3B layer (attention + MoE) through FusedModel, LM head excluded."""
    import torch

    from lowlat.config import preset
    from lowlat.runtime.fused_model import FusedModel

    model = "Qwen3-30B-A3B(1 layer)"
    cfg = preset("Qwen3-30B-A3B").replace(num_layers=1)
    w = random_weights_on_device(cfg, device, seed=3)
    slots = 1 + max(rows_list) * (ctx + 1) + 1
    shape = (slots, cfg.num_kv_heads, cfg.head_dim)

    KV = SimpleNamespace(k_caches=[torch.randn(shape, device=device).to(torch.bfloat16)],
                         v_caches=[torch.randn(shape, device=device).to(torch.bfloat16)])

    fm = FusedModel(cfg, w, device=device, widths=tuple(sorted(rows_list)), validate=False)
    lw = w.layers[0]
    attn_bytes = _nbytes(lw.attn_norm, lw.wq, lw.wk, lw.wv, lw.wo, lw.mlp_norm, lw.q_norm, lw.k_norm, lw.router)
    expert_bytes = 3 * cfg.moe_intermediate_size * cfg.hidden_size * 2
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
            us = _graph_time_us(lambda _: fm._run(bufs, KV.k_caches, KV.v_caches, include_lm_head=False), 1, iters=20)
            nbytes = attn_bytes + active * expert_bytes + rows * (ctx + 2) * 2 * cfg.kv_size * 2 + 4 * rows * cfg.hidden_size
            rec.add(section="moe", model=model, op="layer", rows=rows, ctx=ctx, variant="fused", us=us, bytes=nbytes,
                    floor_us=nbytes / (bw * 1e9) * 1e6, active_experts=active)
        except Exception as e:                                              # noqa: BLE001
            rec.error(where, e)


# ------------------------------------------------------------------------------------------ driver
def run(args: argparse.Namespace) -> int:
    import torch
    import triton

    if not torch.cuda.is_available():
        print("lowlat bench needs a CUDA GPU", file=sys.stderr)
        return 2
    dev = torch.device("cuda", torch.cuda.current_device())
    props = torch.cuda.get_device_properties(dev)
    sections = [s.strip() for s in args.sections.split(",") if s.strip()]
    bad = [s for s in sections if s not in SECTIONS]
    if bad:
        print(f"unknown sections {bad}; known: {SECTIONS}", file=sys.stderr)
        return 2
    rows_list = [int(r) for r in args.rows.split(",")]
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    meta = dict(
        device=props.name, sm_count=props.multi_processor_count,
        l2_bytes=getattr(props, "L2_cache_size", None), capability=f"sm_{props.major}{props.minor}",
        torch=torch.__version__, triton=triton.__version__, cuda=torch.version.cuda,
        date=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        command=" ".join(getattr(sys, "orig_argv", sys.argv)),
        rows=rows_list, ctx=args.ctx, models=models, sections=sections,
        method=("CUDA-graph replays timed with CUDA events, median; per-kernel graphs rotate over >= 192 MB of "
                "weight copies (cold L2); floor = bytes / measured copy bandwidth (read + write)"))
    rec = _Recorder(args.out, meta)
    budget = _Budget(args.budget_s)
    print(f"[bench] {props.name}, torch {torch.__version__}, triton {triton.__version__}", flush=True)
    bw = copy_bandwidth_GBps(dev)
    rec.doc["copy_bandwidth_GBps"] = round(bw, 1)
    print(f"[bench] copy bandwidth {bw:.0f} GB/s (read + write)", flush=True)
    rec.save()

    from lowlat.config import preset

    # priority order (a run cut short by the budget keeps the most important numbers): every
    # model's step and kernels (fused and reference graph), the first model's torch.compile step,
    # the MoE layer, then the remaining torch.compile references (compiling costs the most time)
    order: list[tuple[str, str | None]] = []
    for model in models:
        order += [(t, model) for t in ("step", "kernels") if t in sections]
    if "compiled" in sections and "step" in sections:
        order.append(("compiled_step", models[0]))
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
                bench_step(preset(model), model, w, rows_list, args.ctx, dev, bw, rec, budget, compiled=False)
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
                bench_moe_layer(rows_list, args.ctx, dev, bw, rec, budget)
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


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", default=None, help="JSON path (rewritten after every entry)")
    p.add_argument("--models", default=",".join(DEFAULT_MODELS), help="comma-separated presets")
    p.add_argument("--rows", default=",".join(map(str, DEFAULT_ROWS)))
    p.add_argument("--ctx", type=int, default=512, help="cached tokens per request in the step benchmark")
    p.add_argument("--sections", default=",".join(SECTIONS), help=f"comma-separated subset of {SECTIONS}")
    p.add_argument("--budget-s", type=float, default=600.0, help="stop starting new entries after this many s")


def add_subparser(sub) -> None:
    """Register `lowlat bench` on the CLI's subparsers (lowlat/cli.py `_EXTRA_COMMANDS`)."""
    b = sub.add_parser("bench", help="time the fused kernels and decode step vs PyTorch (needs a GPU)")
    add_arguments(b)
    b.set_defaults(func=run)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m lowlat.bench", description=__doc__.splitlines()[0])
    add_arguments(p)
    return run(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
