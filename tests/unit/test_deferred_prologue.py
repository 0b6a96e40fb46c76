"""The down projection's split-K reduction deferred to the next layer's attention prologue
(`out_proj.residual_gemv_deferred` + `attn_prologue.attn_prologue` given a `DeferredX`) against the same two launches
with the reduction in the down projection (`residual_gemv`, then `attn_prologue` on its output): bitwise the same x,
q and K / V written, since the prologue repeats the finisher's arithmetic (partials added to zeros in split order,
then the residual, one bf16 rounding) before its own GEMV.

Outputs, the partials buffer and the KV caches' unowned slots are poisoned (NaN) before every run, so an element
never written fails; the residual must come back untouched. CPU: tiny shapes under the interpreter, every plan mode
of both launches; GPU: Llama-3.2-1B's down (2048 x 8192, split 4) into its prologue, SmolLM2-135M's (split 6),
Qwen2.5-0.5B's (QKV bias) and Qwen3-0.6B's (QK-norm). The split-order test takes the `device` fixture, so it runs
at its tiny shape on a GPU runner too.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from lowlat.config import preset
from lowlat.errors import StepContractError
from lowlat.kernels._gemv import GemvWorkspace, plan_gemv
from lowlat.kernels.attn_prologue import attn_prologue, make_prologue_workspace, pack_qkv, pack_qkv_bias, rope_table
from lowlat.kernels.out_proj import DeferredX, residual_gemv, residual_gemv_deferred
from lowlat.numerics import check_bitwise, poison
from lowlat.testing import random_step, reverse_interpreter_grid, split_rows, tiny_config
from lowlat.weights import random_layer_weights

MAX_POS = 256
PLAN_MODES = [dict(preload=True, bn=64), dict(preload=True, bn=16), dict(preload=False, bn=16),
              dict(preload=False, bn=64)]



def make_case(cfg, m, pad, inter, seed, device):
    """(layer weights, step, residual x [M, H], act [M, I], w_down [H, I], k_cache, v_cache) with NaN in unowned
    KV slots (`random_step`)."""
    g = torch.Generator().manual_seed(seed)
    lw = random_layer_weights(cfg.replace(intermediate_size=16), generator=g)
    rows = split_rows(m)
    case = random_step(ctx_lens=[(5 * i + seed) % 13 for i in range(len(rows))], new_rows=rows,
                       num_kv_heads=cfg.num_kv_heads, head_dim=cfg.head_dim, pad_to=m + pad, generator=g)
    n = case.step.num_rows
    x = torch.randn(n, cfg.hidden_size, generator=g).bfloat16()
    act = torch.randn(n, inter, generator=g).bfloat16()
    w_down = (torch.randn(cfg.hidden_size, inter, generator=g) / inter ** 0.5).bfloat16()
    lw = lw.map(lambda t: t.to(device))
    return (lw, case.step.to(device), x.to(device), act.to(device), w_down.to(device), case.k_cache.to(device),
            case.v_cache.to(device))


def prologue_fn(cfg, lw, step, kc, vc, ws, use_pdl):
    """The prologue launch as a function of x, everything else (packed weights, RoPE table, poisoned out_q) made now:
    between a down launch and this one nothing else runs, so on a GPU the prologue's wait is the PDL hand-off."""
    args = (pack_qkv(lw), pack_qkv_bias(lw), lw.attn_norm, lw.q_norm, lw.k_norm, step.positions, step.out_cache_loc,
            step.num_valid_rows, kc, vc, rope_table(cfg, MAX_POS, kc.device))
    out_q = poison(torch.empty((step.num_rows, cfg.num_heads, cfg.head_dim), dtype=torch.bfloat16, device=kc.device))
    return lambda x: attn_prologue(x, *args, cfg=cfg, out_q=out_q, workspace=ws, use_pdl=use_pdl)


def prologue(cfg, lw, step, x, kc, vc, ws, use_pdl):
    return prologue_fn(cfg, lw, step, kc, vc, ws, use_pdl)(x)


def both_ways(cfg, lw, step, x, act, w_down, kc0, vc0, plan_down, ws_pro, ws, use_pdl=False):
    """((x, q, k_cache, v_cache) with the reduction in the down projection, the same deferred to the prologue)."""
    kc, vc = kc0.clone(), vc0.clone()
    x_ref, run = poison(torch.empty_like(x)), prologue_fn(cfg, lw, step, kc, vc, ws_pro, use_pdl)
    residual_gemv(act, w_down, x, out=x_ref, workspace=ws, plan=plan_down, use_pdl=use_pdl)
    q_ref = run(x_ref)
    ref = (x_ref, q_ref, kc, vc)
    kc, vc = kc0.clone(), vc0.clone()
    x_before = x.clone()
    parts = poison(torch.empty(plan_down.split, *x.shape, dtype=torch.float32, device=x.device))
    x_out, run = poison(torch.empty_like(x)), prologue_fn(cfg, lw, step, kc, vc, ws_pro, use_pdl)
    d = residual_gemv_deferred(act, w_down, x, x_out, partials=parts, workspace=ws, plan=plan_down, use_pdl=use_pdl)
    q = run(d)
    assert torch.equal(x.view(torch.int16), x_before.view(torch.int16)), "the residual was written"
    assert int(ws_pro.counters.abs().sum()) == 0 and int(ws.counters.abs().sum()) == 0
    return ref, (d.out, q, kc, vc)


