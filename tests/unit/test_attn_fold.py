"""The decode attention's split combine folded into the output projection (`decode_attention(..., fold_combine=True)`
+ `out_proj` / `residual_gemv` / `residual_gemv_deferred` given the `DeferredAttention`) against the same launches
with the combine in the attention: bitwise the same attention output (written by the projection, padding rows 0)
and the same projection outputs, since the projection repeats `_combine_splits`' arithmetic (splits folded one at a
time in split order, then one division and one bf16 rounding).

Every output, the attention output buffer and the attention's split partials are poisoned (NaN) before each run, so
an element never written, or a partial the attention should have stored and did not, fails. CPU: tiny shapes under
the interpreter (BLOCK_N 16, 1-8 splits, so short contexts cross split edges), every plan mode of the projection
and every grouping of the attention; GPU: the production plans of Llama-3.2-1B, SmolLM2-135M (3 heads a K slice),
Qwen2.5-0.5B (a ragged last slice) and Qwen3-0.6B (D 128) with PDL; the adversarial split-order case takes the
`device` fixture, so it runs at its tiny shape on a GPU runner too.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import assume, example, given, settings
from hypothesis import strategies as st

from lowlat.config import preset
from lowlat.errors import StepContractError
from lowlat.kernels._gemv import GemvWorkspace, plan_gemv
from lowlat.kernels.attn_combine import DeferredAttention, fold_pieces
from lowlat.kernels.decode_attention import decode_attention, make_decode_workspace
from lowlat.kernels.out_proj import out_proj, residual_gemv, residual_gemv_deferred
from lowlat.numerics import check_bitwise, poison
from lowlat.testing import random_step, reverse_interpreter_grid, split_rows

PLAN_MODES = [dict(preload=True, bn=64), dict(preload=True, bn=16), dict(preload=False, bn=16),
              dict(preload=False, bn=64)]
KINDS = ("residual", "out_proj", "deferred")



def make_case(m, pad, hq, hkv, d, hidden, max_ctx, seed, device, ctxs=None):
    """(step, q, k_cache, v_cache, wo [hidden, hq*d], residual [rows, hidden], mlp_norm) with the step's own K / V in
    the cache (as the prologue leaves it) and NaN in the slots no row owns. Request i has (37 i + seed) mod
    (max_ctx + 1) cached tokens, or ctxs[i mod len(ctxs)]."""
    g = torch.Generator().manual_seed(seed)
    rows = split_rows(m)
    ctxs = [(37 * i + seed) % (max_ctx + 1) if ctxs is None else ctxs[i % len(ctxs)] for i in range(len(rows))]
    case = random_step(ctx_lens=ctxs, new_rows=rows, num_kv_heads=hkv, head_dim=d, pad_to=m + pad, generator=g)
    step, kc, vc = case.step, case.k_cache, case.v_cache
    n = step.num_valid_rows
    loc = step.out_cache_loc[:n].long()
    kc[loc] = torch.randn(n, hkv, d, generator=g).bfloat16()
    vc[loc] = torch.randn(n, hkv, d, generator=g).bfloat16()
    q = (torch.randn(step.num_rows, hq, d, generator=g) * 2).bfloat16()
    wo = (torch.randn(hidden, hq * d, generator=g) / (hq * d) ** 0.5).bfloat16()
    res = torch.randn(step.num_rows, hidden, generator=g).bfloat16()
    norm = (1 + 0.1 * torch.randn(hidden, generator=g)).bfloat16()
    return tuple(t.to(device) for t in (q, kc, vc, wo, res, norm)), step.to(device)


def projection(kind, wo, res, norm, plan, ws, use_pdl):
    """The projection of `kind` as a function of a (tensor or DeferredAttention), its outputs made and poisoned now
    (so that on a GPU nothing runs between the attention launch and it: its wait is the PDL hand-off); the function
    returns the tuple of its outputs (x; x, h, rstd; the fp32 split partials)."""
    m, n = res.shape
    dev = res.device
    out = poison(torch.empty(m, n, dtype=torch.bfloat16, device=dev))
    if kind == "residual":
        return lambda a: (residual_gemv(a, wo, res, out=out, workspace=ws, plan=plan, use_pdl=use_pdl),)
    if kind == "out_proj":
        h, rstd = poison(torch.empty_like(out)), poison(torch.empty(m, dtype=torch.float32, device=dev))

        def run(a):
            r = out_proj(a, wo, res, norm, 1e-5, out=out, h_out=h, rstd_out=rstd, workspace=ws, plan=plan,
                         use_pdl=use_pdl)
            return r.x, r.h, r.rstd
        return run
    parts = poison(torch.empty(plan.split, m, n, dtype=torch.float32, device=dev))
    return lambda a: (residual_gemv_deferred(a, wo, res, out, partials=parts, workspace=ws, plan=plan,
                                             use_pdl=use_pdl).partials,)


def both_ways(kind, step, q, kc, vc, wo, res, norm, plan, aws, ws, use_pdl=False, **attn_kw):
    """((attention output, projection outputs) with the combine in the attention, the same with it folded into the
    projection). The folded run starts from NaN split partials and a NaN attention buffer; the residual must come
    back untouched."""
    args = (q, kc, vc, step.page_table, step.req_indices, step.positions, step.num_valid_rows)
    attn, run = poison(torch.empty_like(q)), projection(kind, wo, res, norm, plan, ws, use_pdl)
    decode_attention(*args, out=attn, workspace=aws, use_pdl=use_pdl, **attn_kw)
    ref = (attn, run(attn.view(attn.shape[0], -1)))
    aws.partial_o.fill_(float("nan"))
    aws.partial_ml.fill_(float("nan"))
    attn2, run = poison(torch.empty_like(q)), projection(kind, wo, res, norm, plan, ws, use_pdl)
    res_before = res.clone()
    d = decode_attention(*args, out=attn2, workspace=aws, use_pdl=use_pdl, fold_combine=True, **attn_kw)
    assert isinstance(d, DeferredAttention) and d.out is attn2
    new = (attn2, run(d))
    assert torch.equal(res.view(torch.int16), res_before.view(torch.int16)), "the residual changed"
    assert int(aws.counters.abs().sum()) == 0, "the folding attention left a counter set"
    return ref, new


def attention_alone_writes_nothing(step, q, kc, vc, aws):
    """A folding attention launch alone (synchronised before the check) leaves its output buffer untouched."""
    attn = poison(torch.empty_like(q))
    decode_attention(q, kc, vc, step.page_table, step.req_indices, step.positions, step.num_valid_rows, out=attn,
                     workspace=aws, fold_combine=True)
    assert bool(attn.isnan().all()), "the folding attention wrote its output"


def check_same(ref, new, tag=""):
    check_bitwise("decode_attention", new[0], ref[0], output=f"attention{tag}")
    for i, (a, b) in enumerate(zip(new[1], ref[1])):
        check_bitwise("out_proj", a, b, output=f"projection_{i}{tag}")


# ----------------------------------------------------------------------------- CPU (interpreter)
@settings(max_examples=10)
@example(m=7, pad=2, group=4, hkv=2, d=32, num_splits=8, kind="out_proj", mode=PLAN_MODES[2], split=3,
         grouping="groups", seed=140)                      # D 32, 4 split groups of 8 splits, contexts to 140
@example(m=20, pad=1, group=3, hkv=2, d=32, num_splits=4, kind="deferred", mode=PLAN_MODES[0], split=2,
         grouping="pre_kv", seed=7)
@given(m=st.integers(1, 48), pad=st.integers(0, 3), group=st.sampled_from([1, 3, 4, 8]), hkv=st.sampled_from([1, 2]),
       d=st.sampled_from([16, 32]), num_splits=st.sampled_from([1, 2, 4, 8]), kind=st.sampled_from(KINDS),
       mode=st.sampled_from(PLAN_MODES), split=st.sampled_from([1, 2, 3]),
       grouping=st.sampled_from(["one", "pre_kv", "groups"]), seed=st.integers(0, 2 ** 16))
@pytest.mark.slow
@pytest.mark.interpreter
def test_folded_combine_bitwise_equals_attention_combine(m, pad, group, hkv, d, num_splits, kind, mode, split,
                                                        grouping, seed):
    """1-48 rows over 1-3 row blocks, GQA 1 / 3 / 4 / 8, D 16 / 32 (D 32 in the explicit examples), 1-8 splits of
    16-token blocks (contexts to 150: rows with 0 cached tokens, a single split, many, several blocks a split), every
    plan mode of the three projections (K slices of one or more heads, ragged last slices at 3 splits), the attention
    with one program per split (early KV or not) or in num_splits / 2 split groups; the folding attention alone
    writes nothing."""
    pad = min(pad, 48 - m)
    hq = hkv * group
    assume(kind != "deferred" or hq > 1)           # a deferred reduction needs split-K: at least two heads
    (q, kc, vc, wo, res, norm), step = make_case(m, pad, hq, hkv, d, 48, 150, seed, "cpu")
    if kind == "deferred":
        split = max(split, 2)
    plan = plan_gemv(48, hq * d, kind="out_proj" if kind == "out_proj" else "residual", block_k=d,
                     split=min(split, hq), **mode)
    aws = make_decode_workspace(step.num_rows, hq, hkv, d, "cpu", num_splits=num_splits, block_n=16)
    kw = dict(pre_kv=True, out_cache_loc=step.out_cache_loc) if grouping == "pre_kv" else \
        dict(split_groups=max(1, num_splits // 2)) if grouping == "groups" else {}
    ref, new = both_ways(kind, step, q, kc, vc, wo, res, norm, plan, aws, GemvWorkspace.create(48, "cpu"), **kw)
    check_same(ref, new)
    attention_alone_writes_nothing(step, q, kc, vc, aws)


@pytest.mark.parametrize("order", ["forward", "reverse"])
@pytest.mark.interpreter
def test_folded_combine_padding_rows_and_grid_order(monkeypatch, order):
    """Every column tile folds its own K slice before reading it, so no program order may matter (the interpreter's
    programs in grid order and reversed, `reverse_interpreter_grid`; several column tiles, splits and row blocks),
    and NaN in the padding rows' q and residual stays in those rows (the attention output's padding rows are 0)."""
    if order == "reverse":
        reverse_interpreter_grid(monkeypatch)
    (q, kc, vc, wo, res, norm), step = make_case(19, 3, 4, 2, 16, 48, 120, 5, "cpu")
    n = step.num_valid_rows
    plan = plan_gemv(48, 64, kind="residual", block_k=16, split=2, preload=False, bn=16)
    aws = make_decode_workspace(step.num_rows, 4, 2, 16, "cpu", num_splits=4, block_n=16)
    ws = GemvWorkspace.create(48, "cpu")
    ref, new = both_ways("residual", step, q, kc, vc, wo, res, norm, plan, aws, ws)
    check_same(ref, new, tag="_all_rows")
    assert torch.equal(new[0][n:], torch.zeros_like(new[0][n:])), "padding rows' attention output must be 0"
    q2, res2 = q.clone(), res.clone()
    q2[n:] = float("nan")
    res2[n:] = float("nan")
    _, new2 = both_ways("residual", step, q2, kc, vc, wo, res2, norm, plan, aws, ws)
    check_bitwise("decode_attention", new2[0], new[0], output="attention_with_nan_padding")
    check_bitwise("out_proj", new2[1][0][:n], new[1][0][:n], output="x_valid_rows")


def test_folded_combine_keeps_split_order_and_skips_masked_slots(device):
    """The attention test's adversarial case through the fold: one row of L = 48 over 3 splits (num_splits 4: a
    chunk with a masked 4th slot), scores far below 0 (a masked slot's weight 2^(0 - m_max) would be inf, inf * 0
    NaN) and V = +2^26 / -2^26 / N(0, 1) by block, so only split order 0, 1, 2 keeps the last block's mean."""
    (q, kc, vc, wo, res, norm), step = make_case(1, 1, 4, 2, 16, 48, 47, 47, device)   # 47 cached tokens
    assert int(step.positions[0]) == 47
    g = torch.Generator().manual_seed(3)
    slots = step.page_table[int(step.req_indices[0]), :48].long()
    kc[slots] = -8.0
    vc[slots[:16]] = 2.0 ** 26
    vc[slots[16:32]] = -(2.0 ** 26)
    vc[slots[32:48]] = torch.randn(16, 2, 16, generator=g).bfloat16().to(device)
    q.fill_(8.0)
    plan = plan_gemv(48, 64, kind="residual", block_k=16, split=2, preload=True, bn=16)
    aws = make_decode_workspace(step.num_rows, 4, 2, 16, device, num_splits=4, block_n=16)
    ref, new = both_ways("residual", step, q, kc, vc, wo, res, norm, plan, aws, GemvWorkspace.create(48, device))
    check_same(ref, new)
    want = vc[slots[32:48]].double().sum(0) / 48
    got = new[0][0].double().view(2, 2, 16)
    assert torch.isfinite(got).all(), "a masked chunk slot was folded in"
    assert torch.allclose(got, want[:, None, :].expand_as(got), rtol=2e-2, atol=1e-3), (got, want)


