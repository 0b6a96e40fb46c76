"""The fused decode step (lowlat.runtime.fused_model.FusedModel) vs lowlat.reference.model.ReferenceModel.

CPU (Triton interpreter, tiny random models): logits of mixed decode / verify / prefill-chunk steps
with padding within the numerics policy against the float64 oracle, KV written where the reference
writes it, padding rows 0, greedy generation through `Engine`, MoE layers through lowlat.kernels.moe,
refusals, and every kernel compiling for sm_90. Self-speculation: the early-exit forward and the draft
position (layers + final norm + draft sampler) against their reference pipeline, padding rows' sampling
parameters, LayerSkipDrafter's routes, greedy speculative decoding through draft positions == plain
greedy. GPU: CUDA-graph replay == eager bitwise (steps, early exits, draft positions; the last two also on a
Llama-3.2-1B-shape model, which runs the held prologue), greedy generation equal to the reference engine on a
random-weight SmolLM2-135M-shape model; one Qwen3-30B-A3B MoE layer: graph == eager bitwise, logits within the
policy.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch

from lowlat.config import preset
from lowlat.errors import StepContractError, UnsupportedConfigError
from lowlat.kernels.residual_gemv_held import held_residual_supported
from lowlat.numerics import check_accuracy, check_bitwise, oracle_cast
from lowlat.reference.model import ReferenceModel
from lowlat.runtime.engine import Engine, SamplingParams, reference_engine
from lowlat.runtime.fused_model import FOLD_MAX_WIDTH, FusedModel
from lowlat.runtime.kv_cache import KVCachePool
from lowlat.step import StepBatch
from lowlat.testing import random_step, tiny_config
from lowlat.weights import random_model_weights


def tiny(**kw):
    """The smallest config the fused kernels take (head_dim a multiple of 32)."""
    base = dict(head_dim=32, num_layers=1, intermediate_size=96, vocab_size=256)
    base.update(kw)
    return tiny_config(**base)


def layer_caches(case, num_layers: int, seed: int):
    """Per-layer K/V caches sharing `case`'s slot layout: owned slots random, the rest NaN."""
    g = torch.Generator().manual_seed(seed)
    ks, vs = [case.k_cache], [case.v_cache]
    for _ in range(1, num_layers):
        k, v = case.k_cache.clone(), case.v_cache.clone()
        own = ~torch.isnan(k)
        k[own] = torch.randn(int(own.sum()), generator=g).to(device=k.device, dtype=k.dtype)
        v[own] = torch.randn(int(own.sum()), generator=g).to(device=v.device, dtype=v.dtype)
        ks.append(k)
        vs.append(v)
    return ks, vs


def compare_step(cfg, weights, case, *, seed=0, widths=(1, 2, 4, 6, 8, 12, 16, 24, 32, 48), **fm_kw):
    """Run one step fused and through the reference (float64 oracle, bf16 baseline) on identical
    caches; check logits, padding rows, tokens, and the K/V the step wrote. The model runs on the device of
    `case`'s caches (`weights` are moved there)."""
    device = case.k_cache.device
    weights = weights.to(device=device)
    ks, vs = layer_caches(case, cfg.num_layers, seed)
    pool = SimpleNamespace(k_caches=[k.clone() for k in ks], v_caches=[v.clone() for v in vs])
    fm = FusedModel(cfg, weights, device=device, widths=widths, **fm_kw)
    logits = fm.forward(case.step, pool).clone()
    k64, v64 = [k.double() for k in ks], [v.double() for v in vs]
    oracle = ReferenceModel(cfg, weights.to(dtype=torch.float64)).forward(case.step, k64, v64)
    kb, vb = [k.clone() for k in ks], [v.clone() for v in vs]
    baseline = ReferenceModel(cfg, weights).forward(case.step, kb, vb)
    check_accuracy("fused_model", logits, oracle, baseline, output="logits")
    n = case.step.num_valid_rows
    assert bool((logits[n:] == 0).all()), "padding rows' logits must be 0"
    check_bitwise("fused_model", fm.last_tokens, torch.argmax(logits, dim=-1), output="tokens")
    loc = case.step.out_cache_loc[:n].long()
    for i in range(cfg.num_layers):
        check_accuracy("fused_model", pool.k_caches[i][loc], k64[i][loc], kb[i][loc], output="k_cache")
        check_accuracy("fused_model", pool.v_caches[i][loc], v64[i][loc], vb[i][loc], output="v_cache")
        untouched = torch.ones(ks[i].shape[0], dtype=torch.bool, device=device)
        untouched[loc] = False
        check_bitwise("fused_model", pool.k_caches[i][untouched].nan_to_num(7.0), ks[i][untouched].nan_to_num(7.0),
                      output="k_cache_untouched")
    return logits


def test_one_layer_decode_and_verify_rows_within_policy(device):
    cfg = tiny()
    w = random_model_weights(cfg, seed=1)
    case = random_step(ctx_lens=[5, 0, 12], new_rows=[1, 3, 1], num_kv_heads=cfg.num_kv_heads,
                       head_dim=cfg.head_dim, pad_to=6, vocab_size=cfg.vocab_size,
                       generator=torch.Generator().manual_seed(2), device=device)
    compare_step(cfg, w, case)


def test_two_layer_model_padded_to_width_within_policy(device):
    """7 rows padded to width 8: two decode rows and a 5-row prefill chunk, Qwen2-style QKV bias."""
    cfg = tiny(num_layers=2, qkv_bias=True)
    w = random_model_weights(cfg, seed=3)
    case = random_step(ctx_lens=[9, 2, 0], new_rows=[1, 1, 5], num_kv_heads=cfg.num_kv_heads,
                       head_dim=cfg.head_dim, vocab_size=cfg.vocab_size, generator=torch.Generator().manual_seed(4),
                       device=device)
    assert case.step.num_rows == 7
    logits = compare_step(cfg, w, case, seed=5, widths=(4, 8))
    assert logits.shape == (7, cfg.vocab_size)


def _split_out_proj_table(cfg, tmp_path, monkeypatch, split=2, down_split=None):
    """A plan table giving the dense out_proj (residual, H x q) a split-K plan, so FusedModel defers its reduction;
    with down_split the down projection (residual, H x I) too."""
    from lowlat.kernels import _gemv

    entries = []
    for k, s_ in ((cfg.q_size, split), (cfg.intermediate_size, down_split)):
        if s_ is not None:
            plan = _gemv.plan_gemv(cfg.hidden_size, k, kind="residual", split=s_, block_k=16)
            entries.append(dict(kind="residual", n=cfg.hidden_size, k=k, plan=plan.describe()))
    table = tmp_path / "plans.json"
    table.write_text(json.dumps(entries))
    monkeypatch.setenv("LOWLAT_GEMV_PLANS", str(table))


@pytest.mark.slow
@pytest.mark.interpreter
def test_deferred_out_proj_reduction_within_policy_and_same_bits_as_without(tmp_path, monkeypatch):
    """`FusedModel.defers`: up to `defer` rows a dense layer's out_proj with split-K stores its split partials and
    the gate/up launch reduces them (`out_proj.residual_gemv_deferred`). The step is within the policy of the
    reference, and its logits and KV are bitwise those of defer=0 (never) and, row for row, of a 24-row width."""
    cfg = tiny(num_layers=2)
    _split_out_proj_table(cfg, tmp_path, monkeypatch)
    w = random_model_weights(cfg, seed=3)
    case = random_step(ctx_lens=[9, 2, 0], new_rows=[1, 1, 5], num_kv_heads=cfg.num_kv_heads,
                       head_dim=cfg.head_dim, vocab_size=cfg.vocab_size, generator=torch.Generator().manual_seed(4))
    models = dict(on=FusedModel(cfg, w, device="cpu", widths=(8,), defer=8),
                  off=FusedModel(cfg, w, device="cpu", widths=(8,), defer=0),
                  wide=FusedModel(cfg, w, device="cpu", widths=(24,), defer=8))
    assert models["on"].plan_o.split == 2 and models["on"].defers(8)
    assert not models["off"].defers(8) and not models["wide"].defers(24)
    default = FusedModel(cfg, w, device="cpu", widths=(1, 2))       # DEFER_MAX_WIDTH: 1 row
    assert default.defers(1) and not default.defers(2)
    logits = compare_step(cfg, w, case, seed=5, widths=(8,), defer=8)
    ks, vs = layer_caches(case, cfg.num_layers, 5)
    on = same_steps(models, case, ks, vs, cfg.num_layers)
    check_bitwise("fused_model", on, logits, output="logits_rerun")


@pytest.mark.slow
@pytest.mark.interpreter
def test_deferred_down_reduction_within_policy_and_same_bits_as_without(tmp_path, monkeypatch):
    """`FusedModel.defers_down`: up to `defer_down` rows a dense layer's down projection with split-K stores its split
    partials and the next layer's attention prologue reduces them; the last layer never defers (its x feeds the LM
    head / final norm). With and without out_proj deferred too (the stream then alternates between x and x2 in
    different orders), 3 layers: within the policy of the reference, and logits and KV bitwise those of no deferral
    and of a 24-row width; the early-exit hidden states after 2 of 3 layers (layer 0 deferring, layer 1 the last
    run) bitwise those of no deferral."""
    cfg = tiny(num_layers=3)
    _split_out_proj_table(cfg, tmp_path, monkeypatch, down_split=3)
    w = random_model_weights(cfg, seed=3)
    case = random_step(ctx_lens=[9, 2, 0], new_rows=[1, 1, 5], num_kv_heads=cfg.num_kv_heads,
                       head_dim=cfg.head_dim, vocab_size=cfg.vocab_size, generator=torch.Generator().manual_seed(4))
    import lowlat.kernels.attn_prologue as ap
    from lowlat.kernels.out_proj import DeferredX

    fed = []                                   # per prologue launch: given the down's DeferredX?
    plain = ap.attn_prologue
    monkeypatch.setattr(ap, "attn_prologue", lambda x, *a, **k: fed.append(isinstance(x, DeferredX)) or plain(x, *a,
                                                                                                            **k))
    models = dict(on=FusedModel(cfg, w, device="cpu", widths=(8,), defer=8, defer_down=8),
                  down=FusedModel(cfg, w, device="cpu", widths=(8,), defer=0, defer_down=8),
                  off=FusedModel(cfg, w, device="cpu", widths=(8,), defer=0, defer_down=0),
                  wide=FusedModel(cfg, w, device="cpu", widths=(24,), defer=8, defer_down=8))
    assert models["on"].plan_down.split == 3 and models["on"].defers_down(8) and models["down"].defers_down(8)
    assert not models["down"].defers(8) and not models["off"].defers_down(8) and not models["wide"].defers_down(24)
    default = FusedModel(cfg, w, device="cpu", widths=(1, 2))       # by DEFER_DOWN_MAX_SM_BYTES: a tiny pre-pass
    assert default.defer_down is None and default.defers_down(1) and default.defers_down(2)
    logits = compare_step(cfg, w, case, seed=5, widths=(8,), defer=8, defer_down=8)
    assert fed == [False, True, True], fed     # layers 1 and 2 take layer 0's / 1's deferred down; the last none
    ks, vs = layer_caches(case, cfg.num_layers, 5)
    fed.clear()
    on = same_steps(models, case, ks, vs, cfg.num_layers)
    assert fed == [False, True, True] * 2 + [False] * 6, fed      # on, down deferring; off, wide not
    check_bitwise("fused_model", on, logits, output="logits_rerun")
    fed.clear()
    hidden = {name: models[name].early_exit_hidden(case.step, fresh_pool(ks, vs), 2) for name in ("on", "off")}
    assert fed == [False, True, False, False], fed                # 2 of 3 layers: layer 1 is the last run
    check_bitwise("fused_model", hidden["on"], hidden["off"], output="early_exit_hidden")