def check_same(ref, new, rows=slice(None), tag=""):
    for name, a, b in zip(("x", "q"), new[:2], ref[:2]):
        check_bitwise("attn_prologue", a[rows], b[rows], output=f"{name}{tag}")
    for name, a, b in zip(("k_cache", "v_cache"), new[2:], ref[2:]):      # unowned slots hold NaN in both
        assert torch.equal(a.isnan(), b.isnan()), f"{name}{tag}: NaN in other slots"
        check_bitwise("attn_prologue", a.nan_to_num(), b.nan_to_num(), output=f"{name}{tag}")


# ----------------------------------------------------------------------------- CPU (interpreter)
@settings(max_examples=10)
@given(m=st.integers(1, 48), pad=st.integers(0, 3), hidden=st.sampled_from([48, 64, 96]),
       qk_norm=st.booleans(), bias=st.booleans(), mode_down=st.sampled_from(PLAN_MODES),
       split_down=st.sampled_from([2, 3]), split_pro=st.sampled_from([1, 2, 3]), preload_pro=st.booleans(),
       early=st.booleans(), seed=st.integers(0, 2 ** 16))
@pytest.mark.slow
@pytest.mark.interpreter
def test_deferred_down_into_prologue_bitwise_equals_down_finisher(m, pad, hidden, qk_norm, bias, mode_down,
                                                                  split_down, split_pro, preload_pro, early, seed):
    """Every plan mode of the down projection (preload / stream, bn, split 2-3) into every prologue plan (split 1-3,
    preload / stream, epilogue inputs early or late), 1-48 rows over 1-3 row blocks (one per program), with and
    without QK-norm and bias, ragged K slices (hidden 48 / 96 over block_k 16)."""
    pad = min(pad, 48 - m)
    cfg = tiny_config(hidden_size=hidden, num_heads=4, num_kv_heads=2, head_dim=32, qkv_bias=bias, qk_norm=qk_norm)
    lw, step, x, act, w_down, kc, vc = make_case(cfg, m, pad, 80, seed, "cpu")
    plan_down = plan_gemv(hidden, 80, kind="residual", block_k=16, split=split_down, **mode_down)
    ws_pro = make_prologue_workspace(pack_qkv(lw), cfg.head_dim, block_k=16, split=split_pro, preload=preload_pro,
                                     early_inputs=early)
    ref, new = both_ways(cfg, lw, step, x, act, w_down, kc, vc, plan_down, ws_pro, GemvWorkspace.create(96, "cpu"))
    check_same(ref, new)


@pytest.mark.parametrize("order", ["forward", "reverse"])
@pytest.mark.interpreter
def test_deferred_prologue_padding_rows_never_change_valid_rows(monkeypatch, order):
    """NaN in the padding rows' act and residual stays in those rows (x, q; the caches get only valid rows). Run with
    the interpreter's programs in grid order and reversed (`reverse_interpreter_grid`): every program reduces its own
    K slice before reading it, so no order may matter (several column tiles, splits and row blocks here)."""
    if order == "reverse":
        reverse_interpreter_grid(monkeypatch)
    cfg = tiny_config(hidden_size=64, num_heads=4, num_kv_heads=2, head_dim=32, qkv_bias=True, qk_norm=True)
    lw, step, x, act, w_down, kc, vc = make_case(cfg, 18, 3, 80, 7, "cpu")
    n = step.num_valid_rows
    plan_down = plan_gemv(64, 80, kind="residual", block_k=16, split=3, preload=False, bn=16)
    ws_pro = make_prologue_workspace(pack_qkv(lw), cfg.head_dim, block_k=16, split=2, preload=True)
    ws = GemvWorkspace.create(96, "cpu")
    ref, new = both_ways(cfg, lw, step, x, act, w_down, kc, vc, plan_down, ws_pro, ws)
    check_same(ref, new, tag="_all_rows")            # every row, the padding rows too
    act2, x2 = act.clone(), x.clone()
    act2[n:] = float("nan")
    x2[n:] = float("nan")
    _, new2 = both_ways(cfg, lw, step, x2, act2, w_down, kc, vc, plan_down, ws_pro, ws)
    check_same(new, new2, rows=slice(0, n), tag="_valid_rows")


