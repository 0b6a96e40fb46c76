"""Fused MoE kernels (`lowlat.kernels.moe`) against the reference (`lowlat.reference.moe`).

CPU (Triton interpreter, tiny shapes): routing bitmap equality incl. deliberate ties, placement on
forced routings incl. degenerate bitmaps, the full block within the numerics policy, padding rows,
a dense MLP split into experts, NaN weights of inactive experts, typed errors, and a compile of
every kernel for sm_90. The RMSNorm in the router launch (`moe_forward(norm_weight=..., eps=...)`):
the normed rows within the policy of `reference.rms_norm` and every element written, the block bitwise
the unnormed path fed those rows and within the policy of x + moe(rms_norm(x)), in place, typed
refusals, its sm_90 build (no spills, x read only after the PDL wait). GPU (`-m gpu`, Qwen3-30B-A3B
shapes: H 2048, E 128, top-8, Ie 768): the same properties at full size, bitwise run-to-run
determinism, row invariance, CUDA graphs and PDL, with and without the norm.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap

import pytest
import torch
import triton
import triton.language as tl
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lowlat.config import ModelConfig, preset
from lowlat.errors import StepContractError, UnsupportedConfigError
from lowlat.kernels import moe as kmoe
from lowlat.numerics import check_accuracy, check_bitwise, oracle_cast, poison
from lowlat.reference.mlp import swiglu_mlp
from lowlat.reference.moe import moe, moe_experts, route_topk
from lowlat.reference.rms_norm import rms_norm
from lowlat.weights import LayerWeights, random_layer_weights

ON_GPU = torch.cuda.is_available()
#: rows drawn by the property tests: the step contract's 48 on a GPU, fewer under the interpreter
MAX_M = 48 if ON_GPU else 10
# rows past num_valid_rows hold NaN on purpose; numpy (under the interpreter) warns on their max
pytestmark = pytest.mark.filterwarnings("ignore:All-NaN slice encountered:RuntimeWarning")
QUICK = settings(suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


# ----------------------------------------------------------------------------------------- helpers
def tiny_cfg(*, hidden: int, experts: int, top_k: int, inter: int, shared: int = 0,
             renormalize: bool = True) -> ModelConfig:
    """A Qwen3-MoE-shaped config small enough for the interpreter (attention dims unused here)."""
    return ModelConfig(name=f"tiny-moe-h{hidden}-e{experts}", architecture="Qwen3MoeForCausalLM",
                       hidden_size=hidden, num_layers=1, num_heads=2, num_kv_heads=1, head_dim=16,
                       intermediate_size=0, vocab_size=64, num_experts=experts, top_k=top_k,
                       moe_intermediate_size=inter, shared_expert_intermediate_size=shared,
                       norm_topk_prob=renormalize)


def moe_weights(cfg: ModelConfig, seed: int, device) -> LayerWeights:
    return random_layer_weights(cfg, generator=torch.Generator().manual_seed(seed), device=device)


def shared_of(lw: LayerWeights):
    return None if lw.shared_gate is None else (lw.shared_gate, lw.shared_up, lw.shared_down)


def expected_forward(h, x, lw: LayerWeights, top_k: int, renormalize: bool, nv: int):
    """x + moe(h): the reference in the inputs' dtype (bf16 baseline) or float64 (oracle)."""
    return x + moe(h, lw.router, lw.expert_gate, lw.expert_up, lw.expert_down, top_k, renormalize, nv,
                   shared_of(lw))


def expected_forced(h, x, bitmap, gates, lw: LayerWeights, nv: int):
    """x + moe_experts(...) (+ shared expert on valid rows) with the bitmap's padding rows ignored."""
    b = bitmap.clone()
    b[nv:] = False
    y = moe_experts(h, b, gates, lw.expert_gate, lw.expert_up, lw.expert_down)
    if lw.shared_gate is not None:
        s = swiglu_mlp(h, lw.shared_gate, lw.shared_up, lw.shared_down)
        s[nv:] = 0
        y = y + s
    return x + y


def check_valid_rows(out, orc, base, nv: int, output: str) -> None:
    """Policy check of the valid rows (none when nv == 0), padding rows of out == x bitwise elsewhere."""
    if nv > 0:
        check_accuracy("moe", out[:nv], orc[:nv], base[:nv], output=output)


def oracle_weights(lw: LayerWeights) -> LayerWeights:
    return lw.map(lambda t: t.double())


def rand_rows(g: torch.Generator, m: int, n: int, device, scale: float = 1.0) -> torch.Tensor:
    return (scale * torch.randn(m, n, generator=g)).to(device=device, dtype=torch.bfloat16)


def exact_router_inputs(g: torch.Generator, m: int, hidden: int, experts: int, mode: str, device):
    """h [M, H] and router [E, H] whose bf16 logits are computed exactly in any summation order.

    h in {-1/2, 0, 1/2}, router in {-1/4, 0, 1/4} on at most 48 columns: every logit is a multiple
    of 1/8 below 8 in magnitude, so products, partial sums and the bf16 logits are exact and the
    chosen experts depend on nothing but the values. Modes make ties on purpose:
    'random' (ties happen: logits take few values), 'duplicate' (router rows copied),
    'all_equal' (identical router rows: every logit of a row ties), 'one_expert' (one expert wins
    every row).
    """
    cols = min(hidden, 48)
    h = 0.5 * torch.randint(-1, 2, (m, hidden), generator=g).double()
    h[:, 0] = 0.5
    r = torch.zeros(experts, hidden, dtype=torch.float64)
    r[:, :cols] = 0.25 * torch.randint(-1, 2, (experts, cols), generator=g).double()
    if mode == "duplicate":
        src = torch.randint(0, experts, (experts,), generator=g)
        keep = torch.rand(experts, generator=g) < 0.5
        r = torch.where(keep[:, None], r, r[src])
    elif mode == "all_equal":
        r[:] = r[0]
    elif mode == "one_expert":
        win = int(torch.randint(0, experts, (1,), generator=g))
        r[:, 0] = 0.0
        r[win, 0] = 32.0   # its logit >= 16 - 47/8 > 47/8 >= any other logit; all < 22: exact
    if not (r != 0).any():
        r[0, 0] = 0.25
    return h.to(device=device, dtype=torch.bfloat16), r.to(device=device, dtype=torch.bfloat16)


def forced_routing(g: torch.Generator, m: int, experts: int, mode: str, device):
    """bitmap [M, E] bool and gates [M, E] fp32 (0 where not chosen), by mode."""
    if mode == "random":
        bitmap = torch.rand(m, experts, generator=g) < 0.35
    elif mode == "empty":
        bitmap = torch.zeros(m, experts, dtype=torch.bool)
    elif mode == "one_expert":
        bitmap = torch.zeros(m, experts, dtype=torch.bool)
        bitmap[:, int(torch.randint(0, experts, (1,), generator=g))] = True
    elif mode == "all_full":
        bitmap = torch.ones(m, experts, dtype=torch.bool)
    elif mode == "one_row_all":
        bitmap = torch.rand(m, experts, generator=g) < 0.2
        bitmap[int(torch.randint(0, m, (1,), generator=g))] = True
    else:
        raise ValueError(mode)
    gates = torch.where(bitmap, 0.1 + torch.rand(m, experts, generator=g), torch.zeros(()))
    return bitmap.to(device), gates.to(device=device, dtype=torch.float32)


def nan_fill_experts(lw: LayerWeights, experts) -> LayerWeights:
    """A copy of lw whose listed experts' gate/up/down weights are all NaN."""
    out = LayerWeights(**{k: v for k, v in vars(lw).items()})
    out.expert_gate, out.expert_up, out.expert_down = (
        lw.expert_gate.clone(), lw.expert_up.clone(), lw.expert_down.clone())
    for e in experts:
        out.expert_gate[e] = float("nan")
        out.expert_up[e] = float("nan")
        out.expert_down[e] = float("nan")
    return out


def run_forward(h, x, lw, cfg, nv, *, nv_tensor: bool = False, **kw):
    out = poison(torch.empty_like(x))
    nv_arg = torch.tensor([nv], dtype=torch.int32, device=h.device) if nv_tensor else nv
    res = kmoe.moe_forward(h, x, lw, cfg, nv_arg, out=out, **kw)
    assert res is out
    return out


def check_forward(out, h, x, lw, cfg, nv, *, output="out"):
    """Policy check of moe_forward's output, and padding rows == x_residual bitwise."""
    base = expected_forward(h, x, lw, cfg.top_k, cfg.norm_topk_prob, nv)
    orc = expected_forward(oracle_cast(h), oracle_cast(x), oracle_weights(lw), cfg.top_k,
                           cfg.norm_topk_prob, nv)
    check_valid_rows(out, orc, base, nv, output)
    if nv < x.shape[0]:
        check_bitwise("moe", out[nv:], x[nv:], output="padding_rows")


#: block sizes that split the router launch: HS 32 hidden per program in two BK_ROUTER 16 steps (so NSPLIT > 1
#: from H 48 on) and BE 16 experts per program (two expert blocks from E 17 on); the later launches' blocks as
#: wide as the tiny dims (the interpreter's cost is per program)
SPLIT_CONFIG = kmoe.MoEKernelConfig(BE=16, HS=32, BK_ROUTER=16, BR=16, BN=64, BK=128, BNH=128, BKI=64, BH=128)


def norm_weight_of(g: torch.Generator, hidden: int, device) -> torch.Tensor:
    """A random RMSNorm weight [H] bf16, far from all ones (spread 0.5 around 1, a few negative)."""
    return (1.0 + 0.5 * torch.randn(hidden, generator=g)).to(device=device, dtype=torch.bfloat16)


def run_norm_forward(x, residual, lw, cfg, nv, norm_weight, eps, *, nv_tensor: bool = False, **kw):
    """moe_forward(x, residual, ..., norm_weight, eps) into NaN-poisoned out and h_out: (out, hn)."""
    out, hn = poison(torch.empty_like(residual)), poison(torch.empty_like(x))
    nv_arg = torch.tensor([nv], dtype=torch.int32, device=x.device) if nv_tensor else nv
    res = kmoe.moe_forward(x, residual, lw, cfg, nv_arg, norm_weight=norm_weight, eps=eps, h_out=hn, out=out, **kw)
    assert res is out
    return out, hn


