"""The fused decode step (lowlat.runtime.fused_model.FusedModel) vs lowlat.reference.model.ReferenceModel.

CPU (Triton interpreter, tiny random models): logits of mixed decode / verify / prefill-chunk steps
with padding within the numerics policy against the float64 oracle, KV written where the reference
writes it, padding rows 0, greedy generation through `Engine`, MoE layers through lowlat.kernels.moe,
refusals, and every kernel compiling for sm_90. GPU: CUDA-graph replay == eager bitwise, greedy
generation equal to the reference engine on a random-weight SmolLM2-135M-shape model; one Qwen3-30B-A3B
MoE layer: graph == eager bitwise, logits within the policy.
"""

from __future__ import annotations

import os
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch

from lowlat.config import preset
from lowlat.errors import StepContractError, UnsupportedConfigError
from lowlat.numerics import check_accuracy, check_bitwise
from lowlat.reference.model import ReferenceModel
from lowlat.runtime.engine import Engine, SamplingParams, reference_engine
from lowlat.runtime.fused_model import FusedModel
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


def compare_step(cfg, weights, case, *, seed=0, widths=(1, 2, 4, 6, 8, 12, 16, 24, 32, 48)):
    """Run one step fused and through the reference (float64 oracle, bf16 baseline) on identical
    caches; check logits, padding rows, tokens, and the K/V the step wrote."""
    ks, vs = layer_caches(case, cfg.num_layers, seed)
    pool = SimpleNamespace(k_caches=[k.clone() for k in ks], v_caches=[v.clone() for v in vs])
    fm = FusedModel(cfg, weights, device="cpu", widths=widths)
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
        untouched = torch.ones(ks[i].shape[0], dtype=torch.bool)
        untouched[loc] = False
        check_bitwise("fused_model", pool.k_caches[i][untouched].nan_to_num(7.0), ks[i][untouched].nan_to_num(7.0),
                      output="k_cache_untouched")
    return logits


def test_one_layer_decode_and_verify_rows_within_policy():
    cfg = tiny()
    w = random_model_weights(cfg, seed=1)
    case = random_step(ctx_lens=[5, 0, 12], new_rows=[1, 3, 1], num_kv_heads=cfg.num_kv_heads,
                       head_dim=cfg.head_dim, pad_to=6, vocab_size=cfg.vocab_size,
                       generator=torch.Generator().manual_seed(2))
    compare_step(cfg, w, case)


def test_two_layer_model_padded_to_width_within_policy():
    """7 rows padded to width 8: two decode rows and a 5-row prefill chunk, Qwen2-style QKV bias."""
    cfg = tiny(num_layers=2, qkv_bias=True)
    w = random_model_weights(cfg, seed=3)
    case = random_step(ctx_lens=[9, 2, 0], new_rows=[1, 1, 5], num_kv_heads=cfg.num_kv_heads,
                       head_dim=cfg.head_dim, vocab_size=cfg.vocab_size, generator=torch.Generator().manual_seed(4))
    assert case.step.num_rows == 7
    logits = compare_step(cfg, w, case, seed=5, widths=(4, 8))
    assert logits.shape == (7, cfg.vocab_size)


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


def test_moe_layer_runs_through_moe_kernels():
    """An MoE config (4 experts, top-2) goes through lowlat.kernels.moe and matches the reference."""
    cfg = tiny(num_experts=4, top_k=2, moe_intermediate_size=32, architecture="Qwen3MoeForCausalLM",
               qk_norm=True)
    w = random_model_weights(cfg, seed=7)
    case = random_step(ctx_lens=[3, 6], new_rows=[1, 1], num_kv_heads=cfg.num_kv_heads, head_dim=cfg.head_dim,
                       pad_to=4, vocab_size=cfg.vocab_size, generator=torch.Generator().manual_seed(8))
    compare_step(cfg, w, case, widths=(4,))


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


def test_unsupported_configs_are_refused():
    with pytest.raises(UnsupportedConfigError, match="head_dim"):
        FusedModel(tiny(head_dim=16), random_model_weights(tiny(head_dim=16), seed=0), device="cpu")
    with pytest.raises(StepContractError, match="widths"):
        FusedModel(tiny(), random_model_weights(tiny(), seed=0), device="cpu", widths=(1, 64))


