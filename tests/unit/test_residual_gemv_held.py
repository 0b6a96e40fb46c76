"""The residual GEMV with its weights held in registers (`lowlat.kernels.residual_gemv_held`) against the reference.

GPU (`-m gpu`; Gluon kernels do not run under the interpreter): within the numerics policy against the float64 oracle
(2x the bf16 reference's error, `check_accuracy`: the kernel keeps fp32 sums and rounds once, the bf16 reference
rounds the product before the add) at 1..48 rows on Qwen3-30B-A3B's output projection, Llama-3.2-1B's and a small
shape, outputs poisoned first; bitwise run-to-run determinism, row invariance (a row alone == among 48, across the
8 / 16-row block switch; permuted rows), PDL on == off, in place == out of place, CUDA graph replay == eager.
CPU: typed refusals with nothing written, `held_residual_supported`'s reasons, and an sm_90 compile of every launch
FusedModel can make (no spills, every weight load before griddepcontrol.wait, the mma count).
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from lowlat.errors import StepContractError
from lowlat.kernels import residual_gemv_held as rgh
from lowlat.kernels.residual_gemv_held import held_residual_supported, residual_gemv_held
from lowlat.numerics import check_accuracy, check_bitwise, poison

#: (N, K): Qwen3-30B-A3B's output projection (16.8 MB, 8 warps), Llama-3.2-1B's (8.4 MB, 4 warps), the smallest K
SHAPES = {"qwen3_out": (2048, 4096), "llama_out": (2048, 2048), "small": (256, 1024)}


def make_inputs(m: int, n: int, k: int, seed: int, device):
    """a [M, K], w [N, K] (scaled so outputs are O(1)), residual [M, N]: random bf16, never zeros."""
    g = torch.Generator(device=device).manual_seed(seed)
    a = torch.randn(m, k, generator=g, device=device).to(torch.bfloat16)
    w = (torch.randn(n, k, generator=g, device=device) * k ** -0.5).to(torch.bfloat16)
    res = torch.randn(m, n, generator=g, device=device).to(torch.bfloat16)
    return a, w, res


def check_policy(out, a, w, res):
    oracle = res.double() + a.double() @ w.double().T
    baseline = res + torch.nn.functional.linear(a, w)
    check_accuracy("residual_gemv_held", out, oracle, baseline)


def check_sum_sq(ss, out):
    """ss [M, N / 16] against the exact sums of each 16 outputs' squares (float64 of the bf16 out): a bf16 value's
    square is exact in fp32 (8 significant bits squared fit in 24), so only the 15 fp32 additions of nonnegative
    terms round, a relative error below 15 x 2^-24 of the sum; any other rounding (the squares of the fp32 sums
    before their bf16 rounding: ~2^-8) fails. NaN (the poison left) fails."""
    m, n = out.shape
    exact = (out.double() ** 2).view(m, n // 16, 16).sum(-1)
    assert ss.shape == exact.shape and not ss.isnan().any(), "sum_sq_out not fully written"
    err = ((ss.double() - exact).abs() / exact).max().item()
    assert err <= 15 * 2.0 ** -24, f"sum_sq_out relative error {err:.3g} > 15 x 2^-24"


# ----------------------------------------------------------------------------------------------------- GPU
@pytest.mark.gpu
@pytest.mark.parametrize("shape", list(SHAPES))
@settings(max_examples=10)
@given(m=st.integers(1, 48), pdl=st.booleans(), seed=st.integers(0, 2 ** 16))
def test_gpu_within_policy_every_row_written(device, shape, m, pdl, seed):
    n, k = SHAPES[shape]
    a, w, res = make_inputs(m, n, k, seed, device)
    out = poison(torch.empty_like(res))
    assert residual_gemv_held(a, w, res, out=out, use_pdl=pdl) is out
    check_policy(out, a, w, res)               # NaN anywhere (poison left, or computed) fails here
    xi = res.clone()
    # the sums in a view of a NaN buffer with 16 rows and 3 columns to spare (row stride N / 16 + 3): every element of
    # the M rows written, nothing past them
    buf = poison(torch.empty(m + 16, n // 16 + 3, device=device))
    ss = buf[:m, :n // 16]
    residual_gemv_held(a, w, xi, out=xi, sum_sq_out=ss, use_pdl=pdl)   # in place with the sums, as FusedModel runs it
    check_bitwise("residual_gemv_held", xi, out, output="in_place_sum_sq")
    check_sum_sq(ss, out)
    assert buf[m:].isnan().all() and buf[:m, n // 16:].isnan().all(), "sum_sq_out written outside its view"


@pytest.mark.gpu
@pytest.mark.parametrize("shape", list(SHAPES))
def test_gpu_bitwise_deterministic_row_invariant_and_pdl_independent(device, shape):
    """A row's output is the same bits alone, among the first 6 / 8 / 9 / 16 / 17 / 33 rows (8 / 16-row blocks at K
    4096) and among 48 in any order; a rerun and the PDL launch give the same bits; so are its partial sums of
    squares (sum_sq_out) among the first 1 / 8 / 9 / 17 / 33 rows and 48, and they are the exact sums within 15
    fp32 roundings."""
    n, k = SHAPES[shape]
    a, w, res = make_inputs(48, n, k, 7, device)

    def run(a_, r_, pdl=True):
        return residual_gemv_held(a_, w, r_, out=poison(torch.empty_like(r_)), use_pdl=pdl)

    def run_ss(a_, r_, pdl=True):
        ss = poison(torch.empty(a_.shape[0], n // 16, device=device))
        residual_gemv_held(a_, w, r_, out=poison(torch.empty_like(r_)), sum_sq_out=ss, use_pdl=pdl)
        return ss

    full = run(a, res).clone()
    check_policy(full, a, w, res)
    ss_full = run_ss(a, res)
    check_sum_sq(ss_full, full)
    check_bitwise("residual_gemv_held", run_ss(a, res, pdl=False), ss_full, output="sum_sq_no_pdl")
    for m in (1, 8, 9, 17, 33):              # the sums' bits, like the outputs', follow neither M nor the row block
        check_bitwise("residual_gemv_held", run_ss(a[:m].contiguous(), res[:m].contiguous()), ss_full[:m],
                      output=f"sum_sq_m{m}")
    check_bitwise("residual_gemv_held", run(a, res), full, output="rerun")
    check_bitwise("residual_gemv_held", run(a, res, pdl=False), full, output="no_pdl")
    for m in (1, 6, 8, 9, 16, 17, 33):
        check_bitwise("residual_gemv_held", run(a[:m].contiguous(), res[:m].contiguous()), full[:m], output=f"m{m}")
    for i in (0, 5, 47):
        check_bitwise("residual_gemv_held", run(a[i:i + 1].contiguous(), res[i:i + 1].contiguous()), full[i:i + 1],
                      output=f"row{i}_alone")
    perm = torch.randperm(48, generator=torch.Generator().manual_seed(0)).to(device)
    check_bitwise("residual_gemv_held", run(a[perm].contiguous(), res[perm].contiguous()), full[perm],
                  output="rows_permuted")


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 6, 48])
def test_gpu_cuda_graph_replay_equals_eager(device, m):
    """Captured with PDL (as FusedModel's graphs run it), replayed on new inputs copied into the same buffers: the
    eager launch's bits."""
    n, k = SHAPES["qwen3_out"]
    a, w, res = make_inputs(m, n, k, 3, device)
    out, ss = torch.empty_like(res), torch.empty(m, n // 16, device=device)
    residual_gemv_held(a, w, res, out=out, sum_sq_out=ss, use_pdl=True)     # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        residual_gemv_held(a, w, res, out=out, sum_sq_out=ss, use_pdl=True)
    a2, _, res2 = make_inputs(m, n, k, 4, device)
    a.copy_(a2)
    res.copy_(res2)
    poison(out)
    poison(ss)
    graph.replay()
    torch.cuda.synchronize()
    ss_want = torch.empty_like(ss)
    want = residual_gemv_held(a2, w, res2, sum_sq_out=ss_want, use_pdl=False)
    check_bitwise("residual_gemv_held", out, want, output="graph_replay")
    check_bitwise("residual_gemv_held", ss, ss_want, output="graph_replay_sum_sq")


# ----------------------------------------------------------------------------------------------------- CPU
def _bad_inputs(device):
    a, w, res = make_inputs(2, 32, 1024, 1, device)
    return [
        ("a", dict(a=a.float()), "a must be torch.bfloat16"),
        ("a", dict(a=a[0]), "a must be 2-D"),
        ("a", dict(a=torch.zeros(0, 1024, dtype=torch.bfloat16)), "M=0"),
        ("a", dict(a=torch.zeros(49, 1024, dtype=torch.bfloat16), residual=torch.zeros(49, 32, dtype=torch.bfloat16)),
         "M=49"),
        ("w", dict(w=w[:, :512]), "K=1024"),
        ("residual", dict(residual=res[:, :16]), "N=32"),
        ("residual", dict(residual=torch.zeros(2, 64, dtype=torch.bfloat16)[:, :32]), "residual must be contiguous"),
        ("out", dict(out=torch.empty(2, 16, dtype=torch.bfloat16)), "N=32"),
        ("out", dict(out=torch.empty(2, 32)), "out must be torch.bfloat16"),
        ("a", dict(a=torch.zeros(2, 2048, dtype=torch.bfloat16)[:, ::2]), "a must have a contiguous last dim"),
        ("sum_sq_out", dict(sum_sq_out=torch.full((2, 2), 3.0, dtype=torch.bfloat16)),
         "sum_sq_out must be torch.float32"),
        ("sum_sq_out", dict(sum_sq_out=torch.full((2, 3), 3.0)), r"dim 1 must be N / 16=2"),
        ("sum_sq_out", dict(sum_sq_out=torch.full((1, 2), 3.0)), r"dim 0 must be M=2"),
        ("sum_sq_out", dict(sum_sq_out=torch.full((2,), 3.0).expand(2, 2)), "sum_sq_out's rows overlap"),
        ("sum_sq_out", dict(sum_sq_out=torch.full((2, 4), 3.0)[:, ::2]), "sum_sq_out must have a contiguous last"),
        ("support", dict(), "held residual GEMV cannot run here: device cpu"),
        ("support", dict(w=torch.zeros(24, 1024, dtype=torch.bfloat16),
                         residual=torch.zeros(2, 24, dtype=torch.bfloat16)), "N 24"),
    ], (a, w, res)


@pytest.mark.parametrize("case", range(17))
@pytest.mark.interpreter
def test_bad_inputs_raise_typed_errors_and_write_nothing(case):
    cases, (a, w, res) = _bad_inputs("cpu")
    _, override, match = cases[case]
    args = dict(a=a, w=w, residual=res)
    args.update(override)
    out = args.pop("out", None)
    if out is None:
        out = torch.full((args["a"].shape[0], args["w"].shape[0]), 3.0, dtype=torch.bfloat16)
    ss = args.pop("sum_sq_out", None)
    if ss is None:
        ss = torch.full((args["a"].shape[0], args["w"].shape[0] // 16), 3.0)
    before, ss_before = out.clone(), ss.clone()
    res_before = args["residual"].clone()
    with pytest.raises(StepContractError, match=match):
        residual_gemv_held(args["a"], args["w"], args["residual"], out=out, sum_sq_out=ss)
    assert torch.equal(out.nan_to_num(9.0), before.nan_to_num(9.0))
    assert torch.equal(ss.float(), ss_before.float())
    assert torch.equal(args["residual"], res_before)


@pytest.mark.parametrize("name", ["a", "w", "residual", "out"])
@pytest.mark.interpreter
def test_sum_sq_out_overlapping_a_tensor_is_refused(name):
    t = dict(a=torch.zeros(2, 1024, dtype=torch.bfloat16), w=torch.zeros(32, 1024, dtype=torch.bfloat16),
             residual=torch.zeros(2, 32, dtype=torch.bfloat16), out=torch.zeros(2, 32, dtype=torch.bfloat16))
    ss = t[name].view(torch.float32).view(t[name].shape[0], -1)[:2, :2]     # [2, 2] fp32 over that tensor's bytes
    with pytest.raises(StepContractError, match=f"sum_sq_out overlaps {name}"):
        residual_gemv_held(t["a"], t["w"], t["residual"], out=t["out"], sum_sq_out=ss)


@pytest.mark.interpreter
def test_out_overlapping_a_is_refused():
    a = torch.zeros(2, 1024, dtype=torch.bfloat16)
    with pytest.raises(StepContractError, match="out overlaps a"):
        residual_gemv_held(a, torch.zeros(32, 1024, dtype=torch.bfloat16), torch.zeros(2, 32, dtype=torch.bfloat16),
                           out=a.view(-1)[:64].view(2, 32))


def test_supported_reasons(monkeypatch):
    assert "N 24" in held_residual_supported(24, 1024, "cpu")
    assert "K 512" in held_residual_supported(32, 512, "cpu")
    assert "K 8192" in held_residual_supported(32, 8192, "cpu")
    assert "K 3072" in held_residual_supported(32, 3072, "cpu")
    assert "device cpu" in held_residual_supported(2048, 4096, "cpu")
    assert "2^31" in held_residual_supported(2 ** 20, 4096, "cpu")
    from lowlat.kernels import _attn_common as common

    monkeypatch.setattr(common, "interpreting", lambda: False)
    monkeypatch.setattr(common, "cuda_props", lambda dev: type("P", (), {"major": 8})())
    assert "compute capability 8" in held_residual_supported(2048, 4096, "cuda:0")
    monkeypatch.setattr(common, "cuda_props", lambda dev: type("P", (), {"major": 9})())
    assert held_residual_supported(2048, 4096, "cuda:0") is None


def test_tiling_is_a_function_of_k_and_the_block_of_m():
    assert [rgh.held_warps(k) for k in (1024, 2048, 4096)] == [4, 4, 8]
    assert [rgh.row_block(m, 4096) for m in (1, 8, 9, 48)] == [8, 8, 16, 16]
    assert [rgh.row_block(m, 2048) for m in (1, 9, 48)] == [8, 8, 8]


def launch_specs():
    """(K, warps, NMB, RB) of every launch `residual_gemv_held` makes for K 1024 / 2048 / 4096 and M 1..48."""
    out = set()
    for k in (1024, 2048, 4096):
        for m in range(1, 49):
            rb = rgh.row_block(m, k)
            out.add((k, rgh.held_warps(k), -(-m // rb), rb))
    return sorted(out)


def test_compiles_for_sm90_with_weights_held_in_registers():
    """Every launch compiled for sm_90 on the CPU, with and without the partial sums of squares (SS): no spills, at
    most RB 16 x 4 bytes x 8 slices a row block of shared memory (the slices' tree sum), every weight load (16 bytes)
    before griddepcontrol.wait and no a / residual load or mma before it, then K / (16 Q) x RB / 8 mma.sync a warp in
    the row-block loop's body (a loop, not unrolled); with SS one more global store a row block."""
    from sampling_stats import compile_sm90

    specs_in = [(*case, ss) for case in launch_specs() for ss in (False, True)]
    ptrs = {"a_ptr": "*bf16", "w_ptr": "*bf16", "res_ptr": "*bf16", "out_ptr": "*bf16", "ss_ptr": "*fp32"}
    specs = [{"constexprs": {"K": k, "Q": q, "S": rgh.SLICES, "NMB": nmb, "RB": rb, "USE_PDL": True, "SS": ss},
              "pointers": ptrs, "num_warps": q, "launch_pdl": True, "ptx": True, "divisible": ["N", "stride_ss"]}
             for k, q, nmb, rb, ss in specs_in]
    infos = compile_sm90("lowlat.kernels.residual_gemv_held:_held_residual_gemv_kernel", specs)
    stores = {}
    for case, info in zip(specs_in, infos):
        k, q, nmb, rb, ss = case
        stores[case] = info["ptx"].count("st.global")
        if ss:
            assert "st.global.f32" in info["ptx"] or "st.global.b32" in info["ptx"], case
        case = case[:4]
        assert info["spill_bytes"] == 0, (case, info)
        assert info["shared"] <= 8 * 16 * rb * 4, (case, info)
        ptx = info["ptx"]
        before = ptx[:ptx.index("griddepcontrol.wait")]
        assert before.count("ld.global.v4") == 16 * k * 2 // 16 // (32 * q), case   # the weights, 16 bytes a load
        assert before.count("ld.global") == before.count("ld.global.v4"), case     # nothing else before the wait
        assert "mma.sync" not in before, case
        assert ptx.count("mma.sync.aligned.m16n8k16") == k // 16 // q * (rb // 8), case   # the row-block loop's body
    for k, q, nmb, rb, ss in specs_in:
        if ss:
            assert stores[(k, q, nmb, rb, True)] > stores[(k, q, nmb, rb, False)], (k, nmb, rb)
