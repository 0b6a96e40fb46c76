"""Fused attention prologue (lowlat/kernels/attn_prologue.py) vs its reference
(lowlat/reference/attn_prologue.py): accuracy under the numerics policy, padding rows, KV writes,
typed errors; on the GPU also full model shapes, bitwise determinism, row invariance, PDL and graphs.

CPU: the kernel runs under the Triton interpreter at tiny shapes (<= 6 hypothesis examples each).
"""

import dataclasses
import re

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from lowlat.config import preset
from lowlat.errors import StepContractError
from lowlat.kernels._attn_common import interpreting
from lowlat.kernels._gemv import GemvWorkspace, plan_gemv
from lowlat.kernels.attn_prologue import (attn_prologue, make_prologue_workspace, pack_qkv, pack_qkv_bias,
                                          rope_table)
from lowlat.numerics import check_accuracy, check_bitwise, oracle_cast, poison
from lowlat.reference.attention import paged_attention
from lowlat.reference.attn_prologue import attn_prologue as ref_attn_prologue
from lowlat.reference.layer import attention_block
from lowlat.reference.rms_norm import rms_norm
from lowlat.reference.rope import rope_cos_sin, rope_inv_freq
from lowlat.testing import random_step, split_rows, tiny_config
from lowlat.weights import random_layer_weights

#: interpreter runs are slow: at most 6 examples per property on CPU; the profile's count on a GPU
FEW = settings(max_examples=6) if interpreting() else settings()
MAX_POS = 256


def _case(cfg, *, ctxs, rows, pad, seed, device, hostile_padding=False):
    """Weights, a step (shuffled slots, NaN in unowned slots), x and the table for one layer."""
    g = torch.Generator().manual_seed(seed)
    # attention weights only: a dense config with a tiny MLP (MoE experts would only cost time here)
    wcfg = cfg.replace(num_experts=0, top_k=0, moe_intermediate_size=0, intermediate_size=16)
    lw = random_layer_weights(wcfg, generator=g)
    case = random_step(ctx_lens=ctxs, new_rows=rows, num_kv_heads=cfg.num_kv_heads, head_dim=cfg.head_dim,
                       pad_to=sum(rows) + pad, generator=g)
    x = torch.randn(case.step.num_rows, cfg.hidden_size, generator=g).bfloat16()
    if hostile_padding:
        x[case.step.num_valid_rows:] = 1e4
    lw = lw.map(lambda t: t.to(device))
    return lw, case.step.to(device), x.to(device), case.k_cache.to(device), case.v_cache.to(device)



def _run_kernel(cfg, lw, step, x, kc, vc, *, table, workspace=None, use_pdl=False, nvr=None):
    out_q = poison(torch.empty((x.shape[0], cfg.num_heads, cfg.head_dim), dtype=torch.bfloat16, device=x.device))
    q = attn_prologue(x, pack_qkv(lw), pack_qkv_bias(lw), lw.attn_norm, lw.q_norm, lw.k_norm, step.positions,
                      step.out_cache_loc, step.num_valid_rows if nvr is None else nvr, kc, vc, table, cfg=cfg,
                      out_q=out_q, workspace=workspace, use_pdl=use_pdl)
    assert q is out_q
    return q


def _run_reference(cfg, lw, step, x, kc, vc, dtype):
    """(q, k_cache, v_cache) of the reference in `dtype` (bf16 baseline, float64 oracle)."""
    cast = (lambda t: t) if dtype == torch.bfloat16 else oracle_cast
    inv = rope_inv_freq(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling,
                        torch.float64 if dtype == torch.float64 else torch.float32).to(x.device)
    kc, vc = cast(kc.clone()), cast(vc.clone())
    b = pack_qkv_bias(lw)
    q = ref_attn_prologue(cast(x), cast(pack_qkv(lw)), None if b is None else cast(b), cast(lw.attn_norm),
                          cast(lw.q_norm), cast(lw.k_norm), step.positions, step.out_cache_loc,
                          step.num_valid_rows, kc, vc, inv, eps=cfg.rms_eps)
    return q, kc, vc


def _check_against_reference(cfg, lw, step, x, kc0, vc0, run=None, **kw):  # kw: run's
    """q of every row and K / V at the valid rows' slots of one launch within the prologue's policy
    (`check_accuracy("attn_prologue", ...)`: at most 2x the bf16 reference's own error against float64), no other
    slot changed; the launch `run` is the split-K prologue's `_run_kernel` (default) or the held one's `_run_held`
    (held to the same bound)."""
    kc, vc = kc0.clone(), vc0.clone()
    table = rope_table(cfg, MAX_POS, x.device)
    q = (run or _run_kernel)(cfg, lw, step, x, kc, vc, table=table, **kw)
    qo, kco, vco = _run_reference(cfg, lw, step, x, kc0, vc0, torch.float64)
    qb, kcb, vcb = _run_reference(cfg, lw, step, x, kc0, vc0, torch.bfloat16)
    check_accuracy("attn_prologue", q, qo, qb, output="q")
    n = step.num_valid_rows
    loc = step.out_cache_loc[:n].long()
    check_accuracy("attn_prologue", kc[loc], kco[loc], kcb[loc], output="k_cache")
    check_accuracy("attn_prologue", vc[loc], vco[loc], vcb[loc], output="v_cache")
    _assert_only_slots_written(kc0, kc, loc)
    _assert_only_slots_written(vc0, vc, loc)
    return q, kc, vc


def _assert_only_slots_written(before, after, loc):
    keep = torch.ones(before.shape[0], dtype=torch.bool, device=before.device)
    keep[loc] = False
    b, a = before[keep], after[keep]
    assert torch.equal(b.isnan(), a.isnan()) and torch.equal(b.nan_to_num(), a.nan_to_num()), \
        "a KV slot other than the valid rows' out_cache_loc changed (padding rows must write nothing)"


# ----------------------------------------------------------------------------- CPU (interpreter)
@FEW
@given(m=st.integers(1, 48), pad=st.integers(0, 3), group=st.sampled_from([1, 3, 4]),
       hkv=st.sampled_from([1, 2]), d=st.sampled_from([16, 32, 64]), hidden=st.sampled_from([32, 48, 96]),
       bias=st.booleans(), qk_norm=st.booleans(), split_k=st.sampled_from([1, 2, 3]), preload=st.booleans(),
       bn=st.sampled_from([None, 32, 128]), early=st.booleans(), seed=st.integers(0, 2**16))
def test_attn_prologue_within_2x_baseline_error(device, m, pad, group, hkv, d, hidden, bias, qk_norm, split_k,
                                                 preload, bn, early, seed):
    """q of every row and the K/V written at each valid row's slot match the reference; nothing else
    in the cache changes; padding rows write nothing. Both weight-stream modes of the plan (preload,
    stream), split-K 1..3, tiles of one to several heads (bn 32..128; raised to D/2 where narrower);
    tiles past the last head are masked (N/2 not a multiple of bn); the epilogue's inputs loaded early or
    where they are used."""
    cfg = tiny_config(hidden_size=hidden, num_heads=group * hkv, num_kv_heads=hkv, head_dim=d,
                      qkv_bias=bias, qk_norm=qk_norm)
    rows = split_rows(m)
    ctxs = [(seed >> i) % 40 for i in range(len(rows))]
    pad = min(pad, 48 - m)                         # valid + padding rows within a launch's 48
    lw, step, x, kc, vc = _case(cfg, ctxs=ctxs, rows=rows, pad=pad, seed=seed, device=device)
    fields = dict(block_k=16, split=split_k, preload=preload) | ({} if bn is None else dict(bn=bn))
    ws = make_prologue_workspace(pack_qkv(lw), d, early_inputs=early, **fields)
    assert ws.plan.bn >= d // 2 and ws.plan.preload == preload and ws.early_inputs == early
    _check_against_reference(cfg, lw, step, x, kc, vc, workspace=ws)
    assert int(ws.counters.abs().sum()) == 0, "split-K counters must be reset by the last arriver"


@pytest.mark.parametrize("hidden, heads, hkv, d, bias, qk_norm, split, preload, bn, m", [
    (64, 4, 2, 32, True, True, 2, True, 64, 3),         # preload, split-K, two heads per tile
    (96, 6, 2, 64, False, True, 3, False, 64, 20),      # stream, split 3 over 2 row blocks, one head per tile
    (48, 3, 1, 32, True, False, 1, False, 64, 20),      # two row blocks, N/2 = 80: the last tile half masked
    (64, 8, 2, 16, False, True, 1, True, 128, 33),      # three row blocks, 16 heads of D 16 in one tile
    (64, 4, 2, 32, True, True, 2, False, 16, 40),       # bn 16 (one head per tile), split 2, 3 row blocks
])
def test_attn_prologue_plan_modes(device, hidden, heads, hkv, d, bias, qk_norm, split, preload, bn, m):
    """Fixed corners of the tiling, each against the reference: preload / stream weights, split-K with the
    finisher's rotary epilogue, 1-3 row blocks, tiles of one or many heads, a masked last tile; the
    epilogue's inputs loaded early and where they are used give the same bits."""
    cfg = tiny_config(hidden_size=hidden, num_heads=heads, num_kv_heads=hkv, head_dim=d, qkv_bias=bias,
                      qk_norm=qk_norm)
    rows = split_rows(m)
    lw, step, x, kc, vc = _case(cfg, ctxs=[(5 * i) % 13 for i in range(len(rows))], rows=rows, pad=2, seed=m,
                                device=device)
    outs = []
    for early in (False, True):
        ws = make_prologue_workspace(pack_qkv(lw), d, block_k=16, split=split, preload=preload, bn=bn,
                                     early_inputs=early)
        assert (ws.plan.split, ws.plan.preload, ws.plan.bn, ws.early_inputs) == (split, preload, bn, early)
        assert ws.counters.numel() >= 3 * ws.plan.n_tiles      # one counter per (tile, row block)
        outs.append(_check_against_reference(cfg, lw, step, x, kc, vc, workspace=ws))
        assert int(ws.counters.abs().sum()) == 0
    for name, late, early in zip(("q", "k_cache", "v_cache"), *outs):
        check_bitwise("attn_prologue", early.nan_to_num(), late.nan_to_num(), output=f"{name}_early_inputs")