def check_norm_forward(out, hn, x, residual, norm_weight, eps, lw, cfg, nv, *, lw64=None):
    """hn (every row, padding ones too) within the policy of rms_norm(x) and every element written (a NaN left
    by the poison fails check_accuracy); out within the policy of residual + moe(rms_norm(x)) on the valid
    rows and == residual bitwise on the padding rows."""
    x64, w64 = oracle_cast(x), oracle_cast(norm_weight)
    h_base, h_orc = rms_norm(x, norm_weight, eps), rms_norm(x64, w64, eps)
    check_accuracy("rms_norm", hn, h_orc, h_base, output="moe_hn")
    base = expected_forward(h_base, residual, lw, cfg.top_k, cfg.norm_topk_prob, nv)
    orc = expected_forward(h_orc, oracle_cast(residual), lw64 if lw64 is not None else oracle_weights(lw),
                           cfg.top_k, cfg.norm_topk_prob, nv)
    check_valid_rows(out, orc, base, nv, "out_norm")
    if nv < x.shape[0]:
        check_bitwise("moe", out[nv:], residual[nv:], output="padding_rows")


# ----------------------------------------------------------------------------------------- routing
@QUICK
@given(m=st.integers(1, MAX_M), data=st.data(), experts=st.sampled_from([4, 8, 12]),
       hidden=st.sampled_from([32, 48]), renormalize=st.booleans(),
       mode=st.sampled_from(["random", "duplicate", "all_equal", "one_expert"]), seed=st.integers(0, 2**16))
def test_route_bitmap_equals_reference_topk_with_ties(device, m, data, experts, hidden, renormalize, mode, seed):
    """Chosen experts == the reference's exactly (lower index first among ties); gates in policy."""
    nv = data.draw(st.integers(0, m), label="num_valid_rows")
    top_k = data.draw(st.integers(1, experts), label="top_k")        # top_k == E: every expert full
    g = torch.Generator().manual_seed(seed)
    h, router = exact_router_inputs(g, m, hidden, experts, mode, device)
    ws = kmoe.MoEWorkspace.allocate(max_rows=m, hidden=hidden, num_experts=experts, slots_per_row=top_k,
                                    moe_inter=16, device=device)
    poison(ws.bitmap)
    poison(ws.gates)
    bitmap, gates = kmoe.route(h, router, top_k, renormalize, nv, workspace=ws)
    ref_bitmap, ref_gates = route_topk(h, router, top_k, renormalize, nv)
    orc_bitmap, orc_gates = route_topk(oracle_cast(h), oracle_cast(router), top_k, renormalize, nv)
    assert torch.equal(ref_bitmap, orc_bitmap)      # exact inputs: bf16 and float64 agree
    check_bitwise("moe", ws.bitmap[:m], ref_bitmap.to(torch.uint8), output="bitmap")
    assert torch.equal(bitmap, ref_bitmap)
    check_accuracy("moe", gates, orc_gates, ref_gates, output="gates")
    assert (gates[nv:] == 0).all() and not bitmap[nv:].any()


@triton.jit
def _route_keys_kernel(x_ptr, id_ptr, key_ptr, N: tl.constexpr):
    i = tl.arange(0, N)
    tl.store(key_ptr + i, kmoe._route_key32(tl.load(x_ptr + i), tl.load(id_ptr + i)))


def test_route_keys_order_every_bf16_value_then_the_lower_expert(device):
    """`_route_key32` over every non-NaN bf16 value (the route's logits are bf16-exact): keys ascend strictly with
    the value, -0.0 and +0.0 alike; among equal values the lower expert index has the larger key; every key lies
    above `_NO_KEY32` (-inf with the largest index included), so a picked expert never wins again."""
    n = 1 << 16
    x = torch.arange(n, dtype=torch.int32).to(torch.int16).view(torch.bfloat16).float()
    x = x[~x.isnan()]
    x = x[torch.argsort(x, stable=True)]                   # ascending; -0.0 and +0.0 in the middle
    keys = {}
    ids_checked = (0, 1, 32767, 32768, 65535)         # 32767 / 32768: the id field's top bit flips between them
    for e in ids_checked:
        ids = torch.full((x.numel(),), e, dtype=torch.int32)
        xs = torch.cat([x, x.new_zeros(n - x.numel())])     # padded to a power of two (zeros at the end)
        out = torch.empty(n, dtype=torch.int32, device=device)
        _route_keys_kernel[(1,)](xs.to(device), torch.cat([ids, ids.new_zeros(n - ids.numel())]).to(device), out,
                                 N=n)
        keys[e] = out[:x.numel()].cpu().long()
    k = keys[0]
    same = x[1:] == x[:-1]                                  # only -0.0 == +0.0
    assert int(same.sum()) == 1
    assert bool((k[1:][same] == k[:-1][same]).all()), "-0.0 and +0.0 must tie"
    assert bool((k[1:][~same] > k[:-1][~same]).all()), "keys must ascend with the value"
    for lo, hi in zip(ids_checked, ids_checked[1:]):
        assert bool((keys[lo] > keys[hi]).all()), f"expert {lo} must come before expert {hi} at equal values"
    assert int(keys[65535].min()) > -(2 ** 31), "a real key at or below _NO_KEY32"
    assert bool((keys[65535][1:][~same] > keys[0][:-1][~same]).all()), "the value above every index"


@pytest.mark.parametrize("m", [20, 40])
def test_route_with_split_hidden_and_a_smaller_plan_tile(device, m):
    """Router logits in NSPLIT = 3 hidden slices, M = 20 / 40 rows (plan row tile 32 / 64, the partial
    buffer's row stride 64): the bitmap equals the reference's, gates within the policy."""
    hidden, experts, top_k = 48, 8, 2
    g = torch.Generator().manual_seed(m)
    h, router = exact_router_inputs(g, m, hidden, experts, "random", device)
    c = kmoe.MoEKernelConfig(BE=16, HS=16, BK_ROUTER=16, BR=16, BN=16, BK=16, BNH=16, BKI=16, BH=16)
    ws = kmoe.MoEWorkspace.allocate(max_rows=m, hidden=hidden, num_experts=experts, slots_per_row=top_k,
                                    moe_inter=16, device=device, config=c)
    poison(ws.bitmap)
    poison(ws.gates)
    bitmap, gates = kmoe.route(h, router, top_k, True, m, workspace=ws, config=c)
    ref_bitmap, ref_gates = route_topk(h, router, top_k, True, m)
    orc_bitmap, orc_gates = route_topk(oracle_cast(h), oracle_cast(router), top_k, True, m)
    assert torch.equal(ref_bitmap, orc_bitmap)
    assert torch.equal(bitmap, ref_bitmap)
    check_accuracy("moe", gates, orc_gates, ref_gates, output="gates")


@pytest.mark.parametrize("m", [20, 40, 64])
def test_plan_of_several_programs_exact_and_plan_sync_left_zero(device, m):
    """M > PLAN_CHUNK rows take several route / plan programs: each ORs its rows' experts into plan_sync, the last
    to arrive writes the plan and zeroes plan_sync. Launches on one workspace, the active experts shrinking (every
    row valid, then 3; 16 times over on a GPU, where the programs race; then widths of 1, 2 and 4 programs on the same
    workspace; then forced routing with one expert on the last row, then on none): each plan exactly the
    reference's active experts in increasing order (a stale OR, or a chunk's experts lost, would show), and
    plan_sync all zero after each launch. A count left non-zero (a launch that did not complete) gives a wrong plan
    until `reset_plan_sync()`. (The interpreter runs the programs in order, so there the last to arrive is always the
    last program: which one arrives last is exercised on the GPU only.)"""
    hidden, experts, top_k = 32, 16, 2
    g = torch.Generator().manual_seed(m)
    cfg = tiny_cfg(hidden=hidden, experts=experts, top_k=1, inter=16)
    ws = kmoe.MoEWorkspace.allocate(max_rows=m, hidden=hidden, num_experts=experts, slots_per_row=top_k,
                                    moe_inter=16, device=device)
    assert m > kmoe.PLAN_CHUNK.value and not ws.plan_sync.any()

    def check_plan(bitmap, nv, what):
        want = [e for e in range(experts) if bitmap[:nv, e].any()]
        plan = ws.plan.cpu()
        assert plan[0] == len(want) and plan[1:1 + len(want)].tolist() == want, (what, plan.tolist(), want)
        assert not ws.plan_sync.any(), (what, ws.plan_sync.tolist())

    for nv in (m, 3) * (16 if ON_GPU else 1):
        h, router = exact_router_inputs(g, m, hidden, experts, "random", device)
        poison(ws.plan)
        bitmap, _ = kmoe.route(h, router, top_k, True, nv, workspace=ws)
        ref_bitmap, _ = route_topk(h, router, top_k, True, nv)
        assert torch.equal(bitmap, ref_bitmap)
        check_plan(ref_bitmap, nv, f"route nv={nv}")
    for rows in (m, 16, 64, 20, 33):           # one workspace across widths, as FusedModel's: 1, 2 or 4 programs
        if rows > m:
            continue
        h, router = exact_router_inputs(g, rows, hidden, experts, "random", device)
        poison(ws.plan)
        kmoe.route(h, router, top_k, True, rows - 1, workspace=ws)
        ref_bitmap, _ = route_topk(h, router, top_k, True, rows - 1)
        check_plan(ref_bitmap, rows - 1, f"route rows={rows}")
    lw = moe_weights(cfg, m, device)
    h, x = rand_rows(g, m, hidden, device), rand_rows(g, m, hidden, device)
    for expert in (11, None):
        bitmap = torch.zeros(m, experts, dtype=torch.bool, device=device)
        if expert is not None:
            bitmap[m - 1, expert] = True
        poison(ws.plan)
        kmoe.moe_experts_forced(h, x, bitmap, bitmap.float(), lw, m, workspace=ws)
        check_plan(bitmap, m, f"forced expert={expert}")
    # a launch that did not complete leaves the count non-zero: an early arrival then writes the plan without the
    # last program's expert; reset_plan_sync() recovers
    bitmap = torch.zeros(m, experts, dtype=torch.bool, device=device)
    bitmap[m - 1, 11] = True
    ws.plan_sync[0] = 1
    kmoe.moe_experts_forced(h, x, bitmap, bitmap.float(), lw, m, workspace=ws)
    assert ws.plan_sync[0] == 1         # left corrupt, on a GPU too (each launch takes back only its own
    assert ws.plan_sync.any()           # arrivals); in the interpreter's order (on a GPU it races) the plan is
    last_first_row = (kmoe._plan_programs(m) - 1) * kmoe.PLAN_CHUNK.value    # wrong where the last program holds
    assert ON_GPU or m <= last_first_row or ws.plan[0] == 0                      # row m - 1
    ws.reset_plan_sync()
    kmoe.moe_experts_forced(h, x, bitmap, bitmap.float(), lw, m, workspace=ws)
    check_plan(bitmap, m, "forced after reset_plan_sync")