def test_fold_pieces_bound_the_partials_a_round_trip():
    """RB rows a piece keep RB x HP x D x CHUNK fp32 within 32 KB (at least one row); the pieces cover the rows."""
    assert fold_pieces(1, 256, 64, 4) == dict(F_HS=4, F_HP=4, F_RB=1, F_NRB=1, F_CHUNK=4)
    assert fold_pieces(48, 256, 64, 4) == dict(F_HS=4, F_HP=4, F_RB=8, F_NRB=6, F_CHUNK=4)
    assert fold_pieces(6, 192, 64, 4) == dict(F_HS=3, F_HP=4, F_RB=8, F_NRB=1, F_CHUNK=4)
    assert fold_pieces(48, 512, 128, 4) == dict(F_HS=4, F_HP=4, F_RB=4, F_NRB=12, F_CHUNK=4)
    assert fold_pieces(3, 4096, 128, 4) == dict(F_HS=32, F_HP=32, F_RB=1, F_NRB=3, F_CHUNK=4)


@pytest.mark.interpreter
def test_fold_refuses_bad_deferred_attention_before_writing():
    """A plan slicing K through a head, a malformed DeferredAttention, outputs overlapping the attention's buffers or
    an attention output overlapping the residual: a typed error naming it, and nothing written."""
    (q, kc, vc, wo, res, norm), step = make_case(3, 0, 4, 2, 32, 48, 40, 1, "cpu")
    aws = make_decode_workspace(step.num_rows, 4, 2, 32, "cpu", num_splits=2, block_n=16)
    attn = poison(torch.empty_like(q))
    d = decode_attention(q, kc, vc, step.page_table, step.req_indices, step.positions, step.num_valid_rows,
                         out=attn, workspace=aws, fold_combine=True)
    m = step.num_rows
    good = plan_gemv(48, 128, kind="residual", block_k=32, split=2)
    ws = GemvWorkspace.create(48, "cpu")
    big = torch.empty(m * 256, dtype=torch.bfloat16)
    cases = [
        (d, plan_gemv(48, 128, kind="residual", block_k=16, split=8), None, "not whole heads of D=32"),
        (d._replace(out=attn.float()), good, None, "deferred attention out must be"),
        (d._replace(out=attn.transpose(0, 1).contiguous().transpose(0, 1)), good, None, "must be contiguous"),
        (d._replace(positions=step.positions.int()), good, None, "positions must be"),
        (d._replace(num_valid_rows=3), good, None, "num_valid_rows must be a torch.Tensor"),
        (d._replace(partial_ml=aws.partial_ml[:, :, :1]), good, None, "partial_ml must be"),
        (d._replace(partial_o=aws.partial_o.half()), good, None, "partial_o must be"),
        (d._replace(out=big[:m * 128].view(m, 4, 32)), good, big[m * 64:m * 64 + m * 48].view(m, 48),
         "the deferred attention's out overlaps residual"),
    ]
    ws_big = GemvWorkspace.create(48, "cpu")
    cases += [
        (d._replace(positions=torch.arange(2 * m, dtype=torch.int64)[::2]), good, None, "positions must be .* contiguous"),
        (d._replace(out=aws.partial_o.view(-1)[:m * 128].view(torch.bfloat16)[:m * 128].view(m, 4, 32)), good, None,
         "deferred attention out overlaps its partial_o"),
        (d._replace(block_n=16.0), good, None, "block_n=16.0 must be"),
    ]
    for dd, plan, residual, match in cases:
        r = res if residual is None else residual
        out = poison(torch.empty(m, 48, dtype=torch.bfloat16))
        attn_before = dd.out.clone() if isinstance(dd.out, torch.Tensor) else None
        with pytest.raises(StepContractError, match=match):
            residual_gemv(dd, wo, r, out=out, workspace=ws, plan=plan)
        assert bool(out.isnan().all()), f"{match}: out written"
        if attn_before is not None:   # poisoned (NaN): any write shows
            assert torch.equal(dd.out.nan_to_num(7.0), attn_before.nan_to_num(7.0)), f"{match}: attention written"
    out_on_partials = aws.partial_o.view(-1)[:m * 24].view(torch.bfloat16).view(m, 48)
    with pytest.raises(StepContractError, match="out overlaps the deferred attention's partial_o"):
        residual_gemv(d, wo, res, out=out_on_partials, workspace=ws, plan=good)
    with pytest.raises(StepContractError, match="out overlaps the deferred attention's out"):
        residual_gemv(d, wo, res, out=attn.view(-1)[:m * 48].view(m, 48), workspace=ws, plan=good)
    with pytest.raises(StepContractError, match="workspace_partials overlaps the deferred attention's out"):
        on_ws = ws_big.partials.view(-1)[:m * 64].view(torch.bfloat16).view(m, 4, 32)
        residual_gemv(d._replace(out=on_ws), wo, res, out=poison(torch.empty(m, 48, dtype=torch.bfloat16)),
                      workspace=ws_big, plan=good)
    with pytest.raises(StepContractError, match="head_dim D=24 must be a power of two"):
        bad = DeferredAttention(torch.empty(m, 4, 2, 24), torch.empty(m, 4, 2, 2), step.positions,
                                torch.ones(1, dtype=torch.int32), torch.empty(m, 4, 24, dtype=torch.bfloat16), 16)
        residual_gemv(bad, torch.empty(48, 96, dtype=torch.bfloat16), res, workspace=ws, plan=plan_gemv(48, 96))
    args = (q, kc, vc, step.page_table, step.req_indices)
    with pytest.raises(StepContractError, match="fold_combine=1 must be a bool"):
        decode_attention(*args, step.positions, step.num_valid_rows, workspace=aws, fold_combine=1)
    d_int = decode_attention(*args, step.positions, int(step.num_valid_rows), workspace=aws, fold_combine=True)
    assert d_int.num_valid_rows.dtype == torch.int32 and int(d_int.num_valid_rows) == int(step.num_valid_rows)