def test_prologue_launches_the_plan_of_its_row_block_count(device, monkeypatch):
    """A prologue plan whose weight stream depends on the width (`GemvPlan.by_row_blocks`: preload at 2 row blocks,
    stream at 1 and 3) is launched with the plan of the launch's row-block count (one row block per program, so
    the count is the launch's, not the program's, while the stream loop is as deep as one block's), and every width
    is within the policy of the reference."""
    import lowlat.kernels.attn_prologue as ap
    from lowlat.testing import spy_launch_constexprs

    seen = spy_launch_constexprs(monkeypatch, ap)
    cfg = tiny_config(hidden_size=64, num_heads=4, num_kv_heads=2, head_dim=32, qkv_bias=True, qk_norm=True)
    for m in (3, 20, 40):
        rows = split_rows(m)
        lw, step, x, kc, vc = _case(cfg, ctxs=[(7 * i) % 11 for i in range(len(rows))], rows=rows, pad=0, seed=m,
                                    device=device)
        base = make_prologue_workspace(pack_qkv(lw), cfg.head_dim, block_k=16, split=2, preload=False, bn=32,
                                       stages=3).plan
        plan = dataclasses.replace(base, by_row_blocks={2: dict(preload=True, stages=1, pf_k=0)})
        _check_against_reference(cfg, lw, step, x, kc, vc,
                                 workspace=make_prologue_workspace(pack_qkv(lw), cfg.head_dim, plan=plan))
    assert [(lc["PRELOAD"], lc["NUM_MB"], lc["num_stages"]) for lc in seen] == [(False, 1, 3), (True, 2, 1),
                                                                                  (False, 3, 3)]


def test_prologue_bn_by_width_launches_its_own_grid_and_refuses_qk_norm(device):
    """A prologue plan whose bn depends on the row-block count (session 17: Llama-3.2-1B's runs bn 32 at 1 row block,
    bn 64 at 2-3) is launched with each width's own tiling: bn 64 in the plan, bn 16 (one head of D 32 a tile, 8
    tiles) at 1 row block and bn 32 at 2; 3 / 20 / 40 rows are each within the policy of the reference with every
    output written (poisoned first: the base plan's 2 tiles would leave most heads unwritten at 3 and 20 rows). With
    QK-norm (its sums run over a head's tile rows) the same plan raises StepContractError and writes no K / V."""
    for qk_norm in (False, True):
        cfg = tiny_config(hidden_size=64, num_heads=4, num_kv_heads=2, head_dim=32, qkv_bias=True, qk_norm=qk_norm)
        for m in (3, 20, 40):
            rows = split_rows(m)
            lw, step, x, kc, vc = _case(cfg, ctxs=[(3 * i) % 11 for i in range(len(rows))], rows=rows, pad=0, seed=m,
                                        device=device)
            base = make_prologue_workspace(pack_qkv(lw), cfg.head_dim, block_k=16, split=2, preload=False, bn=64,
                                           stages=3).plan
            plan = dataclasses.replace(base, by_row_blocks={1: dict(bn=16), 2: dict(bn=32)})
            assert [plan.at(b).n_tiles for b in (1, 2, 3)] == [8, 4, 2]
            ws = make_prologue_workspace(pack_qkv(lw), cfg.head_dim, plan=plan)
            if not qk_norm:
                _check_against_reference(cfg, lw, step, x, kc, vc, workspace=ws)
                continue
            kc0, vc0 = kc.clone(), vc.clone()
            with pytest.raises(StepContractError, match="prologue with QK-norm cannot take a plan whose bn"):
                _run_kernel(cfg, lw, step, x, kc, vc, table=rope_table(cfg, MAX_POS, device), workspace=ws)
            assert torch.equal(kc.nan_to_num(), kc0.nan_to_num()) and torch.equal(vc.nan_to_num(), vc0.nan_to_num())


def test_prologue_refuses_a_bn_by_width_narrower_than_half_a_head(device, monkeypatch):
    """A tile must hold whole heads at every width: a plan whose bn at some row-block count is not a multiple of D/2
    (bn 16 at 1 row block, D 64) is refused by `attn_prologue` with a StepContractError naming its bns, before any
    write (q, K and V left poisoned), and by `prologue_plan` when a table entry sets it (naming the count)."""
    from lowlat.kernels import _gemv
    from lowlat.kernels.attn_prologue import prologue_plan

    cfg = tiny_config(hidden_size=64, num_heads=4, num_kv_heads=2, head_dim=64, qkv_bias=False, qk_norm=False)
    lw, step, x, kc, vc = _case(cfg, ctxs=[2, 5], rows=[1, 1], pad=1, seed=3, device=device)
    w = pack_qkv(lw)
    base = make_prologue_workspace(w, cfg.head_dim, block_k=16, split=2, preload=False, bn=64, stages=3).plan
    plan = dataclasses.replace(base, by_row_blocks={1: dict(bn=16)})
    ws = make_prologue_workspace(w, cfg.head_dim, plan=plan)
    kc0, vc0 = kc.clone(), vc.clone()
    out_q = poison(torch.empty((x.shape[0], cfg.num_heads, cfg.head_dim), dtype=torch.bfloat16, device=device))
    with pytest.raises(StepContractError, match=re.escape("bn=16/64;")):
        attn_prologue(x, w, None, lw.attn_norm, None, None, step.positions, step.out_cache_loc, step.num_valid_rows,
                      kc, vc, rope_table(cfg, MAX_POS, device), cfg=cfg, out_q=out_q, workspace=ws)
    assert bool(out_q.isnan().all())
    assert torch.equal(kc.nan_to_num(), kc0.nan_to_num()) and torch.equal(vc.nan_to_num(), vc0.nan_to_num())
    monkeypatch.delenv("LOWLAT_GEMV_PLANS", raising=False)
    fields = {f: getattr(plan, f) for f in ("block_k", "split", "chunks_per_split", "bn", "preload", "warps",
                                            "stages", "pf_k", "by_row_blocks")}
    monkeypatch.setitem(_gemv.TUNED_PLANS, ("qkv", plan.n, plan.k), fields)
    with pytest.raises(StepContractError, match="runs bn 16 at 1 row blocks .*narrower than D/2=32"):
        prologue_plan(w, cfg.head_dim)