@pytest.mark.parametrize("m", [3, 20])
def test_device_num_valid_rows_outside_0_to_m_taken_as_its_bound(device, m):
    """A device-tensor num_valid_rows is not checked (no host sync): the kernels take min(value, M), and a negative
    value means no valid row. Rows past M hold other data here (h and x are the first M rows of 64; the workspace's
    64 bitmap rows were all routed by an earlier launch), so with the value M + 5 or 2^31 - 1 the output, bitmap,
    gates and plan must be bitwise those of the int M, and with -1 those of 0. No valid row can choose expert 0 (its
    router row makes its logit the lowest): unclamped, the rows past M in a program's chunk (logits masked to 0:
    every expert ties) would choose experts 0 and 1 and put expert 0 in the plan."""
    hidden, experts, top_k = 32, 8, 2
    cfg = tiny_cfg(hidden=hidden, experts=experts, top_k=top_k, inter=16, shared=16)
    g = torch.Generator().manual_seed(m)
    lw = moe_weights(cfg, m, device)
    rows = kmoe.MAX_KERNEL_ROWS
    h_all, lw.router = exact_router_inputs(g, rows, hidden, experts, "random", device)
    lw.router[0, 0] = -32.0                    # h[:, 0] = 1/2: expert 0's logit <= -16 + 47/8 < every other one
    x_all = rand_rows(g, rows, hidden, device)
    h, x = h_all[:m], x_all[:m]
    ws = kmoe.MoEWorkspace.allocate(max_rows=rows, hidden=hidden, num_experts=experts, slots_per_row=top_k,
                                    moe_inter=16, shared_inter=16, device=device)

    def run(nv):
        kmoe.moe_forward(h_all, x_all, lw, cfg, rows, workspace=ws)      # every bitmap row routed, then M rows
        poison(ws.plan)
        out = run_forward(h, x, lw, cfg, nv, workspace=ws)
        return out, ws.bitmap[:m].clone(), ws.gates[:m].clone(), ws.plan[:1 + int(ws.plan[0])].clone()

    for value, bound in ((m + 5, m), (2 ** 31 - 1, m), (-1, 0)):
        want = run(bound)
        assert bound == 0 or int(want[3][0]) > 0 and 0 not in want[3][1:].tolist()
        got = run(torch.tensor([value], dtype=torch.int32, device=device))
        for name, a, b in zip(("out", "bitmap", "gates", "plan"), got, want):
            assert torch.equal(a, b), (value, name, a.tolist(), b.tolist())


@QUICK
@given(m=st.integers(1, MAX_M), data=st.data(), experts=st.sampled_from([4, 8, 16]),
       hidden=st.sampled_from([32, 96]), renormalize=st.booleans(), seed=st.integers(0, 2**16))
def test_route_gates_within_policy_on_random_inputs(device, m, data, experts, hidden, renormalize, seed):
    """Random logits: K experts per valid row, none on padding rows, gates within the policy."""
    nv = data.draw(st.integers(0, m), label="num_valid_rows")
    top_k = data.draw(st.integers(1, experts), label="top_k")
    g = torch.Generator().manual_seed(seed)
    h = rand_rows(g, m, hidden, device)
    h[nv:] = float("nan")                       # padding rows never enter routing
    router = rand_rows(g, experts, hidden, device, scale=hidden ** -0.5)
    bitmap, gates = kmoe.route(h, router, top_k, renormalize, nv)
    assert (bitmap[:nv].sum(1) == top_k).all() and not bitmap[nv:].any()
    ref_bitmap, ref_gates = route_topk(h, router, top_k, renormalize, nv)
    _, orc_gates = route_topk(oracle_cast(h), oracle_cast(router), top_k, renormalize, nv)
    check_accuracy("moe", gates, orc_gates, ref_gates, output="gates")


# ----------------------------------------------------------------------------------------- placement
@QUICK
@given(m=st.integers(1, MAX_M), data=st.data(), experts=st.sampled_from([3, 8]),
       shape=st.sampled_from([(32, 16), (96, 48)]), shared=st.sampled_from([0, 24]),
       mode=st.sampled_from(["random", "empty", "one_expert", "all_full", "one_row_all"]),
       seed=st.integers(0, 2**16))
def test_forced_routing_placement_matches_reference(device, m, data, experts, shape, shared, mode, seed):
    """Given bitmap + gates (degenerate ones included), the expert stages equal moe_experts."""
    nv = data.draw(st.integers(0, m), label="num_valid_rows")
    hidden, inter = shape
    cfg = tiny_cfg(hidden=hidden, experts=experts, top_k=1, inter=inter, shared=shared)
    g = torch.Generator().manual_seed(seed)
    lw = moe_weights(cfg, seed, device)
    h, x = rand_rows(g, m, hidden, device), rand_rows(g, m, hidden, device)
    bitmap, gates = forced_routing(g, m, experts, mode, device)
    out = poison(torch.empty_like(x))
    kmoe.moe_experts_forced(h, x, bitmap, gates, lw, nv, out=out)
    base = expected_forced(h, x, bitmap, gates, lw, nv)
    orc = expected_forced(oracle_cast(h), oracle_cast(x), bitmap, oracle_cast(gates), oracle_weights(lw), nv)
    check_valid_rows(out, orc, base, nv, "forced")
    if nv < m:
        check_bitwise("moe", out[nv:], x[nv:], output="padding_rows")


@pytest.mark.parametrize("rows", [17, 40, 64])
def test_expert_with_more_rows_than_a_tile(device, rows):
    """All rows on one expert: 17, 40 and 64 rows take 2, 3 and 4 row tiles of 16."""
    cfg = tiny_cfg(hidden=32, experts=4, top_k=1, inter=16)
    g = torch.Generator().manual_seed(rows)
    lw = moe_weights(cfg, rows, device)
    h, x = rand_rows(g, rows, 32, device), rand_rows(g, rows, 32, device)
    bitmap, gates = forced_routing(g, rows, 4, "one_expert", device)
    out = kmoe.moe_experts_forced(h, x, bitmap, gates, lw, rows, out=poison(torch.empty_like(x)))
    base = expected_forced(h, x, bitmap, gates, lw, rows)
    orc = expected_forced(oracle_cast(h), oracle_cast(x), bitmap, oracle_cast(gates), oracle_weights(lw), rows)
    check_accuracy("moe", out, orc, base, output="forced")


# ----------------------------------------------------------------------------------------- full block
@QUICK
@given(m=st.integers(1, MAX_M), data=st.data(), experts=st.sampled_from([4, 8]),
       shape=st.sampled_from([(32, 16), (96, 48)]), shared=st.sampled_from([0, 24]),
       renormalize=st.booleans(), nv_tensor=st.booleans(), seed=st.integers(0, 2**16))
def test_moe_forward_within_policy(device, m, data, experts, shape, shared, renormalize, nv_tensor, seed):
    """x + moe(h) within 2x the bf16 reference's error; NaN padding rows change nothing."""
    nv = data.draw(st.integers(0, m), label="num_valid_rows")
    top_k = data.draw(st.integers(1, min(experts, 3)), label="top_k")
    hidden, inter = shape
    cfg = tiny_cfg(hidden=hidden, experts=experts, top_k=top_k, inter=inter, shared=shared,
                   renormalize=renormalize)
    g = torch.Generator().manual_seed(seed)
    lw = moe_weights(cfg, seed, device)
    h, x = rand_rows(g, m, hidden, device), rand_rows(g, m, hidden, device)
    h[nv:] = float("nan")
    out = run_forward(h, x, lw, cfg, nv, nv_tensor=nv_tensor)
    check_forward(out, h, x, lw, cfg, nv)


def test_moe_forward_in_place_residual(device):
    """out may be x_residual itself (in-place residual add)."""
    cfg = tiny_cfg(hidden=32, experts=4, top_k=2, inter=16)
    g = torch.Generator().manual_seed(3)
    lw = moe_weights(cfg, 3, device)
    h, x = rand_rows(g, 5, 32, device), rand_rows(g, 5, 32, device)
    expect = kmoe.moe_forward(h, x, lw, cfg, 4)
    x2 = x.clone()
    kmoe.moe_forward(h, x2, lw, cfg, 4, out=x2)
    check_bitwise("moe", x2, expect, output="in_place")


@pytest.mark.parametrize("experts,rows", [(2, 3), (4, 7)])
def test_split_dense_mlp_equals_dense_swiglu(device, experts, rows):
    """A dense MLP split along I into E experts, all active with unit gates, is the dense MLP."""
    hidden, inter = 64, 96
    g = torch.Generator().manual_seed(experts)
    w_gate = rand_rows(g, inter, hidden, device, hidden ** -0.5)
    w_up = rand_rows(g, inter, hidden, device, hidden ** -0.5)
    w_down = rand_rows(g, hidden, inter, device, inter ** -0.5)
    ie = inter // experts
    cfg = tiny_cfg(hidden=hidden, experts=experts, top_k=experts, inter=ie)
    lw = moe_weights(cfg, 0, device)
    lw.expert_gate = w_gate.view(experts, ie, hidden).contiguous()
    lw.expert_up = w_up.view(experts, ie, hidden).contiguous()
    lw.expert_down = w_down.view(hidden, experts, ie).permute(1, 0, 2).contiguous()
    h, x = rand_rows(g, rows, hidden, device), rand_rows(g, rows, hidden, device)
    bitmap = torch.ones(rows, experts, dtype=torch.bool, device=device)
    gates = torch.ones(rows, experts, dtype=torch.float32, device=device)
    out = kmoe.moe_experts_forced(h, x, bitmap, gates, lw, rows, out=poison(torch.empty_like(x)))
    orc = oracle_cast(x) + swiglu_mlp(*oracle_cast((h, w_gate, w_up, w_down)))
    base = x + swiglu_mlp(h, w_gate, w_up, w_down)
    check_accuracy("moe", out, orc, base, output="split_dense")