# ------------------------------------------------------------------------------------------------- GPU
@pytest.mark.gpu
@pytest.mark.parametrize("model", ["Llama-3.2-1B", "SmolLM2-135M", "Qwen2.5-0.5B", "Qwen3-0.6B"])
def test_folded_combine_gpu_bitwise_equals_attention_combine(device, model):
    """The production plans of the model's output projection (residual and out_proj kinds; the deferred form where
    the plan splits K) with the attention's default grid and the early-KV path, PDL on (the projection's wait is
    the hand-off: its outputs are made before the attention launch), 1-48 rows; contexts 0-2100: one row at 511
    (8 splits, the benchmarked case) and at 2100 (33 blocks: 17 splits of 2 blocks), then mixes with one split,
    split edges (1023: 16 splits), 2047 / 2048 (32 splits of 1 block / 17 of 2)."""
    cfg = preset(model)
    hq, hkv, d, hidden = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.hidden_size
    ws = GemvWorkspace.create(hidden, device)
    mixes = [(1, [511]), (1, [2100]), (2, [100, 0]), (6, [2100, 700, 64, 0]), (16, [1023, 2047, 5, 300]),
             (17, [2048, 63, 1500]), (33, [900, 0, 2100, 127]), (48, [2100, 511, 30, 1200, 64])]
    for i, (m, ctxs) in enumerate(mixes):
        (q, kc, vc, wo, res, norm), step = make_case(m, 1 if m < 48 else 0, hq, hkv, d, hidden, 0, i, device,
                                                     ctxs=ctxs)
        aws = make_decode_workspace(step.num_rows, hq, hkv, d, device)
        attention_alone_writes_nothing(step, q, kc, vc, aws)
        for kind in KINDS:
            plan = plan_gemv(hidden, hq * d, kind="out_proj" if kind == "out_proj" else "residual")
            if kind == "deferred" and plan.split < 2:
                continue
            for kw in ({}, dict(out_cache_loc=step.out_cache_loc)):
                ref, new = both_ways(kind, step, q, kc, vc, wo, res, norm, plan, aws, ws, use_pdl=True, **kw)
                check_same(ref, new, tag=f"_{model}_m{m}_{kind}")