@pytest.mark.slow
@pytest.mark.interpreter
def test_folded_attention_combine_within_policy_and_same_bits_as_without(tmp_path, monkeypatch):
    """`FusedModel.folds`: up to `fold` rows the decode attention stores its split partials and the output projection
    combines them (`decode_attention(fold_combine=True)`); alone, and with both split-K reductions deferred too (the
    projection then both consumes the attention's partials and leaves its own to gate/up). 2 layers, rows with 0 to
    130 cached tokens (1-3 splits of 64-token blocks) and padding: within the policy of the reference, and logits
    and KV bitwise those of no fold and of a 24-row width (never folding); the early-exit hidden states after 1 of
    2 layers bitwise too. A spy counts the attention launches that folded."""
    import lowlat.kernels.decode_attention as da

    cfg = tiny(num_layers=2)
    _split_out_proj_table(cfg, tmp_path, monkeypatch, down_split=3)
    w = random_model_weights(cfg, seed=3)
    case = random_step(ctx_lens=[130, 2, 0, 70], new_rows=[1, 1, 5, 1], num_kv_heads=cfg.num_kv_heads,
                       head_dim=cfg.head_dim, vocab_size=cfg.vocab_size, pad_to=10,
                       generator=torch.Generator().manual_seed(4))
    folded = []
    plain = da.decode_attention
    monkeypatch.setattr(da, "decode_attention", lambda *a, **k: folded.append(bool(k.get("fold_combine"))) or
                        plain(*a, **k))
    models = dict(on=FusedModel(cfg, w, device="cpu", widths=(12,), fold=12, defer=12, defer_down=12),
                  fold=FusedModel(cfg, w, device="cpu", widths=(12,), fold=12, defer=0, defer_down=0),
                  off=FusedModel(cfg, w, device="cpu", widths=(12,), fold=0, defer=0, defer_down=0),
                  wide=FusedModel(cfg, w, device="cpu", widths=(24,), fold=12, defer=12, defer_down=12))
    assert models["on"].plan_o.split == 2 and models["on"].folds(12) and models["fold"].folds(12)
    assert not models["off"].folds(12) and not models["wide"].folds(24) and models["on"].fold == 12
    default = FusedModel(cfg, w, device="cpu", widths=(1, 2))
    assert [default.folds(r) for r in (1, 2)] == [r <= FOLD_MAX_WIDTH for r in (1, 2)]
    logits = compare_step(cfg, w, case, seed=5, widths=(12,), fold=12, defer=12, defer_down=12)
    assert folded == [True, True], folded
    ks, vs = layer_caches(case, cfg.num_layers, 5)
    folded.clear()
    on = same_steps(models, case, ks, vs, cfg.num_layers)
    assert folded == [True] * 4 + [False] * 4, folded
    check_bitwise("fused_model", on, logits, output="logits_rerun")
    hidden = {name: models[name].early_exit_hidden(case.step, fresh_pool(ks, vs), 1) for name in ("on", "off")}
    check_bitwise("fused_model", hidden["on"], hidden["off"], output="early_exit_hidden")


@pytest.mark.parametrize("model, widths", [
    ("Llama-3.2-1B", (1, 2)), ("SmolLM2-135M", (1, 2, 4, 6, 8, 12, 16, 24, 32, 48)),
    ("Qwen2.5-0.5B", (1, 2, 4, 6, 8)), ("Qwen3-0.6B", (1, 2, 4)), ("Qwen3-30B-A3B", ())])
def test_default_down_deferral_widths_by_prepass_bytes(model, widths):
    """The default rule (defer_down=None): the widths of DEFAULT_WIDTHS whose prologue pre-pass reads at most
    DEFER_DOWN_MAX_SM_BYTES of partials per SM (`down_prepass_sm_bytes`, from the production plans, 132 SMs):
    Llama-3.2-1B at 1-2 rows (23.3 KiB; 46.5 at 4, measured +0.8 us), SmolLM2-135M at every width (43.2 KiB at 48),
    Qwen2.5-0.5B up to 8 (48 KiB at 12, measured +1.7 us), Qwen3-0.6B up to 4 (46.5 KiB at 6), none for an MoE
    model (no down projection); none with the held prologue. NOTES sessions 21-22 have the measurements the bound was
    fitted to."""
    from lowlat.kernels._gemv import plan_gemv
    from lowlat.kernels.attn_prologue import make_prologue_workspace
    from lowlat.runtime.fused_model import (ASSUMED_SMS, DEFAULT_WIDTHS, DEFER_DOWN_MAX_SM_BYTES, down_prepass_bytes,
                                            down_prepass_sm_bytes)

    cfg = preset(model)
    if cfg.is_moe:
        assert FusedModel.defers_down(SimpleNamespace(cfg=cfg), 1) is False
        return
    qkv = torch.empty(cfg.q_size + 2 * cfg.kv_size, cfg.hidden_size, dtype=torch.bfloat16, device="meta")
    fm = SimpleNamespace(cfg=cfg, pro_ws=make_prologue_workspace(qkv, cfg.head_dim), _defer_down=None,
                         plan_down=plan_gemv(cfg.hidden_size, cfg.intermediate_size, kind="residual"),
                         num_sms=ASSUMED_SMS, held_prologue=False, cluster_prologue=False)
    assert fm.plan_down.split > 1 and ASSUMED_SMS == 132 and DEFER_DOWN_MAX_SM_BYTES == 44 << 10
    assert tuple(w for w in DEFAULT_WIDTHS if FusedModel.defers_down(fm, w)) == widths
    pro = fm.pro_ws.plan
    total = down_prepass_bytes(cfg, pro, fm.plan_down, 1)
    assert total == pro.n_tiles * cfg.hidden_size * fm.plan_down.split * 4
    programs = pro.n_tiles * pro.split
    assert down_prepass_sm_bytes(cfg, pro, fm.plan_down, 1, ASSUMED_SMS) == total / min(programs, ASSUMED_SMS)
    assert down_prepass_sm_bytes(cfg, pro, fm.plan_down, 1, 1) == total            # one SM reads it all
    with pytest.raises(ValueError, match="num_sms=0"):
        down_prepass_sm_bytes(cfg, pro, fm.plan_down, 1, 0)
    fm.num_sms = 1                             # fewer SMs, more bytes each: never more widths
    assert set(w for w in DEFAULT_WIDTHS if FusedModel.defers_down(fm, w)) <= set(widths)
    fm._defer_down = 0
    assert not any(FusedModel.defers_down(fm, w) for w in DEFAULT_WIDTHS)
    fm._defer_down = 24
    assert tuple(w for w in DEFAULT_WIDTHS if FusedModel.defers_down(fm, w)) == (1, 2, 4, 6, 8, 12, 16, 24)
    fm.held_prologue = True                    # the held prologue takes no deferred input (session 25)
    assert not any(FusedModel.defers_down(fm, w) for w in DEFAULT_WIDTHS)


def same_steps(models: dict, case, ks, vs, num_layers: int, tag: str = ""):
    """Run the step of `case` with every model in `models` (keys "on" and any others) on copies of the caches ks / vs;
    check the logits and every layer's K / V of the others bitwise those of "on"; return "on"'s logits."""
    runs = {}
    for name, fm in models.items():
        pool = fresh_pool(ks, vs)
        runs[name] = (fm.forward(case.step, pool).clone(), pool)
    for name in (n for n in runs if n != "on"):
        check_bitwise("fused_model", runs[name][0], runs["on"][0], output=f"logits_{name}{tag}")
        for i in range(num_layers):
            for kind in ("k_caches", "v_caches"):
                check_bitwise("fused_model", getattr(runs[name][1], kind)[i].nan_to_num(7.0),
                              getattr(runs["on"][1], kind)[i].nan_to_num(7.0), output=f"{kind}_{name}{tag}")
    return runs["on"][0]


def assert_tokens_equal_or_near_tie(cfg, weights, device, prompts, got, want, *, slots=64, ctx=32):
    """Token for token, except that a flip is accepted at a near-tie: where the float32 reference's
    top-2 margin is within twice the fused step's measured logit error on that same prefix (nothing
    is compared after a flip). Returns the number of prompts that match exactly."""
    exact = 0
    for g, r, p in zip(got, want, prompts):
        if g == r:
            exact += 1
            continue
        k = next(j for j, (a, b) in enumerate(zip(g, r)) if a != b)
        prefix = p + r[:k]
        ref = reference_engine(cfg, weights, num_slots=slots, max_reqs=2, max_ctx=ctx, device=device,
                               compute_dtype=torch.float32)
        ref_last = ref.prefill(ref.add_request(prefix))
        fused = Engine(cfg, FusedModel(cfg, weights, device=device),
                       KVCachePool(cfg, num_slots=slots, max_reqs=2, max_ctx=ctx, device=device))
        fused_last = fused.prefill(fused.add_request(prefix))
        err = float((fused_last - ref_last).abs().max())
        top2 = ref_last.topk(2).values
        margin = float(top2[0] - top2[1])
        assert margin <= 2 * err, (f"prompt {p}: fused {g} vs reference {r} differ at token {k}, but the "
                                   f"reference's top-2 margin {margin:.3e} exceeds 2x the logit error {err:.3e}")
    return exact


@pytest.mark.interpreter
def test_engine_greedy_generation_matches_reference_engine():
    """`Engine(cfg, FusedModel(...), pool)` runs a batch of two prompts (prefill chunks, then shared
    decode steps padded to a width); its greedy tokens equal the reference engine's."""
    cfg = tiny(vocab_size=128)
    w = random_model_weights(cfg, seed=6)
    prompts = [[3, 17, 99, 4, 8], [42, 7]]
    params = SamplingParams(max_new_tokens=3, ignore_eos=True)
    pool = KVCachePool(cfg, num_slots=64, max_reqs=4, max_ctx=32)
    fused = Engine(cfg, FusedModel(cfg, w, device="cpu"), pool)
    got = [r.output_ids for r in fused.generate(prompts, params)]
    assert all(len(g) == 3 for g in got)
    assert fused.pool.free_slots == 63, "the engine frees every KV slot after generation"
    want = [r.output_ids for r in reference_engine(cfg, w, num_slots=64, max_reqs=4, max_ctx=32).generate(
        prompts, params)]
    assert_tokens_equal_or_near_tie(cfg, w, "cpu", prompts, got, want)


@pytest.mark.parametrize("moe_out_proj", ["split_k", "norm_epilogue"])
def test_moe_layer_runs_through_moe_kernels(device, moe_out_proj):
    """An MoE config (4 experts, top-2) goes through lowlat.kernels.moe and matches the reference: with the split-K
    residual GEMV and the RMSNorm in the MoE's router launch (from whole rows of x), and with out_proj's RMSNorm
    epilogue (what "auto", the default, runs where the held GEMV is not supported: the CPU here)."""
    cfg = tiny(num_experts=4, top_k=2, moe_intermediate_size=32, architecture="Qwen3MoeForCausalLM",
               qk_norm=True)
    w = random_model_weights(cfg, seed=7)
    case = random_step(ctx_lens=[3, 6], new_rows=[1, 1], num_kv_heads=cfg.num_kv_heads, head_dim=cfg.head_dim,
                       pad_to=4, vocab_size=cfg.vocab_size, generator=torch.Generator().manual_seed(8), device=device)
    compare_step(cfg, w, case, widths=(4,), moe_out_proj=moe_out_proj)


def test_bad_step_raises_before_any_kv_write():
    cfg = tiny()
    w = random_model_weights(cfg, seed=9)
    case = random_step(ctx_lens=[4], new_rows=[2], num_kv_heads=cfg.num_kv_heads, head_dim=cfg.head_dim,
                       vocab_size=cfg.vocab_size)
    pool = SimpleNamespace(k_caches=[case.k_cache.clone()], v_caches=[case.v_cache.clone()])
    s = case.step
    bad = StepBatch(s.input_ids.clone(), s.positions.clone(), s.out_cache_loc.clone(), s.req_indices,
                    s.seq_lens, s.page_table, s.num_valid_rows)
    bad.input_ids[1] = cfg.vocab_size + 5
    fm = FusedModel(cfg, w, device="cpu")
    with pytest.raises(StepContractError, match=r"input_ids\[1\]=261"):
        fm.forward(bad, pool)
    check_bitwise("fused_model", pool.k_caches[0].nan_to_num(7.0), case.k_cache.nan_to_num(7.0), output="k_cache")
    big = random_step(ctx_lens=[0], new_rows=[49], num_kv_heads=cfg.num_kv_heads, head_dim=cfg.head_dim,
                      vocab_size=cfg.vocab_size)
    with pytest.raises(StepContractError, match="49"):
        fm.forward(big.step, SimpleNamespace(k_caches=[big.k_cache], v_caches=[big.v_cache]))


@pytest.mark.interpreter
def test_a_pool_with_a_bad_later_layer_is_refused_before_any_kv_write():
    """Every layer's K and V cache must be bf16, on the model's device, of layer 0's shape: a float32 (or
    resized) layer 1 is refused before layer 0's K/V is written (only layer 0 was checked before)."""
    cfg = tiny(num_layers=2)
    w = random_model_weights(cfg, seed=9)
    case, ks, vs = _early_exit_case(cfg, 9)
    fm = FusedModel(cfg, w, device="cpu", widths=(4,))
    for bad, what in ((lambda t: t.float(), "float32"), (lambda t: t[:-1].clone(), "bfloat16")):
        pool = SimpleNamespace(k_caches=[k.clone() for k in ks], v_caches=[vs[0].clone(), bad(vs[1])])
        with pytest.raises(StepContractError, match=f"layer 1's V cache is torch.{what}"):
            fm.forward(case.step, pool)
        check_bitwise("fused_model", pool.k_caches[0].nan_to_num(7.0), ks[0].nan_to_num(7.0), output="k_cache")
        check_bitwise("fused_model", pool.v_caches[0].nan_to_num(7.0), vs[0].nan_to_num(7.0), output="v_cache")
    pool = fresh_pool(ks, vs)                          # a good pool after the refusals still runs
    fm.forward(case.step, pool)