def test_inactive_expert_weights_never_read_forced(device):
    """NaN weights on experts no valid row uses: output finite, bitwise the same as without NaN."""
    cfg = tiny_cfg(hidden=32, experts=8, top_k=2, inter=16)
    g = torch.Generator().manual_seed(11)
    lw = moe_weights(cfg, 11, device)
    m, nv = 6, 4
    h, x = rand_rows(g, m, 32, device), rand_rows(g, m, 32, device)
    bitmap, gates = forced_routing(g, m, 8, "random", device)
    bitmap[:, [1, 5]] = False
    bitmap[nv:, 6] = True                      # only padding rows name expert 6: never runs
    bitmap[:nv, 6] = False
    gates = torch.where(bitmap, gates, torch.zeros_like(gates))
    clean = kmoe.moe_experts_forced(h, x, bitmap, gates, lw, nv)
    dirty = kmoe.moe_experts_forced(h, x, bitmap, gates, nan_fill_experts(lw, [1, 5, 6]), nv)
    check_bitwise("moe", dirty, clean, output="inactive_nan")


@QUICK
@given(m=st.integers(1, MAX_M), seed=st.integers(0, 2**16))
def test_inactive_expert_weights_never_read_routed(device, m, seed):
    """Through the router: experts no row chose have NaN weights; output bitwise unchanged."""
    experts, hidden = 8, 32
    cfg = tiny_cfg(hidden=hidden, experts=experts, top_k=2, inter=16)
    g = torch.Generator().manual_seed(seed)
    lw = moe_weights(cfg, seed, device)
    h, lw.router = exact_router_inputs(g, m, hidden, experts, "random", device)
    x = rand_rows(g, m, hidden, device)
    ref_bitmap, _ = route_topk(h, lw.router, 2, True, m)
    unused = [e for e in range(experts) if not ref_bitmap[:, e].any()]
    clean = run_forward(h, x, lw, cfg, m)
    dirty = run_forward(h, x, nan_fill_experts(lw, unused), cfg, m)
    check_bitwise("moe", dirty, clean, output="inactive_nan")


# ----------------------------------------------------------------------------------------- RMSNorm in the router
@QUICK
@given(m=st.integers(1, MAX_M), data=st.data(), experts=st.sampled_from([4, 8, 20]),
       shape=st.sampled_from([(32, 16), (80, 48), (96, 48)]), shared=st.sampled_from([0, 24]),
       renormalize=st.booleans(), nv_tensor=st.booleans(), split=st.booleans(),
       residual=st.sampled_from(["x", "other"]), scale=st.sampled_from([0.05, 1.0, 4.0]),
       eps=st.sampled_from([1e-6, 1e-5, 1e-2]), seed=st.integers(0, 2**16))
def test_moe_forward_norm_in_router_launch(device, m, data, experts, shape, shared, renormalize, nv_tensor, split,
                                           residual, scale, eps, seed):
    """moe_forward(x, r, norm_weight=g, eps=eps, h_out=hn): (a) hn within the policy of rms_norm(x, g, eps), every
    element of its M rows written (padding rows too); (b) out bitwise == moe_forward(hn, r) (the unnormed path
    fed the rows it wrote); (c) out within the policy of r + moe(rms_norm(x)), padding rows == r bitwise.
    split: the router launch in several hidden slices (NSPLIT 1..3, two BK steps each) and, at 20 experts,
    two expert blocks (only block 0 stores hn); H 80 is ragged (masked columns)."""
    nv = data.draw(st.integers(0, m), label="num_valid_rows")
    top_k = data.draw(st.integers(1, min(experts, 3)), label="top_k")
    hidden, inter = shape
    cfg = tiny_cfg(hidden=hidden, experts=experts, top_k=top_k, inter=inter, shared=shared,
                   renormalize=renormalize)
    g = torch.Generator().manual_seed(seed)
    lw = moe_weights(cfg, seed, device)
    x = rand_rows(g, m, hidden, device, scale)
    r = x if residual == "x" else rand_rows(g, m, hidden, device)
    norm_weight = norm_weight_of(g, hidden, device)
    config = SPLIT_CONFIG if split else None
    x_before, r_before = x.clone(), r.clone()
    out, hn = run_norm_forward(x, r, lw, cfg, nv, norm_weight, eps, nv_tensor=nv_tensor, config=config)
    assert torch.equal(x, x_before) and torch.equal(r, r_before), "an input was written"
    check_norm_forward(out, hn, x, r, norm_weight, eps, lw, cfg, nv)
    plain = run_forward(hn.clone(), r, lw, cfg, nv, nv_tensor=nv_tensor, config=config)
    check_bitwise("moe", out, plain, output="norm_vs_unnormed_path")


@pytest.mark.parametrize("hidden,scale,eps", [(80, 0.05, 1e-2), (96, 4.0, 1e-6)])
def test_moe_forward_norm_split_router_most_rows(device, hidden, scale, eps):
    """The property test's claims (a)-(c) at MAX_M rows with padding, the router launch split in NSPLIT 3 hidden
    slices x 2 expert blocks (20 experts), H ragged (80) or not (96), eps dominating mean(x^2) or negligible."""
    cfg = tiny_cfg(hidden=hidden, experts=20, top_k=3, inter=48, shared=24)
    m, nv = MAX_M, MAX_M - 3
    g = torch.Generator().manual_seed(hidden)
    lw = moe_weights(cfg, hidden, device)
    x = rand_rows(g, m, hidden, device, scale)
    norm_weight = norm_weight_of(g, hidden, device)
    out, hn = run_norm_forward(x, x, lw, cfg, nv, norm_weight, eps, config=SPLIT_CONFIG)
    check_norm_forward(out, hn, x, x, norm_weight, eps, lw, cfg, nv)
    plain = run_forward(hn.clone(), x, lw, cfg, nv, config=SPLIT_CONFIG)
    check_bitwise("moe", out, plain, output="norm_vs_unnormed_path")


@pytest.mark.parametrize("split", [False, True])
@pytest.mark.parametrize("eps", [1e-6, 0.5])
def test_norm_rows_bitwise_the_reference_on_exact_sums(device, split, eps):
    """x in multiples of 1/8 in [-2, 2] (never 0): every partial sum of a row's squares is a multiple of 2^-6
    below 4H, exact in fp32 in any order, so the statistic is torch's and hn must be the CPU reference's
    rms_norm(x, g, eps) bit for bit — both roundings, in its order (the policy check alone would pass one
    rounding dropped)."""
    m, hidden = 9, 96
    cfg = tiny_cfg(hidden=hidden, experts=20, top_k=2, inter=16)
    g = torch.Generator().manual_seed(23)
    lw = moe_weights(cfg, 23, device)
    sign = 1 - 2 * torch.randint(0, 2, (m, hidden), generator=g)
    x = (torch.randint(1, 17, (m, hidden), generator=g) * sign * 0.125).to(device=device, dtype=torch.bfloat16)
    norm_weight = norm_weight_of(g, hidden, device)
    _, hn = run_norm_forward(x, x, lw, cfg, 6, norm_weight, eps, config=SPLIT_CONFIG if split else None)
    check_bitwise("rms_norm", hn.cpu(), rms_norm(x.cpu(), norm_weight.cpu(), eps), output="moe_hn_exact")


def eighths(g: torch.Generator, m: int, hidden: int, device) -> torch.Tensor:
    """[M, H] bf16 in multiples of 1/8 in [-2, 2], never 0: sums of their squares are exact in fp32 in any order."""
    sign = 1 - 2 * torch.randint(0, 2, (m, hidden), generator=g)
    return (torch.randint(1, 17, (m, hidden), generator=g) * sign * 0.125).to(device=device, dtype=torch.bfloat16)


def sum_sq_parts_of(y: torch.Tensor, parts: int) -> torch.Tensor:
    """[M, P] fp32: the sums of y's squares over P contiguous, uneven column ranges (torch.tensor_split)."""
    cols = torch.tensor_split(torch.arange(y.shape[1], device=y.device), parts)
    return torch.stack([(y.double()[:, c] ** 2).sum(-1) for c in cols], 1).float()


