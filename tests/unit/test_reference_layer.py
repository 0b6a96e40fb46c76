"""Decoder layer, tensor-parallel view and MoE reference properties."""

import dataclasses

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from lowlat.config import preset
from lowlat.errors import UnsupportedConfigError
from lowlat.numerics import check_accuracy, check_bitwise
from lowlat.reference.layer import decoder_layer
from lowlat.reference.mlp import swiglu_mlp
from lowlat.reference.moe import moe_experts, route_topk
from lowlat.reference.rope import rope_cos_sin, rope_inv_freq
from lowlat.reference.tp import shard_layer, tp_decoder_layer
from lowlat.testing import pad_step, random_step, tiny_config
from lowlat.weights import random_layer_weights


def _layer_inputs(cfg, seed, ctxs, rows, dtype=torch.bfloat16):
    g = torch.Generator().manual_seed(seed)
    lw = random_layer_weights(cfg, generator=g)
    case = random_step(ctx_lens=ctxs, new_rows=rows, num_kv_heads=cfg.num_kv_heads, head_dim=cfg.head_dim,
                       generator=g)
    x = torch.randn(case.step.num_rows, cfg.hidden_size, generator=g).to(dtype)
    inv = rope_inv_freq(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling)
    cos, sin = rope_cos_sin(case.step.positions, inv, dtype)
    return lw, case, x, cos, sin


def _run(cfg, lw, case, x, cos, sin, world=None, dtype=torch.bfloat16):
    kc, vc = case.k_cache.clone().to(dtype), case.v_cache.clone().to(dtype)
    if world is None:
        return decoder_layer(cfg, lw, x, case.step, kc, vc, cos, sin), kc
    return tp_decoder_layer(cfg, shard_layer(cfg, lw, world), x, case.step, kc, vc, cos, sin), kc


SMOL_LAYER = preset("SmolLM2-135M")


@pytest.mark.parametrize("world", [1, 3])
@given(seed=st.integers(0, 2**16), ctx=st.integers(0, 24))
def test_tp_view_equals_unsharded_layer_and_is_deterministic(world, seed, ctx):
    """SmolLM2-shaped layer (3 KV heads, I 1536) sharded over world ranks vs the unsharded layer:
    within the policy against the float64 oracle, bitwise run to run, same KV writes."""
    cfg = SMOL_LAYER
    lw, case, x, cos, sin = _layer_inputs(cfg, seed, [ctx, 3], [1, 2])
    tp, kc_tp = _run(cfg, lw, case, x, cos, sin, world)
    again, _ = _run(cfg, lw, case, x, cos, sin, world)
    check_bitwise("tp_layer", tp, again, output="run_to_run")
    base, kc = _run(cfg, lw, case, x, cos, sin)
    to64 = lambda t: t.double()  # noqa: E731
    oracle, _ = _run(cfg, lw.map(to64), case, x.double(), cos.double(), sin.double(), dtype=torch.float64)
    check_accuracy("tp_layer", tp, oracle, base)
    n = case.step.num_valid_rows
    check_bitwise("tp_layer", kc_tp[case.step.out_cache_loc[:n].long()], kc[case.step.out_cache_loc[:n].long()],
                  output="kv_writes")


def test_tp_refuses_world_not_dividing_kv_heads():
    cfg = tiny_config()
    lw = random_layer_weights(cfg, generator=torch.Generator().manual_seed(0))
    with pytest.raises(UnsupportedConfigError, match="tp_size"):
        shard_layer(cfg, lw, 3)


