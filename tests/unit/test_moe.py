"""Fused MoE kernels (`lowlat.kernels.moe`) against the reference (`lowlat.reference.moe`).

CPU (Triton interpreter, tiny shapes): routing bitmap equality incl. deliberate ties, placement on
forced routings incl. degenerate bitmaps, the full block within the numerics policy, padding rows,
a dense MLP split into experts, NaN weights of inactive experts, typed errors, and a compile of
every kernel for sm_90. GPU (`-m gpu`, Qwen3-30B-A3B shapes: H 2048, E 128, top-8, Ie 768): the
same properties at full size, bitwise run-to-run determinism, row invariance, CUDA graphs and PDL.
"""

from __future__ import annotations

import os
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
        ("h 1-D", dict(h=h[0]), StepContractError, "h must be an \\[M, H\\] tensor"),
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
        ("config experts", dict(cfg=cfg.replace(num_experts=8, top_k=2)), UnsupportedConfigError, "E=4"),
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
    bad = torch.full((3, 4), 2, dtype=torch.uint8, device=device)
    with pytest.raises(StepContractError, match="0 or 1"):
        kmoe.moe_experts_forced(h, x, bad, torch.zeros(3, 4, device=device), lw, 3)
    with pytest.raises(StepContractError, match="gates must be torch.float32"):
        kmoe.moe_experts_forced(h, x, bad.bool(), torch.zeros(3, 4, device=device, dtype=torch.bfloat16), lw, 3)


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


@pytest.mark.skipif(ON_GPU, reason="the GPU tests build and run the kernels for real")
def test_kernels_compile_for_sm90():
    """Every kernel at Qwen3-30B-A3B shapes builds to an sm_90 cubin (the interpreter skips this)."""
    pytest.importorskip("triton.backends.nvidia")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    r = subprocess.run([sys.executable, "-c", _COMPILE_SCRIPT], env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-4000:]
    assert r.stdout.count(" ok ") == 24, r.stdout


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
