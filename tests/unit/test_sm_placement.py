"""bench/explore/sm_placement.py, the session-12 tool that records on which SM every program of a graph's launches
runs: its source rewrite (instrumented copies of lowlat's kernels), its reading of the trace, and that the copies
compile for sm_90 with the record in them (and, for the attention variant, without the early PDL trigger)."""

from __future__ import annotations

import ast
import inspect
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench" / "explore"))

import sm_placement as sp  # noqa: E402

NO_TRIGGER = sp.ATTN_TRIGGER_EDITS["none"]


def _src(module: str, kernel: str) -> str:
    import importlib

    return inspect.getsource(getattr(importlib.import_module(module), kernel).fn)


def test_instrumented_source_records_after_the_docstring_and_adds_the_trace_parameter():
    out = sp.instrumented_source(_src("lowlat.kernels.out_proj", "_residual_gemv_kernel"), "k_placed", 4)
    fn = ast.parse(out).body[0]
    assert fn.name == "k_placed"
    assert fn.args.args[-1].arg == "_pl_tr"
    assert "do_not_specialize" in out                                 # the decorator is kept
    body = fn.body
    assert isinstance(body[0].value, ast.Constant)                    # the docstring stays first
    first = ast.unparse(body[1])
    assert first.startswith("_pl_pid = tl.program_id(0)"), first
    stores = [ast.unparse(s) for s in body[3:6]]
    assert stores[0] == "tl.store(_pl_b, _pl_now())" and stores[2].endswith("_pl_smid() * 0 + 4)"), stores
    assert ast.unparse(body[6]) == "pid_n = tl.program_id(0)"          # then the kernel's own statements


def test_instrumented_source_applies_the_attention_edit_once_and_refuses_a_missing_one():
    src = _src("lowlat.kernels.decode_attention", "_decode_attention_kernel")
    out = sp.instrumented_source(src, "a_placed", 1, NO_TRIGGER)
    assert "gdc_launch_dependents" not in out and "gdc_wait()" in out
    assert ast.unparse(ast.parse(out).body[0].body[0]).startswith("_pl_pid")   # no docstring: record first
    with pytest.raises(ValueError, match="found 0 times"):
        sp.instrumented_source(out, "b", 1, NO_TRIGGER)
    gu = _src("lowlat.kernels.mlp", "_gate_up_kernel")
    late = sp.instrumented_source(gu, "g_placed", 1, sp.GATE_UP_TRIGGER_EDITS["late"])
    assert late.count("gdc_launch_dependents()") == 1
    trigger = late.index("gdc_launch_dependents()")
    assert late.index("gdc_wait()") < late.index("gemv_loop(") < trigger < late.index("store_partial(")
    assert trigger < late.index("tl.atomic_add")


def test_launches_of_counts_programs_per_sm_and_orders_by_start():
    names = ["_attn_prologue_kernel", "_residual_gemv_kernel"]
    t = torch.zeros(4, 16, sp.FIELDS, dtype=torch.int64)
    # slot 3: kernel 2, five programs on SMs 7, 7, 7, 9, 11 starting at 100..140 ns
    for i, (sm, start) in enumerate(zip([7, 7, 7, 9, 11], [120, 100, 140, 110, 130])):
        t[3, i] = torch.tensor([start, sm, 2])
    # slot 1: kernel 1, two programs on SMs 0 and 0 at 500, 500 (starts later than slot 3)
    t[1, 0] = torch.tensor([500, 0, 1])
    t[1, 5] = torch.tensor([500, 0, 1])
    got = sp.launches_of(t, names)
    assert got == [dict(kernel="_residual_gemv_kernel", programs=5, sms=3, max_per_sm=3, spread_ns=40, start_ns=100),
                   dict(kernel="_attn_prologue_kernel", programs=2, sms=1, max_per_sm=2, spread_ns=0, start_ns=500)]