@pytest.mark.parametrize("split", [False, True])
@pytest.mark.parametrize("parts", [1, 5, 6])
def test_norm_statistic_from_sum_sq_parts(device, split, parts):
    """moe_forward(..., sum_sq_parts=ss): the router takes rstd from the sum of the given parts, not from x. With x and
    the parts' source y both multiples of 1/8 (every sum exact in any order), hn is bitwise
    g * bf16(x * rsqrt(mean(y^2) + eps)) — the reference's formula with y's statistic, so a kernel that recomputed x's
    own statistic fails — for 1, 5 (not a power of two: masked) and 6 parts of uneven column ranges, in a view whose
    rows are P + 3 apart (NaN in the gaps), padding rows included; out bitwise the unnormed path fed hn; with the
    parts of x itself, hn and out bitwise the path that computes the statistic from x."""
    m, hidden, nv, eps = 9, 96, 6, 1e-5
    cfg = tiny_cfg(hidden=hidden, experts=20, top_k=2, inter=16)
    g = torch.Generator().manual_seed(29 + parts)
    lw = moe_weights(cfg, 29, device)
    x, y = eighths(g, m, hidden, device), eighths(g, m, hidden, device)
    norm_weight = norm_weight_of(g, hidden, device)
    config = SPLIT_CONFIG if split else None
    ss = torch.full((m, parts + 3), float("nan"), device=device)[:, :parts]     # rows with gaps (stride P + 3)
    ss.copy_(sum_sq_parts_of(y, parts))
    ss_before = ss.clone()
    out, hn = run_norm_forward(x, x, lw, cfg, nv, norm_weight, eps, config=config, sum_sq_parts=ss)
    assert torch.equal(ss, ss_before), "sum_sq_parts was written"
    xf, yf = x.cpu().float(), y.cpu().float()
    want = norm_weight.cpu() * (xf * torch.rsqrt(yf.pow(2).mean(-1, keepdim=True) + eps)).to(torch.bfloat16)
    check_bitwise("rms_norm", hn.cpu(), want, output="moe_hn_from_parts")
    check_bitwise("moe", out, run_forward(hn.clone(), x, lw, cfg, nv, config=config), output="parts_vs_unnormed_path")
    own, hn_own = run_norm_forward(x, x, lw, cfg, nv, norm_weight, eps, config=config,
                                   sum_sq_parts=sum_sq_parts_of(x, parts))
    out_x, hn_x = run_norm_forward(x, x, lw, cfg, nv, norm_weight, eps, config=config)
    check_bitwise("rms_norm", hn_own, hn_x, output="moe_hn_parts_of_x")
    check_bitwise("moe", own, out_x, output="parts_of_x")


@pytest.mark.parametrize("h_out_given", [False, True])
@pytest.mark.parametrize("nv_tensor,shared", [(False, 0), (True, 24)])
def test_moe_forward_norm_in_place(device, h_out_given, nv_tensor, shared):
    """out = x_residual = h, one tensor (FusedModel's in-place residual add): the same out and hn as with separate
    buffers, hn in h_out or (none given) in workspace.h."""
    cfg = tiny_cfg(hidden=96, experts=20, top_k=3, inter=48, shared=shared)
    m, nv, eps = 7, 5, 1e-5
    g = torch.Generator().manual_seed(31)
    lw = moe_weights(cfg, 31, device)
    x = rand_rows(g, m, 96, device, 2.0)
    norm_weight = norm_weight_of(g, 96, device)
    out, hn = run_norm_forward(x, x, lw, cfg, nv, norm_weight, eps, config=SPLIT_CONFIG)
    ws = kmoe.MoEWorkspace.allocate(max_rows=8, hidden=96, num_experts=20, slots_per_row=3, moe_inter=48,
                                    shared_inter=shared, device=device, config=SPLIT_CONFIG)
    poison(ws.h)
    h_out = poison(torch.empty_like(x)) if h_out_given else None
    xs = x.clone()
    nv_arg = torch.tensor([nv], dtype=torch.int32, device=device) if nv_tensor else nv
    res = kmoe.moe_forward(xs, xs, lw, cfg, nv_arg, norm_weight=norm_weight, eps=eps, h_out=h_out, out=xs,
                           workspace=ws, config=SPLIT_CONFIG)
    assert res is xs
    check_bitwise("moe", xs, out, output="norm_in_place")
    check_bitwise("moe", h_out if h_out_given else ws.h[:m], hn, output="norm_in_place_hn")
    if h_out_given:
        assert ws.h.isnan().all(), "workspace.h written although h_out was given"
    else:
        assert ws.h[m:].isnan().all(), "workspace.h written past row M"


# ----------------------------------------------------------------------------------------- errors
def _error_cases(device):
    cfg = tiny_cfg(hidden=32, experts=4, top_k=2, inter=16)
    lw = moe_weights(cfg, 0, device)
    g = torch.Generator().manual_seed(0)
    h, x = rand_rows(g, 3, 32, device), rand_rows(g, 3, 32, device)

    def with_(**kw):
        return LayerWeights(**{**vars(lw), **kw})

    small_ws = kmoe.MoEWorkspace.allocate(max_rows=2, hidden=32, num_experts=4, slots_per_row=2, moe_inter=16,
                                          device=device)
    return cfg, lw, h, x, [
        ("h float32", dict(h=h.float()), StepContractError, "h must be torch.bfloat16"),
        ("h 1-D", dict(h=h[0]), StepContractError, "h must be an \\[M, H\\] tensor, got shape \\(32,\\)"),
        ("h numpy", dict(h=h.float().cpu().numpy()), StepContractError, "h must be a torch.Tensor.*numpy.ndarray"),
        ("residual shape", dict(x_residual=x[:2]), StepContractError, "x_residual must have shape"),
        ("too many rows", dict(h=h.repeat(22, 1)[:65], x_residual=x.repeat(22, 1)[:65]), StepContractError,
         "M=65 rows"),
        ("num_valid_rows > M", dict(num_valid_rows=4), StepContractError, "num_valid_rows=4"),
        ("num_valid_rows < 0", dict(num_valid_rows=-1), StepContractError, "num_valid_rows=-1"),
        ("num_valid_rows int64 tensor", dict(num_valid_rows=torch.tensor([2], device=device)),
         StepContractError, "one int32 element"),
        ("router width", dict(lw=with_(router=lw.router[:, :16].contiguous())), StepContractError,
         "router must have shape"),
        ("down shape", dict(lw=with_(expert_down=lw.expert_down[:, :, :8].contiguous())), StepContractError,
         "expert_down must have shape"),
        ("gate dtype", dict(lw=with_(expert_gate=lw.expert_gate.float())), StepContractError,
         "expert_gate must be torch.bfloat16"),
        ("config experts", dict(cfg=cfg.replace(num_experts=8, top_k=2)), UnsupportedConfigError,
         "num_experts=8: the weights have E=4"),
        # a defined fp32 buffer: uninitialised memory may hold NaN, which torch.equal never matches
        ("out dtype", dict(out=torch.full((3, 32), 7.0, device=device)), StepContractError,
         "out must be torch.bfloat16"),
        ("small workspace", dict(workspace=small_ws), StepContractError, "max_rows=2 < M=3"),
    ]


def test_bad_inputs_raise_typed_errors_and_write_nothing(device):
    cfg, lw, h, x, cases = _error_cases(device)
    for name, change, err, msg in cases:
        out = torch.full_like(x, 7.0)
        args = dict(h=h, x_residual=x, lw=lw, cfg=cfg, num_valid_rows=3, out=out)
        args.update(change)
        sentinel = args["out"].clone()
        with pytest.raises(err, match=msg):
            kmoe.moe_forward(**args)
        assert torch.equal(args["out"], sentinel), f"{name}: out was written before the error"


def test_route_bad_top_k_and_forced_bad_bitmap(device):
    cfg, lw, h, x, _ = _error_cases(device)
    for k in (0, 5):
        with pytest.raises(UnsupportedConfigError, match=f"top_k={k}"):
            kmoe.route(h, lw.router, k, True, 3)
    for field, ws in (("num_experts=8 but the router has 4", dict(num_experts=8, hidden=32, max_rows=3)),
                      ("hidden=64 but the router has 32", dict(num_experts=4, hidden=64, max_rows=3)),
                      ("max_rows=2 < M=3", dict(num_experts=4, hidden=32, max_rows=2))):
        other = kmoe.MoEWorkspace.allocate(**ws, slots_per_row=2, moe_inter=16, device=device)
        with pytest.raises(StepContractError, match=f"workspace.{field}"):
            kmoe.route(h, lw.router, 2, True, 3, workspace=other)
    bad = torch.full((3, 4), 2, dtype=torch.uint8, device=device)
    with pytest.raises(StepContractError, match="0 or 1"):
        kmoe.moe_experts_forced(h, x, bad, torch.zeros(3, 4, device=device), lw, 3)
    with pytest.raises(StepContractError, match="gates must be torch.float32"):
        kmoe.moe_experts_forced(h, x, bad.bool(), torch.zeros(3, 4, device=device, dtype=torch.bfloat16), lw, 3)