def test_kernels_compile_for_sm90():
    """Every fused GEMV kernel (SmolLM2's plans, 1 and 3 row blocks) compiles for sm_90 with Triton's
    own ptxas (no GPU needed): tensor cores, griddepcontrol (PDL), no register spills; a preload
    kernel issues its weight loads before the PDL wait, a stream kernel pipelines with cp.async."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    res = subprocess.run([sys.executable, "-m", "lowlat.kernels.sm90_check", "--quick"], env=env,
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    lines = [ln for ln in res.stdout.splitlines() if ln.startswith("kernel=")]
    assert len(lines) == 12, res.stdout         # 10 GEMV launches + the attention prologue at 1 and 3 row blocks
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


def graph_vs_eager_steps(cfg, w, device, rows_seeds, **fm_kw):
    """For each (rows, seed): a decode step of `rows` requests (request i with 37 + 5i cached tokens) run by
    an eager FusedModel and by a graphed one (the first call of a width captures, the second is a pure
    replay) on copies of the same caches; checks the graphed logits bitwise equal to the eager ones and
    yields (rows, case, ks, vs, pa, pb, eager logits) (pa / pb: the eager / graphed runs' caches)."""
    eager = FusedModel(cfg, w, device=device, use_cuda_graphs=False, **fm_kw)
    graphed = FusedModel(cfg, w, device=device, use_cuda_graphs=True, **fm_kw)
    for rows, seed in rows_seeds:
        case = random_step(ctx_lens=[37 + 5 * i for i in range(rows)], new_rows=[1] * rows,
                           num_kv_heads=cfg.num_kv_heads, head_dim=cfg.head_dim, vocab_size=cfg.vocab_size,
                           generator=torch.Generator().manual_seed(seed), device=device)
        ks, vs = layer_caches(case, cfg.num_layers, seed)
        pa = SimpleNamespace(k_caches=[k.clone() for k in ks], v_caches=[v.clone() for v in vs])
        pb = SimpleNamespace(k_caches=[k.clone() for k in ks], v_caches=[v.clone() for v in vs])
        a = eager.forward(case.step, pa).clone()
        b = graphed.forward(case.step, pb).clone()       # first call of a width: eager + capture + replay
        c = graphed.forward(case.step, pb).clone()       # a pure replay
        check_bitwise("fused_model", b, a, output="logits_graph_vs_eager")
        check_bitwise("fused_model", c, a, output="logits_replay_vs_eager")
        yield rows, case, ks, vs, pa, pb, a


@pytest.mark.gpu
def test_gpu_graph_replay_equals_eager_bitwise(device):
    cfg, w = _smollm2_random(device)
    for _, _, _, _, pa, pb, _ in graph_vs_eager_steps(cfg, w, device, ((1, 0), (6, 1), (8, 2), (16, 3), (48, 4))):
        for i in range(cfg.num_layers):
            check_bitwise("fused_model", pb.k_caches[i].nan_to_num(7.0), pa.k_caches[i].nan_to_num(7.0),
                          output="k_cache")


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


def _early_exit_case(cfg, seed):
    case = random_step(ctx_lens=[6, 0, 3], new_rows=[1, 1, 1], num_kv_heads=cfg.num_kv_heads,
                       head_dim=cfg.head_dim, vocab_size=cfg.vocab_size, pad_to=4,
                       generator=torch.Generator().manual_seed(seed))
    return case, *layer_caches(case, cfg.num_layers, seed)


def test_early_exit_hidden_matches_reference_first_layers():
    """The self-speculation draft forward: layers 0..n-1 fused, final RMSNorm, no LM head, vs
    ReferenceModel.hidden_states(num_layers=n); K/V written for layers < n only, padding rows 0."""
    cfg = tiny(num_layers=3)
    w = random_model_weights(cfg, seed=8)
    case, ks, vs = _early_exit_case(cfg, 9)
    n = 2
    pool = SimpleNamespace(k_caches=[k.clone() for k in ks], v_caches=[v.clone() for v in vs])
    fm = FusedModel(cfg, w, device="cpu", widths=(4,))
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


def test_layer_skip_drafter_uses_the_fused_runner_when_built():
    """LayerSkipDrafter drafts through the built runner's early_exit_hidden (not the reference model)
    when the engine's backend has one, and through the reference model with fused=False."""
    from lowlat.runtime.drafters import LayerSkipDrafter

    calls = []

    class Runner:
        def early_exit_hidden(self, step, pool, n):
            calls.append((step, pool, n))
            return torch.zeros(step.num_rows, 4)

    pool = object()                                     # the engine's KV pool goes to the runner as is
    engine = SimpleNamespace(cfg=SimpleNamespace(num_layers=3), pool=pool,
                             backend=SimpleNamespace(built=SimpleNamespace(runner=Runner()), fallback=None))
    step = SimpleNamespace(num_rows=2)
    assert LayerSkipDrafter(2)._draft_hidden(engine, step).shape == (2, 4) and calls == [(step, pool, 2)]
    with pytest.raises(TypeError, match="LayerSkipDrafter needs"):
        LayerSkipDrafter(2, fused=False)._draft_hidden(engine, step)


@pytest.mark.gpu
def test_gpu_early_exit_graph_equals_eager_and_full_step_unchanged(device):
    """(width, n) graphs of the draft forward replay bitwise equal to an eager run, and interleaving
    them with full steps leaves the full step's logits bitwise unchanged."""
    cfg, w = _smollm2_random(device)
    eager = FusedModel(cfg, w, device=device, use_cuda_graphs=False)
    graphed = FusedModel(cfg, w, device=device, use_cuda_graphs=True)
    case = random_step(ctx_lens=[40, 7, 90], new_rows=[1, 1, 1], num_kv_heads=cfg.num_kv_heads,
                       head_dim=cfg.head_dim, vocab_size=cfg.vocab_size, generator=torch.Generator().manual_seed(3),
                       device=device)
    ks, vs = layer_caches(case, cfg.num_layers, 3)
    pa = SimpleNamespace(k_caches=[k.clone() for k in ks], v_caches=[v.clone() for v in vs])
    pb = SimpleNamespace(k_caches=[k.clone() for k in ks], v_caches=[v.clone() for v in vs])
    full = eager.forward(case.step, pa).clone()
    check_bitwise("fused_model", graphed.forward(case.step, pb), full, output="logits_captured_first")
    for n in (4, 29):
        a = eager.early_exit_hidden(case.step, pa, n).clone()
        for _ in range(2):                                   # capture, then a pure replay
            check_bitwise("fused_model", graphed.early_exit_hidden(case.step, pb, n), a, output=f"hidden_{n}")
    # the full step's graph, captured before the drafts, replays unchanged after them
    check_bitwise("fused_model", graphed.forward(case.step, pb), full, output="logits_after_drafts")


@pytest.mark.gpu
def test_gpu_qwen3_moe_layer_graph_equals_eager_and_within_policy(device):
    """One Qwen3-30B-A3B layer (random weights; vocab cut to 4096 to keep the LM head small) as the fused
    step runs MoE layers: out_proj writing x and h = rms_norm(x), then the MoE block. CUDA-graph replay ==
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