def test_instrumented_copies_compile_for_sm90_with_the_record(tmp_path, monkeypatch):
    from sampling_stats import compile_sm90

    files = [("placed_res", "lowlat.kernels.out_proj", "_residual_gemv_kernel", []),
             ("placed_att_none", "lowlat.kernels.decode_attention", "_decode_attention_kernel", NO_TRIGGER),
             ("placed_att_start", "lowlat.kernels.decode_attention", "_decode_attention_kernel",
              sp.ATTN_TRIGGER_EDITS["start"])]
    for file, mod, kernel, edits in files:
        (tmp_path / f"{file}.py").write_text(
            sp.HEADER.format(module=mod) + sp.instrumented_source(_src(mod, kernel), f"{kernel}_placed", 2, edits))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    ptr = {n: "*bf16" for n in ("a_ptr", "w_ptr", "res_ptr", "out_ptr", "nw_ptr", "h_ptr")}
    ptr.update(rstd_ptr="*fp32", ws_ptr="*fp32", ss_ptr="*fp32", cnt_ptr="*i32", _pl_tr="*i64")
    [res] = compile_sm90("placed_res:_residual_gemv_kernel_placed", [{
        "constexprs": dict(SPLIT=1, CPS=9, BN=16, BK=64, NUM_MB=1, NORM=False, WRITE_H=False, NT_P2=16, BH=512,
                           N_COLS=1, EVEN_N=True, EVEN_K=True, PF_K=1024, PRELOAD=False, USE_PDL=True,
                           UPCAST=False),
        "pointers": ptr, "scalars": {"eps": "fp32"}, "launch_pdl": True, "ptx": True}])
    assert "%smid" in res["ptx"] and "%globaltimer" in res["ptx"]
    assert "griddepcontrol.launch_dependents" in res["ptx"]
    att_spec = {
        "constexprs": dict(G=3, G_PAD=16, D=64, BLOCK_N=64, MAX_SPLITS=32, GROUPS=32, CHUNK=8, NVR_FROM_PTR=True,
                           PRE_KV=True, LOC_PAD=16, USE_PDL=True, TRIGGER_AFTER_KV=True, INTERP=False),
        "pointers": dict(q_ptr="*bf16", kc_ptr="*bf16", vc_ptr="*bf16", pt_ptr="*i32", req_ptr="*i32",
                         pos_ptr="*i64", nvr_ptr="*i32", loc_ptr="*i32", o_ptr="*bf16", wso_ptr="*fp32",
                         wsml_ptr="*fp32", cnt_ptr="*i32", _pl_tr="*i64"),
        "scalars": {"qk_scale": "fp32"}, "launch_pdl": True, "ptx": True}
    [none] = compile_sm90("placed_att_none:_decode_attention_kernel_placed", [att_spec])
    assert "%smid" in none["ptx"] and "griddepcontrol.wait" in none["ptx"]
    assert "griddepcontrol.launch_dependents" not in none["ptx"]
    start_spec = dict(att_spec, constexprs=dict(att_spec["constexprs"], TRIGGER_AFTER_KV=False))
    for spec in (att_spec, start_spec):
        [copy] = compile_sm90("placed_att_start:_decode_attention_kernel_placed", [spec])
        assert copy["ptx"].count("griddepcontrol.launch_dependents") == 1


def test_placement_installs_proxies_that_refuse_oversized_grids_and_restores_the_kernels():
    from lowlat.kernels import decode_attention, out_proj

    real = out_proj._residual_gemv_kernel, decode_attention._decode_attention_kernel
    pl = sp.Placement("cpu", attn_trigger="none")
    try:
        assert out_proj._residual_gemv_kernel is not real[0]
        assert pl.names[:3] == ["_attn_prologue_kernel", "_decode_attention_kernel", "_residual_gemv_kernel"]
        with pytest.raises(ValueError, match="programs > 16384"):
            out_proj._residual_gemv_kernel[(129, 128)]
        out_proj._residual_gemv_kernel[(128, 128)]                  # within the trace: a launcher
        assert out_proj._residual_gemv_kernel.arg_names == real[0].arg_names   # attributes pass through
    finally:
        pl.restore()
    assert (out_proj._residual_gemv_kernel, decode_attention._decode_attention_kernel) == real


class _Stop(Exception):
    pass