def test_norm_bad_inputs_raise_typed_errors_and_write_nothing(device):
    """norm_weight / eps / h_out / sum_sq_parts refused (StepContractError naming the value) before any write: out,
    h_out, h, x_residual and the workspace's normed-rows buffer unchanged."""
    cfg, lw, h, x, _ = _error_cases(device)
    m, hidden = h.shape
    bf16 = torch.bfloat16
    norm_weight = norm_weight_of(torch.Generator().manual_seed(5), hidden, device)
    meta = torch.device("meta")                     # a device other than h's on any machine
    ws = kmoe.MoEWorkspace.allocate(max_rows=m, hidden=hidden, num_experts=4, slots_per_row=2, moe_inter=16,
                                    device=device)
    ws.h.copy_(h)                                   # the pre-norm rows kept in the workspace's own buffer
    ws.logits.fill_(7.0)                            # defined (NaN never equals itself): a case passes a view of it
    ws_no_h = kmoe.MoEWorkspace.allocate(max_rows=m, hidden=hidden, num_experts=4, slots_per_row=2, moe_inter=16,
                                         device=device, normed_rows=False)
    assert ws_no_h.h is None
    h_big = torch.cat([h, torch.full_like(h, 7.0)])     # h and h_out: two views of one storage
    w_big = torch.full(((m + 1) * hidden,), 7.0, dtype=bf16, device=device)
    w_big[:hidden] = norm_weight                   # norm_weight and h_out: two views of one storage

    def sentinel(*shape, dtype=bf16):
        return torch.full(shape, 7.0, dtype=dtype, device=device)

    ss = sentinel(m, 2, dtype=torch.float32)        # partial sums of squares (P = 2)
    ss_big = sentinel(m, hidden // 2 + 2, dtype=torch.float32)   # h_out (as bf16) and sum_sq_parts in one storage

    cases = [
        ("norm_weight shape", dict(norm_weight=norm_weight[:16].clone()), "norm_weight must have shape"),
        ("norm_weight 2-D", dict(norm_weight=norm_weight[None]), "norm_weight must have shape"),
        ("norm_weight dtype", dict(norm_weight=norm_weight.float()), "norm_weight must be torch.bfloat16"),
        ("norm_weight device", dict(norm_weight=torch.empty(hidden, dtype=bf16, device=meta)),
         "norm_weight is on meta"),
        ("norm_weight strided", dict(norm_weight=torch.stack([norm_weight, norm_weight], 1)[:, 0]),
         "norm_weight must be contiguous"),
        ("norm_weight list", dict(norm_weight=norm_weight.tolist()), "norm_weight must be a torch.Tensor"),
        ("eps missing", dict(eps=None), "eps=None must be a finite float > 0"),
        ("eps zero", dict(eps=0.0), "eps=0.0 must be"),
        ("eps negative", dict(eps=-1e-6), "eps=-1e-06 must be"),
        ("eps nan", dict(eps=float("nan")), "eps=nan must be"),
        ("eps inf", dict(eps=float("inf")), "eps=inf must be"),
        ("eps bool", dict(eps=True), "eps=True must be"),
        ("eps str", dict(eps="1e-6"), "eps='1e-6' must be"),
        ("eps without norm_weight", dict(norm_weight=None, h_out=None), "eps=1e-06 given without norm_weight"),
        ("h_out without norm_weight", dict(norm_weight=None, eps=None), "h_out given without norm_weight"),
        ("h_out shape", dict(h_out=sentinel(m - 1, hidden)), "h_out must have shape"),
        ("h_out dtype", dict(h_out=sentinel(m, hidden, dtype=torch.float32)), "h_out must be torch.bfloat16"),
        ("h_out device", dict(h_out=torch.empty(m, hidden, dtype=bf16, device=meta)), "h_out is on meta"),
        ("h_out rows overlap", dict(h_out=sentinel(1, hidden).expand(m, hidden)), "h_out's rows overlap"),
        ("h_out is h", dict(h_out="h"), "h_out shares storage with h"),
        ("h_out beside h", dict(h=h_big[:m], h_out=h_big[m:]), "h_out shares storage with h"),
        ("h_out is x_residual", dict(h_out="x_residual"), "h_out shares storage with x_residual"),
        ("h_out is out", dict(h_out="out"), "h_out shares storage with out"),
        ("h_out beside norm_weight", dict(norm_weight=w_big[:hidden], h_out=w_big[hidden:].view(m, hidden)),
         "h_out shares storage with norm_weight"),
        ("sum_sq_parts without norm_weight", dict(norm_weight=None, eps=None, h_out=None, sum_sq_parts=ss),
         "sum_sq_parts given without norm_weight"),
        ("sum_sq_parts dtype", dict(sum_sq_parts=ss.to(bf16)), "sum_sq_parts must be torch.float32"),
        ("sum_sq_parts 1-D", dict(sum_sq_parts=ss[0]), r"sum_sq_parts must be an \[M, P\] tensor"),
        ("sum_sq_parts list", dict(sum_sq_parts=ss.tolist()), r"sum_sq_parts must be an \[M, P\] tensor"),
        ("sum_sq_parts P=0", dict(sum_sq_parts=ss[:, :0]), "P=0 partial sums"),
        ("sum_sq_parts P=257", dict(sum_sq_parts=sentinel(m, 257, dtype=torch.float32)), "P=257 partial sums"),
        ("sum_sq_parts rows", dict(sum_sq_parts=ss[:m - 1]), "sum_sq_parts must have shape"),
        ("sum_sq_parts device", dict(sum_sq_parts=torch.empty(m, 2, device=meta)), "sum_sq_parts is on meta"),
        ("sum_sq_parts rows overlap", dict(sum_sq_parts=ss[:1].expand(m, 2)), "sum_sq_parts's rows overlap"),
        ("sum_sq_parts strided", dict(sum_sq_parts=sentinel(m, 4, dtype=torch.float32)[:, ::2]),
         "sum_sq_parts must be contiguous"),
        ("h_out beside sum_sq_parts", dict(h_out=ss_big[:, :hidden // 2].view(bf16), sum_sq_parts=ss_big[:, -2:]),
         "h_out shares storage with sum_sq_parts"),
        ("sum_sq_parts in the workspace", dict(sum_sq_parts=ws.logits[0, :m, :2], workspace=ws),
         "sum_sq_parts shares storage with workspace.logits"),
        ("workspace.h is h", dict(h=ws.h[:m], h_out=None, workspace=ws), "workspace.h shares storage with h"),
        ("workspace without h", dict(h_out=None, workspace=ws_no_h), "workspace.h is None"),
    ]
    for name, change, msg in cases:
        args = dict(h=h.clone(), x_residual=x.clone(), lw=lw, cfg=cfg, num_valid_rows=3, norm_weight=norm_weight,
                    eps=1e-6, h_out=sentinel(m, hidden), out=sentinel(m, hidden))
        args.update(change)
        if isinstance(args["h_out"], str):
            args["h_out"] = args[args["h_out"]]
        before = {k: v.clone() for k, v in args.items() if isinstance(v, torch.Tensor) and v.device == h.device}
        ws_h = ws.h.clone()
        with pytest.raises(StepContractError, match=msg):
            kmoe.moe_forward(**args)
        for k, v in before.items():
            assert torch.equal(args[k], v), f"{name}: {k} was written before the error"
        assert torch.equal(ws.h, ws_h), f"{name}: workspace.h was written before the error"


@pytest.mark.skipif(ON_GPU, reason="the GPU runs the kernels themselves")
def test_use_pdl_refused_under_interpreter(device):
    cfg, lw, h, x, _ = _error_cases(device)
    with pytest.raises(UnsupportedConfigError, match="use_pdl"):
        kmoe.moe_forward(h, x, lw, cfg, 3, use_pdl=True)


# ----------------------------------------------------------------------------------------- sm_90 build
_COMPILE_SCRIPT = textwrap.dedent("""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from lowlat.kernels import moe as K
    from lowlat.config import preset
    cfg = preset("Qwen3-30B-A3B")
    H, E, IE, TOPK = cfg.hidden_size, cfg.num_experts, cfg.moe_intermediate_size, cfg.top_k
    for pdl in (False, True):
        for name, fn, sig, cx, opts in K.sm90_compile_specs(H, E, IE, TOPK, use_pdl=pdl):
            params = list(fn.arg_names)
            full = {p: sig.get(p, "constexpr") for p in params}
            attrs = {(i,): [["tt.divisibility", 16]] for i, p in enumerate(params)
                     if p in sig and (sig[p].startswith("*") or p.startswith("stride"))}
            out = triton.compile(ASTSource(fn=fn, signature=full, constexprs=cx, attrs=attrs),
                                 target=GPUTarget("cuda", 90, 32), options=opts)
            assert out.asm["cubin"], name
            print(name, "pdl" if pdl else "-", "ok", out.metadata.shared)
""")


@pytest.mark.slow
@pytest.mark.skipif(ON_GPU, reason="the GPU tests build and run the kernels for real")
def test_kernels_compile_for_sm90():
    """Every kernel at Qwen3-30B-A3B shapes builds to an sm_90 cubin (the interpreter skips this)."""
    pytest.importorskip("triton.backends.nvidia")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    r = subprocess.run([sys.executable, "-c", _COMPILE_SCRIPT], env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-4000:]
    assert r.stdout.count(" ok ") == 28, r.stdout
    assert r.stdout.count("router_logits_norm ") == 2, r.stdout


def kernel_launch_specs(kernel, hidden: int, experts: int, inter: int, top_k: int,
                        pdl: bool) -> list[tuple[str, dict]]:
    """(name, compile_sm90 spec) of each variant of `kernel` that `moe.sm90_compile_specs` lists, built as a launch
    specialises it (16-divisible strides, H and E; launch_pdl with PDL), PTX kept."""
    return [(name, {"constexprs": cx, "pointers": {k: v for k, v in sig.items() if v.startswith("*")},
                    "scalars": {k: v for k, v in sig.items() if not v.startswith("*")},
                    "divisible": [k for k in sig if k.startswith("stride") or k in ("H", "E")],
                    "launch_pdl": pdl, "ptx": True, **opts})
            for name, fn, sig, cx, opts in kmoe.sm90_compile_specs(hidden, experts, inter, top_k, use_pdl=pdl)
            if fn is kernel]


@pytest.mark.skipif(ON_GPU, reason="the GPU tests build and run the kernels for real")
def test_route_plan_sm90_no_spills_at_any_row_tile():
    """The route / plan kernel at Qwen3-30B-A3B's 128 experts, every row tile it launches (16 / 32 / 64 rows: up to
    48 rows), routing and forced, built as a launch specialises it: no spills (a [32 | 64, 128] tile in one program
    spilled 24 / 296 bytes a thread, session 28; a program now takes PLAN_CHUNK rows), and where several programs
    run, the PTX's order of the plan's synchronisation (the GPU cannot be made to show a missing barrier)."""
    from sampling_stats import compile_sm90

    cfg = preset("Qwen3-30B-A3B")
    listed = kernel_launch_specs(kmoe._route_plan_kernel, cfg.hidden_size, cfg.num_experts,
                                 cfg.moe_intermediate_size, cfg.top_k, True)
    assert sorted(n for n, _ in listed) == sorted(f"{kind}_{bm}" for kind in ("route_plan", "plan_forced")
                                                  for bm in (16, 32, 64))
    for (name, _), info in zip(listed, compile_sm90("lowlat.kernels.moe:_route_plan_kernel",
                                                    [sp for _, sp in listed])):
        assert info["spill_bytes"] == 0 and ".local" not in info["ptx"], (name, info["spill_bytes"])
        # several programs (32 / 64 rows): the experts ORed, a CTA barrier, the arrival (acquire-release), the
        # barrier handing its count to every thread, then the last program's load of the ORs from L2; none at 16
        sync = re.findall(r"atom\.global\.gpu\.relaxed\.or|atom\.global\.gpu\.acq_rel\.add|bar\.sync|"
                          r"ld\.global\.cg", info["ptx"])
        if name.endswith("_16"):
            assert "atom.global.gpu.acq_rel.add" not in sync, name
            continue
        i = sync.index("atom.global.gpu.relaxed.or")
        assert sync[i:i + 5] == ["atom.global.gpu.relaxed.or", "bar.sync", "atom.global.gpu.acq_rel.add", "bar.sync",
                                 "ld.global.cg"], (name, sync[i:i + 5])
        assert sync.count("atom.global.gpu.acq_rel.add") == 1 and sync.count("atom.global.gpu.relaxed.or") == 1


@pytest.mark.skipif(ON_GPU, reason="the GPU tests build and run the kernels for real")
def test_router_norm_sm90_no_spills_and_x_read_after_the_wait():
    """The router launch's NORM variants (the statistic from whole rows of x, or from H / 16 partial sums) at
    Qwen3-30B-A3B shapes, and the partial-sums variant at the most parts it takes (MAX_SUM_SQ_PARTS: H 4096), built
    as a launch specialises it: no spills; with PDL one `griddepcontrol.wait`, and before it only the loads the plain
    variant issues there (the router's first weight slice) plus the norm weight's first slice: no read of x (the
    previous launch's output) nor of the partial sums, no store, no tensor-core product."""
    from sampling_stats import compile_sm90

    cfg = preset("Qwen3-30B-A3B")
    router = kmoe._router_logits_kernel
    listed = [((name, pdl), spec) for pdl in (False, True)
              for name, spec in kernel_launch_specs(router, cfg.hidden_size, cfg.num_experts,
                                                    cfg.moe_intermediate_size, cfg.top_k, pdl)]
    listed += [(("most_parts", True), spec) for name, spec in
               kernel_launch_specs(router, 16 * kmoe.MAX_SUM_SQ_PARTS, 128, 1536, 8, True)
               if name == "router_logits_norm_ss"]
    assert listed[-1][1]["constexprs"]["SS_P2"] == kmoe.MAX_SUM_SQ_PARTS
    variants = ("router_logits", "router_logits_norm", "router_logits_norm_ss")
    names = [n for n, _ in listed]
    assert sorted(names) == sorted([(n, p) for n in variants for p in (False, True)] + [("most_parts", True)])
    info = dict(zip(names, compile_sm90("lowlat.kernels.moe:_router_logits_kernel", [sp for _, sp in listed])))
    for key in [(n, p) for n in variants[1:] for p in (False, True)] + [("most_parts", True)]:
        assert info[key]["spill_bytes"] == 0, (key, {k: v for k, v in info[key].items() if k != "ptx"})
    heads = {}
    for name in variants:
        ptx = info[(name, True)]["ptx"]
        assert ptx.count("griddepcontrol.wait") == 1, name
        head = ptx.partition("griddepcontrol.wait")[0]
        assert "st.global" not in head and "mma" not in head, name
        heads[name] = head.count("ld.global")
    assert 1 <= heads["router_logits"] <= heads["router_logits_norm"] <= heads["router_logits"] + 2, heads
    assert heads["router_logits_norm_ss"] == heads["router_logits_norm"], heads      # ss and x only after the wait


# ----------------------------------------------------------------------------------------- GPU, full size
@pytest.fixture(scope="module")
def qwen(device):
    """Qwen3-30B-A3B's MoE layer shape with random weights on the GPU, and its float64 copy."""
    cfg = preset("Qwen3-30B-A3B")
    lw = moe_weights(cfg, 0, device)
    return cfg, lw, oracle_weights(lw)


def _qwen_check(out, h, x, cfg, lw, lw64, nv, output="out"):
    base = expected_forward(h, x, lw, cfg.top_k, cfg.norm_topk_prob, nv)
    orc = expected_forward(oracle_cast(h), oracle_cast(x), lw64, cfg.top_k, cfg.norm_topk_prob, nv)
    check_valid_rows(out, orc, base, nv, output)
    if nv < x.shape[0]:
        check_bitwise("moe", out[nv:], x[nv:], output="padding_rows")


@pytest.mark.gpu
@settings(max_examples=20, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(m=st.integers(1, 48), data=st.data(), seed=st.integers(0, 2**16))
def test_qwen3_moe_layer_within_policy(qwen, device, m, data, seed):
    cfg, lw, lw64 = qwen
    nv = data.draw(st.integers(1, m), label="num_valid_rows")
    g = torch.Generator().manual_seed(seed)
    h, x = rand_rows(g, m, cfg.hidden_size, device), rand_rows(g, m, cfg.hidden_size, device)
    h[nv:] = float("nan")
    out = run_forward(h, x, lw, cfg, nv)
    _qwen_check(out, h, x, cfg, lw, lw64, nv)


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["random", "duplicate", "all_equal", "one_expert"])
def test_qwen3_route_bitmap_equals_reference_with_ties(device, mode):
    cfg = preset("Qwen3-30B-A3B")
    g = torch.Generator().manual_seed(1)
    h, router = exact_router_inputs(g, 48, cfg.hidden_size, cfg.num_experts, mode, device)
    bitmap, gates = kmoe.route(h, router, cfg.top_k, True, 40)
    ref_bitmap, ref_gates = route_topk(h, router, cfg.top_k, True, 40)
    _, orc_gates = route_topk(oracle_cast(h), oracle_cast(router), cfg.top_k, True, 40)
    assert torch.equal(bitmap, ref_bitmap)
    check_accuracy("moe", gates, orc_gates, ref_gates, output="gates")


@triton.jit
def _exact_row_sum_probe(v_ptr, out_ptr, R: tl.constexpr, C: tl.constexpr):
    r = tl.arange(0, R)
    v = tl.load(v_ptr + r[:, None] * C + tl.arange(0, C)[None, :])
    tl.store(out_ptr + r, kmoe._exact_row_sum(v))


def test_exact_row_sum_is_order_free_and_exact(device):
    """`moe._exact_row_sum` (the route kernel's softmax and renormalisation sums): the same bits whatever
    the order of a row's values (columns permuted), within 2^-48 per value + one fp32 rounding of the
    float64 sum, NaN counted as 0. A float sum in the tile's order fails the permutation check (it is what
    made a row's gates depend on M on the GPU; the GPU guard is test_qwen3_route_gates_row_invariant)."""
    g = torch.Generator().manual_seed(11)
    r, c = 16, 128
    v = torch.exp(-30 * torch.rand(r, c, generator=g))         # softmax-like terms, 1e-13 .. 1
    v[3, 5] = float("nan")
    sums = []
    for p in range(6):
        perm = torch.randperm(c, generator=g) if p else torch.arange(c)
        out = torch.full((r,), float("nan"), device=device)
        _exact_row_sum_probe[(1,)](v[:, perm].contiguous().to(device), out, R=r, C=c)
        sums.append(out.cpu())
    for p, x in enumerate(sums[1:], 1):
        assert torch.equal(x, sums[0]), f"permutation {p} changed a row sum: {(x - sums[0]).abs().max()}"
    want = torch.nan_to_num(v.double(), nan=0.0).sum(1)
    err = (sums[0].double() - want).abs()
    assert bool((err <= c * 2.0 ** -48 + want * 2.0 ** -24).all()), err.max()


@pytest.mark.gpu
def test_qwen3_route_gates_row_invariant(qwen, device):
    """Bitmap and gates of a row are bitwise the same at M = 1, 20 and 48 (plan row tiles 16, 32, 64: the
    softmax and renormalisation sums must not follow the tile's layout)."""
    cfg, lw, _ = qwen
    g = torch.Generator().manual_seed(8)
    h = rand_rows(g, 48, cfg.hidden_size, device)
    bitmap, gates = (t.clone() for t in kmoe.route(h, lw.router, cfg.top_k, True, 48))
    part = [t.clone() for t in kmoe.route(h[:20].clone(), lw.router, cfg.top_k, True, 20)]
    check_bitwise("moe", part[1], gates[:20], output="gates_m20")
    assert torch.equal(part[0], bitmap[:20])
    for i in range(48):
        b1, g1 = kmoe.route(h[i:i + 1].clone(), lw.router, cfg.top_k, True, 1)
        check_bitwise("moe", g1, gates[i:i + 1], output=f"gates_row{i}_m1")
        assert torch.equal(b1, bitmap[i:i + 1])


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["random", "one_expert", "all_full"])
def test_qwen3_forced_routing_matches_reference(qwen, device, mode):
    cfg, lw, lw64 = qwen
    g = torch.Generator().manual_seed(2)
    m, nv = 48, 45
    h, x = rand_rows(g, m, cfg.hidden_size, device), rand_rows(g, m, cfg.hidden_size, device)
    bitmap, gates = forced_routing(g, m, cfg.num_experts, mode, device)
    if mode == "all_full":                 # every expert serves the first 6 rows only
        bitmap[6:] = False
        gates[6:] = 0
    out = kmoe.moe_experts_forced(h, x, bitmap, gates, lw, nv, out=poison(torch.empty_like(x)))
    base = expected_forced(h, x, bitmap, gates, lw, nv)
    orc = expected_forced(oracle_cast(h), oracle_cast(x), bitmap, oracle_cast(gates), lw64, nv)
    check_accuracy("moe", out[:nv], orc[:nv], base[:nv], output="forced")
    check_bitwise("moe", out[nv:], x[nv:], output="padding_rows")


@pytest.mark.gpu
def test_qwen3_deterministic_and_row_invariant(qwen, device):
    """Bitwise: two runs; each row alone (M=1); the first 30 rows at M=30 vs M=48 with padding."""
    cfg, lw, _ = qwen
    g = torch.Generator().manual_seed(5)
    h, x = rand_rows(g, 48, cfg.hidden_size, device), rand_rows(g, 48, cfg.hidden_size, device)
    a = run_forward(h, x, lw, cfg, 48)
    b = run_forward(h, x, lw, cfg, 48)
    check_bitwise("moe", a, b, output="run_to_run")
    for i in (0, 7, 31, 47):
        one = run_forward(h[i:i + 1].clone(), x[i:i + 1].clone(), lw, cfg, 1)
        check_bitwise("moe", one, a[i:i + 1], output="row_invariance")
    hp = h.clone()
    hp[30:] = rand_rows(g, 18, cfg.hidden_size, device)       # different padding contents
    padded = run_forward(hp, x, lw, cfg, 30)
    short = run_forward(h[:30].clone(), x[:30].clone(), lw, cfg, 30)
    check_bitwise("moe", padded[:30], a[:30], output="row_invariance_padding")
    check_bitwise("moe", short, a[:30], output="row_invariance_width")


@pytest.mark.gpu
def test_qwen3_inactive_expert_weights_never_read(qwen, device):
    cfg, lw, _ = qwen
    g = torch.Generator().manual_seed(6)
    h, x = rand_rows(g, 6, cfg.hidden_size, device), rand_rows(g, 6, cfg.hidden_size, device)
    bitmap, _ = kmoe.route(h, lw.router, cfg.top_k, True, 6)
    unused = [e for e in range(cfg.num_experts) if not bool(bitmap[:, e].any())]
    assert len(unused) >= cfg.num_experts - 6 * cfg.top_k
    clean = run_forward(h, x, lw, cfg, 6)
    dirty = run_forward(h, x, nan_fill_experts(lw, unused), cfg, 6)
    check_bitwise("moe", dirty, clean, output="inactive_nan")


@pytest.mark.gpu
@pytest.mark.parametrize("use_pdl", [False, True])
def test_qwen3_cuda_graph_replay_bitwise_equals_eager(qwen, device, use_pdl):
    """Captured once (preallocated workspace, num_valid_rows on the device), replayed on new rows."""
    cfg, lw, lw64 = qwen
    m = 16
    ws = kmoe.MoEWorkspace.for_config(cfg, m, device)
    g = torch.Generator().manual_seed(7)
    h = rand_rows(g, m, cfg.hidden_size, device)
    x = rand_rows(g, m, cfg.hidden_size, device)
    nv = torch.tensor([m], dtype=torch.int32, device=device)
    out = torch.empty_like(x)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        kmoe.moe_forward(h, x, lw, cfg, nv, out=out, workspace=ws, use_pdl=use_pdl)   # warm-up / compile
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        kmoe.moe_forward(h, x, lw, cfg, nv, out=out, workspace=ws, use_pdl=use_pdl)
    for valid in (16, 9):
        h.copy_(rand_rows(g, m, cfg.hidden_size, device))
        x.copy_(rand_rows(g, m, cfg.hidden_size, device))
        nv.fill_(valid)
        poison(out)
        graph.replay()
        torch.cuda.synchronize()
        eager = run_forward(h, x, lw, cfg, valid)
        check_bitwise("moe", out, eager, output="graph_vs_eager")
        _qwen_check(out, h, x, cfg, lw, lw64, valid)


@pytest.mark.gpu
@pytest.mark.parametrize("m,nv", [(1, 1), (6, 6), (48, 48), (48, 41)])
def test_qwen3_norm_within_policy(qwen, device, m, nv):
    """The RMSNorm in the router launch at full size: hn within the policy of rms_norm(x), out within the policy
    of x + moe(rms_norm(x)) (padding rows == x), and out bitwise the unnormed path fed hn."""
    cfg, lw, lw64 = qwen
    g = torch.Generator().manual_seed(100 + m + nv)
    x = rand_rows(g, m, cfg.hidden_size, device)
    norm_weight = norm_weight_of(g, cfg.hidden_size, device)
    out, hn = run_norm_forward(x, x, lw, cfg, nv, norm_weight, cfg.rms_eps)
    check_norm_forward(out, hn, x, x, norm_weight, cfg.rms_eps, lw, cfg, nv, lw64=lw64)
    plain = run_forward(hn.clone(), x, lw, cfg, nv)
    check_bitwise("moe", out, plain, output="norm_vs_unnormed_path")


@pytest.mark.gpu
def test_qwen3_norm_from_held_out_proj_sums(qwen, device):
    """FusedModel's "held" MoE layer: x = residual_gemv_held(attn, Wo, r, sum_sq_out=ss), then moe_forward(x, x,
    norm_weight, sum_sq_parts=ss) (H / 16 = 128 parts a row): hn and out within the policy of rms_norm(x) and
    x + moe(rms_norm(x)) at 48 rows (41 valid), out bitwise the unnormed path fed hn; each row alone (M = 1), the
    first 9 / 17 / 33 rows: bitwise hn and out of those rows among 48."""
    from lowlat.kernels.residual_gemv_held import residual_gemv_held

    cfg, lw, lw64 = qwen
    hidden, eps = cfg.hidden_size, cfg.rms_eps
    g = torch.Generator().manual_seed(19)
    attn = rand_rows(g, 48, cfg.q_size, device)
    wo = (torch.randn(hidden, cfg.q_size, generator=g) * cfg.q_size ** -0.5).to(device=device, dtype=torch.bfloat16)
    r = rand_rows(g, 48, hidden, device)
    norm_weight = norm_weight_of(g, hidden, device)

    def run(m, nv):
        ss = poison(torch.empty(m, hidden // 16, device=device))
        x = residual_gemv_held(attn[:m].contiguous(), wo, r[:m].contiguous(), sum_sq_out=ss)
        out, hn = run_norm_forward(x, x, lw, cfg, nv, norm_weight, eps, sum_sq_parts=ss)
        return x, out, hn

    x, out, hn = run(48, 41)
    check_norm_forward(out, hn, x, x, norm_weight, eps, lw, cfg, 41, lw64=lw64)
    check_bitwise("moe", out, run_forward(hn.clone(), x, lw, cfg, 41), output="held_sums_vs_unnormed_path")
    for m in (9, 17, 33):
        _, o, h_ = run(m, min(m, 41))
        check_bitwise("moe", h_, hn[:m], output=f"held_sums_m{m}_hn")
        check_bitwise("moe", o, out[:m], output=f"held_sums_m{m}")
    for i in (0, 7, 40):
        attn_i, r_i = attn[i:i + 1].clone(), r[i:i + 1].clone()
        ss = poison(torch.empty(1, hidden // 16, device=device))
        xi = residual_gemv_held(attn_i, wo, r_i, sum_sq_out=ss)
        o1, h1 = run_norm_forward(xi, xi, lw, cfg, 1, norm_weight, eps, sum_sq_parts=ss)
        check_bitwise("moe", h1, hn[i:i + 1], output=f"held_sums_row{i}_hn")
        check_bitwise("moe", o1, out[i:i + 1], output=f"held_sums_row{i}")


@pytest.mark.gpu
def test_qwen3_norm_deterministic_and_row_invariant(qwen, device):
    """Bitwise, hn and out: two runs; each row alone (M=1) == that row among 48; the first 30 rows at M=30 and at
    M=48 with 18 different padding rows; in place (out = x_residual = h, hn in the workspace) == separate buffers."""
    cfg, lw, _ = qwen
    hidden, eps = cfg.hidden_size, cfg.rms_eps
    g = torch.Generator().manual_seed(15)
    x = rand_rows(g, 48, hidden, device)
    norm_weight = norm_weight_of(g, hidden, device)
    out, hn = run_norm_forward(x, x, lw, cfg, 48, norm_weight, eps)
    out2, hn2 = run_norm_forward(x, x, lw, cfg, 48, norm_weight, eps)
    check_bitwise("moe", out2, out, output="norm_run_to_run")
    check_bitwise("moe", hn2, hn, output="norm_run_to_run_hn")
    for i in range(48):
        xi = x[i:i + 1].clone()
        o1, h1 = run_norm_forward(xi, xi, lw, cfg, 1, norm_weight, eps)
        check_bitwise("moe", h1, hn[i:i + 1], output=f"norm_row{i}_m1_hn")
        check_bitwise("moe", o1, out[i:i + 1], output=f"norm_row{i}_m1")
    xp = x.clone()
    xp[30:] = rand_rows(g, 18, hidden, device)               # different padding contents
    padded, hp = run_norm_forward(xp, xp, lw, cfg, 30, norm_weight, eps)
    x30 = x[:30].clone()
    short, hs = run_norm_forward(x30, x30, lw, cfg, 30, norm_weight, eps)
    for name, o, h_ in (("padding", padded, hp), ("width", short, hs)):
        check_bitwise("moe", o[:30], out[:30], output=f"norm_row_invariance_{name}")
        check_bitwise("moe", h_[:30], hn[:30], output=f"norm_row_invariance_{name}_hn")
    ws = kmoe.MoEWorkspace.for_config(cfg, 48, device)
    xs = x.clone()
    kmoe.moe_forward(xs, xs, lw, cfg, 48, norm_weight=norm_weight, eps=eps, out=xs, workspace=ws)
    check_bitwise("moe", xs, out, output="norm_in_place")
    check_bitwise("moe", ws.h[:48], hn, output="norm_in_place_hn")


@pytest.mark.gpu
@pytest.mark.parametrize("use_pdl", [False, True])
def test_qwen3_norm_cuda_graph_replay_bitwise_equals_eager(qwen, device, use_pdl):
    """FusedModel's call captured once — in place (out = x_residual = h), hn into the preallocated workspace,
    num_valid_rows on the device — and replayed on new rows: out and hn bitwise the eager run's (separate
    buffers, no PDL), and within the policy."""
    cfg, lw, lw64 = qwen
    m, hidden, eps = 16, cfg.hidden_size, cfg.rms_eps
    ws = kmoe.MoEWorkspace.for_config(cfg, m, device)
    g = torch.Generator().manual_seed(17)
    norm_weight = norm_weight_of(g, hidden, device)
    xs = rand_rows(g, m, hidden, device)
    nv = torch.tensor([m], dtype=torch.int32, device=device)

    def step():
        kmoe.moe_forward(xs, xs, lw, cfg, nv, norm_weight=norm_weight, eps=eps, out=xs, workspace=ws,
                         use_pdl=use_pdl)

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        step()                                              # warm-up / compile
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    for valid in (16, 9):
        x = rand_rows(g, m, hidden, device)
        xs.copy_(x)
        nv.fill_(valid)
        poison(ws.h)
        graph.replay()
        torch.cuda.synchronize()
        eager, hn = run_norm_forward(x, x, lw, cfg, valid, norm_weight, eps)
        check_bitwise("moe", xs, eager, output="norm_graph_vs_eager")
        check_bitwise("moe", ws.h[:m], hn, output="norm_graph_vs_eager_hn")
        check_norm_forward(xs, ws.h[:m], x, x, norm_weight, eps, lw, cfg, valid, lw64=lw64)