def test_unsupported_configs_are_refused():
    for bad in (True, -1, 49, 1.0):
        for arg in ("defer", "defer_down", "fold"):
            with pytest.raises(StepContractError, match=rf"^{arg}={bad!r} must be an int in 0\.\.48"):
                FusedModel(tiny(), random_model_weights(tiny(), seed=0), device="cpu", **{arg: bad})
    for bad in ("out_proj", "Auto", "auto ", b"auto", ("auto",), {"auto"}, {"down": False}, ("out_proj", "gate_up"),
                ("prologue",), True, None, 1, (n for n in ("down",)), (1,)):
        with pytest.raises(StepContractError, match=r"^early_release=.* must be 'auto' or a sequence of names in"):
            FusedModel(tiny(), random_model_weights(tiny(), seed=0), device="cpu", early_release=bad)
    for names in (("attn_prologue",), ["down", "attn_prologue"]):        # the split-K prologue: never released early
        with pytest.raises(StepContractError, match=r"^early_release names 'attn_prologue', which only the held "
                                                    r"prologue does; this model runs the split-K prologue "
                                                    r"\(hidden_size 64"):
            FusedModel(tiny(), random_model_weights(tiny(), seed=0), device="cpu", early_release=names)
    for bad in ("on", "Auto", 1, 0, None, ("auto",)):
        with pytest.raises(StepContractError, match=r"^held_prologue=.* must be 'auto', True or False"):
            FusedModel(tiny(), random_model_weights(tiny(), seed=0), device="cpu", held_prologue=bad)
    with pytest.raises(UnsupportedConfigError, match=r"held_prologue=True: hidden_size 64"):
        FusedModel(tiny(), random_model_weights(tiny(), seed=0), device="cpu", held_prologue=True)
    wide = tiny(hidden_size=256)
    with pytest.raises(UnsupportedConfigError, match=r"held_prologue=True: device cpu"):     # Gluon: GPU only
        FusedModel(wide, random_model_weights(wide, seed=0), device="cpu", held_prologue=True)
    for arg in ("auto", False):                  # where it cannot run, "auto" runs the split-K prologue
        assert not FusedModel(tiny(), random_model_weights(tiny(), seed=0), device="cpu",
                              held_prologue=arg).held_prologue


def test_held_prologue_choice_and_an_explicit_down_deferral(monkeypatch):
    """Where the held prologue could run (`held_prologue_supported` patched to allow the CPU: the model is only built,
    never run): "auto" takes it, stores the QKV weights packed, or folded with the norm weight where HELD_FOLD is
    "build" (the default "registers" multiplies it in the kernel), defers no down; an explicit
    defer_down > 0 (it needs the split-K prologue's DeferredX input) turns "auto" off and is refused with True;
    False never takes it."""
    from lowlat.kernels.attn_prologue import pack_qkv
    from lowlat.kernels.attn_prologue_held import fold_attn_norm
    from lowlat.runtime import fused_model

    monkeypatch.setattr(fused_model, "held_prologue_supported", lambda cfg, device: None)
    cfg = tiny(hidden_size=256, intermediate_size=1024)
    w = random_model_weights(cfg, seed=0)
    held = FusedModel(cfg, w, device="cpu", widths=(1, 2))
    assert held.held_prologue and not held.defers_down(1)
    lw = w.layers[0]
    assert fused_model.HELD_FOLD == "registers" and not held._held_folded
    assert torch.equal(held.layers[0].qkv, pack_qkv(lw))
    monkeypatch.setattr(fused_model, "HELD_FOLD", "build")
    folded = FusedModel(cfg, w, device="cpu", widths=(1, 2))
    assert folded._held_folded and torch.equal(folded.layers[0].qkv, fold_attn_norm(pack_qkv(lw), lw.attn_norm))
    monkeypatch.setattr(fused_model, "HELD_FOLD", "fold")
    with pytest.raises(StepContractError, match="HELD_FOLD='fold'"):
        FusedModel(cfg, w, device="cpu", widths=(1, 2))
    monkeypatch.setattr(fused_model, "HELD_FOLD", "registers")
    split = FusedModel(cfg, w, device="cpu", widths=(1, 2), defer_down=16)
    assert not split.held_prologue and split.defers_down(1) and torch.equal(split.layers[0].qkv, pack_qkv(lw))
    assert not FusedModel(cfg, w, device="cpu", widths=(1,), held_prologue=False).held_prologue
    assert FusedModel(cfg, w, device="cpu", widths=(1,), defer_down=0).held_prologue
    with pytest.raises(StepContractError, match=r"held_prologue=True cannot take defer_down=16"):
        FusedModel(cfg, w, device="cpu", widths=(1,), held_prologue=True, defer_down=16)
    with pytest.raises(UnsupportedConfigError, match="head_dim"):
        FusedModel(tiny(head_dim=16), random_model_weights(tiny(head_dim=16), seed=0), device="cpu")
    with pytest.raises(StepContractError, match="widths"):
        FusedModel(tiny(), random_model_weights(tiny(), seed=0), device="cpu", widths=(1, 64))


def test_cluster_prologue_choice_refusals_and_folded_weights(monkeypatch):
    """cluster_prologue (QK-norm models): off by default; anything but "auto" / True / False refused; "auto" on only
    for MoE models where supported, every width <= CLUSTER_AUTO_MAX_WIDTH and no defer_down asked for (the refusal of
    early_release's "attn_prologue" names the prologue "auto" resolved to); where True cannot run the reason
    is named (on the CPU the device's; a Llama-family model's its missing QK-norm); where it could
    (`cluster_prologue_supported` patched to allow the CPU: the model is only built) the QKV weights are stored folded
    with the norm weight, the down never defers, an explicit defer_down > 0 and early_release's "attn_prologue" are
    refused."""
    from lowlat.kernels.attn_prologue import pack_qkv
    from lowlat.kernels.attn_prologue_held import fold_attn_norm
    from lowlat.runtime import fused_model

    cfg = tiny(architecture="Qwen3ForCausalLM", qk_norm=True, hidden_size=1024, num_heads=2, num_kv_heads=1,
               head_dim=64, intermediate_size=2048)
    w = random_model_weights(cfg, seed=0)
    split = FusedModel(cfg, w, device="cpu", widths=(1,), defer_down=16)
    assert not split.cluster_prologue and split.defers_down(1)          # the split-K prologue's model defers here
    for bad in ("yes", "Auto", 1, None):
        with pytest.raises(StepContractError, match=re.escape(f"cluster_prologue={bad!r} must be 'auto', True or")):
            FusedModel(cfg, w, device="cpu", widths=(1,), cluster_prologue=bad)
    with pytest.raises(UnsupportedConfigError, match=r"cluster_prologue=True: device cpu"):
        FusedModel(cfg, w, device="cpu", widths=(1,), cluster_prologue=True)
    assert not FusedModel(cfg, w, device="cpu", widths=(1,), cluster_prologue="auto").cluster_prologue  # the CPU
    moe = tiny(architecture="Qwen3MoeForCausalLM", qk_norm=True, hidden_size=1024, num_heads=2, num_kv_heads=1,
               head_dim=64, num_experts=4, top_k=2, moe_intermediate_size=32)
    mw = random_model_weights(moe, seed=0)
    assert not FusedModel(moe, mw, device="cpu", widths=(1,), cluster_prologue="auto").cluster_prologue  # the CPU
    llama = tiny(hidden_size=1024, intermediate_size=128)
    with pytest.raises(UnsupportedConfigError, match=r"cluster_prologue=True: no QK-norm"):
        FusedModel(llama, random_model_weights(llama, seed=0), device="cpu", widths=(1,), cluster_prologue=True)
    monkeypatch.setattr(fused_model, "cluster_prologue_supported", lambda cfg, device: None)    # the CPU allowed
    fm = FusedModel(cfg, w, device="cpu", widths=(1, 2), cluster_prologue=True)
    lw = w.layers[0]
    assert fm.cluster_prologue and not fm.held_prologue and not fm.defers_down(1)
    assert torch.equal(fm.layers[0].qkv, fold_attn_norm(pack_qkv(lw), lw.attn_norm))
    with pytest.raises(StepContractError, match=r"cluster_prologue=True cannot take defer_down=16"):
        FusedModel(cfg, w, device="cpu", widths=(1,), cluster_prologue=True, defer_down=16)
    with pytest.raises(StepContractError, match=r"this model runs the cluster prologue"):
        FusedModel(cfg, w, device="cpu", widths=(1,), cluster_prologue=True, early_release=("attn_prologue",))
    # "auto": on for MoE models where supported and every width is at most CLUSTER_AUTO_MAX_WIDTH, without a
    # defer_down > 0; a dense model (cfg) keeps the split-K prologue and its down deferral
    top = fused_model.CLUSTER_AUTO_MAX_WIDTH
    assert FusedModel(moe, mw, device="cpu", widths=(1, top), cluster_prologue="auto").cluster_prologue
    assert FusedModel(moe, mw, device="cpu", widths=(top,), cluster_prologue="auto", defer_down=0).cluster_prologue
    assert not FusedModel(moe, mw, device="cpu", widths=(1, top + 1), cluster_prologue="auto").cluster_prologue
    assert not FusedModel(moe, mw, device="cpu", widths=(1,), cluster_prologue="auto", defer_down=1).cluster_prologue
    assert not FusedModel(moe, mw, device="cpu", widths=(1,)).cluster_prologue            # the default stays off
    assert not FusedModel(cfg, w, device="cpu", widths=(1,), cluster_prologue="auto").cluster_prologue   # dense
    with pytest.raises(StepContractError, match=r"this model runs the cluster prologue"):
        FusedModel(moe, mw, device="cpu", widths=(1,), cluster_prologue="auto", early_release=("attn_prologue",))
    with pytest.raises(StepContractError, match=r"this model runs the split-K prologue"):
        FusedModel(moe, mw, device="cpu", widths=(16,), cluster_prologue="auto", early_release=("attn_prologue",))