@pytest.mark.parametrize("trigger, expected", [("start", False), ("after_kv", True)])
def test_attention_proxy_sets_the_trigger_constexpr_on_every_launch(trigger, expected):
    """--attn-trigger start: the proxy launches the copy with TRIGGER_AFTER_KV False whatever the wrapper passed
    (the kernel's own "start" release); after_kv leaves the wrapper's value. Seen where the launch options are
    settled (`match_residency`), stopped before any launch."""
    from lowlat.kernels import decode_attention

    seen = []

    def spy(kname, real, kernel, grid, args, kw, tr):
        seen.append(dict(kw))
        raise _Stop

    pl = sp.Placement("cpu", attn_trigger=trigger)
    pl.match_residency = spy
    try:
        with pytest.raises(_Stop):
            decode_attention._decode_attention_kernel[(1, 1, 1)](USE_PDL=True, TRIGGER_AFTER_KV=True)
    finally:
        pl.restore()
    assert seen == [{"USE_PDL": True, "TRIGGER_AFTER_KV": expected}]


class _Compiled:
    def __init__(self, regs, shared, warps=4):
        from types import SimpleNamespace
        self.n_regs, self.metadata = regs, SimpleNamespace(shared=shared, num_warps=warps)

    def _init_handles(self):
        pass


class _Kernel:
    def __init__(self, compiled=None, error=None):
        self.compiled, self.error, self.calls = compiled, error, []

    def warmup(self, *args, grid, **kw):
        self.calls.append((grid, kw))
        if self.error:
            raise self.error
        return self.compiled


def test_match_residency_caps_the_copy_at_the_production_registers_only_when_it_would_hold_fewer():
    pl = sp.Placement("cpu")
    try:
        # 83 registers (rounded to 88) x 128 threads: 5 programs an SM; production's 80: 6 -> capped at 80
        got = pl.match_residency("att", _Kernel(_Compiled(80, 12288)), _Kernel(_Compiled(83, 12288)), (32, 3, 6),
                                 (), {"num_warps": 4}, None)
        assert got == {"maxnreg": 80}
        assert pl.resources["att"]["real_per_sm"] == 6 and pl.resources["att"]["copy_per_sm"] == 5
        # 44 vs 48 registers, 28 KB shared: 7 either way (shared memory bounds it) -> not capped
        assert pl.match_residency("op", _Kernel(_Compiled(44, 28672)), _Kernel(_Compiled(48, 28672)), (36,), (),
                                  {}, None) == {}
        assert pl.resources["op"]["capped_to_maxnreg"] is None
        # a failure to compile without launching is recorded, never raised
        assert pl.match_residency("bad", _Kernel(error=RuntimeError("no GPU")), _Kernel(), (1,), (), {}, None) == {}
        assert pl.resources["bad"]["error"].startswith("RuntimeError: no GPU")
    finally:
        pl.restore()


@pytest.mark.parametrize("variant", ["stamps", "late", "probe", "warm"])
def test_explore25_traced_out_proj_sources(variant):
    """explore25's stamped copies of the residual GEMV (session 12's runs): valid Python, every stamp placed,
    and each variant's one change where it was meant to be."""
    import explore25

    src = explore25.traced_source(variant)
    fn = next(n for n in ast.parse(src).body if isinstance(n, ast.FunctionDef) and n.name.endswith("_traced"))
    body = ast.unparse(fn)
    stamps = [body.index(f"_t{i} = ") for i in range(5)]
    assert stamps == sorted(stamps), stamps
    wait = body.index("gdc_wait()")
    trigger = body.index("gdc_launch_dependents()", wait)    # the one after the wait (EARLY_RELEASE's is before it)
    if variant == "late":                         # the trigger after the GEMV products (t2), not at the wait
        assert body.index("_t2 = ") < trigger and body.count("gdc_launch_dependents()") == 2
    else:
        assert wait < trigger < body.index("_t1 = ", wait)
    assert ("for _it in range(M * 0, 2)" in body) == (variant == "warm")
    assert ("tl.store(_b + 6, _pl_smid())" in body) == (variant != "probe")