def test_early_inputs_rule_counts_the_programs_of_one_row_block():
    """With bn depending on the width, the rule counts the (tile, split) programs of a launch of one row block (where
    it was measured): Llama-3.2-1B's QKV at bn 32, split 4 is 192 programs (late), but 48 (early) with bn 128 at 1 row
    block."""
    from lowlat.kernels.attn_prologue import EARLY_INPUTS_PROGRAMS

    cfg = preset("Llama-3.2-1B")
    w = torch.empty(cfg.q_size + 2 * cfg.kv_size, cfg.hidden_size, dtype=torch.bfloat16)
    base = plan_gemv(w.shape[0] // 2, w.shape[1], kind="qkv", bn=32, split=4, preload=False)
    wide = dataclasses.replace(base, by_row_blocks={1: dict(bn=128)})
    assert base.n_tiles * base.split == 192 >= EARLY_INPUTS_PROGRAMS > wide.at(1).n_tiles * wide.split == 48
    assert not make_prologue_workspace(w, cfg.head_dim, plan=base).early_inputs
    assert make_prologue_workspace(w, cfg.head_dim, plan=wide).early_inputs


def test_early_inputs_rule():
    """The default: epilogue inputs loaded early only for launches of fewer (tile, split) programs than
    EARLY_INPUTS_PROGRAMS (SmolLM2's 40 programs: early; Llama-3.2-1B's 384 and Qwen3-30B-A3B's 320: not)."""
    from lowlat.kernels.attn_prologue import EARLY_INPUTS_PROGRAMS

    for name, early in (("SmolLM2-135M", True), ("Llama-3.2-1B", False), ("Qwen3-30B-A3B", False)):
        cfg = preset(name)
        w = torch.empty(cfg.q_size + 2 * cfg.kv_size, cfg.hidden_size, dtype=torch.bfloat16)
        ws = make_prologue_workspace(w, cfg.head_dim)
        assert ws.early_inputs == early == (ws.plan.n_tiles * ws.plan.split < EARLY_INPUTS_PROGRAMS), name


def test_attn_prologue_48_rows(device):
    """48 rows, the most a launch takes: the third row block ends at row 47 (valid row 46, padding row 47)."""
    cfg = tiny_config(hidden_size=32, num_heads=2, num_kv_heads=1, head_dim=16)
    rows = split_rows(47)
    lw, step, x, kc, vc = _case(cfg, ctxs=[i % 5 for i in range(len(rows))], rows=rows, pad=1, seed=5,
                                device=device)
    ws = make_prologue_workspace(pack_qkv(lw), 16, block_k=16, split=2)
    _check_against_reference(cfg, lw, step, x, kc, vc, workspace=ws)


def test_attn_prologue_split_k_adds_partials_in_split_order(device):
    """split 3: the finisher adds the fp32 partials as (p0 + p1) + p2. Built so that only this order is
    exact: V row 0 of the only KV head has partials 2^30, -2^30, 1 (x = 1, attn_norm = 1), so v = rstd
    = 1 in bf16 (any other order loses the 1 against 2^30 and gives 0)."""
    cfg = tiny_config(hidden_size=48, num_heads=1, num_kv_heads=1, head_dim=16)
    _, step, x, kc, vc = _case(cfg, ctxs=[2], rows=[1], pad=0, seed=0, device=device)
    w = torch.zeros(3 * 16, 48, dtype=torch.bfloat16, device=device)
    w[32, :16], w[32, 16:32], w[32, 32] = 2.0 ** 26, -(2.0 ** 26), 1.0        # row Hq*D + Hkv*D: V, index 0
    ws = make_prologue_workspace(w, 16, block_k=16, split=3)
    assert (ws.plan.split, ws.plan.chunks_per_split) == (3, 1)
    one = torch.ones(48, dtype=torch.bfloat16, device=device)
    attn_prologue(torch.ones_like(x), w, None, one, None, None, step.positions, step.out_cache_loc, 1, kc, vc,
                  rope_table(cfg, MAX_POS, device), cfg=cfg, workspace=ws)
    assert vc[int(step.out_cache_loc[0]), 0, 0].item() == 1.0


def test_attn_prologue_zero_row_stays_finite_with_qk_norm(device):
    """A row of zeros: RMSNorm and QK-norm keep their eps (q, K, V are 0 as in the reference, not NaN)."""
    cfg = tiny_config(hidden_size=32, num_heads=2, num_kv_heads=1, head_dim=16, qk_norm=True)
    lw, step, x, kc, vc = _case(cfg, ctxs=[1, 4], rows=[1, 1], pad=1, seed=2, device=device)
    x[1] = 0
    q, kc, vc = _check_against_reference(cfg, lw, step, x, kc, vc)
    assert not q.isnan().any() and torch.all(q[1] == 0)


def test_attn_prologue_num_valid_rows_tensor(device):
    """num_valid_rows as a 1-element int32 tensor (the CUDA-graph path, read in-kernel) on the interpreter."""
    cfg = tiny_config(hidden_size=32, num_heads=2, num_kv_heads=1, head_dim=16)
    lw, step, x, kc, vc = _case(cfg, ctxs=[2, 6], rows=[2, 1], pad=2, seed=4, device=device)
    nvr = torch.tensor([step.num_valid_rows], dtype=torch.int32, device=device)
    _check_against_reference(cfg, lw, step, x, kc, vc, nvr=nvr)


def test_attn_prologue_strided_x_out_q_v_cache(device):
    """x (2 row blocks), out_q and v_cache as views with row / slot / head strides wider than packed: each
    kernel uses its own tensor's strides (same bits as packed tensors)."""
    cfg = tiny_config(hidden_size=32, num_heads=2, num_kv_heads=1, head_dim=16)
    rows = split_rows(18)
    lw, step, x, kc0, vc0 = _case(cfg, ctxs=[i % 4 for i in range(len(rows))], rows=rows, pad=1, seed=9,
                                  device=device)
    table = rope_table(cfg, MAX_POS, device)
    kc1, vc1 = kc0.clone(), vc0.clone()
    want = _run_kernel(cfg, lw, step, x, kc1, vc1, table=table)
    xs = torch.zeros(x.shape[0], 48, dtype=x.dtype, device=device)[:, :32]
    xs.copy_(x)
    vs = torch.full((*vc0.shape[:2], 32), float("nan"), dtype=vc0.dtype, device=device)[..., :16]
    vs.copy_(vc0)
    qs = poison(torch.empty(x.shape[0], 2, 32, dtype=torch.bfloat16, device=device))[..., :16]
    kc2 = kc0.clone()
    attn_prologue(xs, pack_qkv(lw), None, lw.attn_norm, None, None, step.positions, step.out_cache_loc,
                  step.num_valid_rows, kc2, vs, table, cfg=cfg, out_q=qs)
    check_bitwise("attn_prologue", qs, want, output="q_strided")
    assert torch.equal(kc2.nan_to_num(), kc1.nan_to_num()) and torch.equal(vs.nan_to_num(), vc1.nan_to_num())


@pytest.mark.interpreter
def test_prologue_plan_raises_bn_to_a_rotary_half():
    """bn below D/2 is raised to D/2 (a tile holds whole heads), and a workspace whose plan is narrower
    than D/2 is refused by the wrapper, naming the plan, with nothing written."""
    cfg = tiny_config(hidden_size=32, num_heads=2, num_kv_heads=1, head_dim=64)
    w = torch.zeros(4 * 64, 32, dtype=torch.bfloat16)
    assert make_prologue_workspace(w, 64, bn=16).plan.bn == 32
    assert make_prologue_workspace(torch.zeros(4 * 128, 32, dtype=torch.bfloat16), 128, bn=32).plan.bn == 64
    lw, step, x, kc, vc = _case(cfg, ctxs=[1], rows=[1], pad=0, seed=1, device="cpu")
    narrow = make_prologue_workspace(pack_qkv(lw), 64, plan=plan_gemv(128, 32, kind="qkv", bn=16))
    kc0 = kc.clone()
    with pytest.raises(StepContractError, match=re.escape("bn=16")):
        _run_kernel(cfg, lw, step, x, kc, vc, table=rope_table(cfg, 8), workspace=narrow)
    assert torch.equal(kc.nan_to_num(), kc0.nan_to_num())


@pytest.mark.interpreter
def test_workspace_too_small_refused():
    """A workspace whose GEMV scratch is narrower than the plan's N / 2 pair rows is refused, naming the
    sizes, with nothing written."""
    cfg, base, _ = _error_cases()
    ws = make_prologue_workspace(base["qkv_weight"], 32)
    small = dataclasses.replace(ws, gemv=GemvWorkspace.create(ws.plan.n - 16, "cpu"))
    kc0 = base["k_cache"].clone()
    with pytest.raises(StepContractError, match=re.escape(f"scratch for N <= {ws.plan.n - 16}")):
        attn_prologue(cfg=cfg, **{**base, "workspace": small})
    assert torch.equal(base["k_cache"].nan_to_num(), kc0.nan_to_num())


def test_prologue_programs_count_both_rotary_halves():
    """kind "qkv" is a pair kind (both half rows' bytes count): SmolLM2's default prologue plan is the
    40 programs the module docstring names, as a gate/up plan of the same shape would be."""
    cfg = preset("SmolLM2-135M")
    w = torch.empty(cfg.q_size + 2 * cfg.kv_size, cfg.hidden_size, dtype=torch.bfloat16)
    p = make_prologue_workspace(w, cfg.head_dim).plan
    assert p.n_tiles * p.split == 40
    assert p == plan_gemv(w.shape[0] // 2, cfg.hidden_size, kind="gate_up", table={})


def test_attn_prologue_padding_rows_change_nothing_valid(device):
    """Hostile padding rows (x = 1e4) leave every valid row's q bitwise unchanged and write no slot."""
    cfg = tiny_config(hidden_size=64, num_heads=4, num_kv_heads=2, head_dim=32, qk_norm=True)
    lw, step, x, kc0, vc0 = _case(cfg, ctxs=[3, 9], rows=[1, 2], pad=5, seed=7, device=device,
                                  hostile_padding=True)
    table = rope_table(cfg, MAX_POS, device)
    kc, vc = kc0.clone(), vc0.clone()
    q = _run_kernel(cfg, lw, step, x, kc, vc, table=table)
    n = step.num_valid_rows
    kc1, vc1 = kc0.clone(), vc0.clone()
    one = _run_kernel(cfg, lw, _rows(step, n), x[:n], kc1, vc1, table=table)
    check_bitwise("attn_prologue", q[:n], one, output="padding_invariance")
    assert torch.equal(kc.nan_to_num(), kc1.nan_to_num()) and torch.equal(vc.nan_to_num(), vc1.nan_to_num())
    _assert_only_slots_written(kc0, kc, step.out_cache_loc[:n].long())


def _rows(step, n, idx=None):
    """The step restricted to rows `idx` (default: the first n), all valid."""
    from lowlat.step import StepBatch

    idx = torch.arange(n, device=step.positions.device) if idx is None else idx
    return StepBatch(step.input_ids[idx], step.positions[idx], step.out_cache_loc[idx], step.req_indices[idx],
                     step.seq_lens, step.page_table, len(idx))


def test_reference_prologue_then_attention_equals_attention_block():
    """The prologue spec is attention_block's first half: prologue + paged_attention == attention_block,
    bitwise, in bf16 (so the spec lives in one place)."""
    cfg = tiny_config(hidden_size=64, num_heads=6, num_kv_heads=2, head_dim=16, qkv_bias=True, qk_norm=True)
    lw, step, x, kc0, vc0 = _case(cfg, ctxs=[4, 0, 11], rows=[1, 3, 1], pad=2, seed=3, device="cpu")
    inv = rope_inv_freq(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling)
    cos, sin = rope_cos_sin(step.positions, inv, torch.bfloat16)
    kc1, vc1 = kc0.clone(), vc0.clone()
    h = rms_norm(x, lw.attn_norm, cfg.rms_eps)
    want = attention_block(cfg, lw, h, step, kc1, vc1, cos, sin)
    kc2, vc2 = kc0.clone(), vc0.clone()
    q = ref_attn_prologue(x, pack_qkv(lw), pack_qkv_bias(lw), lw.attn_norm, lw.q_norm, lw.k_norm, step.positions,
                          step.out_cache_loc, step.num_valid_rows, kc2, vc2, inv, eps=cfg.rms_eps)
    got = paged_attention(q, kc2, vc2, step.page_table, step.req_indices, step.positions, step.num_valid_rows)
    check_bitwise("attn_prologue", got.reshape(want.shape), want, output="reference_vs_attention_block")
    assert torch.equal(kc1.nan_to_num(), kc2.nan_to_num())


def test_pack_qkv_layout():
    cfg = tiny_config(qkv_bias=True)
    lw = random_layer_weights(cfg, generator=torch.Generator().manual_seed(0))
    w, b = pack_qkv(lw), pack_qkv_bias(lw)
    assert w.is_contiguous() and w.dtype == torch.bfloat16
    assert w.shape == (cfg.q_size + 2 * cfg.kv_size, cfg.hidden_size)
    h = torch.randn(3, cfg.hidden_size).bfloat16()
    fused = F.linear(h, w, b)
    parts = torch.cat([F.linear(h, lw.wq, lw.bq), F.linear(h, lw.wk, lw.bk), F.linear(h, lw.wv, lw.bv)], dim=1)
    check_bitwise("attn_prologue", fused, parts, output="pack_qkv")
    assert pack_qkv_bias(random_layer_weights(tiny_config(), generator=torch.Generator())) is None


@pytest.mark.parametrize("name", ["SmolLM2-135M", "Llama-3.2-1B"])
def test_rope_table_is_float64_angles_rounded_once(name):
    cfg = preset(name)
    table = rope_table(cfg, 4096)
    pos = torch.tensor([0, 1, 17, 4095])
    cos, sin = rope_cos_sin(pos, rope_inv_freq(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling, torch.float64),
                            torch.float64)
    half = cfg.head_dim // 2
    check_bitwise("rope_table", table[pos], torch.cat([cos[:, :half], sin[:, :half]], 1).float())


def _error_cases():
    cfg = tiny_config(hidden_size=64, num_heads=4, num_kv_heads=2, head_dim=32, qk_norm=True)
    lw, step, x, kc, vc = _case(cfg, ctxs=[2, 5], rows=[1, 1], pad=1, seed=1, device="cpu")
    w, tab = pack_qkv(lw), rope_table(cfg, 16)
    base = dict(x=x, qkv_weight=w, qkv_bias=None, attn_norm=lw.attn_norm, q_norm=lw.q_norm, k_norm=lw.k_norm,
                positions=step.positions, out_cache_loc=step.out_cache_loc, num_valid_rows=step.num_valid_rows,
                k_cache=kc, v_cache=vc, cos_sin_table=tab)
    bad_loc = step.out_cache_loc.clone()
    bad_loc[1] = 0
    twice = step.out_cache_loc.clone()
    twice[1] = twice[0]
    far = step.positions.clone()
    far[0] = 99
    out_q = torch.empty(3, 4, 32, dtype=torch.bfloat16)
    x_in_out_q = out_q.view(3, 128)[:, :64]
    x_in_out_q.copy_(x)
    return cfg, base, [
        ("x", dict(x=x.float()), "x must be torch.bfloat16"),
        ("weight rows", dict(qkv_weight=w[:-32]), "qkv_weight has N=224 rows"),
        ("weight H", dict(qkv_weight=torch.cat([w, w[:, :16]], 1).contiguous()), "dim 1 must be H=64"),
        ("q_norm only", dict(k_norm=None), "q_norm and k_norm must both be given"),
        ("positions dtype", dict(positions=step.positions.int()), "positions must be torch.int64"),
        ("loc rows", dict(out_cache_loc=step.out_cache_loc[:2]), "out_cache_loc has shape (2,): dim 0 must be M=3"),
        ("cache D", dict(v_cache=vc[..., :16].contiguous()), "v_cache has shape"),
        ("table D", dict(cos_sin_table=tab[:, :16].contiguous()), "dim 1 must be D=32"),
        ("num_valid_rows", dict(num_valid_rows=4), "num_valid_rows=4 must be in 0..M=3"),
        ("out_q", dict(out_q=torch.empty(3, 4, 16, dtype=torch.bfloat16)), "out_q has shape (3, 4, 16)"),
        ("position value", dict(positions=far, check_values=True), "positions[0]=99 outside the RoPE table"),
        ("slot value", dict(out_cache_loc=bad_loc, check_values=True), "out_cache_loc[1]=0 outside"),
        ("rows", dict(x=x[:1].expand(49, -1).contiguous()), "x has M=49 rows; the fused prologue takes 1..48"),
        ("workspace", dict(workspace=make_prologue_workspace(w[:-64].contiguous(), 32)),
         "workspace (plan N=96, K=64"),
        ("head_dim", dict(cfg=cfg.replace(head_dim=8), k_cache=kc[..., :8].contiguous(),
                          v_cache=vc[..., :8].contiguous(),
                          cos_sin_table=tab[:, :8].contiguous(), q_norm=None, k_norm=None),
         "head_dim D=8 must be a power of two in 16..256"),
        ("eps 0", dict(cfg=cfg.replace(rms_eps=0.0)), "cfg.rms_eps=0.0 must be a finite float > 0"),
        ("eps nan", dict(cfg=cfg.replace(rms_eps=float("nan"))), "cfg.rms_eps=nan must be a finite float > 0"),
        ("out_q over x", dict(x=x_in_out_q, out_q=out_q),
         "out_q overlaps x, which the prologue reads while it writes out_q"),
        ("out_q over k_cache", dict(out_q=kc.view(-1)[:384].view(3, 4, 32)),
         "out_q overlaps k_cache: the prologue writes both"),
        ("v_cache is k_cache", dict(v_cache=kc), "k_cache overlaps v_cache: the prologue writes both"),
        ("k_cache over the weight", dict(k_cache=w.view(-1)[:kc.numel()].view(kc.shape)),
         "k_cache overlaps qkv_weight, which the prologue reads"),
        ("two rows, one slot", dict(out_cache_loc=twice, check_values=True),
         f"out_cache_loc rows [0, 1] all write KV slot {int(twice[0])}"),
    ]


def test_last_dim_stride_checked_only_where_it_is_used():
    """A last dim of size 1 has no stride to respect (a 1-row column slice of a page table, stride C, is a
    valid out_cache_loc); a strided last dim of size > 1 is refused, naming the tensor."""
    from lowlat.kernels._attn_common import check_tensor

    col = torch.arange(15, dtype=torch.int32).view(3, 5)
    check_tensor("out_cache_loc", col[:1, 2], dtype=torch.int32, ndim=1)
    with pytest.raises(StepContractError, match=re.escape("out_cache_loc must have a contiguous last dim")):
        check_tensor("out_cache_loc", col[:, 2], dtype=torch.int32, ndim=1)


@pytest.mark.parametrize("case", range(len(_error_cases()[2])))
@pytest.mark.interpreter
def test_attn_prologue_bad_input_raises_typed_error_and_writes_nothing(case):
    cfg, base, cases = _error_cases()
    name, change, msg = cases[case]
    kc0, vc0 = base["k_cache"].clone(), base["v_cache"].clone()
    args = {"cfg": cfg, **base, **change}
    with pytest.raises(StepContractError, match=re.escape(msg)):
        attn_prologue(**args)
    assert torch.equal(base["k_cache"].nan_to_num(), kc0.nan_to_num()), name
    assert torch.equal(base["v_cache"].nan_to_num(), vc0.nan_to_num()), name


# ----------------------------------------------------------------------------- GPU (full shapes)
GPU_MODELS = ["SmolLM2-135M", "Llama-3.2-1B", "Qwen2.5-0.5B", "Qwen3-0.6B", "Qwen3-30B-A3B"]


@pytest.mark.gpu
@given(name=st.sampled_from(GPU_MODELS), reqs=st.integers(1, 16), verify=st.integers(1, 3),
       pad=st.integers(0, 4), seed=st.integers(0, 2**16))
def test_attn_prologue_model_shapes_within_2x_baseline_error(device, name, reqs, verify, pad, seed):
    cfg = preset(name)
    rows = [verify] * reqs
    while sum(rows) + pad > 48:
        rows.pop()
    ctxs = [(seed * (i + 1)) % 200 for i in range(len(rows))]
    lw, step, x, kc, vc = _case(cfg, ctxs=ctxs, rows=rows, pad=pad, seed=seed, device=device)
    _check_against_reference(cfg, lw, step, x, kc, vc)


def _on_copies(run, kc0, vc0):
    """(q, k_cache, v_cache) of `run(kc, vc) -> q`, one prologue launch on fresh copies of the caches kc0 / vc0."""
    kc, vc = kc0.clone(), vc0.clone()
    return run(kc, vc), kc, vc


def _assert_same_outputs(got, want, tag, loc=None):
    """Two prologue runs' (q, k_cache, v_cache) bitwise equal: q whole (every row is written, padding rows too, so a
    NaN of the poisoned output fails), the caches at the slots `loc` (written: NaN fails) or, with loc None, whole
    (their unowned slots are NaN: compared as nan_to_num)."""
    (q, kc, vc), (q0, kc0, vc0) = got, want
    check_bitwise("attn_prologue", q, q0, output=f"q_{tag}")
    for kind, a, b in (("k", kc, kc0), ("v", vc, vc0)):
        if loc is None:
            check_bitwise("attn_prologue", a.nan_to_num(), b.nan_to_num(), output=f"{kind}_cache_{tag}")
        else:
            check_bitwise("attn_prologue", a[loc], b[loc], output=f"{kind}_{tag}")


def _assert_rows_invariant(run, step, x, kc0, vc0, want):
    """Row invariance of a prologue launch `run(step, x, kc, vc) -> q` (on fresh copies of the caches kc0 / vc0):
    rows 0, 1, 8 (the second 8-row block's first), 17 and the last valid one each alone, and the first 6 / 17 / 33
    rows (1-3 16-row blocks: a split-K plan's weight stream and bn may depend on the count, Llama's bn does; 1, 3 and
    5 of the held prologue's 8-row blocks), give bitwise the q rows and K / V slots of `want` = (q, k_cache, v_cache),
    the launch of every row of `step`."""
    loc = step.out_cache_loc[:step.num_valid_rows].long()
    for i in (0, 1, 8, 17, step.num_valid_rows - 1):
        idx = torch.tensor([i], device=x.device)
        q, kc, vc = _on_copies(lambda kc, vc: run(_rows(step, 1, idx), x[idx], kc, vc), kc0, vc0)
        _assert_same_outputs((q[0], kc, vc), (want[0][i], *want[1:]), "row_invariance", loc[i])
    for m in (6, 17, 33):
        q, kc, vc = _on_copies(lambda kc, vc: run(_rows(step, m), x[:m].contiguous(), kc, vc), kc0, vc0)
        _assert_same_outputs((q, kc, vc), (want[0][:m], *want[1:]), f"first_{m}_rows", loc[:m])


def _assert_graph_replay_equals_eager(launch, kc0, vc0, want):
    """A CUDA-graph replay of `launch(kc, vc, out_q)` (static buffers; num_valid_rows a device tensor, read in-kernel)
    equals eager: run once (compiling outside the capture), captured, then replayed on the caches reset to kc0 / vc0
    and out_q poisoned; q and the whole caches bitwise those of `want` = (q, k_cache, v_cache), an eager run."""
    kc, vc = kc0.clone(), vc0.clone()
    out_q = torch.empty_like(want[0])

    def call():
        launch(kc, vc, out_q)

    call()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        call()
    kc.copy_(kc0)
    vc.copy_(vc0)
    poison(out_q)
    graph.replay()
    torch.cuda.synchronize()
    _assert_same_outputs((out_q, kc, vc), want, "cuda_graph")


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["SmolLM2-135M", "Llama-3.2-1B", "Qwen3-0.6B", "Qwen2.5-0.5B", "Qwen3-30B-A3B"])
def test_attn_prologue_bitwise_deterministic_row_invariant_pdl_and_graph(device, name):
    """Run-to-run bitwise; each row's q / K / V identical alone, among 48 rows (44 valid) and among the first 6 / 17 /
    33 (`_assert_rows_invariant`); PDL on == off; epilogue inputs early == late; a CUDA-graph replay (num_valid_rows
    as a device tensor) == eager; the split-K counters reset."""
    cfg = preset(name)
    lw, step, x, kc0, vc0 = _case(cfg, ctxs=[(7 * i) % 90 for i in range(44)], rows=[1] * 44, pad=4, seed=11,
                                  device=device)
    table = rope_table(cfg, MAX_POS, device)
    ws = make_prologue_workspace(pack_qkv(lw), cfg.head_dim)
    other = make_prologue_workspace(pack_qkv(lw), cfg.head_dim, early_inputs=not ws.early_inputs)
    runs = [_on_copies(lambda kc, vc: _run_kernel(cfg, lw, step, x, kc, vc, table=table, workspace=wsp, use_pdl=pdl),
                       kc0, vc0)
            for pdl, wsp in ((False, ws), (False, ws), (True, ws), (True, other))]
    for got in runs[1:]:
        _assert_same_outputs(got, runs[0], "run_to_run_pdl_early_inputs")
    _assert_rows_invariant(lambda st, xs, kc, vc: _run_kernel(cfg, lw, st, xs, kc, vc, table=table, workspace=ws),
                           step, x, kc0, vc0, runs[0])
    nvr = torch.tensor([step.num_valid_rows], dtype=torch.int32, device=device)
    w, b = pack_qkv(lw), pack_qkv_bias(lw)
    _assert_graph_replay_equals_eager(
        lambda kc, vc, out_q: attn_prologue(x, w, b, lw.attn_norm, lw.q_norm, lw.k_norm, step.positions,
                                            step.out_cache_loc, nvr, kc, vc, table, cfg=cfg, out_q=out_q, workspace=ws,
                                            use_pdl=True),
        kc0, vc0, runs[0])
    assert int(ws.counters.abs().sum()) == 0, "split-K counters must be reset by the last arriver"


# ----------------------------------------------------------------------------- the held prologue (session 25)
def _run_held(cfg, lw, step, x, kc, vc, *, table, use_pdl=False, nvr=None, folded=False, early_release=False,
              pace=False):
    """The held prologue with g multiplied into the weights in registers, or (folded) by `fold_attn_norm` first."""
    from lowlat.kernels.attn_prologue_held import attn_prologue_held, fold_attn_norm

    out_q = poison(torch.empty((x.shape[0], cfg.num_heads, cfg.head_dim), dtype=torch.bfloat16, device=x.device))
    w, g = (fold_attn_norm(pack_qkv(lw), lw.attn_norm), None) if folded else (pack_qkv(lw), lw.attn_norm)
    q = attn_prologue_held(x, w, g, step.positions, step.out_cache_loc,
                           step.num_valid_rows if nvr is None else nvr, kc, vc, table, cfg=cfg, out_q=out_q,
                           use_pdl=use_pdl, early_release=early_release, pace=pace)
    assert q is out_q
    return q


@pytest.mark.gpu
@given(m=st.integers(1, 48), pad=st.integers(0, 3), group=st.sampled_from([1, 3, 4, 8]),
       hkv=st.sampled_from([1, 2, 8]), d=st.sampled_from([16, 32, 64, 128]),
       hidden=st.sampled_from([256, 512, 1024, 2048]), hostile=st.booleans(), seed=st.integers(0, 2**16))
def test_held_prologue_within_2x_baseline_error(device, m, pad, group, hkv, d, hidden, hostile, seed):
    """kernels/attn_prologue_held.py (Gluon, GPU only): q of every row and the K / V of every valid row against the
    reference, rows 1..48 with padding (optionally padding rows of 1e4: they must not leak into valid rows), GQA
    ratios 1 / 3 / 4 / 8, head_dim 16..128 (one to eight programs a head), H 256..2048 (K slices of 64..512), contexts
    0..39 tokens; g multiplied in registers or the weights folded first, PDL on or off."""
    cfg = tiny_config(hidden_size=hidden, num_heads=group * hkv, num_kv_heads=hkv, head_dim=d)
    rows = split_rows(m)
    ctxs = [(seed >> i) % 40 for i in range(len(rows))]
    pad = min(pad, 48 - m)
    lw, step, x, kc, vc = _case(cfg, ctxs=ctxs, rows=rows, pad=pad, seed=seed, device=device, hostile_padding=hostile)
    _check_against_reference(cfg, lw, step, x, kc, vc, run=_run_held, use_pdl=bool(seed & 1),
                             folded=bool(seed & 2))


@pytest.mark.gpu
@settings(max_examples=40)
@given(m=st.one_of(st.just(1), st.integers(2, 12)), pad=st.integers(0, 3), group=st.sampled_from([1, 3, 4, 8]),
       hkv=st.sampled_from([1, 2, 8]), d=st.sampled_from([16, 32, 64, 128]),
       hidden=st.sampled_from([256, 512, 1024, 2048]), hostile=st.booleans(), seed=st.integers(0, 2**16))
def test_held_prologue_paced_bitwise_equal_to_production(device, m, pad, group, hkv, d, hidden, hostile, seed):
    """pace=True on folded weights with early_release under PDL (the paced form at 1 row: the weights in chunks with
    a window, x loaded whole and in chunks, the mma chunk after chunk; g = 1 in the g-multiplied form, released
    after the wait, at 2+ rows) gives production's bits (g multiplied in registers, released after the wait): q of
    every row (poisoned before), the K / V caches whole (every valid slot written: NaN fails; no other slot
    changed); and the paced launch alone is within the prologue's policy against the reference. The shapes of the
    test above at 1 row (half the examples: the paced form where H >= 1024, g = 1 at H 256 / 512) and 2-15 rows."""
    cfg = tiny_config(hidden_size=hidden, num_heads=group * hkv, num_kv_heads=hkv, head_dim=d)
    rows = split_rows(m)
    ctxs = [(seed >> i) % 40 for i in range(len(rows))]
    pad = 0 if m == 1 else min(pad, 48 - m)              # one row in all: the paced form
    lw, step, x, kc0, vc0 = _case(cfg, ctxs=ctxs, rows=rows, pad=pad, seed=seed, device=device,
                                  hostile_padding=hostile)
    table = rope_table(cfg, MAX_POS, device)
    paced = dict(use_pdl=True, folded=True, early_release=True, pace=True)
    want = _on_copies(lambda kc, vc: _run_held(cfg, lw, step, x, kc, vc, table=table, use_pdl=True), kc0, vc0)
    got = _on_copies(lambda kc, vc: _run_held(cfg, lw, step, x, kc, vc, table=table, **paced), kc0, vc0)
    _assert_same_outputs(got, want, "paced")
    _assert_same_outputs(got, want, "paced_slots", loc=step.out_cache_loc[:step.num_valid_rows].long())
    _check_against_reference(cfg, lw, step, x, kc0, vc0, run=_run_held, **paced)


@pytest.mark.gpu
@pytest.mark.parametrize("tp", [1, 2, 4])
def test_held_prologue_llama_shapes_and_tp_shards_within_2x_baseline_error(device, tp):
    """Llama-3.2-1B's prologue (H 2048, 32 / 8 heads of D 64: 192 programs) and its TP shards (16 / 4, 8 / 2 heads
    a rank) at 1, 6, 17 and 48 rows, the last two with padding."""
    cfg = preset("Llama-3.2-1B")
    cfg = cfg.replace(num_heads=cfg.num_heads // tp, num_kv_heads=cfg.num_kv_heads // tp)
    for m, pad, seed in ((1, 0, 1), (6, 0, 2), (15, 2, 3), (44, 4, 4)):
        lw, step, x, kc, vc = _case(cfg, ctxs=[(5 * i) % 90 for i in range(m)], rows=[1] * m, pad=pad, seed=seed,
                                    device=device)
        _check_against_reference(cfg, lw, step, x, kc, vc, run=_run_held, use_pdl=True)


@pytest.mark.gpu
def test_held_prologue_bitwise_deterministic_row_invariant_pdl_and_graph(device):
    """Llama-3.2-1B's shapes: run-to-run bitwise; each row's q / K / V identical alone, among 48 rows (44 valid) and
    among the first 6 / 17 / 33 (`_assert_rows_invariant`); PDL on == off; the weights folded by `fold_attn_norm` ==
    g multiplied in registers; the next launch released at the start (early_release) == after the wait; pace=True
    (g = 1 at 2+ rows, the paced form for each row alone) == production; num_valid_rows as a device tensor in a
    CUDA-graph replay == eager (and the paced form's at 1 row == production's eager run); a position past the RoPE
    table rotates by cos = sin = 0 (q and K of that row 0, V untouched), as the split-K prologue does."""
    from lowlat.kernels.attn_prologue_held import attn_prologue_held, fold_attn_norm

    cfg = preset("Llama-3.2-1B")
    lw, step, x, kc0, vc0 = _case(cfg, ctxs=[(7 * i) % 90 for i in range(44)], rows=[1] * 44, pad=4, seed=11,
                                  device=device)
    table = rope_table(cfg, MAX_POS, device)
    runs = [_on_copies(lambda kc, vc: _run_held(cfg, lw, step, x, kc, vc, table=table, use_pdl=pdl, folded=folded,
                                                early_release=early), kc0, vc0)
            for pdl, folded, early in ((False, False, False), (False, False, False), (True, False, False),
                                       (True, True, False), (True, False, True))]
    runs += [_on_copies(lambda kc, vc: _run_held(cfg, lw, step, x, kc, vc, table=table, use_pdl=True, folded=True,
                                                 early_release=early, pace=True), kc0, vc0) for early in (False, True)]
    for got in runs[1:]:
        _assert_same_outputs(got, runs[0], "run_to_run_pdl_folded")
    _assert_rows_invariant(lambda st, xs, kc, vc: _run_held(cfg, lw, st, xs, kc, vc, table=table),
                           step, x, kc0, vc0, runs[0])
    _assert_rows_invariant(lambda st, xs, kc, vc: _run_held(cfg, lw, st, xs, kc, vc, table=table, use_pdl=True,
                                                            folded=True, early_release=True, pace=True),
                           step, x, kc0, vc0, runs[0])
    nvr = torch.tensor([step.num_valid_rows], dtype=torch.int32, device=device)
    w = pack_qkv(lw)
    _assert_graph_replay_equals_eager(
        lambda kc, vc, out_q: attn_prologue_held(x, w, lw.attn_norm, step.positions, step.out_cache_loc, nvr, kc, vc,
                                                 table, cfg=cfg, out_q=out_q, use_pdl=True),
        kc0, vc0, runs[0])
    # the paced form (1 row) with num_valid_rows a device tensor, as FusedModel launches it
    st1, x1, wf = _rows(step, 1), x[:1].contiguous(), fold_attn_norm(w, lw.attn_norm)
    want1 = _on_copies(lambda kc, vc: _run_held(cfg, lw, st1, x1, kc, vc, table=table, use_pdl=True), kc0, vc0)
    nvr1 = torch.tensor([1], dtype=torch.int32, device=device)
    _assert_graph_replay_equals_eager(
        lambda kc, vc, out_q: attn_prologue_held(x1, wf, None, st1.positions, st1.out_cache_loc, nvr1, kc, vc, table,
                                                 cfg=cfg, out_q=out_q, use_pdl=True, early_release=True, pace=True),
        kc0, vc0, want1)
    q_all, _, vc_all = runs[0]
    loc = step.out_cache_loc[:step.num_valid_rows].long()
    far = _rows(step, 2)
    far.positions[1] = MAX_POS                     # one past the table
    kc, vc = kc0.clone(), vc0.clone()
    q2 = _run_held(cfg, lw, far, x[:2].contiguous(), kc, vc, table=table)
    check_bitwise("attn_prologue", q2[0], q_all[0], output="q_beside_a_far_row")
    assert bool((q2[1] == 0).all()) and bool((kc[loc[1]] == 0).all()), "cos = sin = 0 past the table"
    check_bitwise("attn_prologue", vc[loc[1]], vc_all[loc[1]], output="v_of_a_far_row")


def _held_error_cases():
    """(cfg, base arguments, [(name, change, message)]) for attn_prologue_held's refusals on the CPU (every one
    before `held_prologue_supported`'s, which comes last: here the model's, H 64)."""
    cfg = tiny_config(hidden_size=64, num_heads=4, num_kv_heads=2, head_dim=16)
    bf = torch.bfloat16
    n = (4 + 2 * 2) * 16
    base = dict(x=torch.randn(3, 64).to(bf), qkv_weight=torch.randn(n, 64).to(bf), attn_norm=torch.ones(64, dtype=bf),
                positions=torch.arange(3), out_cache_loc=torch.arange(1, 4, dtype=torch.int32), num_valid_rows=3,
                k_cache=torch.zeros(8, 2, 16, dtype=bf), v_cache=torch.zeros(8, 2, 16, dtype=bf),
                cos_sin_table=torch.zeros(16, 16), out_q=torch.zeros(3, 4, 16, dtype=bf))
    cases = [
        ("M 0", dict(x=torch.zeros(0, 64, dtype=bf)), "x has M=0 rows; the held prologue takes 1..48"),
        ("H", dict(x=torch.zeros(3, 32, dtype=bf)), "x has H=32 columns; cfg.hidden_size is 64"),
        ("x row-strided", dict(x=torch.zeros(3, 128, dtype=bf)[:, :64]), "x must be contiguous"),
        ("x dtype", dict(x=torch.zeros(3, 64)), "x must be torch.bfloat16"),
        ("v_cache", dict(v_cache=torch.zeros(9, 2, 16, dtype=bf)), "v_cache"),
        ("N", dict(qkv_weight=torch.zeros(n + 16, 64, dtype=bf)), "qkv_weight has N=144 rows"),
        ("weight strided", dict(qkv_weight=torch.zeros(64, n, dtype=bf).T), "qkv_weight"),
        ("norm", dict(attn_norm=torch.ones(32, dtype=bf)), "attn_norm"),
        ("positions", dict(positions=torch.arange(3, dtype=torch.int32)), "positions must be torch.int64"),
        ("slots", dict(out_cache_loc=torch.arange(3)), "out_cache_loc must be torch.int32"),
        ("table", dict(cos_sin_table=torch.zeros(16, 8)), "cos_sin_table"),
        ("nvr", dict(num_valid_rows=4), "num_valid_rows=4 must be in 0..M=3"),
        ("out_q", dict(out_q=torch.zeros(3, 2, 16, dtype=bf)), "out_q"),
        ("position past the table", dict(positions=torch.tensor([0, 16, 1]), check_values=True),
         "positions[1]=16 outside the RoPE table [0, 16)"),
        ("slot 0", dict(out_cache_loc=torch.tensor([1, 0, 2], dtype=torch.int32), check_values=True),
         "out_cache_loc[1]=0 outside [1, 8)"),
        ("eps negative", dict(cfg=cfg.replace(rms_eps=-1.0)), "cfg.rms_eps=-1.0 must be a finite float > 0"),
        ("out_q is x", dict(x=base["out_q"].view(3, 64)), "out_q overlaps x, which the prologue reads"),
        ("v_cache is k_cache", dict(v_cache=base["k_cache"]), "k_cache overlaps v_cache: the prologue writes both"),
        ("two rows, one slot", dict(out_cache_loc=torch.tensor([1, 2, 1], dtype=torch.int32), check_values=True),
         "out_cache_loc rows [0, 2] all write KV slot 1"),
        ("early_release", dict(early_release="yes"), "early_release='yes' must be a bool"),
        ("pace", dict(pace=1), "pace=1 must be a bool"),
        ("model", {}, "the held prologue cannot run here: hidden_size 64"),
        ("model, folded weight", dict(attn_norm=None), "the held prologue cannot run here: hidden_size 64"),
    ]
    return cfg, base, cases


@pytest.mark.parametrize("case", range(len(_held_error_cases()[2])))
@pytest.mark.interpreter
def test_held_prologue_bad_input_raises_typed_error_before_any_launch(case):
    """Every refusal of attn_prologue_held, on the CPU: a StepContractError naming the value, the caches and out_q
    untouched. (The kernel cannot launch on the CPU, so what this proves is the message and that nothing else runs
    first, e.g. a host-side write; the GPU tests prove the kernel writes only valid rows' slots.)"""
    from lowlat.kernels.attn_prologue_held import attn_prologue_held

    _assert_refused_untouched(attn_prologue_held, *_held_error_cases(), case)


def _assert_refused_untouched(fn, cfg, base, cases, case):
    """fn(cfg, **base, **cases[case]'s change) raises a StepContractError matching its message; the caches and out_q
    are untouched."""
    name, change, msg = cases[case]
    kc0, vc0, q0 = base["k_cache"].clone(), base["v_cache"].clone(), base["out_q"].clone()
    with pytest.raises(StepContractError, match=re.escape(msg)):
        fn(**{"cfg": cfg, **base, **change})
    for key, before in (("k_cache", kc0), ("v_cache", vc0), ("out_q", q0)):
        assert torch.equal(base[key], before), (name, key)


def test_fold_attn_norm_rounds_each_product_once():
    """fold_attn_norm(W, g) is bf16(W g), each product of two bf16 values (exact in float64) rounded once to the
    nearest bf16 (ties to even), what the kernel computes in registers; other dtypes / shapes are refused."""
    from lowlat.kernels.attn_prologue_held import fold_attn_norm

    w = _bf16_like(96, 64, seed=1)
    g = _bf16_like(64, seed=2) + 1
    got = fold_attn_norm(w, g)
    assert got.dtype == torch.bfloat16 and got.is_contiguous()
    assert torch.equal(got, (w.double() * g.double()).to(torch.bfloat16))
    assert not torch.equal(got, w), "g was multiplied in"
    with pytest.raises(StepContractError, match="attn_norm"):
        fold_attn_norm(w, g[:32])
    with pytest.raises(StepContractError, match="qkv_weight must be torch.bfloat16"):
        fold_attn_norm(w.float(), g)


def _bf16_like(*shape, seed):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(torch.bfloat16)


@pytest.mark.parametrize("name,why", [("Llama-3.2-1B", "device cpu"), ("SmolLM2-135M", "hidden_size 576"),
                                      ("Qwen2.5-0.5B", "QKV bias"), ("Qwen3-0.6B", "QK-norm"),
                                      ("Qwen3-30B-A3B", "QK-norm")])
def test_held_prologue_supported_names_the_first_reason(name, why):
    """The model's reasons come before the device's: on the CPU only Llama-3.2-1B (no bias, no QK-norm, H 2048, D 64)
    is refused for the device; H 4096 (Llama-3.1-8B's) would hold 256 registers of weights a thread, H 128 slices of
    32 columns (replicated in the mma operand layout)."""
    from lowlat.kernels.attn_prologue_held import held_prologue_supported

    assert why in held_prologue_supported(preset(name), "cpu")
    assert "hidden_size 4096" in held_prologue_supported(preset("Llama-3.2-1B").replace(hidden_size=4096), "cpu")
    assert "head_dim 48" in held_prologue_supported(tiny_config(head_dim=48), "cpu")
    assert "head_dim 256" in held_prologue_supported(tiny_config(hidden_size=256, head_dim=256), "cpu")  # untested
    assert "hidden_size 128" in held_prologue_supported(tiny_config(hidden_size=128), "cpu")     # slices < 64
    assert "device cpu" in held_prologue_supported(tiny_config(hidden_size=256), "cpu")


def test_held_prologue_compiles_for_sm90_with_weights_held_in_registers(monkeypatch):
    """The held prologue compiled for sm_90 on the CPU (Llama-3.2-1B's H 2048 / D 64, a D-128 head at H 1024, D 16 at
    H 512; 1 / 2 / 3 / 6 row blocks): no spills, no shared memory but the slices' 2 KB, and before the PDL wait every
    weight load and (FOLD_G) the norm weight's (16-byte loads), the valid-row count's, the first row block's
    positions / slots / cos / sin, and no mma; then K / 64 mma.sync a row block (K / 4 columns a warp, k16 steps).
    The next launch is released once: right after the wait, or with EARLY_RELEASE before the first load."""
    from sampling_stats import compile_sm90

    ptrs = {"x_ptr": "*bf16", "w_ptr": "*bf16", "g_ptr": "*bf16", "tab_ptr": "*fp32", "pos_ptr": "*i64",
            "loc_ptr": "*i32", "nvr_ptr": "*i32", "q_ptr": "*bf16", "kc_ptr": "*bf16", "vc_ptr": "*bf16"}
    cases = [(2048, 64, 1, True, False), (2048, 64, 2, True, False), (2048, 64, 6, True, False),
             (1024, 128, 3, True, False), (512, 16, 6, True, False), (2048, 64, 1, False, False),
             (2048, 64, 6, False, False), (2048, 64, 1, True, True), (2048, 64, 6, False, True)]
    specs = [{"constexprs": {"K": k, "D": d, "NMB": nmb, "NVR_FROM_PTR": True, "USE_PDL": True, "FOLD_G": fold,
                             "EARLY_RELEASE": early},
              "pointers": ptrs,
              "scalars": {"eps": "fp32"}, "num_warps": 4, "launch_pdl": True, "ptx": True,
              "divisible": ["stride_qm", "stride_qh", "stride_kcs", "stride_kch", "stride_vcs", "stride_vch"]}
             for k, d, nmb, fold, early in cases]
    for case, info in zip(cases, compile_sm90("lowlat.kernels.attn_prologue_held:_held_prologue_kernel", specs)):
        k, d, nmb, fold, early = case
        assert info["spill_bytes"] == 0 and info["shared"] <= 2176, (case, info)
        ptx = info["ptx"]
        wait = ptx.index("griddepcontrol.wait")
        assert ptx.count("griddepcontrol.launch_dependents") == 1, case
        release = ptx.index("griddepcontrol.launch_dependents")
        if early:
            assert release < ptx.index("ld.global"), case
        else:
            assert release > wait and "ld.global" not in ptx[wait:release], case
        before = ptx[:wait]
        v4 = 16 * k // 4 * 2 // 32 // 16                  # [16, K / 4] bf16 a warp: 16-byte loads a thread
        loads = v4 * (2 if fold else 1)                   # the weights, and g where it is multiplied in here
        assert before.count("ld.global.v4") == loads, case
        assert before.count("ld.global") - loads == 5, case       # num_valid_rows, position, slot, cos, sin
        assert "mma.sync" not in before, case
        assert ptx.count("mma.sync.aligned.m16n8k16") == k // 16 // 4 * nmb, case


def test_held_prologue_paced_form_compiles_for_sm90_with_a_window_of_chunks():
    """The paced form (PACE chunks of 64 columns a K slice, PACE_WIN 2, maxnreg 168, early release; Llama-3.2-1B's H
    2048 / D 64 and H 1024 / D 128, 1 row) compiled for sm_90 on the CPU: at most 168 registers, no spills; the
    next launch released before the first load; before the wait only the weights' 16-byte loads (the whole-slice load
    of the unpaced form is not compiled) and each chunk past the window offset by an `and` with the chunk PACE_WIN
    back (one per 16-byte load: the window); after the wait x's 16-byte loads twice (whole, then in chunks) and K / 64
    mma.sync."""
    from lowlat.kernels.attn_prologue_held import PACE_COLUMNS, PACE_MAXNREG, PACE_WINDOW
    from sampling_stats import compile_sm90

    ptrs = {"x_ptr": "*bf16", "w_ptr": "*bf16", "g_ptr": "*bf16", "tab_ptr": "*fp32", "pos_ptr": "*i64",
            "loc_ptr": "*i32", "nvr_ptr": "*i32", "q_ptr": "*bf16", "kc_ptr": "*bf16", "vc_ptr": "*bf16"}
    cases = [(2048, 64), (1024, 128)]
    specs = [{"constexprs": {"K": k, "D": d, "NMB": 1, "NVR_FROM_PTR": True, "USE_PDL": True, "FOLD_G": False,
                             "EARLY_RELEASE": True, "PACE": k // 4 // PACE_COLUMNS, "PACE_WIN": PACE_WINDOW,
                             "M": 1},                    # a 1-row launch: Triton specialises the int 1
              "pointers": ptrs, "scalars": {"eps": "fp32"}, "num_warps": 4, "launch_pdl": True, "ptx": True,
              "maxnreg": PACE_MAXNREG, "divisible": ["stride_qm", "stride_qh", "stride_kcs", "stride_kch",
                                                     "stride_vcs", "stride_vch", "zero"]}
             for k, d in cases]
    for (k, d), info in zip(cases, compile_sm90("lowlat.kernels.attn_prologue_held:_held_prologue_kernel", specs)):
        assert info["registers"] <= PACE_MAXNREG and info["spill_bytes"] == 0, (k, info)
        ptx = info["ptx"]
        wait = ptx.index("griddepcontrol.wait")
        assert ptx.count("griddepcontrol.launch_dependents") == 1
        assert ptx.index("griddepcontrol.launch_dependents") < ptx.index("ld.global"), k
        before, after = ptx[:wait], ptx[wait:]
        v4 = 16 * k // 4 * 2 // 32 // 16                      # the weights' 16-byte loads a thread
        chunks = k // 4 // PACE_COLUMNS
        assert before.count("ld.global.v4") == v4, k
        assert before.count("cvt.u32.u16") == v4 // chunks * (chunks - PACE_WINDOW), k     # `_zero_after`
        assert after.count("ld.global.v4") == 2 * (8 * k // 4 * 2 // 32 // 16), k      # x [K / 4, 8] a warp, twice
        assert "mma.sync" not in before and after.count("mma.sync.aligned.m16n8k16") == k // 64, k


def test_held_prologue_ones_vector_is_made_outside_capture_and_cached(monkeypatch):
    """pace=True's g = 1 for folded weights: one cached [H] bf16 ones tensor a (device, H); its first use under
    CUDA-graph capture is refused (the fill would only be recorded), a cached one is served there."""
    import lowlat.kernels.attn_prologue_held as aph

    monkeypatch.setattr(aph, "_ONES", {})
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    with pytest.raises(StepContractError, match="outside CUDA-graph capture"):
        aph._ones(64, torch.device("cuda", 0))
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    one = aph._ones(64, torch.device("cpu"))
    assert one.dtype == torch.bfloat16 and one.shape == (64,) and bool((one == 1).all())
    assert aph._ones(64, torch.device("cpu")) is one and aph._ones(32, torch.device("cpu")) is not one
    aph._ONES[("cuda:0", 64)] = one                                  # cached: served under capture too
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    assert aph._ones(64, torch.device("cuda", 0)) is one


@pytest.mark.parametrize("hidden", [512, 1024, 2048])
def test_held_prologue_launcher_picks_the_paced_build_where_documented(monkeypatch, hidden):
    """On the CPU with the kernel stubbed (the launcher's decision, not the GPU's bits): pace=True launches the paced
    build (PACE = H / 256 chunks, PACE_WIN 2, maxnreg 168, FOLD_G off, the release at the start) exactly on folded
    weights with early_release under PDL at 1 row and H >= 1024; elsewhere pace=True releases after the wait and
    folded weights take the cached ones vector as g (FOLD_G on); pace=False launches as before. `zero` is 0 always."""
    import itertools

    import lowlat.kernels.attn_prologue_held as aph

    launches = []

    class Stub:
        def __getitem__(self, grid):
            return lambda *args, **kw: launches.append((grid, args, kw))

    monkeypatch.setattr(aph, "_held_prologue_kernel", Stub())
    monkeypatch.setattr(aph, "held_prologue_supported", lambda cfg, dev: None)
    monkeypatch.setattr(aph, "require_runnable", lambda name, t: None)
    monkeypatch.setattr(aph, "_ONES", {})
    cfg = tiny_config(hidden_size=hidden, num_heads=4, num_kv_heads=2, head_dim=64)
    bf = torch.bfloat16
    w, g = torch.randn(8 * 64, hidden).to(bf), torch.randn(hidden).to(bf)
    for m, folded, early, pdl, pace in itertools.product((1, 2, 9), *[(False, True)] * 4):
        monkeypatch.setattr(aph, "pdl_supported", lambda dev, pdl=pdl: pdl)
        aph.attn_prologue_held(torch.randn(m, hidden).to(bf), w, None if folded else g, torch.arange(m),
                               torch.arange(1, m + 1, dtype=torch.int32), m, torch.zeros(m + 1, 2, 64, dtype=bf),
                               torch.zeros(m + 1, 2, 64, dtype=bf), torch.zeros(16, 64), cfg=cfg, use_pdl=True,
                               early_release=early, pace=pace)
        grid, args, kw = launches[-1]
        case = (m, folded, early, pdl, pace)
        paced = pace and folded and early and pdl and m == 1 and hidden >= 1024
        assert grid == (8 * 64 // 16,) and kw["zero"] == 0 and ("PACE" in kw) == paced, case
        if paced:
            assert (kw["PACE"], kw["PACE_WIN"], kw["maxnreg"]) == (hidden // 256, 2, 168), case
            assert kw["FOLD_G"] is False and kw["EARLY_RELEASE"] is True and kw["NMB"] == 1, case
            continue
        assert "maxnreg" not in kw and kw["EARLY_RELEASE"] == (early and not pace), case
        if not folded:
            assert kw["FOLD_G"] is True and args[2] is g, case
        elif pace:
            assert kw["FOLD_G"] is True and args[2] is aph._ones(hidden, torch.device("cpu")), case
            assert bool((args[2] == 1).all()), case
        else:
            assert kw["FOLD_G"] is False and args[2] is w, case


# ----------------------------------------------------------------------------- the cluster prologue (session 40)
def _run_cluster(cfg, lw, step, x, kc, vc, *, table, use_pdl=False, nvr=None):
    """attn_prologue_cluster on `fold_attn_norm`'s weights with the layer's q_norm / k_norm."""
    from lowlat.kernels.attn_prologue_cluster import attn_prologue_cluster
    from lowlat.kernels.attn_prologue_held import fold_attn_norm

    out_q = poison(torch.empty((x.shape[0], cfg.num_heads, cfg.head_dim), dtype=torch.bfloat16, device=x.device))
    q = attn_prologue_cluster(x, fold_attn_norm(pack_qkv(lw), lw.attn_norm), lw.q_norm, lw.k_norm, step.positions,
                              step.out_cache_loc, step.num_valid_rows if nvr is None else nvr, kc, vc, table, cfg=cfg,
                              out_q=out_q, use_pdl=use_pdl)
    assert q is out_q
    return q


def _qk_config(hidden, group, hkv, d):
    return tiny_config(architecture="Qwen3ForCausalLM", qk_norm=True, hidden_size=hidden, num_heads=group * hkv,
                       num_kv_heads=hkv, head_dim=d)


@pytest.mark.gpu
@given(m=st.integers(1, 48), pad=st.integers(0, 3), group=st.sampled_from([1, 4, 8]), hkv=st.sampled_from([1, 2, 4]),
       d=st.sampled_from([64, 128]), hidden=st.sampled_from([1024, 2048]), hostile=st.booleans(),
       seed=st.integers(0, 2**16))
def test_cluster_prologue_within_2x_baseline_error(device, m, pad, group, hkv, d, hidden, hostile, seed):
    """kernels/attn_prologue_cluster.py (Gluon clusters, GPU only): q of every row (poisoned before: every element
    written) and the K / V of every valid row against the reference with QK-norm, no other KV slot changed; rows 1..48
    with padding (optionally padding rows of 1e4: they must not leak into valid rows), GQA ratios 1 / 4 / 8, head_dim
    64 / 128 (clusters of 4 / 8 programs), H 1024 / 2048 (8 / 16 chunks a K slice), PDL on or off."""
    cfg = _qk_config(hidden, group, hkv, d)
    rows = split_rows(m)
    ctxs = [(seed >> i) % 40 for i in range(len(rows))]
    pad = min(pad, 48 - m)
    lw, step, x, kc, vc = _case(cfg, ctxs=ctxs, rows=rows, pad=pad, seed=seed, device=device, hostile_padding=hostile)
    _check_against_reference(cfg, lw, step, x, kc, vc, run=_run_cluster, use_pdl=bool(seed & 1))


@pytest.mark.gpu
@pytest.mark.parametrize("tp", [1, 4])
def test_cluster_prologue_qwen3_deterministic_row_invariant_and_graph(device, tp):
    """Qwen3-30B-A3B's prologue (H 2048, 32 / 4 heads of D 128: 320 programs, 40 clusters) and its TP-4 shard: within
    the policy at 1 / 6 / 17 / 48 rows; run-to-run bitwise; PDL on == off; each row's q / K / V identical alone,
    among 48 rows (44 valid) and among the first 6 / 17 / 33 (`_assert_rows_invariant`: the chunked mma at every
    width); a CUDA-graph replay (num_valid_rows a device tensor) == eager."""
    from lowlat.kernels.attn_prologue_cluster import attn_prologue_cluster
    from lowlat.kernels.attn_prologue_held import fold_attn_norm

    cfg = preset("Qwen3-30B-A3B")
    cfg = cfg.replace(num_heads=cfg.num_heads // tp, num_kv_heads=cfg.num_kv_heads // tp)
    for m, pad, seed in ((1, 0, 1), (6, 0, 2), (15, 2, 3), (44, 4, 4)):
        lw, step, x, kc, vc = _case(cfg, ctxs=[(5 * i) % 90 for i in range(m)], rows=[1] * m, pad=pad, seed=seed,
                                    device=device)
        _check_against_reference(cfg, lw, step, x, kc, vc, run=_run_cluster, use_pdl=True)
    lw, step, x, kc0, vc0 = _case(cfg, ctxs=[(7 * i) % 90 for i in range(44)], rows=[1] * 44, pad=4, seed=11,
                                  device=device)
    table = rope_table(cfg, MAX_POS, device)
    runs = [_on_copies(lambda kc, vc: _run_cluster(cfg, lw, step, x, kc, vc, table=table, use_pdl=pdl), kc0, vc0)
            for pdl in (False, False, True)]
    for got in runs[1:]:
        _assert_same_outputs(got, runs[0], "run_to_run_pdl")
    _assert_rows_invariant(lambda st, xs, kc, vc: _run_cluster(cfg, lw, st, xs, kc, vc, table=table),
                           step, x, kc0, vc0, runs[0])
    nvr = torch.tensor([step.num_valid_rows], dtype=torch.int32, device=device)
    wf = fold_attn_norm(pack_qkv(lw), lw.attn_norm)
    _assert_graph_replay_equals_eager(
        lambda kc, vc, out_q: attn_prologue_cluster(x, wf, lw.q_norm, lw.k_norm, step.positions, step.out_cache_loc,
                                                    nvr, kc, vc, table, cfg=cfg, out_q=out_q, use_pdl=True),
        kc0, vc0, runs[0])


def _cluster_error_cases():
    """(cfg, base arguments, [(name, change, message)]) for attn_prologue_cluster's refusals on the CPU (the device's
    reason last: the CPU is not an sm_90 GPU)."""
    cfg = _qk_config(1024, 2, 1, 64)
    bf = torch.bfloat16
    n = (2 + 2 * 1) * 64
    base = dict(x=torch.randn(3, 1024).to(bf), qkv_weight=torch.randn(n, 1024).to(bf), q_norm=torch.ones(64, dtype=bf),
                k_norm=torch.ones(64, dtype=bf), positions=torch.arange(3),
                out_cache_loc=torch.arange(1, 4, dtype=torch.int32), num_valid_rows=3,
                k_cache=torch.zeros(8, 1, 64, dtype=bf), v_cache=torch.zeros(8, 1, 64, dtype=bf),
                cos_sin_table=torch.zeros(16, 64), out_q=torch.zeros(3, 2, 64, dtype=bf))
    cases = [
        ("M 49", dict(x=torch.zeros(49, 1024, dtype=bf)), "x has M=49 rows; the held prologue takes 1..48"),
        ("q_norm None", dict(q_norm=None), "q_norm is None: this prologue applies QK-norm"),
        ("k_norm shape", dict(k_norm=torch.ones(32, dtype=bf)), "k_norm has shape (32,): dim 0 must be D=64"),
        ("q_norm dtype", dict(q_norm=torch.ones(64)), "q_norm must be torch.bfloat16"),
        ("N", dict(qkv_weight=torch.zeros(n + 32, 1024, dtype=bf)), "qkv_weight has N=288 rows"),
        ("nvr", dict(num_valid_rows=-1), "num_valid_rows=-1 must be in 0..M=3"),
        ("out_q is q_norm", dict(q_norm=base["out_q"].view(-1)[:64]), "out_q overlaps q_norm"),
        ("no QK-norm", dict(cfg=cfg.replace(qk_norm=False)), "cannot run here: no QK-norm"),
        ("QKV bias", dict(cfg=cfg.replace(qkv_bias=True)), "cannot run here: QKV bias"),
        ("H 512", dict(cfg=cfg.replace(hidden_size=512), x=torch.zeros(3, 512, dtype=bf),
                       qkv_weight=torch.zeros(n, 512, dtype=bf)), "cannot run here: hidden_size 512"),
        ("device", {}, "the cluster prologue cannot run here:"),
    ]
    return cfg, base, cases


@pytest.mark.parametrize("case", range(len(_cluster_error_cases()[2])))
@pytest.mark.interpreter
def test_cluster_prologue_bad_input_raises_typed_error_before_any_launch(case):
    """Every refusal of attn_prologue_cluster, on the CPU: a StepContractError naming the value, the caches and out_q
    untouched."""
    from lowlat.kernels.attn_prologue_cluster import attn_prologue_cluster

    _assert_refused_untouched(attn_prologue_cluster, *_cluster_error_cases(), case)


def test_cluster_prologue_model_reasons():
    """Qwen3-30B-A3B / Qwen3-0.6B's prologues are taken (QK-norm, D 128, H 2048 / 1024); the Llama family's, a QKV
    bias and D 96 are refused by name."""
    from lowlat.kernels.attn_prologue_cluster import cluster_prologue_model_reason

    assert cluster_prologue_model_reason(preset("Qwen3-30B-A3B")) is None
    assert cluster_prologue_model_reason(preset("Qwen3-0.6B")) is None
    assert "no QK-norm" in cluster_prologue_model_reason(preset("Llama-3.2-1B"))
    assert "QKV bias" in cluster_prologue_model_reason(preset("Qwen2.5-0.5B"))
    assert cluster_prologue_model_reason(_qk_config(1024, 2, 1, 64)) is None
    assert "head_dim 96" in cluster_prologue_model_reason(_qk_config(1024, 2, 1, 96))


class _FakeCompiled:
    def __init__(self, md, scratch=0):
        self.packed_metadata = md
        self.metadata = dataclasses.make_dataclass("Meta", ["global_scratch_size", "profile_scratch_size"])(scratch, 0)


class _FakeKernel:
    """A kernel's warmup / launch surface: warmup returns one compiled kernel (its metadata as given), a launch
    records its grid and the metadata it would launch with."""

    def __init__(self, md, scratch=0, compiled=True):
        self.compiled = _FakeCompiled(md, scratch) if compiled else None
        self.launches = []

    def warmup(self, *args, grid, **kwargs):
        self.warmed = (grid, args, kwargs)
        return self.compiled

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.launches.append((grid, self.compiled.packed_metadata, args, kwargs))


def test_launch_as_clusters_sets_num_ctas_then_launches_clusters(monkeypatch):
    """launch_as_clusters compiles first (warmup on the cluster grid with the launch's own arguments: the same cache
    entry), gives the compiled kernel num_ctas = the cluster size (keeping num_warps and shared memory), launches
    programs / size clusters once; a second launch finds it set; a Triton it does not know, programs not a multiple
    of the size, a kernel compiled for other clusters, metadata of another shape, no compiled kernel (a cache hook)
    and a kernel needing global scratch (sized by the launcher for grid x 1 CTAs) are refused before any launch."""
    import lowlat.kernels.attn_prologue_cluster as apc

    k = _FakeKernel((4, 1, 4096))
    apc.launch_as_clusters(k, 320, 8, (1, 2), dict(D=128))
    assert k.warmed == ((40,), (1, 2), dict(D=128)) and k.launches == [((40,), (4, 8, 4096), (1, 2), dict(D=128))]
    apc.launch_as_clusters(k, 320, 8, (1, 2), dict(D=128))
    assert len(k.launches) == 2 and k.compiled.packed_metadata == (4, 8, 4096)
    for programs, bad, msg in ((321, _FakeKernel((4, 1, 0)), "321 programs are not a multiple of the cluster size 8"),
                               (320, _FakeKernel((4, 4, 0)), "compiled for clusters of 4, not 8"),
                               (320, _FakeKernel((4, 1)), "is not (num_warps, num_ctas, shared memory)"),
                               (320, _FakeKernel(None, compiled=False), "packed metadata None is not"),
                               (320, _FakeKernel((4, 1, 0), scratch=64), "needs global / profile scratch")):
        with pytest.raises(StepContractError, match=re.escape(msg)):
            apc.launch_as_clusters(bad, programs, 8, (), {})
        assert bad.launches == []
    monkeypatch.setattr(apc.triton, "__version__", "3.7.0")
    bad = _FakeKernel((4, 1, 0))
    with pytest.raises(StepContractError, match=re.escape("Triton 3.7.0 is not among")):
        apc.launch_as_clusters(bad, 320, 8, (), {})
    assert bad.launches == []


@pytest.mark.parametrize("hidden,d,m", [(2048, 128, 1), (2048, 128, 6), (2048, 128, 16), (2048, 128, 48),
                                        (1024, 64, 1), (1024, 64, 48), (1024, 128, 17)])
def test_cluster_prologue_sm90_build_holds_paces_and_syncs_the_cluster(hidden, d, m):
    """The kernel as attn_prologue_cluster launches it (Qwen3-30B-A3B's H 2048 / D 128; H 1024 and D 64: clusters of 4,
    8 chunks a slice), compiled for sm_90 on the CPU: no spills under maxnreg 168 (three programs an SM); before the
    wait the weights' H / 32 16-byte loads a thread (H / 128 chunks of 32 columns a slice, each piece twice in the
    narrow chunks' operand layout: 64 at H 2048), all but a window's worth offset by the chunk 4 back
    (`_zero_after`); after it per row block x's chunks (H / 64 16-byte loads: each piece twice too; x loaded whole is
    dead, the statistic is chunked), H / 64 mma.sync (the chunked chain only), one cluster barrier with its size check
    (trap); the program id is the CTA's (`%ctaid`, no `%clusterid`: compiled with num_ctas 1, clustered at launch).
    Without CHUNK_STAT's statistic before the mma chain the 2+ row-block builds spilled 316-1120 bytes (every x chunk
    live after the chain)."""
    from sampling_stats import compile_sm90

    from lowlat.kernels.attn_prologue_cluster import CHUNK_COLUMNS, MAXNREG, WINDOW

    pointers = {a: "*bf16" for a in ("x_ptr", "w_ptr", "g_ptr", "q_ptr", "kc_ptr", "vc_ptr", "qnorm_ptr",
                                     "knorm_ptr")}
    pointers.update(tab_ptr="*fp32", pos_ptr="*i64", loc_ptr="*i32", nvr_ptr="*i32", hsum_ptr="*fp32")
    nmb = (m + 7) // 8
    chunks = hidden // 4 // CHUNK_COLUMNS
    spec = {"constexprs": {"K": hidden, "D": d, "NMB": nmb, "NVR_FROM_PTR": True, "USE_PDL": True, "FOLD_G": False,
                           "Q": 4, "S": 4, "RB": 8, "PACE": chunks, "PACE_WIN": WINDOW, "EARLY_RELEASE": False,
                           "QK_NORM": True, "CHUNK_STAT": True, **({"M": 1} if m == 1 else {})},
            "pointers": pointers, "scalars": {"eps": "fp32"},
            "divisible": ["stride_qm", "stride_qh", "stride_kcs", "stride_kch", "stride_vcs", "stride_vch", "Hq",
                          "max_pos", "zero"], "num_warps": 4, "maxnreg": MAXNREG, "launch_pdl": True, "ptx": True}
    info, = compile_sm90("lowlat.kernels.attn_prologue_held:_held_prologue_kernel", [spec])
    ptx = info["ptx"][info["ptx"].index(".entry"):]
    before, _, after = ptx.partition("griddepcontrol.wait")
    loads = hidden // 32
    assert info["spill_bytes"] == 0 and info["registers"] <= MAXNREG, info
    assert before.count("ld.global.v4") == loads and before.count("cvt.u32.u16") == loads // chunks * (chunks - WINDOW)
    assert after.count("ld.global.v4") == hidden // 64 * nmb and after.count("mma.sync") == hidden // 64 * nmb
    assert after.count("barrier.cluster.arrive") == nmb and after.count("trap;") == nmb
    assert "%ctaid.x" in ptx and "%clusterid" not in ptx