@given(experts=st.sampled_from([2, 3, 4, 6]), rows=st.integers(1, 9), seed=st.integers(0, 2**16))
def test_moe_split_from_dense_mlp_with_all_experts_and_unit_gates_equals_dense(experts, rows, seed):
    """Splitting the MLP's intermediate dim into E experts, all active with gate 1, is the dense MLP."""
    g = torch.Generator().manual_seed(seed)
    h, i = 48, 96
    x = torch.randn(rows, h, generator=g).double()
    wg, wu, wd = (torch.randn(i, h, generator=g).double() / h ** .5, torch.randn(i, h, generator=g).double() / h ** .5,
                  torch.randn(h, i, generator=g).double() / i ** .5)
    e_gate, e_up = wg.view(experts, i // experts, h), wu.view(experts, i // experts, h)
    e_down = wd.view(h, experts, i // experts).permute(1, 0, 2)
    bitmap = torch.ones(rows, experts, dtype=torch.bool)
    gates = torch.ones(rows, experts, dtype=torch.float64)
    split = moe_experts(x, bitmap, gates, e_gate, e_up, e_down)
    check_accuracy("moe", split, swiglu_mlp(x, wg, wu, wd), None, output="split_dense", dtype=torch.float32)


def test_route_topk_breaks_ties_to_lower_expert_and_ignores_padding():
    x = torch.ones(3, 4)
    router = torch.tensor([[1.0, 0, 0, 0], [2.0, 0, 0, 0], [1.0, 0, 0, 0], [2.0, 0, 0, 0], [0.5, 0, 0, 0]])
    bitmap, gates = route_topk(x, router, top_k=2, renormalize=True, num_valid_rows=2)
    assert bitmap[:2].tolist() == [[False, True, False, True, False]] * 2   # experts 1 and 3 tie; both chosen
    bitmap1, _ = route_topk(x, router, top_k=1, renormalize=False, num_valid_rows=2)
    assert bitmap1[0].nonzero().flatten().tolist() == [1]                    # tie 1 vs 3 -> lower index
    assert not bitmap[2].any() and not gates[2].any()                       # padding row routes nowhere
    torch.testing.assert_close(gates[:2].sum(-1), torch.ones(2))


@given(seed=st.integers(0, 2**16))
def test_moe_layer_padding_rows_never_enter_routing(seed):
    cfg = tiny_config(num_experts=4, top_k=2, moe_intermediate_size=32, intermediate_size=0,
                      architecture="Qwen3MoeForCausalLM", qk_norm=True)
    lw, case, x, cos, sin = _layer_inputs(cfg, seed, [5, 2], [1, 1])
    padded = dataclasses.replace(case, step=pad_step(case.step, 6))
    xp = torch.cat([x, torch.randn(4, cfg.hidden_size).bfloat16() * 100])
    inv = rope_inv_freq(cfg.head_dim, cfg.rope_theta)
    cp, sp = rope_cos_sin(padded.step.positions, inv, torch.bfloat16)
    out, _ = _run(cfg, lw, case, x, cos, sin)
    out_p, _ = _run(cfg, lw, padded, xp, cp, sp)
    check_bitwise("moe_layer", out_p[:2], out, output="padding_invariance")


@pytest.mark.parametrize("shared", [24, 21])
def test_tp_view_shards_the_shared_expert_or_refuses_a_world_not_dividing_it(shared):
    """MoE layer with an ungated shared expert over 2 ranks: equal to the unsharded layer (float64) when 2
    divides the shared width; refused when it does not (each rank's slice was width // world columns, so the
    last column of the shared expert was silently dropped: 0.18 off)."""
    cfg = tiny_config(num_experts=4, top_k=2, moe_intermediate_size=32, intermediate_size=0,
                      architecture="Qwen3MoeForCausalLM", shared_expert_intermediate_size=shared)
    lw, case, x, cos, sin = _layer_inputs(cfg, 5, [3, 0], [2, 1])
    to64 = lambda t: t.double()  # noqa: E731
    lw64, x64, cos64, sin64 = lw.map(to64), x.double(), cos.double(), sin.double()
    if shared % 2:
        with pytest.raises(UnsupportedConfigError, match="shared expert"):
            shard_layer(cfg, lw64, 2)
        return
    tp, kc_tp = _run(cfg, lw64, case, x64, cos64, sin64, world=2, dtype=torch.float64)
    full, kc = _run(cfg, lw64, case, x64, cos64, sin64, dtype=torch.float64)
    check_accuracy("tp_layer", tp, full, None, output="shared_expert", dtype=torch.float32)


@pytest.mark.parametrize("num_layers", [0, -1, 3, 2.0, True])
def test_reference_model_refuses_a_layer_count_outside_1_to_num_layers(num_layers):
    """hidden_states(num_layers=n) is the early-exit draft's spec (FusedModel refuses n outside 1..L); 0 ran
    every layer and -1 all but the last, silently. Refused before any KV write."""
    from lowlat.reference.model import ReferenceModel
    from lowlat.weights import random_model_weights

    cfg = tiny_config()
    ref = ReferenceModel(cfg, random_model_weights(cfg, seed=0))
    case = random_step(ctx_lens=[2], new_rows=[1], num_kv_heads=cfg.num_kv_heads, head_dim=cfg.head_dim,
                       vocab_size=cfg.vocab_size)
    kc = [case.k_cache.clone() for _ in range(cfg.num_layers)]
    vc = [case.v_cache.clone() for _ in range(cfg.num_layers)]
    with pytest.raises(ValueError, match="num_layers"):
        ref.hidden_states(case.step, kc, vc, num_layers)
    with pytest.raises(ValueError, match="num_layers"):
        ref.forward(case.step, kc, vc, num_layers=num_layers)
    assert all(torch.equal(k.nan_to_num(7.0), case.k_cache.nan_to_num(7.0)) for k in kc)
    one = ref.hidden_states(case.step, [k.clone() for k in kc], [v.clone() for v in vc], 1)
    every = ref.hidden_states(case.step, [k.clone() for k in kc], [v.clone() for v in vc], cfg.num_layers)
    check_bitwise("model", ref.hidden_states(case.step, kc, vc), every, output="num_layers_default")
    assert not torch.equal(one, every)
