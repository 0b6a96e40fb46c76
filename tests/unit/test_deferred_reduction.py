"""out_proj's split-K reduction deferred to the gate/up launch (`out_proj.residual_gemv_deferred` +
`mlp.gate_up_act` given a `DeferredX`) against the same two launches with the reduction in out_proj
(`residual_gemv`, then `gate_up_act` on its output): bitwise the same x and act, since the consumer repeats the
finisher's arithmetic (partials added to zeros in split order, then the residual, one bf16 rounding).

Outputs and the partials buffer are poisoned (NaN) before every run, so an element never written fails; the
residual must come back untouched. CPU: tiny shapes under the interpreter, every plan mode; GPU: Llama-3.2-1B's
out_proj (2048 x 2048, split 8) and SmolLM2-135M's shapes with a split-K plan forced, PDL on. The partial-slot and
split-order tests take the `device` fixture, so they run at their tiny shapes on a GPU runner too.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from lowlat.errors import StepContractError
from lowlat.kernels._gemv import GemvWorkspace, plan_gemv
from lowlat.kernels.mlp import gate_up_act
from lowlat.kernels.out_proj import DeferredX, check_deferred, residual_gemv, residual_gemv_deferred
from lowlat.numerics import check_bitwise, poison
from lowlat.testing import reverse_interpreter_grid

EPS = 1e-5
#: (H, Q, I): out_proj [H, Q], gate/up [2I, H]; even, ragged H, ragged Q
CPU_SHAPES = [(64, 64, 96), (80, 48, 64), (96, 80, 160)]
PLAN_MODES = [dict(preload=True, bn=64), dict(preload=True, bn=16), dict(preload=False, bn=16),
              dict(preload=False, bn=64)]


def make_inputs(m, h, q, i, seed, device):
    g = torch.Generator(device=device).manual_seed(seed)
    kw = dict(generator=g, device=device)
    attn = torch.randn(m, q, **kw)
    wo = torch.randn(h, q, **kw) / q ** 0.5
    x = torch.randn(m, h, **kw)
    wgu = torch.randn(2 * i, h, **kw) / h ** 0.5
    nw = 1.0 + 0.1 * torch.randn(h, **kw)
    return tuple(t.to(torch.bfloat16) for t in (attn, wo, x, wgu, nw))


def both_ways(attn, wo, x, wgu, nw, plan_o, plan_gu, ws, use_pdl=False):
    """(x_new, act) with the reduction in out_proj, then (x_new, act) deferred to gate/up."""
    m, h = x.shape
    i = wgu.shape[0] // 2
    x_ref = residual_gemv(attn, wo, x, out=poison(torch.empty_like(x)), workspace=ws, plan=plan_o, use_pdl=use_pdl)
    act_ref = gate_up_act(x_ref, wgu, norm_weight=nw, eps=EPS, out=poison(torch.empty(m, i, dtype=x.dtype,
                          device=x.device)), workspace=ws, plan=plan_gu, use_pdl=use_pdl)
    x_before = x.clone()
    parts = poison(torch.empty(plan_o.split, m, h, dtype=torch.float32, device=x.device))
    d = residual_gemv_deferred(attn, wo, x, poison(torch.empty_like(x)), partials=parts, workspace=ws, plan=plan_o,
                               use_pdl=use_pdl)
    assert d.partials is parts
    act = gate_up_act(d, wgu, norm_weight=nw, eps=EPS, out=poison(torch.empty(m, i, dtype=x.dtype, device=x.device)),
                      workspace=ws, plan=plan_gu, use_pdl=use_pdl)
    assert torch.equal(x.view(torch.int16), x_before.view(torch.int16)), "the residual was written"
    return (x_ref, act_ref), (d.out, act)


@settings(max_examples=12)
@given(m=st.integers(1, 48), shape=st.sampled_from(CPU_SHAPES), mode_o=st.sampled_from(PLAN_MODES),
       mode_gu=st.sampled_from(PLAN_MODES), split_o=st.sampled_from([2, 3]), split_gu=st.sampled_from([1, 2]),
       seed=st.integers(0, 2 ** 16))
@pytest.mark.slow
@pytest.mark.interpreter
def test_deferred_reduction_bitwise_equals_out_proj_finisher(m, shape, mode_o, mode_gu, split_o, split_gu, seed):
    h, q, i = shape
    attn, wo, x, wgu, nw = make_inputs(m, h, q, i, seed, "cpu")
    plan_o = plan_gemv(h, q, kind="residual", block_k=16, split=split_o, **mode_o)
    plan_gu = plan_gemv(i, h, kind="gate_up", block_k=16, split=split_gu, **mode_gu)
    ws = GemvWorkspace.create(max(h, i), "cpu")
    (x_ref, act_ref), (x_new, act) = both_ways(attn, wo, x, wgu, nw, plan_o, plan_gu, ws)
    check_bitwise("out_proj", x_new, x_ref, output="x")
    check_bitwise("mlp", act, act_ref, output="act")
    assert int(ws.counters.abs().sum()) == 0


@pytest.mark.parametrize("order", ["forward", "reverse"])
@pytest.mark.interpreter
def test_deferred_reduction_padding_rows_never_change_valid_rows(monkeypatch, order):
    """NaN in padding rows' attention and residual stays in those rows. Run with the interpreter's programs in grid
    order and reversed (`reverse_interpreter_grid`): every gate/up program reduces its own K slice before reading it,
    so no order may matter."""
    if order == "reverse":
        reverse_interpreter_grid(monkeypatch)
    m, n, (h, q, i) = 18, 5, CPU_SHAPES[1]
    attn, wo, x, wgu, nw = make_inputs(m, h, q, i, 3, "cpu")
    plan_o = plan_gemv(h, q, kind="residual", block_k=16, split=3, preload=False, bn=16)
    plan_gu = plan_gemv(i, h, kind="gate_up", block_k=16, split=2, preload=True, bn=64)
    ws = GemvWorkspace.create(max(h, i), "cpu")
    (x_ref, act_ref), (x_new, act) = both_ways(attn, wo, x, wgu, nw, plan_o, plan_gu, ws)
    check_bitwise("out_proj", x_new, x_ref, output="x_all_rows")       # every row, the padding rows too
    check_bitwise("mlp", act, act_ref, output="act_all_rows")
    attn2, x2 = attn.clone(), x.clone()
    attn2[n:] = float("nan")
    x2[n:] = float("nan")
    _, (x_new2, act2) = both_ways(attn2, wo, x2, wgu, nw, plan_o, plan_gu, ws)
    check_bitwise("out_proj", x_new2[:n], x_new[:n], output="x_valid_rows")
    check_bitwise("mlp", act2[:n], act[:n], output="act_valid_rows")


def test_each_partial_slot_holds_its_splits_k_slice(device):
    """partials[s] = a[:, ks] W[:, ks]^T over split s's K slice ks = [s * CPS * BK, (s + 1) * CPS * BK): against a
    float64 product, within 2^-20 times sum |a||w| over the slice. The kernel adds at most 80 bf16-exact products in
    fp32: the worst case of their roundings is 80 * 2^-24 (~2^-17.7) of that sum, so this bound is ~5x tighter than
    the worst case and holds because random-sign products' rounding errors grow like sqrt(n), not n (on a GPU the
    tensor cores' fp32 accumulation of 16-product chunks too; not yet run there). Another split's slice would be off
    by a whole partial sum."""
    h, q, i = CPU_SHAPES[1]
    attn, wo, x, _, _ = make_inputs(7, h, q, i, 5, device)
    plan = plan_gemv(h, q, kind="residual", block_k=16, split=3, preload=False, bn=16)
    d = residual_gemv_deferred(attn, wo, x, poison(torch.empty_like(x)),
                               partials=poison(torch.empty(3, 7, h, dtype=torch.float32, device=device)), plan=plan)
    width = plan.chunks_per_split * plan.block_k
    for s_ in range(plan.split):
        ks = slice(s_ * width, min((s_ + 1) * width, q))
        want = attn[:, ks].double() @ wo[:, ks].double().T
        bound = 2.0 ** -20 * (attn[:, ks].double().abs() @ wo[:, ks].double().abs().T)
        got = d.partials[s_].double()
        assert bool(torch.isfinite(got).all()), f"partials[{s_}] not all written"
        assert bool(((got - want).abs() <= bound).all()), f"partials[{s_}] is not split {s_}'s product"


def test_gate_up_reduces_the_partials_in_split_order(device):
    """Partials chosen so that the order of the fp32 sum shows: (1 + 1e8) - 1e8 = 0 in split order, 1 in reverse,
    and the residual r = 1 added last (added first, ((1 + 1) + 1e8) - 1e8 = 0). x = bf16(((p0 + p1) + p2) + r) must
    come out 1 in every element."""
    m, h, i = 2, 64, 96
    _, _, _, wgu, nw = make_inputs(m, h, 64, i, 1, device)
    parts = torch.stack([torch.full((m, h), v, device=device) for v in (1.0, 1e8, -1e8)])
    d = DeferredX(parts, torch.ones(m, h, dtype=torch.bfloat16, device=device),
                  poison(torch.empty(m, h, dtype=torch.bfloat16, device=device)))
    gate_up_act(d, wgu, norm_weight=nw, eps=EPS, plan=plan_gemv(i, h, kind="gate_up", block_k=16, split=2))
    assert bool((d.out == 1).all()), f"x not partials in split order, then r: {d.out.unique().tolist()}"


def _args(m=3):
    h, q, i = CPU_SHAPES[0]
    attn, wo, x, wgu, nw = make_inputs(m, h, q, i, 0, "cpu")
    plan = plan_gemv(h, q, kind="residual", block_k=16, split=2)
    return dict(attn=attn, wo=wo, x=x, wgu=wgu, nw=nw, plan=plan, out=torch.empty_like(x),
                partials=torch.empty(2, m, h, dtype=torch.float32))


@pytest.mark.parametrize("change, match", [
    (lambda a: a.update(plan=plan_gemv(64, 64, kind="residual", block_k=16, split=1)), "split=1"),
    (lambda a: a.update(out=a["x"]), "overlaps deferred residual"),
    (lambda a: a.update(out=a["x"][1:].clone()), r"deferred out has shape"),
    (lambda a: a.update(partials=torch.empty(2, 3, 64, dtype=torch.bfloat16)), "deferred partials must be"),
    (lambda a: a.update(partials=torch.empty(3, 3, 64)), "hold 3 splits; the plan has split=2"),
    (lambda a: a.update(partials=torch.empty(2, 64, 3).transpose(1, 2)), "partials must be contiguous"),
    (lambda a: a.update(wo=a["wo"][:, :32]), r"wo|w has shape|contiguous|plan"),
])
@pytest.mark.interpreter
def test_residual_gemv_deferred_bad_input_raises_typed_error_and_writes_nothing(change, match):
    a = _args()
    change(a)
    out_before = a["out"].clone() if a["out"] is not a["x"] else None
    x_before = a["x"].clone()
    with pytest.raises(StepContractError, match=match):
        residual_gemv_deferred(a["attn"], a["wo"], a["x"], a["out"], partials=a["partials"], plan=a["plan"])
    check_bitwise("out_proj", a["x"], x_before, output="residual")
    if out_before is not None:
        assert torch.equal(a["out"].isnan(), out_before.isnan())


@pytest.mark.interpreter
def test_overlapping_deferred_buffers_are_refused():
    """out sharing bytes with the residual or the partials, also through strided views (rows with gaps), and act
    sharing bytes with the DeferredX: the consuming launch would read what it (or another program) writes."""
    a = _args()
    x, nw, wgu = a["x"], a["nw"], a["wgu"]
    big = torch.empty(4 * 64, dtype=torch.bfloat16)
    res_gapped = big.as_strided((3, 64), (96, 1))          # rows at 0, 96, 192: row 2 ends at 256
    out_inside = big[192:].view(1, 64).expand(3, 64)      # not (3, 64)-shaped storage, but a view over row 2
    parts = torch.empty(2, 3, 64)
    out_in_parts = parts.view(-1).view(torch.bfloat16)[:192].view(3, 64)
    for d, match in [
        (DeferredX(parts, res_gapped, big[192:].clone().view(1, 64).expand(3, 64).contiguous()), None),
        (DeferredX(parts, res_gapped, out_inside), "deferred out overlaps deferred residual"),
        (DeferredX(parts, x, out_in_parts), "deferred out overlaps deferred partials"),
    ]:
        if match is None:
            assert check_deferred(d, 3, 64, torch.device("cpu")) == 2
        else:
            with pytest.raises(StepContractError, match=match):
                check_deferred(d, 3, 64, torch.device("cpu"))
    base = torch.empty(3 * 96, dtype=torch.bfloat16)       # act [3, I = 96] over the DeferredX's out [3, 64]
    with pytest.raises(StepContractError, match="act out overlaps deferred out"):
        gate_up_act(DeferredX(parts, x, base[:192].view(3, 64)), wgu, norm_weight=nw, eps=EPS, out=base.view(3, 96))


@pytest.mark.interpreter
def test_gate_up_act_bad_deferred_raises_typed_error():
    a = _args()
    x, nw, wgu = a["x"], a["nw"], a["wgu"]
    for d, match in [
        (DeferredX(torch.empty(2, 3, 64, dtype=torch.bfloat16), x, torch.empty_like(x)), "deferred partials must be"),
        (DeferredX(torch.empty(1, 3, 64), x, torch.empty_like(x)), r"\[S >= 2, M, N\]"),
        (DeferredX(torch.empty(2, 3, 64), x, x), "overlaps deferred residual"),
        (DeferredX(torch.empty(2, 3, 64), x, torch.empty(3, 64)), "deferred out must be torch.bfloat16"),
        (DeferredX(torch.empty(2, 3, 64), x, torch.empty(2, 64, dtype=torch.bfloat16)), "deferred out has shape"),
        (DeferredX([1, 2], x, torch.empty_like(x)), "deferred partials must be a torch.Tensor"),
        (DeferredX(None, x, torch.empty_like(x)), "deferred partials must be a torch.Tensor"),
    ]:
        with pytest.raises(StepContractError, match=match):
            gate_up_act(d, wgu, norm_weight=nw, eps=EPS)


# ------------------------------------------------------------------------------------------------- GPU
#: (H, Q, I, out_proj plan fields or None for the production plan)
GPU_CASES = {"Llama-3.2-1B": (2048, 2048, 8192, None),
             "SmolLM2-135M-split3": (576, 576, 1536, dict(split=3, block_k=64))}


@pytest.mark.gpu
@pytest.mark.parametrize("case", list(GPU_CASES))
def test_deferred_reduction_gpu_bitwise_equals_out_proj_finisher(device, case):
    h, q, i, fields = GPU_CASES[case]
    plan_o = plan_gemv(h, q, kind="residual", **(fields or {}))
    assert plan_o.split > 1
    plan_gu = plan_gemv(i, h, kind="gate_up")
    ws = GemvWorkspace.create(max(h, i), device)
    attn, wo, x, wgu, nw = make_inputs(48, h, q, i, 31, device)
    for m in (1, 2, 6, 16, 17, 33, 48):
        (x_ref, act_ref), (x_new, act) = both_ways(attn[:m].contiguous(), wo, x[:m].contiguous(), wgu, nw, plan_o,
                                                   plan_gu, ws, use_pdl=True)
        check_bitwise("out_proj", x_new, x_ref, output=f"x_m{m}")
        check_bitwise("mlp", act, act_ref, output=f"act_m{m}")
        if m == 48:
            check_bitwise("out_proj", both_ways(attn, wo, x, wgu, nw, plan_o, plan_gu, ws, use_pdl=True)[1][0], x_new,
                          output="rerun")
    assert int(ws.counters.abs().sum()) == 0