def test_kernels_compile_for_sm90():
    """Every fused GEMV kernel (SmolLM2's plans, 1 and 3 row blocks) compiles for sm_90 with Triton's
    own ptxas (no GPU needed): tensor cores, griddepcontrol (PDL), no register spills; a preload
    kernel issues its weight loads before the PDL wait, a stream kernel pipelines with cp.async."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    res = subprocess.run([sys.executable, "-m", "lowlat.kernels.sm90_check", "--quick"], env=env,
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    lines = [ln for ln in res.stdout.splitlines() if ln.startswith("kernel=")]
    # 10 GEMV launches + the attention prologue at 1 and 3 row blocks, plain and with down's reduction deferred (pieces
    # of 1 and 16 rows at 1 row block, 16 at 3), + out_proj with the attention's combine folded in (1 and 16 rows at
    # 1 row block, 48 at 3; SmolLM2's out_proj does not split K, so no deferred form)
    assert len(lines) == 18, res.stdout
    assert sum("/attn_prologue_deferred_r" in ln for ln in lines) == 3, res.stdout
    assert sum("/out_proj_fold_r" in ln for ln in lines) == 3, res.stdout
    for ln in lines:
        assert "tensor_cores=True" in ln and "griddepcontrol=True" in ln and "local_memory=False" in ln, ln
        if "/preload-" in ln:
            assert "loads_before_wait=True" in ln, ln
        else:
            assert "/stream-" in ln and "cp_async=True" in ln, ln


# ------------------------------------------------------------------------------------------------- GPU
def _smollm2_random(device):
    cfg = preset("SmolLM2-135M")
    return cfg, random_model_weights(cfg, seed=0).to(device=device)


def decode_case(cfg, rows: int, seed: int, device):
    """A decode step of `rows` requests (request i with 37 + 5i cached tokens, one new token each) and its
    per-layer caches (case, ks, vs)."""
    case = random_step(ctx_lens=[37 + 5 * i for i in range(rows)], new_rows=[1] * rows,
                       num_kv_heads=cfg.num_kv_heads, head_dim=cfg.head_dim, vocab_size=cfg.vocab_size,
                       generator=torch.Generator().manual_seed(seed), device=device)
    return (case, *layer_caches(case, cfg.num_layers, seed))


def graph_vs_eager_steps(cfg, w, device, rows_seeds, **fm_kw):
    """For each (rows, seed): a decode step of `rows` requests (request i with 37 + 5i cached tokens) run by
    an eager FusedModel and by a graphed one (the first call of a width captures, the second is a pure
    replay) on copies of the same caches; checks the graphed logits bitwise equal to the eager ones and
    yields (rows, case, ks, vs, pa, pb, eager logits) (pa / pb: the eager / graphed runs' caches)."""
    eager = FusedModel(cfg, w, device=device, use_cuda_graphs=False, **fm_kw)
    graphed = FusedModel(cfg, w, device=device, use_cuda_graphs=True, **fm_kw)
    for rows, seed in rows_seeds:
        case, ks, vs = decode_case(cfg, rows, seed, device)
        pa, pb = fresh_pool(ks, vs), fresh_pool(ks, vs)
        a = eager.forward(case.step, pa).clone()
        b = graphed.forward(case.step, pb).clone()       # first call of a width: eager + capture + replay
        c = graphed.forward(case.step, pb).clone()       # a pure replay
        check_bitwise("fused_model", b, a, output="logits_graph_vs_eager")
        check_bitwise("fused_model", c, a, output="logits_replay_vs_eager")
        yield rows, case, ks, vs, pa, pb, a


@pytest.mark.gpu
def test_gpu_deferred_out_proj_reduction_same_bits_as_without(device):
    """Llama-3.2-1B's shapes (2 layers, random weights; its out_proj plan splits K 8 ways, its down 4 ways): graphed
    steps of 1 / 6 / 16 rows with out_proj's reduction deferred to gate/up and layer 0's down reduction deferred to
    layer 1's prologue (defer=16, defer_down=16; the defaults defer out_proj at 1 row, down at 1-2), or the down's
    alone, give bitwise the logits and KV of no deferral and of a 24-row width (never deferred) for the same rows,
    and the same logits on a pure replay with x2 and every partial buffer NaN first. All with the split-K prologue
    (held_prologue=False): the held one takes no deferred input, so a model running it never defers down."""
    cfg = preset("Llama-3.2-1B").replace(num_layers=2)
    w = random_model_weights(cfg, seed=0).to(device=device)
    split = dict(held_prologue=False)            # the down's deferral needs the split-K prologue (session 25)
    models = dict(on=FusedModel(cfg, w, device=device, widths=(1, 6, 16), defer=16, defer_down=16, **split),
                  down=FusedModel(cfg, w, device=device, widths=(1, 6, 16), defer=0, defer_down=16, **split),
                  off=FusedModel(cfg, w, device=device, widths=(1, 6, 16), defer=0, defer_down=0, **split),
                  wide=FusedModel(cfg, w, device=device, widths=(24,), defer=16, defer_down=16, **split))
    default = FusedModel(cfg, w, device=device, widths=(1, 2, 4), **split)
    held = FusedModel(cfg, w, device=device, widths=(1, 2, 4))
    assert held.held_prologue and not any(held.defers_down(r) for r in (1, 2, 4))
    assert default.defers(1) and not default.defers(2) and not models["off"].defers(1)
    if default.num_sms == 132:                 # the default rule divides by the SMs: fitted on an H200
        assert default.defers_down(2) and not default.defers_down(4)
    assert not models["off"].defers_down(1)
    assert models["on"].plan_o.split > 1 and all(models["on"].defers(r) for r in (1, 6, 16))
    assert models["on"].plan_down.split > 1 and all(models["on"].defers_down(r) for r in (1, 6, 16))
    for rows, seed in ((1, 0), (6, 1), (16, 2)):
        case, ks, vs = decode_case(cfg, rows, seed, device)
        on = same_steps(models, case, ks, vs, cfg.num_layers, f"_r{rows}")
        for name in ("on", "down"):            # a replay recomputes every deferred buffer, after the PDL waits
            fm = models[name]
            replay_after_nan(fm, case, ks, vs, (fm._x2, fm._deferred, fm._deferred_down), on, f"_{name}_r{rows}")


@pytest.mark.slow
@pytest.mark.interpreter
def test_early_release_reaches_the_dense_residual_gemvs_only(tmp_path, monkeypatch):
    """`FusedModel(early_release=...)` (default EARLY_RELEASE) reaches the dense layers' out_proj and / or down
    projection launches it names, deferred or not (out_proj deferred at 1 row, down deferred to the next prologue at 1 row
    where its plan splits K), and the step's bits do not depend on it (under the interpreter PDL is off: the GPU test
    below checks the launches themselves)."""
    import lowlat.runtime.fused_model as fmod

    cfg = tiny(num_layers=2)
    _split_out_proj_table(cfg, tmp_path, monkeypatch, down_split=3)
    w = random_model_weights(cfg, seed=3)
    seen = []
    for name in ("residual_gemv", "residual_gemv_deferred"):
        plain = getattr(fmod, name)
        monkeypatch.setattr(fmod, name, lambda *a, _plain=plain, _name=name, **k: seen.append(
            (_name, k["early_release"])) or _plain(*a, **k))
    assert fmod.EARLY_RELEASE == "auto"
    assert FusedModel(cfg, w, device="cpu", widths=(1,)).early_release == fmod.early_release_launches(cfg) == ()
    kinds = dict(on=("down", "out_proj"), off=(), out_proj=("out_proj",), down=("down",))
    models = {name: FusedModel(cfg, w, device="cpu", widths=(1, 2), defer_down=1, early_release=k)
              for name, k in kinds.items()}
    assert models["on"].early_release == ("out_proj", "down")
    # per model at 1 row: layer 0's out_proj and down deferred, layer 1's out_proj deferred and down (the last) plain;
    # at 2 rows nothing deferred
    for rows, launches in ((1, [("residual_gemv_deferred", "out_proj"), ("residual_gemv_deferred", "down"),
                                ("residual_gemv_deferred", "out_proj"), ("residual_gemv", "down")]),
                           (2, [("residual_gemv", "out_proj"), ("residual_gemv", "down")] * 2)):
        want = [(fn, role in k) for k in kinds.values() for fn, role in launches]
        case = random_step(ctx_lens=[9, 3][:rows], new_rows=[1] * rows, num_kv_heads=cfg.num_kv_heads,
                           head_dim=cfg.head_dim, vocab_size=cfg.vocab_size, generator=torch.Generator().manual_seed(4))
        ks, vs = layer_caches(case, cfg.num_layers, 5)
        seen.clear()
        on = same_steps(models, case, ks, vs, cfg.num_layers, f"_r{rows}")
        assert seen == want, (rows, seen)
        fm = models["on"]           # the replay helper of the GPU tests (eager here: nothing captured on the CPU)
        replay_after_nan(fm, case, ks, vs, (fm._x2, fm._deferred, fm._deferred_down, fm._full["act"]), on,
                         f"_r{rows}")


def test_early_release_auto_names_the_launches_over_8_mb(monkeypatch):
    """early_release="auto" (the default) releases early the dense launches whose bf16 weights exceed
    EARLY_RELEASE_MIN_BYTES (8 MB): Llama-3.2-1B's out_proj (2048 x 2048, 8.39 MB) and down (33.6 MB), Qwen2.5-0.5B's
    down (896 x 4864, 8.72 MB) but not its out_proj (1.6 MB), nothing of SmolLM2-135M / Qwen3-0.6B, and no MoE layer
    (Qwen3-30B-A3B). The bound is strict and read when the model is built."""
    import lowlat.runtime.fused_model as fmod

    want = {"Llama-3.2-1B": ("out_proj", "down"), "Qwen2.5-0.5B": ("down",), "SmolLM2-135M": (), "Qwen3-0.6B": (),
            "Qwen3-30B-A3B": ()}
    for model, names in want.items():
        assert fmod.early_release_launches(preset(model)) == names, model
    assert fmod.EARLY_RELEASE_MIN_BYTES == 8_000_000
    assert not fmod.releases_early(2000, 2000) and fmod.releases_early(2000, 2001)     # 8 000 000 / 8 004 000 bytes
    cfg = tiny(num_layers=2)
    w = random_model_weights(cfg, seed=3)
    o_bytes, d_bytes = 2 * cfg.hidden_size * cfg.q_size, 2 * cfg.hidden_size * cfg.intermediate_size
    assert o_bytes > d_bytes                           # tiny: out_proj 64 x 128, down 64 x 96
    for bound, names in ((o_bytes - 1, ("out_proj",)), (o_bytes, ()), (d_bytes - 1, ("out_proj", "down")),
                         (d_bytes, ("out_proj",))):
        monkeypatch.setattr(fmod, "EARLY_RELEASE_MIN_BYTES", bound)
        assert FusedModel(cfg, w, device="cpu", widths=(1,)).early_release == names, bound
        assert FusedModel(cfg, w, device="cpu", widths=(1,), early_release="auto").early_release == names, bound
        assert FusedModel(cfg, w, device="cpu", widths=(1,), early_release=["down"]).early_release == ("down",)


@pytest.mark.gpu
def test_gpu_held_prologue_step_within_policy_row_invariant_and_replayed(device, monkeypatch):
    """Llama-3.2-1B's shapes (2 layers, random weights): the default model runs the held prologue
    (`attn_prologue_held`: held_prologue "auto" on an sm_90 GPU) and never defers down. A mixed step (decode, verify
    and prefill-chunk rows, padding) gives logits and K / V within the policy against the float64 reference, like the
    split-K prologue's model on the same step; graphed decode steps of 1 / 6 / 16 rows give bitwise the logits and KV
    of a 24-row width (row invariance with padding) and of a model applying the norm weight the other way
    (`HELD_FOLD`: folded at build or multiplied in registers) and of a folded model releasing early (the paced
    prologue at 1 row: `attn_prologue_held`'s pace), and the same logits on a pure replay with q and the
    attention's output NaN first (a launch reading them before its wait would show)."""
    cfg = preset("Llama-3.2-1B").replace(num_layers=2)
    w = random_model_weights(cfg, seed=0).to(device=device)
    held = FusedModel(cfg, w, device=device, widths=(1, 6, 16))
    assert held.held_prologue and not any(held.defers_down(r) for r in (1, 2, 6, 16))
    mixed = MixedStep(cfg, w, device)
    for name, fm in (("held", FusedModel(cfg, w, device=device, widths=(12,))),
                     ("split_k", FusedModel(cfg, w, device=device, widths=(12,), held_prologue=False))):
        assert fm.held_prologue == (name == "held")
        mixed.check(fm, name)
    import lowlat.runtime.fused_model as fmod

    monkeypatch.setattr(fmod, "HELD_FOLD", "registers" if fmod.HELD_FOLD == "build" else "build")
    other = FusedModel(cfg, w, device=device, widths=(1, 6, 16))       # the norm weight applied the other way
    assert other.held_prologue and other._held_folded != held._held_folded
    monkeypatch.setattr(fmod, "HELD_FOLD", "build")        # folded weights + the prologue's early release: paced
    paced = FusedModel(cfg, w, device=device, widths=(1, 6, 16), early_release=("out_proj", "down", "attn_prologue"))
    assert paced._held_folded and paced._held_early
    models = dict(on=held, wide=FusedModel(cfg, w, device=device, widths=(24,)), fold=other, paced=paced)
    for rows, seed in ((1, 0), (6, 1), (16, 2)):
        case, ks, vs = decode_case(cfg, rows, seed, device)
        on = same_steps(models, case, ks, vs, cfg.num_layers, f"_r{rows}")
        replay_after_nan(held, case, ks, vs, (held._full["q"], held._full["attn"]), on, f"_r{rows}")
        replay_after_nan(paced, case, ks, vs, (paced._full["q"], paced._full["attn"], paced._x2), on,
                         f"_paced_r{rows}")


@pytest.mark.gpu
def test_gpu_cluster_prologue_step_within_policy_row_invariant_and_replayed(device):
    """Qwen3-0.6B's shapes (2 layers, random weights; QK-norm, H 1024, D 128) with cluster_prologue=True
    (`attn_prologue_cluster`): a mixed step (decode, verify and prefill-chunk rows, padding) gives logits and K / V
    within the policy against the float64 reference, like the split-K prologue's model; graphed decode steps of
    1 / 6 / 16 rows give bitwise the logits and KV of a 24-row width (row invariance with padding), and the same
    logits on a pure replay with q and the attention's output NaN first."""
    cfg = preset("Qwen3-0.6B").replace(num_layers=2)
    w = random_model_weights(cfg, seed=0).to(device=device)
    fm = FusedModel(cfg, w, device=device, widths=(1, 6, 16), cluster_prologue=True)
    assert fm.cluster_prologue and not fm.held_prologue and not any(fm.defers_down(r) for r in (1, 2, 6, 16))
    mixed = MixedStep(cfg, w, device)
    mixed.check(FusedModel(cfg, w, device=device, widths=(12,), cluster_prologue=True), "cluster")
    mixed.check(FusedModel(cfg, w, device=device, widths=(12,)), "split_k")
    models = dict(on=fm, wide=FusedModel(cfg, w, device=device, widths=(24,), cluster_prologue=True))
    for rows, seed in ((1, 0), (6, 1), (16, 2)):
        case, ks, vs = decode_case(cfg, rows, seed, device)
        on = same_steps(models, case, ks, vs, cfg.num_layers, f"_r{rows}")
        replay_after_nan(fm, case, ks, vs, (fm._full["q"], fm._full["attn"]), on, f"_r{rows}")


@pytest.mark.gpu
@pytest.mark.parametrize("model", ["Llama-3.2-1B", "SmolLM2-135M"])
def test_gpu_early_release_same_bits_as_without(device, model):
    """The model's shapes (2 layers, random weights): graphed steps of 1 / 6 / 16 rows with out_proj and down (and the
    held prologue, Llama-3.2-1B's) releasing the next launch at their start (early_release, the deferrals at their
    defaults) give bitwise the logits and KV of the release after the wait, and the same logits on a pure replay with
    x2, the activations, q and every partial buffer NaN first (a successor that read them before its wait, i.e.
    before they were rewritten, would show)."""
    from lowlat.kernels.attn_prologue_held import held_prologue_supported

    cfg = preset(model).replace(num_layers=2)
    w = random_model_weights(cfg, seed=0).to(device=device)
    held = held_prologue_supported(cfg, device) is None
    names = ("out_proj", "down") + (("attn_prologue",) if held else ())
    models = dict(on=FusedModel(cfg, w, device=device, widths=(1, 6, 16), early_release=names),
                  off=FusedModel(cfg, w, device=device, widths=(1, 6, 16), early_release=()))
    assert models["on"].early_release == names and models["on"].held_prologue == held == (model == "Llama-3.2-1B")
    for rows, seed in ((1, 0), (6, 1), (16, 2)):
        case, ks, vs = decode_case(cfg, rows, seed, device)
        on = same_steps(models, case, ks, vs, cfg.num_layers, f"_r{rows}")
        fm = models["on"]
        replay_after_nan(fm, case, ks, vs, (fm._x2, fm._deferred, fm._deferred_down, fm._full["act"],
                                            fm._full["q"]), on, f"_r{rows}")


@pytest.mark.gpu
@pytest.mark.parametrize("model", ["Llama-3.2-1B", "SmolLM2-135M", "Qwen3-0.6B"])
def test_gpu_folded_attention_combine_same_bits_as_without(device, model):
    """The model's shapes (2 layers, random weights; Qwen3-0.6B: D 128 and QK-norm): graphed steps of 1 / 6 / 16 rows
    (request i with (511 + 397 i) mod 2101 cached tokens: 8 splits of 64-token blocks at 1 row, up to 17 of 2 blocks)
    with the attention's combine folded into out_proj (fold=16,
    the split-K deferrals at their defaults) give bitwise the logits and KV of no fold and of a 24-row width (never
    folding), and the same logits on a pure replay with the attention's split partials and output buffer NaN
    first."""
    cfg = preset(model).replace(num_layers=2)
    w = random_model_weights(cfg, seed=0).to(device=device)
    models = dict(on=FusedModel(cfg, w, device=device, widths=(1, 6, 16), fold=16),
                  off=FusedModel(cfg, w, device=device, widths=(1, 6, 16), fold=0),
                  wide=FusedModel(cfg, w, device=device, widths=(24,), fold=16))
    assert all(models["on"].folds(r) for r in (1, 6, 16)) and not models["wide"].folds(24)
    for rows, seed in ((1, 0), (6, 1), (16, 2)):
        case = random_step(ctx_lens=[(511 + 397 * i) % 2101 for i in range(rows)], new_rows=[1] * rows,
                           num_kv_heads=cfg.num_kv_heads, head_dim=cfg.head_dim, vocab_size=cfg.vocab_size,
                           generator=torch.Generator().manual_seed(seed), device=device)
        ks, vs = layer_caches(case, cfg.num_layers, seed)
        on = same_steps(models, case, ks, vs, cfg.num_layers, f"_r{rows}")
        fm = models["on"]
        replay_after_nan(fm, case, ks, vs, (fm.dec_ws.partial_o, fm.dec_ws.partial_ml, fm._full["attn"]), on,
                         f"_r{rows}")


@pytest.mark.gpu
def test_gpu_graph_replay_equals_eager_bitwise(device):
    cfg, w = _smollm2_random(device)
    for _, _, _, _, pa, pb, _ in graph_vs_eager_steps(cfg, w, device, ((1, 0), (6, 1), (8, 2), (16, 3), (48, 4))):
        for i in range(cfg.num_layers):
            check_bitwise("fused_model", pb.k_caches[i].nan_to_num(7.0), pa.k_caches[i].nan_to_num(7.0),
                          output="k_cache")


@pytest.mark.gpu
@pytest.mark.parametrize("prologue", ["tuned", "late_writer"])
def test_gpu_default_early_kv_step_equals_the_plain_attention_bitwise(device, monkeypatch, tmp_path, prologue):
    """FusedModel's decode attention loads its first KV block before the PDL wait by default where its grid fits
    (`pre_kv=None`: SmolLM2 at 1-8 rows). The graphed step's logits and KV caches at widths 1, 2, 6, 8, 48 are
    bitwise those of a model whose attention never does (pre_kv=False), and the early path really ran.
    The compared step is a pure graph replay with the step's own KV slots set to NaN first, so an attention that
    skipped the re-load of those slots after its wait would read NaN. Until session 17 the compared run was the
    first on its cache (an eager run, where the host enqueues each launch after the previous one ran, so no early load
    could beat the prologue, then the capture, then a replay reading the slots the eager run had written) and the
    test passed that mutation (session 16, H200). Now both cases fail it, each run alone (session 17, call 4, twice).
    "late_writer" runs a prologue plan that stores its K / V late (split 1, block_k 16, streamed: 15 programs, 36
    dependent chunk loads each after the wait), so the early loads beat its stores whatever the tuned plan's speed.
    `test_decode_attention_pre_kv_under_pdl_reads_a_late_writers_slots` tests the attention alone."""
    from lowlat.kernels import _gemv
    from lowlat.kernels import decode_attention as da

    if prologue == "late_writer":
        slow = _gemv.plan_gemv(480, 576, kind="qkv", bn=32, split=1, block_k=16, preload=False, stages=2, pf_k=0)
        table = tmp_path / "plans.json"
        table.write_text(json.dumps([dict(kind="qkv", n=480, k=576, plan=slow.describe())]))
        monkeypatch.setenv("LOWLAT_GEMV_PLANS", str(table))
    cfg, w = _smollm2_random(device)
    assert cfg.q_size + 2 * cfg.num_kv_heads * cfg.head_dim == 2 * 480 and cfg.hidden_size == 576
    widths = (1, 2, 6, 8, 48)
    early = []
    fits = da.pre_kv_fits

    def counting(*args):
        early.append(fits(*args))
        return early[-1]
    monkeypatch.setattr(da, "pre_kv_fits", counting)
    runs = {}
    for name in ("default", "plain"):
        if name == "plain":
            inner = da.decode_attention

            def never(*args, pre_kv=None, **kw):
                return inner(*args, pre_kv=False, **kw)
            monkeypatch.setattr(da, "decode_attention", never)
        fm = FusedModel(cfg, w, device=device, widths=widths)
        runs[name] = []
        for rows in widths:
            case, ks, vs = decode_case(cfg, rows, rows, device)
            pool = SimpleNamespace(k_caches=ks, v_caches=vs)
            fm.forward(case.step, pool)         # a new cache: an eager run, the capture and a replay
            loc = case.step.out_cache_loc[: case.step.num_valid_rows].long()
            for t in (*ks, *vs):                # the step's own slots stale again (NaN), as before the eager run
                t[loc] = float("nan")
            logits = fm.forward(case.step, pool).clone()      # a pure replay: every launch queued at once
            runs[name].append((logits, ks[0].nan_to_num(7.0), vs[-1].nan_to_num(7.0)))
        if name == "default":
            assert any(early) and not all(early), early     # on at the small widths, off at 48
    for rows, got, want in zip(widths, runs["default"], runs["plain"]):
        for what, a, b in zip(("logits", "k_cache", "v_cache"), got, want):
            check_bitwise("fused_model", a, b, output=f"{what}_{rows}_rows")


@pytest.mark.gpu
def test_gpu_whole_step_within_policy(device):
    cfg, w = _smollm2_random(device)
    case = random_step(ctx_lens=[100, 3, 250, 0], new_rows=[1, 1, 4, 2], num_kv_heads=cfg.num_kv_heads,
                       head_dim=cfg.head_dim, vocab_size=cfg.vocab_size, pad_to=12,
                       generator=torch.Generator().manual_seed(5), device=device)
    ks, vs = layer_caches(case, cfg.num_layers, 6)
    pool = SimpleNamespace(k_caches=[k.clone() for k in ks], v_caches=[v.clone() for v in vs])
    logits = FusedModel(cfg, w, device=device).forward(case.step, pool).clone()
    oracle = ReferenceModel(cfg, w.to(dtype=torch.float64)).forward(case.step, [k.double() for k in ks],
                                                                     [v.double() for v in vs])
    baseline = ReferenceModel(cfg, w).forward(case.step, [k.clone() for k in ks], [v.clone() for v in vs])
    check_accuracy("fused_model", logits, oracle, baseline, output="logits")


@pytest.mark.gpu
def test_gpu_engine_greedy_equals_reference_engine(device):
    """Greedy generation through Engine: FusedModel vs the reference engine, token for token (a flip
    is accepted only at a near-tie of the float32 reference, and nothing is compared after it)."""
    cfg, w = _smollm2_random(device)
    prompts = [[1, 540, 3303, 314, 4649, 314], [1, 20, 21, 22], [1, 9000]]
    params = SamplingParams(max_new_tokens=16, ignore_eos=True)
    pool = KVCachePool(cfg, num_slots=512, max_reqs=4, max_ctx=128, device=device)
    got = [r.output_ids for r in Engine(cfg, FusedModel(cfg, w, device=device), pool).generate(prompts, params)]
    ref = reference_engine(cfg, w, num_slots=512, max_reqs=4, max_ctx=128, device=device)
    want = [r.output_ids for r in ref.generate(prompts, params)]
    exact = assert_tokens_equal_or_near_tie(cfg, w, device, prompts, got, want, slots=512, ctx=128)
    print(f"{exact} of {len(prompts)} prompts token-for-token equal; the others flip at a reference near-tie")


def _early_exit_case(cfg, seed, device="cpu"):
    case = random_step(ctx_lens=[6, 0, 3], new_rows=[1, 1, 1], num_kv_heads=cfg.num_kv_heads,
                       head_dim=cfg.head_dim, vocab_size=cfg.vocab_size, pad_to=4,
                       generator=torch.Generator().manual_seed(seed), device=device)
    return case, *layer_caches(case, cfg.num_layers, seed)


def test_early_exit_hidden_matches_reference_first_layers(device):
    """The self-speculation draft forward: layers 0..n-1 fused, final RMSNorm, no LM head, vs
    ReferenceModel.hidden_states(num_layers=n); K/V written for layers < n only, padding rows 0."""
    cfg = tiny(num_layers=3)
    w = random_model_weights(cfg, seed=8).to(device=device)
    case, ks, vs = _early_exit_case(cfg, 9, device)
    n = 2
    pool = SimpleNamespace(k_caches=[k.clone() for k in ks], v_caches=[v.clone() for v in vs])
    fm = FusedModel(cfg, w, device=device, widths=(4,))
    h = fm.early_exit_hidden(case.step, pool, n).clone()
    k64, v64 = [k.double() for k in ks], [v.double() for v in vs]
    oracle = ReferenceModel(cfg, w.to(dtype=torch.float64)).hidden_states(case.step, k64, v64, n)
    baseline = ReferenceModel(cfg, w).hidden_states(case.step, [k.clone() for k in ks], [v.clone() for v in vs], n)
    assert h.shape == (4, cfg.hidden_size) and h.dtype == torch.bfloat16
    check_accuracy("fused_model", h, oracle, baseline, output="hidden")
    assert bool((h[case.step.num_valid_rows:] == 0).all())
    loc = case.step.out_cache_loc[: case.step.num_valid_rows].long()
    for i in range(cfg.num_layers):
        written = not torch.equal(pool.k_caches[i][loc].nan_to_num(7.0), ks[i][loc].nan_to_num(7.0))
        assert written == (i < n), f"layer {i}: K written {written}, draft of {n} layers"
    with pytest.raises(ValueError, match="num_layers=4"):
        fm.early_exit_hidden(case.step, pool, 4)


@pytest.mark.interpreter
def test_early_exit_leaves_the_full_steps_outputs_alone():
    """A draft forward runs no LM head: the logits and tokens the last full step returned (views of the
    runner's static buffers) are unchanged by it."""
    cfg = tiny(num_layers=3)
    w = random_model_weights(cfg, seed=8)
    case, ks, vs = _early_exit_case(cfg, 9)
    pool = SimpleNamespace(k_caches=[k.clone() for k in ks], v_caches=[v.clone() for v in vs])
    fm = FusedModel(cfg, w, device="cpu", widths=(4,))
    logits = fm.forward(case.step, pool)
    want_logits, want_tokens = logits.clone(), fm.last_tokens.clone()
    fm.early_exit_hidden(case.step, pool, 1)
    assert torch.equal(logits, want_logits) and torch.equal(fm.last_tokens, want_tokens)


# ------------------------------------------------------------------------------------- draft position
#: (temperature, top_k, top_p) of the valid rows of a draft position's step, per case
DRAFT_ROWS = {
    "greedy": ([0.0, 0.0, 0.0], [0, 0, 0], [1.0, 1.0, 1.0]),           # the greedy-only launch (one_hot)
    "mixed": ([0.0, 0.8, 1.2], [0, 0, 5], [1.0, 1.0, 0.8]),            # greedy, temperature, top-k + top-p
    "top_k": ([0.0, 0.7, 1.0], [0, 1, 3], [1.0, 1.0, 0.9]),            # top-k (+ top-p), no per-token noise
}


def draft_rows(case: str, nv: int, seed: int):
    """(temperature [nv] f32, top_k [nv] i32, top_p [nv] f32, seeds [nv] i64, offsets [nv] i64) of a case:
    the last nv rows of DRAFT_ROWS[case] (cycled for nv > 3); Philox keys random, offsets as the drafter forms them
    (rng_offset * DRAFT_OFFSET_STRIDE + position)."""
    from lowlat.runtime.drafters import DRAFT_OFFSET_STRIDE

    t, k, p = (list(map(v.__getitem__, [(i - nv) % 3 for i in range(nv)])) for v in DRAFT_ROWS[case])
    g = torch.Generator().manual_seed(seed)
    seeds = torch.randint(0, 2 ** 62, (nv,), generator=g)
    offsets = torch.randint(0, 1000, (nv,), generator=g) * DRAFT_OFFSET_STRIDE + torch.randint(0, 5, (nv,), generator=g)
    return (torch.tensor(t, dtype=torch.float32), torch.tensor(k, dtype=torch.int32),
            torch.tensor(p, dtype=torch.float32), seeds, offsets)


def run_draft_position(fm, step, pool, n, rows):
    """fm.draft_position with the launch flags the drafter derives for `rows` (draft_rows' tuple)."""
    from lowlat.kernels.draft_sampling import launch_flags

    k_cap, need_noise = launch_flags(rows[0], rows[1], fm.cfg.vocab_size)
    return fm.draft_position(step, pool, n, *rows, k_cap=k_cap, need_noise=need_noise)


class MixedStep:
    """A mixed step of 12 rows (decode, verify and prefill-chunk rows: new rows 1 / 1 / 4 / 2 after 100 / 3 / 250 / 0
    cached tokens, then padding), its per-layer caches and the reference's logits / K / V in float64 (oracle) and
    bf16 (baseline); `check(fm, tag)` runs it through a FusedModel (width 12 among its widths) on a fresh pool and
    checks logits and the written K / V against them within the policy."""

    def __init__(self, cfg, w, device):
        self.case = random_step(ctx_lens=[100, 3, 250, 0], new_rows=[1, 1, 4, 2], num_kv_heads=cfg.num_kv_heads,
                                head_dim=cfg.head_dim, vocab_size=cfg.vocab_size, pad_to=12,
                                generator=torch.Generator().manual_seed(5), device=device)
        self.ks, self.vs = layer_caches(self.case, cfg.num_layers, 6)
        self.k64, self.v64 = [k.double() for k in self.ks], [v.double() for v in self.vs]
        step = self.case.step
        self.oracle = ReferenceModel(cfg, w.to(dtype=torch.float64)).forward(step, self.k64, self.v64)
        self.kb, self.vb = [k.clone() for k in self.ks], [v.clone() for v in self.vs]
        self.baseline = ReferenceModel(cfg, w).forward(step, self.kb, self.vb)
        self.loc = step.out_cache_loc[:step.num_valid_rows].long()

    def check(self, fm, tag: str) -> None:
        pool, loc = fresh_pool(self.ks, self.vs), self.loc
        logits = fm.forward(self.case.step, pool).clone()
        check_accuracy("fused_model", logits, self.oracle, self.baseline, output=f"logits_{tag}")
        for i in range(len(self.ks)):
            check_accuracy("fused_model", pool.k_caches[i][loc], self.k64[i][loc], self.kb[i][loc],
                           output=f"k_cache_{tag}")
            check_accuracy("fused_model", pool.v_caches[i][loc], self.v64[i][loc], self.vb[i][loc],
                           output=f"v_cache_{tag}")


def replay_after_nan(fm, case, ks, vs, buffers, want, tag: str) -> None:
    """Run `case` once on a pool of its own (a new cache: an eager run, the capture and a replay), fill `buffers` with
    NaN, then run it again on the SAME pool: a pure replay of the captured graph (asserted: a new pool would clear the
    graphs and re-run eagerly, rewriting the NaN buffers first, so a launch reading one too early could not show).
    Its logits must equal `want` bitwise. The second run rewrites the step's own KV slots with the same values."""
    pool = fresh_pool(ks, vs)
    fm.forward(case.step, pool)
    graph = fm._graphs.get(fm.width_for(case.step.num_rows))
    for t in buffers:
        t.fill_(float("nan"))
    got = fm.forward(case.step, pool)
    assert fm._graphs.get(fm.width_for(case.step.num_rows)) is graph
    assert graph is not None or not fm.use_graphs, "no graph captured"
    check_bitwise("fused_model", got, want, output=f"logits_replay{tag}")


def fresh_pool(ks, vs):
    return SimpleNamespace(k_caches=[k.clone() for k in ks], v_caches=[v.clone() for v in vs])


def one_row_case(cfg, seed, device="cpu"):
    """A 1-row decode step padded to width 4 (3 padding rows), with its caches."""
    case = random_step(ctx_lens=[5], new_rows=[1], num_kv_heads=cfg.num_kv_heads, head_dim=cfg.head_dim,
                       vocab_size=cfg.vocab_size, pad_to=4, generator=torch.Generator().manual_seed(seed),
                       device=device)
    return case, *layer_caches(case, cfg.num_layers, seed)


@pytest.mark.parametrize("rows_case", list(DRAFT_ROWS))
def test_draft_position_tokens_equal_reference_pipeline(device, rows_case):
    """A draft position (embed, layers 0..n-1, final RMSNorm, draft sampler: one launch chain) vs its spec,
    ReferenceModel.hidden_states(num_layers=n) + reference draft_sample, on the same Philox counters:
    (1) exactly the reference sampler's tokens on the fused pipeline's own normed rows (early_exit_hidden's,
    the same launches), q within the policy there; (2) the reference pipeline's tokens, a flip accepted only
    where the two pipelines' logits differ within the numerics policy (then (1) says the flip is the
    sampler's answer to those logits); (3) only the M valid rows come back; K/V written for layers < n
    only, bitwise as early_exit_hidden writes them."""
    from lowlat.reference.draft_sampling import draft_sample as ref_draft_sample

    cfg = tiny(num_layers=3)
    w = random_model_weights(cfg, seed=8).to(device=device)
    n, lm = 2, w.lm_head
    fm = FusedModel(cfg, w, device=device, widths=(4,))
    for case, ks, vs in (_early_exit_case(cfg, 9, device), one_row_case(cfg, 10, device)):
        nv = case.step.num_valid_rows
        rows = tuple(t.to(device) for t in draft_rows(rows_case, nv, seed=11 + nv))
        pool = fresh_pool(ks, vs)
        out = run_draft_position(fm, case.step, pool, n, rows)
        assert out.tokens.shape == (nv,) and out.lse.shape == (nv,) and out.cut_id.shape == (nv,)
        assert out.logits.shape == (nv, cfg.vocab_size) and out.one_hot == bool((rows[0] == 0).all())
        assert bool((out.tokens >= 0).all()), f"rows marked outside the launch: {out.tokens}"
        # (1) the sampler on the fused normed rows
        ee_pool = fresh_pool(ks, vs)
        h = fm.early_exit_hidden(case.step, ee_pool, n)[:nv]
        tok_h, q_h, _ = ref_draft_sample(h, lm, *rows)
        check_bitwise("draft_position", out.tokens, tok_h, output="tokens_vs_sampler_on_fused_h")
        _, q_o, _ = ref_draft_sample(*oracle_cast((h, lm)), *rows)
        check_accuracy("draft_sampling", out.probs(), q_o, q_h, output="q")
        # (2) the reference pipeline
        hr = ReferenceModel(cfg, w).hidden_states(case.step, [k.clone() for k in ks], [v.clone() for v in vs], n)[:nv]
        tok_r, _, logits_r = ref_draft_sample(hr, lm, *rows)
        if not torch.equal(out.tokens, tok_r):
            h64 = ReferenceModel(cfg, w.to(dtype=torch.float64)).hidden_states(
                case.step, [k.double() for k in ks], [v.double() for v in vs], n)[:nv]
            check_accuracy("draft_position", h.float() @ lm.float().T, h64 @ lm.double().T, logits_r,
                           output="logits_at_a_token_flip")
        # (3) K/V of layers < n only, as early_exit_hidden writes them
        loc = case.step.out_cache_loc[:nv].long()
        for i in range(cfg.num_layers):
            written = not torch.equal(pool.k_caches[i][loc].nan_to_num(7.0), ks[i][loc].nan_to_num(7.0))
            assert written == (i < n), f"layer {i}: K written {written}, draft of {n} layers"
            check_bitwise("draft_position", pool.k_caches[i].nan_to_num(7.0), ee_pool.k_caches[i].nan_to_num(7.0),
                          output=f"k_cache_{i}")
            check_bitwise("draft_position", pool.v_caches[i].nan_to_num(7.0), ee_pool.v_caches[i].nan_to_num(7.0),
                          output=f"v_cache_{i}")


@pytest.mark.interpreter
def test_draft_position_padding_rows_get_neutral_parameters():
    """Padding rows of the width run as greedy rows with zero counters (temperature 0, top_k 0, top_p 1,
    seed 0, offset 0), whatever an earlier call at the same width left there: a sampled draft of 3 rows,
    then a greedy 1-row draft (3 padding rows in the greedy-only launch, where a padding row with a
    temperature would come out as token -1)."""
    cfg = tiny(num_layers=3)
    w = random_model_weights(cfg, seed=8)
    fm = FusedModel(cfg, w, device="cpu", widths=(4,))
    for (case, ks, vs), rows_case in ((_early_exit_case(cfg, 9), "mixed"), (one_row_case(cfg, 10), "greedy")):
        nv = case.step.num_valid_rows
        out = run_draft_position(fm, case.step, fresh_pool(ks, vs), 1, draft_rows(rows_case, nv, seed=3))
        assert out.tokens.shape == (nv,)
        b = fm._bufs[4]
        for name, want in (("temperature", 0.0), ("top_k", 0), ("top_p", 1.0), ("seeds", 0), ("offsets", 0)):
            pad = getattr(b, name)[nv:]
            assert bool((pad == want).all()), f"padding rows' {name} = {pad.tolist()}, want {want}"
        static = fm._draft_sample_out(4)
        assert bool((static.tokens >= 0).all()), f"a padding row ran outside the launch: {static.tokens.tolist()}"


def test_draft_position_bad_arguments_raise_before_any_kv_write():
    cfg = tiny(num_layers=3)
    w = random_model_weights(cfg, seed=8)
    fm = FusedModel(cfg, w, device="cpu", widths=(4,))
    case, ks, vs = _early_exit_case(cfg, 9)
    pool = fresh_pool(ks, vs)
    rows = draft_rows("mixed", 3, seed=1)
    with pytest.raises(ValueError, match="num_layers=4"):
        fm.draft_position(case.step, pool, 4, *rows, k_cap=8, need_noise=True)
    with pytest.raises(ValueError, match="num_layers=0"):
        fm.draft_position(case.step, pool, 0, *rows, k_cap=8, need_noise=True)
    with pytest.raises(UnsupportedConfigError, match="k_cap"):
        fm.draft_position(case.step, pool, 2, *rows, k_cap=5, need_noise=True)
    for k_cap in (8.0, torch.tensor(8)):            # equal to a valid k_cap, but not an int: refused before any launch
        with pytest.raises(UnsupportedConfigError, match="k_cap"):
            fm.draft_position(case.step, pool, 2, *rows, k_cap=k_cap, need_noise=True)
    with pytest.raises(UnsupportedConfigError, match="need_noise"):
        fm.draft_position(case.step, pool, 2, *rows, k_cap=8, need_noise=torch.tensor(True))
    for n in (2.0, True, torch.tensor(2)):          # the graph key needs a plain int
        with pytest.raises(ValueError, match="num_layers=.* must be an int"):
            fm.draft_position(case.step, pool, n, *rows, k_cap=8, need_noise=True)
    with pytest.raises(StepContractError, match=r"temperature must be \[R\] = \[3\] torch.float32, got \(4,\)"):
        fm.draft_position(case.step, pool, 2, torch.zeros(4), *rows[1:], k_cap=8, need_noise=True)
    with pytest.raises(StepContractError, match="top_k must be"):
        fm.draft_position(case.step, pool, 2, rows[0], rows[1].long(), *rows[2:], k_cap=8, need_noise=True)
    with pytest.raises(StepContractError, match="offsets must be"):
        fm.draft_position(case.step, pool, 2, *rows[:4], rows[4].int(), k_cap=8, need_noise=True)
    for i in range(cfg.num_layers):
        check_bitwise("draft_position", pool.k_caches[i].nan_to_num(7.0), ks[i].nan_to_num(7.0), output="k_cache")


def _fake_drafter_engine(runner):
    """An engine-shaped namespace around a real KV pool (two requests with 5 and 3 cached tokens) whose
    backend's built runner is `runner`; returns (engine, pool indices)."""
    from lowlat.runtime.kv_cache import KVCachePool

    cfg = tiny(num_layers=3)
    pool = KVCachePool(cfg, num_slots=64, max_reqs=4, max_ctx=32)
    idx = [pool.alloc_request(), pool.alloc_request()]
    pool.extend(idx[0], 5)
    pool.extend(idx[1], 3)
    engine = SimpleNamespace(cfg=cfg, pool=pool, widths=(1, 2, 4), max_rows=4, device=torch.device("cpu"),
                             backend=SimpleNamespace(built=SimpleNamespace(runner=runner), fallback=None))
    return engine, idx


class _RecordingRunner:
    """A fused runner double: records draft_position / early_exit_hidden calls; drafts token 10 + position."""

    def __init__(self, cfg):
        self.cfg, self.calls = cfg, []
        self.lm_head_w = torch.zeros(cfg.vocab_size, cfg.hidden_size, dtype=torch.bfloat16)

    def draft_position(self, step, pool, n, temperature, top_k, top_p, seeds, offsets, *, k_cap, need_noise):
        from lowlat.kernels.draft_sampling import DraftSample

        self.calls.append(("draft_position", step, pool, n, temperature, top_k, top_p, seeds, offsets, k_cap,
                           need_noise))
        m, v = step.num_valid_rows, self.cfg.vocab_size
        tok = 10 + int(offsets[0]) % 64
        return DraftSample(tokens=torch.full((m,), tok), logits=torch.zeros(m, v), lse=torch.zeros(m),
                           cut_value=torch.zeros(m), cut_id=torch.zeros(m, dtype=torch.int32), one_hot=True)

    def early_exit_hidden(self, step, pool, n):
        self.calls.append(("early_exit_hidden", step, pool, n))
        return torch.zeros(step.num_rows, self.cfg.hidden_size, dtype=torch.bfloat16)


def test_layer_skip_drafter_uses_the_fused_runner_when_built():
    """LayerSkipDrafter drafts each position through the built runner's draft_position (the drafter's Philox
    seeds and offsets rng_offset * DRAFT_OFFSET_STRIDE + position, the launch flags of the rows, q rows only
    for sampled requests) when every row fits the draft sampler; through early_exit_hidden + sample_drafts
    when a row does not (top_k 100); through the reference model with fused=False; through `forward=` when
    given."""
    from lowlat.kernels.draft_sampling import launch_flags
    from lowlat.runtime.drafters import DRAFT_OFFSET_STRIDE, LayerSkipDrafter, SpecState

    runner = _RecordingRunner(tiny(num_layers=3))
    engine, idx = _fake_drafter_engine(runner)
    greedy = SamplingParams(seed=5)
    sampled = SamplingParams(temperature=0.9, top_k=7, top_p=0.8, seed=77)

    def states(*params):
        return [SpecState(req=SimpleNamespace(params=p, req_pool_idx=i), pending=3 + b, history=[], max_draft=2,
                          rng_offset=4 + b) for b, (i, p) in enumerate(zip(idx, params))]

    prop = LayerSkipDrafter(2).propose(engine, states(greedy, sampled))
    calls = [c for c in runner.calls if c[0] == "draft_position"]
    assert len(calls) == 2 and len(runner.calls) == 2, [c[0] for c in runner.calls]
    for j, (_, step, pool, n, temp, top_k, top_p, seeds, offsets, k_cap, need_noise) in enumerate(calls):
        assert pool is engine.pool and n == 2 and step.num_valid_rows == 2
        assert step.positions[:2].tolist() == [5 + j, 3 + j]
        assert step.input_ids[:2].tolist() == ([3, 4] if j == 0 else [10 + 4 * DRAFT_OFFSET_STRIDE % 64] * 2)
        assert temp.tolist() == pytest.approx([0.0, 0.9]) and top_k.tolist() == [0, 7]
        assert top_p.tolist() == pytest.approx([1.0, 0.8])
        assert seeds.tolist() == [5, 77]
        assert offsets.tolist() == [4 * DRAFT_OFFSET_STRIDE + j, 5 * DRAFT_OFFSET_STRIDE + j]
        assert (k_cap, need_noise) == launch_flags(temp, top_k, engine.cfg.vocab_size) == (8, False)
    assert prop.tokens == [[10, 11], [10, 11]]
    assert prop.probs[0] is None and prop.probs[1].shape == (2, engine.cfg.vocab_size)
    assert prop.probs[1][:, 10:12].tolist() == [[1.0, 0.0], [0.0, 1.0]]

    runner.calls.clear()            # a row the draft sampler cannot take: layers through the runner, then sampling
    prop = LayerSkipDrafter(2).propose(engine, states(greedy, SamplingParams(temperature=1.0, top_k=100, seed=1)))
    assert [c[0] for c in runner.calls] == ["early_exit_hidden"] * 2 and all(len(t) == 2 for t in prop.tokens)
    runner.calls.clear()            # a GREEDY row's top-k / top-p do not matter: the graph takes it
    prop = LayerSkipDrafter(2).propose(engine, states(SamplingParams(top_k=100, top_p=0.5, seed=2), sampled))
    assert [c[0] for c in runner.calls] == ["draft_position"] * 2, [c[0] for c in runner.calls]

    runner.calls.clear()            # an lm_head override: the graph samples with the runner's own, so route 2
    mine = torch.ones(engine.cfg.vocab_size, engine.cfg.hidden_size, dtype=torch.bfloat16)
    prop = LayerSkipDrafter(2, lm_head=mine).propose(engine, states(greedy, greedy))
    assert [c[0] for c in runner.calls] == ["early_exit_hidden"] * 2, [c[0] for c in runner.calls]
    assert prop.tokens == [[0, 0], [0, 0]]          # the runner's zero hidden states: all logits tie, lowest id

    step = SimpleNamespace(num_rows=2)
    with pytest.raises(TypeError, match="LayerSkipDrafter needs"):
        LayerSkipDrafter(2, fused=False)._draft_hidden(engine, step)
    seen = []
    own = LayerSkipDrafter(2, forward=lambda st, pl, n: seen.append(n) or torch.zeros(st.num_rows, 64),
                           lm_head=torch.zeros(engine.cfg.vocab_size, 64))
    runner.calls.clear()
    assert [len(t) for t in own.propose(engine, states(greedy, greedy)).tokens] == [2, 2]
    assert seen == [2, 2] and runner.calls == []


@pytest.mark.interpreter
def test_layer_skip_drafter_draft_position_route_equals_early_exit_route():
    """`Engine(cfg, FusedModel(...), pool)` (the runner is the backend itself), three requests (top-k + top-p,
    greedy, temperature only), two drafts each: the draft_position route proposes exactly the tokens of the
    early_exit_hidden + sample_drafts route on the same Philox counters (on the CPU that route samples with
    the reference sampler), the same kept sets for the sampled requests, q rows within the policy's floor of
    the reference's, and no q for the greedy request."""
    from lowlat.runtime.drafters import LayerSkipDrafter, SpecState
    from lowlat.runtime.kv_cache import KVCachePool

    cfg = tiny(num_layers=3)
    w = random_model_weights(cfg, seed=8)
    fm = FusedModel(cfg, w, device="cpu", widths=(1, 2, 4))
    pool = KVCachePool(cfg, num_slots=64, max_reqs=4, max_ctx=32)
    g = torch.Generator().manual_seed(12)
    for kc, vc in zip(pool.k_caches, pool.v_caches):
        kc.copy_(torch.randn(kc.shape, generator=g))
        vc.copy_(torch.randn(vc.shape, generator=g))
    engine = Engine(cfg, fm, pool, widths=(1, 2, 4), max_rows=4)
    params = [SamplingParams(temperature=0.9, top_k=20, top_p=0.9, seed=3), SamplingParams(seed=8),
              SamplingParams(temperature=1.3, seed=4)]
    states = []
    for b, sp in enumerate(params):
        idx = pool.alloc_request()
        pool.extend(idx, 4 + 3 * b)
        states.append(SpecState(req=SimpleNamespace(params=sp, req_pool_idx=idx), pending=5 + 40 * b, history=[],
                                max_draft=2, rng_offset=2 + b))
    fused = LayerSkipDrafter(1).propose(engine, states)
    for b, s in enumerate(states):        # roll the draft positions back, as a verify step would
        pool.truncate(s.pool_idx, 4 + 3 * b)
    runner = SimpleNamespace(early_exit_hidden=fm.early_exit_hidden, lm_head_w=fm.lm_head_w)    # no draft_position
    separate = LayerSkipDrafter(1).propose(SimpleNamespace(**{**vars(engine), "backend": runner}), states)
    assert fused.tokens == separate.tokens and all(len(t) == 2 for t in fused.tokens)
    assert fused.probs[1] is None and separate.probs[1] is None
    for b in (0, 2):
        qf, qs = fused.probs[b], separate.probs[b]
        assert qf.shape == (2, cfg.vocab_size)
        check_bitwise("draft_position", qf > 0, qs > 0, output="kept_vs_early_exit_route")
        check_accuracy("draft_sampling", qf, qs, None, output="q_vs_early_exit_route")


@pytest.mark.slow
def test_greedy_speculative_with_fused_draft_positions_equals_plain_greedy(device, monkeypatch):
    """The fused contract backend on a tiny model (on the CPU: the Triton interpreter; on a GPU runner: the GPU,
    hardware facts probed), built for verify steps of k + 1 rows: greedy speculative decoding whose every draft
    position runs through FusedModel.draft_position emits plain greedy decoding's tokens exactly (verify rows are
    row-invariant decode rows), and frees every KV slot."""
    from lowlat.runtime import contract
    from lowlat.runtime.drafters import LayerSkipDrafter
    from lowlat.runtime.speculative import SpeculativeDecoder

    cfg = tiny(num_layers=2, head_dim=64, vocab_size=128)
    w = random_model_weights(cfg, seed=6)
    k = 3
    hardware = None if device.type == "cuda" else contract.DeviceFacts("sm_90", 132, "NVIDIA H200")
    eng = contract.fused_engine(cfg, w, device=device, num_slots=128, max_reqs=4, max_ctx=48, hardware=hardware,
                                runner_factory=contract.fused_runner, tokens_per_request=k + 1)
    runner = eng.backend.built.runner
    assert isinstance(runner, FusedModel), eng.backend.report()
    keys = []
    real = runner.draft_position
    monkeypatch.setattr(runner, "draft_position", lambda *a, **kw: keys.append(kw) or real(*a, **kw))
    prompts = [[3, 17, 99, 4, 8], [42, 7]]
    sp = SamplingParams(max_new_tokens=6, ignore_eos=True)
    plain = [r.output_ids for r in eng.generate(prompts, sp)]
    free_before = eng.pool.free_slots
    res = SpeculativeDecoder(eng, LayerSkipDrafter(1), k=k).generate(prompts, sp)
    assert [r.output_ids for r in res] == plain
    assert eng.pool.free_slots == free_before
    assert keys and all(kw == {"k_cap": 0, "need_noise": False} for kw in keys)
    assert eng.backend.counts["fused"] > 0


#: the self-speculation GPU tests' models: one per attention prologue FusedModel runs
SELF_SPEC_MODELS = ["SmolLM2-135M", "Llama-3.2-1B"]


def _self_spec_model(model: str, device):
    """(cfg, weights on `device`, draft depths n) of a self-speculation GPU test. SmolLM2-135M (30 layers, n = 4 and
    29) runs the split-K prologue (`attn_prologue`); Llama-3.2-1B's shapes cut to 3 layers and a 4096-token vocabulary
    (n = 1 and 2: early exits before the last layer, as SmolLM2's) run the held one (`attn_prologue_held`: held_prologue
    "auto" on an sm_90 GPU), whose launch reads the step inputs before its PDL wait, so the draft graphs are tested
    on both prologues."""
    if model == "SmolLM2-135M":
        return (*_smollm2_random(device), (4, 29))
    cfg = preset(model).replace(num_layers=3, vocab_size=4096)
    return cfg, random_model_weights(cfg, seed=0).to(device=device), (1, 2)


def _assert_runs_its_prologue(model: str, *models: FusedModel) -> None:
    """Every FusedModel of a `SELF_SPEC_MODELS` case runs the prologue the case is named for (the held one for
    Llama-3.2-1B only), so a case cannot silently test the other kernel."""
    for fm in models:
        assert fm.held_prologue is (model == "Llama-3.2-1B"), (model, fm.held_prologue)


@pytest.mark.gpu
@pytest.mark.parametrize("model", SELF_SPEC_MODELS)
def test_gpu_early_exit_graph_equals_eager_and_full_step_unchanged(device, model):
    """(width, n) graphs of the draft forward replay bitwise equal to an eager run, and interleaving
    them with full steps leaves the full step's logits bitwise unchanged; with the split-K prologue (SmolLM2-135M)
    and the held one (Llama-3.2-1B's shapes, 3 layers), asserted run."""
    cfg, w, depths = _self_spec_model(model, device)
    eager = FusedModel(cfg, w, device=device, use_cuda_graphs=False)
    graphed = FusedModel(cfg, w, device=device, use_cuda_graphs=True)
    _assert_runs_its_prologue(model, eager, graphed)
    case = random_step(ctx_lens=[40, 7, 90], new_rows=[1, 1, 1], num_kv_heads=cfg.num_kv_heads,
                       head_dim=cfg.head_dim, vocab_size=cfg.vocab_size, generator=torch.Generator().manual_seed(3),
                       device=device)
    ks, vs = layer_caches(case, cfg.num_layers, 3)
    pa = SimpleNamespace(k_caches=[k.clone() for k in ks], v_caches=[v.clone() for v in vs])
    pb = SimpleNamespace(k_caches=[k.clone() for k in ks], v_caches=[v.clone() for v in vs])
    full = eager.forward(case.step, pa).clone()
    check_bitwise("fused_model", graphed.forward(case.step, pb), full, output="logits_captured_first")
    for n in depths:
        a = eager.early_exit_hidden(case.step, pa, n).clone()
        for _ in range(2):                                   # capture, then a pure replay
            check_bitwise("fused_model", graphed.early_exit_hidden(case.step, pb, n), a, output=f"hidden_{n}")
    # the full step's graph, captured before the drafts, replays unchanged after them
    check_bitwise("fused_model", graphed.forward(case.step, pb), full, output="logits_after_drafts")


def assert_same_draft(a, b, what: str) -> None:
    """Bitwise: tokens, lse, cut value / id, the one_hot flag, and the logits unless one_hot."""
    assert a.one_hot == b.one_hot, f"{what}: one_hot {a.one_hot} vs {b.one_hot}"
    for name in ("tokens", "lse", "cut_value", "cut_id") + (() if a.one_hot else ("logits",)):
        check_bitwise("draft_position", getattr(b, name), getattr(a, name), output=f"{name}_{what}")


@pytest.mark.gpu
@pytest.mark.parametrize("model", SELF_SPEC_MODELS)
def test_gpu_draft_position_graph_equals_eager_bitwise(device, model):
    """Draft positions at widths 1 and 6 (5 valid rows + 1 padding row), two depths n (SmolLM2-135M: 4 and 29 of
    30 layers, split-K prologue; Llama-3.2-1B's shapes: 1 and 2 of 3, the held prologue, asserted run), greedy-only
    and mixed rows, PDL on: the DraftKey graph's capture run and a pure replay equal an eager run bitwise (tokens,
    lse, cut values, logits, one_hot; K/V); the tokens are the standalone draft sampler's on early_exit_hidden's rows;
    the full step's graph, captured first, replays unchanged after the drafts."""
    from lowlat.kernels.draft_sampling import draft_sample, launch_flags
    from lowlat.runtime.fused_model import DraftKey

    cfg, w, depths = _self_spec_model(model, device)
    eager = FusedModel(cfg, w, device=device, use_cuda_graphs=False)
    graphed = FusedModel(cfg, w, device=device, use_cuda_graphs=True)
    _assert_runs_its_prologue(model, eager, graphed)
    assert graphed.use_pdl
    for rows, width in ((1, 1), (5, 6)):
        case = random_step(ctx_lens=[40 + 7 * i for i in range(rows)], new_rows=[1] * rows,
                           num_kv_heads=cfg.num_kv_heads, head_dim=cfg.head_dim, vocab_size=cfg.vocab_size,
                           pad_to=width, generator=torch.Generator().manual_seed(rows), device=device)
        ks, vs = layer_caches(case, cfg.num_layers, rows)
        pa, pb = fresh_pool(ks, vs), fresh_pool(ks, vs)
        full = eager.forward(case.step, pa).clone()
        check_bitwise("fused_model", graphed.forward(case.step, pb), full, output="logits_captured_first")
        for n in depths:
            for rows_case in ("greedy", "mixed"):
                d = draft_rows(rows_case, rows, seed=n)
                a = run_draft_position(eager, case.step, pa, n, d)
                a = type(a)(a.tokens.clone(), a.logits.clone(), a.lse.clone(), a.cut_value.clone(), a.cut_id.clone(),
                            a.one_hot)
                for what in ("capture", "replay"):
                    assert_same_draft(a, run_draft_position(graphed, case.step, pb, n, d), f"{rows_case}_{n}_{what}")
                assert DraftKey(width, n, *launch_flags(d[0], d[1], cfg.vocab_size)) in graphed._graphs
                assert a.one_hot == (rows_case == "greedy")
                for i in range(cfg.num_layers):
                    check_bitwise("draft_position", pb.k_caches[i].nan_to_num(7.0), pa.k_caches[i].nan_to_num(7.0),
                                  output="k_cache")
                h = eager.early_exit_hidden(case.step, fresh_pool(ks, vs), n)[:rows]
                alone = draft_sample(h, eager.lm_head_w, *(t.to(device) for t in d[:3]), seeds=d[3].to(device),
                                     offsets=d[4].to(device))
                check_bitwise("draft_position", a.tokens, alone.tokens, output=f"tokens_vs_sampler_{rows_case}_{n}")
        check_bitwise("fused_model", graphed.forward(case.step, pb), full, output="logits_after_drafts")


@pytest.mark.gpu
def test_gpu_qwen3_moe_layer_graph_equals_eager_and_within_policy(device):
    """One Qwen3-30B-A3B layer (random weights; vocab cut to 4096 to keep the LM head small) as the fused
    step runs MoE layers by default (on the H200 the held out_proj writing x and its sums of squares, then the MoE
    block normalising x in its router launch). CUDA-graph replay ==
    eager bitwise at 1, 6 (padded to 8) and 48 rows; logits within the policy against the float64
    reference at 6 rows."""
    from lowlat.bench import random_weights_on_device

    cfg = preset("Qwen3-30B-A3B").replace(num_layers=1, vocab_size=4096)
    w = random_weights_on_device(cfg, device, seed=0)
    for rows, case, ks, vs, _, _, a in graph_vs_eager_steps(cfg, w, device, ((1, 0), (6, 1), (48, 2)),
                                                            widths=(1, 8, 48)):
        if rows == 6:
            oracle = ReferenceModel(cfg, w.to(dtype=torch.float64)).forward(
                case.step, [k.double() for k in ks], [v.double() for v in vs])
            baseline = ReferenceModel(cfg, w).forward(case.step, [k.clone() for k in ks], [v.clone() for v in vs])
            check_accuracy("fused_model", a, oracle, baseline, output="logits")


def test_draft_position_refuses_a_hidden_size_its_norm_kernel_cannot_take(monkeypatch):
    """H above the RMSNorm kernel's MAX_HIDDEN: UnsupportedConfigError naming hidden_size (not vocab_size), before
    any launch (the K/V cache untouched). The limit is lowered here so that a tiny model crosses it."""
    import lowlat.runtime.fused_model as fmod

    cfg = tiny(num_layers=3)
    fm = FusedModel(cfg, random_model_weights(cfg, seed=8), device="cpu", widths=(4,))
    case, ks, vs = _early_exit_case(cfg, 9)
    pool = fresh_pool(ks, vs)
    monkeypatch.setattr(fmod, "RMS_MAX_HIDDEN", cfg.hidden_size - 1)
    with pytest.raises(UnsupportedConfigError, match=f"hidden_size={cfg.hidden_size}"):
        fm.draft_position(case.step, pool, 2, *draft_rows("mixed", 3, seed=1), k_cap=8, need_noise=True)
    for i in range(cfg.num_layers):
        check_bitwise("draft_position", pool.k_caches[i].nan_to_num(7.0), ks[i].nan_to_num(7.0), output="k_cache")


def fused_model_module():
    from lowlat.runtime import fused_model

    return fused_model


def test_moe_out_proj_forms_resolve_and_refuse(monkeypatch):
    """`FusedModel(moe_out_proj=...)`: the default is "auto", which resolves to "held" where `held_residual_supported`
    allows (an sm_90 GPU; the GPU test below) else "norm_epilogue" (the CPU here); "held" where it is not supported
    raises UnsupportedConfigError with the reason; anything outside MOE_OUT_PROJ_FORMS raises StepContractError; dense
    models ignore it (None). Only the held model allocates the [w, H / 16] partial sums of squares. Where H / 16 passes
    the router's `moe.MAX_SUM_SQ_PARTS` (lowered here), "auto" is "norm_epilogue" and "held" is refused at build."""
    cfg = tiny(num_experts=4, top_k=2, moe_intermediate_size=32, architecture="Qwen3MoeForCausalLM", qk_norm=True)
    w = random_model_weights(cfg, seed=7)
    assert fused_model_module().MOE_OUT_PROJ == "auto"
    assert FusedModel(cfg, w, device="cpu", widths=(4,)).moe_out_proj == "norm_epilogue"
    assert FusedModel(cfg, w, device="cpu", widths=(4,), moe_out_proj="auto").moe_out_proj == "norm_epilogue"
    for form in ("split_k", "norm_epilogue"):
        assert FusedModel(cfg, w, device="cpu", widths=(4,), moe_out_proj=form).moe_out_proj == form
    why = held_residual_supported(cfg.hidden_size, cfg.q_size, "cpu")
    with pytest.raises(UnsupportedConfigError, match=re.escape(f"moe_out_proj='held': {why}")):
        FusedModel(cfg, w, device="cpu", widths=(4,), moe_out_proj="held")
    for bad in ("fast", True, None, "HELD"):
        with pytest.raises(StepContractError, match="moe_out_proj="):
            FusedModel(cfg, w, device="cpu", widths=(4,), moe_out_proj=bad)
    dense = tiny()
    assert FusedModel(dense, random_model_weights(dense, seed=1), device="cpu", widths=(4,),
                      moe_out_proj="held").moe_out_proj is None
    from lowlat.runtime import fused_model            # where the held GEMV is supported (built, never run here)
    monkeypatch.setattr(fused_model, "held_residual_supported", lambda n, k, device: None)
    for form, want in (("auto", "held"), ("held", "held"), (None, "held"), ("norm_epilogue", "norm_epilogue")):
        kw = {} if form is None else dict(moe_out_proj=form)
        fm = FusedModel(cfg, w, device="cpu", widths=(4,), **kw)
        assert fm.moe_out_proj == want
        assert fm._full["sum_sq"].shape == ((4, cfg.hidden_size // 16) if want == "held" else (4, 1))
        assert fm.moe_ws.h is None                  # the normed rows go to bufs.h (moe_forward's h_out)
    from lowlat.kernels import moe as kmoe        # H / 16 partial sums a row past what the router adds: not held
    monkeypatch.setattr(kmoe, "MAX_SUM_SQ_PARTS", cfg.hidden_size // 16 - 1)
    assert FusedModel(cfg, w, device="cpu", widths=(4,)).moe_out_proj == "norm_epilogue"
    with pytest.raises(UnsupportedConfigError, match=f"moe_out_proj='held': hidden_size {cfg.hidden_size}: "
                                                     f"{cfg.hidden_size // 16} partial sums of squares a row"):
        FusedModel(cfg, w, device="cpu", widths=(4,), moe_out_proj="held")


@pytest.mark.gpu
@pytest.mark.parametrize("form", ["held", "split_k", "norm_epilogue"])
def test_gpu_moe_out_proj_forms_within_policy_row_invariant_and_replayed(device, form):
    """One Qwen3-30B-A3B layer (random weights, vocab cut to 4096) with each form of the MoE layers' output projection
    (`moe_out_proj`: "held", what the default "auto" picks on an sm_90 GPU, and "split_k" leave the RMSNorm to the
    MoE's router launch; "norm_epilogue", what "auto" picks where the held GEMV does not run, is out_proj writing h): a
    mixed step (decode, verify and prefill-chunk rows, padding) within the policy against the float64 reference
    (logits, K / V); graphed decode steps of 1 / 6 / 16 rows give bitwise the logits and KV of a 48-row width (row
    invariance with padding), and the same logits on a pure replay with h (the normed rows the experts read), the
    attention output and the held out_proj's partial sums of squares (the router's statistic) NaN first (a launch
    reading them before they are rewritten would show)."""
    from lowlat.bench import random_weights_on_device

    cfg = preset("Qwen3-30B-A3B").replace(num_layers=1, vocab_size=4096)
    w = random_weights_on_device(cfg, device, seed=0)
    if form == "held":
        assert FusedModel(cfg, w, device=device, widths=(1,), moe_out_proj="auto").moe_out_proj == "held"   # H200
    fm = FusedModel(cfg, w, device=device, widths=(1, 6, 12, 16), moe_out_proj=form)
    assert fm.moe_out_proj == form
    MixedStep(cfg, w, device).check(fm, form)
    models = dict(on=fm, wide=FusedModel(cfg, w, device=device, widths=(48,), moe_out_proj=form))
    for rows, seed in ((1, 0), (6, 1), (16, 2)):
        case, ks, vs = decode_case(cfg, rows, seed, device)
        on = same_steps(models, case, ks, vs, cfg.num_layers, f"_r{rows}")
        replay_after_nan(fm, case, ks, vs, (fm._full["h"], fm._full["attn"], fm._full["sum_sq"]), on, f"_r{rows}")
