"""The benchmarks' plain-PyTorch decode step (`lowlat.bench._torch_step_fns`, the baseline the fused step is
timed against, capturable: masked fixed-context attention, gathered-weights MoE) computes what the
reference model computes. Float64 weights, so both sides differ only by summation order: tolerance 1e-9
relative to the largest logit."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from lowlat.bench import _DecodeCase, _torch_step_fns, random_weights_on_device
from lowlat.reference.model import ReferenceModel
from lowlat.reference.rope import rope_cos_sin, rope_inv_freq
from lowlat.testing import tiny_config

CONFIGS = {
    "dense": dict(),
    "moe_qk_norm": dict(architecture="Qwen3MoeForCausalLM", qk_norm=True, num_experts=8, top_k=3,
                        moe_intermediate_size=32, norm_topk_prob=True),
    "moe_no_renorm": dict(num_experts=6, top_k=2, moe_intermediate_size=24, norm_topk_prob=False),
    "dense_qkv_bias": dict(qkv_bias=True),                                   # Qwen2 / Qwen2.5
    "moe_shared_expert": dict(num_experts=4, top_k=2, moe_intermediate_size=16, norm_topk_prob=False,
                              shared_expert_intermediate_size=24),           # Qwen2-MoE
}


@pytest.mark.parametrize("name", sorted(CONFIGS))
@pytest.mark.parametrize("rows", [1, 5])
def test_torch_step_matches_reference_model(name, rows):
    cfg = tiny_config(**CONFIGS[name])
    ctx = 7
    w = random_weights_on_device(cfg, "cpu", seed=rows).map(lambda t: t.double())
    slots = 1 + rows * (ctx + 1) + 1
    g = torch.Generator().manual_seed(5)
    shape = (slots, cfg.num_kv_heads, cfg.head_dim)
    k0 = [torch.randn(shape, generator=g, dtype=torch.float64) for _ in range(cfg.num_layers)]
    v0 = [torch.randn(shape, generator=g, dtype=torch.float64) for _ in range(cfg.num_layers)]
    kv = SimpleNamespace(k_caches=[t.clone() for t in k0], v_caches=[t.clone() for t in v0])
    case = _DecodeCase(cfg, rows, ctx, "cpu", kv)

    inv = rope_inv_freq(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling, torch.float64)
    cos, sin = rope_cos_sin(torch.arange(ctx + 2), inv, torch.float64)
    got = _torch_step_fns(cfg, w, ctx, cos, sin, compiled=False)(case)

    k1, v1 = [t.clone() for t in k0], [t.clone() for t in v0]
    want = ReferenceModel(cfg, w).forward(case.step, k1, v1)
    assert torch.isfinite(got).all()
    tol = 1e-9 * want.abs().max().item()
    assert (got - want).abs().max().item() <= tol
    for a, b, before in zip(kv.k_caches + kv.v_caches, k1 + v1, k0 + v0):    # the same KV writes
        assert not torch.equal(b, before)
        assert (a - b).abs().max().item() <= 1e-12 * b.abs().max().item()


def test_torch_step_without_lm_head_returns_hidden_state():
    cfg = tiny_config(num_experts=4, top_k=2, moe_intermediate_size=16)
    w = random_weights_on_device(cfg, "cpu").map(lambda t: t.double())
    kv = SimpleNamespace(k_caches=[torch.randn(20, 2, 16, dtype=torch.float64) for _ in range(2)],
                         v_caches=[torch.randn(20, 2, 16, dtype=torch.float64) for _ in range(2)])
    case = _DecodeCase(cfg, 2, 3, "cpu", kv)
    inv = rope_inv_freq(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling, torch.float64)
    cos, sin = rope_cos_sin(torch.arange(5), inv, torch.float64)
    x = _torch_step_fns(cfg, w, 3, cos, sin, compiled=False, lm_head=False)(case)
    assert x.shape == (2, cfg.hidden_size)


def test_bench_torch_steps_times_every_width_and_records_failures(monkeypatch):
    """The bench driver loop around `_torch_step_fns` (CPU: the graph timer replaced by one eager call):
    one record per width, and a failing width is recorded as an error while the others go on."""
    import lowlat.bench as bench
    from lowlat.benchmarking import Budget

    cfg = tiny_config(num_experts=4, top_k=2, moe_intermediate_size=16)
    w = random_weights_on_device(cfg, "cpu")
    kv = SimpleNamespace(k_caches=[torch.randn(64, 2, 16).bfloat16() for _ in range(2)],
                         v_caches=[torch.randn(64, 2, 16).bfloat16() for _ in range(2)])
    monkeypatch.setattr(bench, "graph_time_us", lambda fn, n, iters: (fn(0), 7.0)[1])
    errors, got = [], []
    rec = SimpleNamespace(error=lambda where, e: errors.append(where), skip=lambda where, why: None)
    bench._bench_torch_steps(cfg, w, [1, 99, 3], 4, "cpu", kv, rec, Budget(600), variants=(False,),
                             where_prefix="tiny", lm_head=False, record=lambda r, v, us: got.append((r, v, us)))
    assert got == [(1, "reference_graph", 7.0), (3, "reference_graph", 7.0)]      # the width after the failure too
    assert errors == ["tiny/rows=99/reference_graph"]          # 99 rows x 5 slots do not fit 64 slots