def test_explore29_stamps_the_attention_in_chain_order_and_compiles_for_sm90(tmp_path, monkeypatch):
    """explore29's stamped decode attention (session 19, not yet run on a GPU): every stamp placed once, in the
    kernel's chain order (start, inputs ready, KV loop done, arrival, end), the record last; the copy compiles for
    sm_90 without spills, with and without the early first block and grouped, with PDL and %globaltimer in it."""
    from sampling_stats import compile_sm90

    import explore29

    src = explore29.traced_source()
    fn = next(n for n in ast.parse(src).body if isinstance(n, ast.FunctionDef) and n.name == explore29.NAME)
    body = ast.unparse(fn)
    assert fn.args.args[-1].arg == "_pl_tr"
    marks = ["_t0 = _pl_now()", "_t1 = _now_after(nvr)", "_t1 = _now_after(tl.sum(tl.sum(v0",
             "_t2 = _now_after(tl.sum(l_i", "_t3 = _now_after(cnt)", "_t4 = _pl_now()", "tl.store(_b + 7"]
    at = [body.index(m) for m in marks]
    assert at == sorted(at) and all(body.count(m) == 1 for m in marks), at
    assert body.index("gdc_wait()") < body.index("_t1 = _now_after(tl.sum(tl.sum(v0"), "t1 after the early path's wait"
    (tmp_path / "traced_att.py").write_text(src)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    base = dict(G=3, G_PAD=16, D=64, BLOCK_N=64, MAX_SPLITS=32, GROUPS=32, CHUNK=4, NVR_FROM_PTR=True, PRE_KV=False,
                LOC_PAD=16, USE_PDL=True, TRIGGER_AFTER_KV=True, INTERP=False)
    ptrs = dict(q_ptr="*bf16", kc_ptr="*bf16", vc_ptr="*bf16", pt_ptr="*i32", req_ptr="*i32", pos_ptr="*i64",
                nvr_ptr="*i32", loc_ptr="*i32", o_ptr="*bf16", wso_ptr="*fp32", wsml_ptr="*fp32", cnt_ptr="*i32",
                _pl_tr="*i64")
    specs = [{"constexprs": dict(base, **over), "pointers": ptrs, "scalars": {"qk_scale": "fp32"},
              "launch_pdl": True, "ptx": True, "num_stages": stages}
             for over, stages in ((dict(), 3), (dict(PRE_KV=True), 3), (dict(GROUPS=1, G=4), 5))]
    for info in compile_sm90(f"traced_att:{explore29.NAME}", specs):
        assert info["spill_bytes"] == 0, info["spill_bytes"]
        assert info["ptx"].count("%globaltimer") >= 4 and "%smid" in info["ptx"]
        # the stamps after a value read the timer under a predicate on it (an asm comment orders nothing)
        assert info["ptx"].count("@!p mov.u64") >= 2 and "setp.eq.u32" in info["ptx"]
        assert "griddepcontrol.wait" in info["ptx"]


def test_explore29_summarizes_a_launch_from_its_programs_records():
    import explore29

    t = torch.zeros(16, explore29.FIELDS, dtype=torch.int64)
    base = 1_800_000_000_000_000_000          # %globaltimer's size on the H200: a double steps by 256 ns there
    # t0, t1, t2, t3, t4, SM, flags, written: two programs with work (one combines), one without
    t[0] = torch.tensor([100, 301, 901, 1003, 1103, 5, 1, 1])
    t[1] = torch.tensor([120, 321, 1021, 1221, 2041, 6, 3, 1])
    t[7] = torch.tensor([110, 310, 110, 110, 400, 5, 0, 1])
    t[[0, 1, 7], :5] += base
    s = explore29.summarize_slot(t)
    assert s["programs"] == 3 and s["with_work"] == 2 and s["combiners"] == 1 and s["sms"] == 2
    assert s["start_to_ready"] == 201 and s["kv_loop"] == 600 and s["arrival"] == 102   # lower medians of 2
    assert s["combine"] == 820 and s["span"] == 2041 - 301 and s["ready_spread"] == 20
    assert explore29.summarize_slot(torch.zeros(4, explore29.FIELDS, dtype=torch.int64)) is None
    trace = torch.stack([t, torch.zeros_like(t)])
    assert explore29.summarize(trace, 2)["launches"] == 1