def test_prologue_reduces_the_partials_in_split_order(device):
    """Partials chosen so that the order of the fp32 sum shows: (1 + 1e8) - 1e8 = 0 in split order, 1 in reverse,
    and the residual r = 1 added last (added first, ((1 + 1) + 1e8) - 1e8 = 0). x = bf16(((p0 + p1) + p2) + r) must
    come out 1 in every element of every row block."""
    cfg = tiny_config(hidden_size=64, num_heads=4, num_kv_heads=2, head_dim=32)
    lw, step, x, _, _, kc, vc = make_case(cfg, 20, 0, 80, 1, device)
    m = step.num_rows
    parts = torch.stack([torch.full((m, 64), v, device=device) for v in (1.0, 1e8, -1e8)])
    d = DeferredX(parts, torch.ones(m, 64, dtype=torch.bfloat16, device=device),
                  poison(torch.empty(m, 64, dtype=torch.bfloat16, device=device)))
    ws_pro = make_prologue_workspace(pack_qkv(lw), cfg.head_dim, block_k=16, split=2)
    prologue(cfg, lw, step, d, kc, vc, ws_pro, False)
    assert bool((d.out == 1).all()), f"x not partials in split order, then r: {d.out.unique().tolist()}"


@pytest.mark.interpreter
def test_prologue_refuses_deferred_buffers_it_writes():
    """The DeferredX's out, residual or partials sharing bytes with out_q or a KV cache, and a malformed DeferredX:
    a typed error, and nothing written (the caches and out_q unchanged)."""
    cfg = tiny_config(hidden_size=64, num_heads=4, num_kv_heads=2, head_dim=32)
    lw, step, x, _, _, kc, vc = make_case(cfg, 3, 0, 80, 2, "cpu")
    m = step.num_rows
    parts = torch.randn(2, m, 64)
    q_buf = torch.empty(m * cfg.num_heads * cfg.head_dim, dtype=torch.bfloat16)
    out_q = q_buf.view(m, cfg.num_heads, cfg.head_dim)
    kc_flat = kc.view(-1)
    cases = [
        (DeferredX(parts, x, q_buf[:m * 64].view(m, 64)), out_q, "out_q overlaps deferred out"),
        (DeferredX(parts, kc_flat[:m * 64].view(m, 64), torch.empty_like(x)), None, "k_cache overlaps deferred "
                                                                                   "residual"),
        (DeferredX(parts, x, vc.view(-1)[64:64 + m * 64].view(m, 64)), None, "v_cache overlaps deferred out"),
        (DeferredX(kc_flat.view(torch.float32)[:2 * m * 64].view(2, m, 64), x, torch.empty_like(x)), None,
         "k_cache overlaps deferred partials"),
        (DeferredX(parts, x, x), None, "deferred out overlaps deferred residual"),
        (DeferredX(torch.randn(1, m, 64), x, torch.empty_like(x)), None, r"\[S >= 2, M, N\]"),
        (DeferredX(parts, x, torch.empty(m, 64)), None, "deferred out must be torch.bfloat16"),
        (DeferredX(parts, None, torch.empty_like(x)), None, "deferred residual must be a torch.Tensor"),
    ]
    for d, oq, match in cases:
        kc_before, vc_before = kc.clone(), vc.clone()
        oq_before = None if oq is None else oq.clone()
        with pytest.raises(StepContractError, match=match):
            attn_prologue(d, pack_qkv(lw), None, lw.attn_norm, None, None, step.positions, step.out_cache_loc,
                          step.num_valid_rows, kc, vc, rope_table(cfg, MAX_POS, "cpu"), cfg=cfg, out_q=oq)
        assert torch.equal(kc.nan_to_num(), kc_before.nan_to_num()) and torch.equal(vc.nan_to_num(),
                                                                                     vc_before.nan_to_num())
        if oq is not None:
            assert torch.equal(oq.view(torch.int16), oq_before.view(torch.int16))


# ------------------------------------------------------------------------------------------------- GPU
@pytest.mark.gpu
@pytest.mark.parametrize("model", ["Llama-3.2-1B", "SmolLM2-135M", "Qwen2.5-0.5B", "Qwen3-0.6B"])
def test_deferred_prologue_gpu_bitwise_equals_down_finisher(device, model):
    """The production plans of the model's down projection (split-K) and prologue, PDL on, 1-48 rows; the Qwen
    presets bring the QKV bias and the QK-norm epilogue."""
    full = preset(model)
    cfg = full.replace(num_layers=1)
    plan_down = plan_gemv(cfg.hidden_size, cfg.intermediate_size, kind="residual")
    assert plan_down.split > 1
    ws = GemvWorkspace.create(max(cfg.hidden_size, cfg.intermediate_size), device)
    for m in (1, 2, 6, 16, 17, 33, 48):
        lw, step, x, act, w_down, kc, vc = make_case(cfg, m, 0, cfg.intermediate_size, 31 + m, device)
        ws_pro = make_prologue_workspace(pack_qkv(lw), cfg.head_dim)
        ref, new = both_ways(cfg, lw, step, x, act, w_down, kc, vc, plan_down, ws_pro, ws, use_pdl=True)
        check_same(ref, new, tag=f"_m{m}")
