"""Tile plans of the fused GEMVs (lowlat.kernels._gemv): what `plan_gemv` returns for the fused step's
shapes, the tuned table and its JSON override, forced fields, refusals, and the tuner's candidates —
each one correct (numerics policy at 48 rows, rows bitwise independent of the row-block count) under
the interpreter at tiny shapes, checked by the same `lowlat.bench._GemvCase.check` the GPU tuner uses.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, replace

import pytest
import triton
import triton.language as tl

from lowlat.bench import _GemvCase
from lowlat.config import preset
from lowlat.errors import StepContractError, UnsupportedConfigError
from lowlat.kernels import _gemv
from lowlat.kernels._gemv import (MAX_SPLIT, GemvPlan, candidate_plans, default_plan, launch_constexprs, legacy_plan,
                                  plan_gemv, plans_from_json)


def step_shapes(model: str):
    cfg = preset(model)
    h, i = cfg.hidden_size, cfg.intermediate_size
    return [("residual", h, cfg.q_size), ("out_proj", h, cfg.q_size), ("gate_up", i, h), ("residual", h, i),
            ("lm_head", cfg.vocab_size, h)]


@pytest.mark.parametrize("model", ["SmolLM2-135M", "Llama-3.2-1B", "Qwen2.5-0.5B"])
def test_default_plans_of_step_shapes_are_valid_and_cover_k(model):
    for kind, n, k in step_shapes(model):
        p = plan_gemv(n, k, kind=kind, table={})
        assert p == default_plan(n, k, kind=kind, pair=kind == "gate_up")
        assert 1 <= p.split <= MAX_SPLIT and p.split * p.span >= k > (p.split - 1) * p.span
        assert (p.split == 1) if kind == "lm_head" else True
        if p.preload:
            assert p.weight_bytes_per_program(kind == "gate_up") <= _gemv.PRELOAD_MAX_BYTES
            assert p.preload_smem(kind == "gate_up") <= _gemv.PRELOAD_MAX_SMEM


def test_plan_is_a_function_of_kind_n_k_only():
    a = plan_gemv(1536, 576, kind="gate_up")
    b = plan_gemv(1536, 576, kind="gate_up")
    assert a == b and a == plan_gemv(1536, 576, pair=True)
    assert plan_gemv(576, 576, kind="lm_head").split == 1


def test_tuned_table_and_json_override(tmp_path, monkeypatch):
    base = default_plan(576, 576, kind="residual")
    other = GemvPlan(n=576, k=576, block_k=64, split=1, chunks_per_split=9, bn=16, preload=False, warps=4, stages=8,
                     pf_k=1024)
    fields = {f: v for f, v in asdict(other).items() if f not in ("n", "k")}
    assert plan_gemv(576, 576, kind="residual", table={("residual", 576, 576): fields}) == other
    assert plan_gemv(576, 576, kind="out_proj", table={("residual", 576, 576): fields}) != other   # keyed by kind
    path = tmp_path / "plans.json"
    path.write_text(json.dumps([dict(kind="residual", n=576, k=576, plan=other.describe())]))
    assert plans_from_json(json.loads(path.read_text())) == {("residual", 576, 576): fields}
    monkeypatch.setenv("LOWLAT_GEMV_PLANS", str(path))
    assert plan_gemv(576, 576, kind="residual") == other
    assert plan_gemv(576, 576, kind="residual", split=2) != other          # forced fields bypass the table
    monkeypatch.delenv("LOWLAT_GEMV_PLANS")
    assert plan_gemv(576, 576, kind="residual") == plan_gemv(576, 576, kind="residual", table=_gemv.TUNED_PLANS)
    assert plan_gemv(576, 576, kind="residual", table={}) == base
    # a missing or malformed table names the variable and the path (was FileNotFoundError / JSONDecodeError)
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    wrong = tmp_path / "wrong.json"
    wrong.write_text(json.dumps([dict(kind="residual", n=576)]))
    for p in (tmp_path / "missing.json", bad, wrong):
        monkeypatch.setenv("LOWLAT_GEMV_PLANS", str(p))
        with pytest.raises(UnsupportedConfigError, match=f"LOWLAT_GEMV_PLANS='{p}'"):
            plan_gemv(576, 576, kind="residual")


def test_forced_fields_rederive_split_and_stay_valid():
    p = plan_gemv(576, 1536, kind="residual", preload=True, bn=64)
    assert p.preload and p.bn == 64 and p.weight_bytes_per_program() <= _gemv.PRELOAD_MAX_BYTES
    assert p.preload_smem() <= _gemv.PRELOAD_MAX_SMEM
    q = plan_gemv(576, 1536, kind="residual", preload=False, bn=16, split=1, stages=8)
    assert not q.preload and q.split == 1 and q.chunks_per_split == 12 and q.stages == 8
    r = plan_gemv(100, 80, block_k=16, split=3)
    assert r.split == 3 and r.split * r.span >= 80


@pytest.mark.parametrize("bad, match", [
    (dict(bn=48), "bn=48"),
    (dict(split=MAX_SPLIT + 1), "split=9"),
    (dict(block_k=24), "block_k=24"),
    (dict(kind="attention"), "kind 'attention'"),
    (dict(warps=2), "warps=2"),
])
def test_bad_plan_fields_raise_typed_error(bad, match):
    with pytest.raises(StepContractError, match=match):
        plan_gemv(576, 576, **bad)
    with pytest.raises(StepContractError, match="N=0"):
        plan_gemv(0, 576)


@pytest.mark.parametrize("model", ["SmolLM2-135M", "Llama-3.2-1B"])
def test_candidates_start_with_default_include_legacy_and_are_distinct(model):
    for kind, n, k in step_shapes(model):
        if kind == "out_proj":
            continue
        cands = candidate_plans(kind, n, k)
        labels = [lbl for lbl, _ in cands]
        assert labels[0] == "default" and cands[0][1] == default_plan(n, k, kind=kind, pair=kind == "gate_up")
        assert "legacy" in labels or legacy_plan(n, k, kind=kind, pair=kind == "gate_up") == cands[0][1]
        plans = [p for _, p in cands]
        assert len(set(plans)) == len(plans) >= 3
        assert all(p.split == 1 for p in plans) if kind == "lm_head" else True


@pytest.mark.parametrize("kind, n, k", [("residual", 96, 80), ("out_proj", 96, 80), ("gate_up", 80, 64),
                                        ("lm_head", 200, 64)])
def test_every_candidate_passes_the_tuners_check(device, kind, n, k):
    """The tuner's correctness gate (policy at 48 rows, rows bitwise independent of row blocks) on
    every candidate plan of a tiny shape (out_proj: the norm epilogue's h and x), under the interpreter on the CPU,
    on the GPU on a GPU runner."""
    case = _GemvCase(kind, n, k, 1e-5, device, copies=1)
    cands = candidate_plans(kind, n, k)
    assert len(cands) >= 3
    for label, plan in cands:
        case.check(plan, rows=20, small=3)


def test_wide_candidates_cover_the_bandwidth_shapes_and_are_valid():
    """The extra stream plans timed for weights above LATENCY_BYTES (SmolLM2's LM head, Llama's down
    projection): present, distinct, within the shared-memory bound, lm_head always split 1."""
    for kind, n, k in [("lm_head", 49152, 576), ("residual", 2048, 8192)]:
        cands = candidate_plans(kind, n, k)
        labels = [lbl for lbl, _ in cands]
        assert sum(lbl.startswith("w_") for lbl in labels) >= 6
        plans = [p for _, p in cands]
        assert len(set(plans)) == len(plans)
        for p in plans:
            assert p.split * p.span >= k > (p.split - 1) * p.span
            assert (p.split == 1) if kind == "lm_head" else p.split <= MAX_SPLIT
    assert not any(lbl.startswith("w_") for lbl, _ in candidate_plans("residual", 576, 1536))   # latency regime


@pytest.mark.parametrize("kind, n, k", [("lm_head", 300, 96), ("residual", 96, 512)])
def test_wide_candidate_fields_pass_the_tuners_check(device, kind, n, k):
    """The wide candidates' tilings (bn 32..128, block_k 64..256, split 4 / 8, masked K) forced on a
    tiny shape pass the tuner's correctness gate (the interpreter on the CPU, the GPU on a GPU runner)."""
    case = _GemvCase(kind, n, k, 1e-5, device, copies=1)
    for label, fields in _gemv._wide_candidates(kind):
        case.check(plan_gemv(n, k, kind=kind, **fields), rows=20, small=3)


@pytest.mark.parametrize("kind, n, k", [("residual", 96, 128), ("gate_up", 80, 128)])
def test_max_split_with_a_partial_last_tile_passes_the_tuners_check(device, kind, n, k):
    """Split-K MAX_SPLIT with N not a multiple of bn (the last tile's partials are stored and read only
    for the columns n < N, so nothing lands in the next slot): within the policy at 20 rows and the
    first 3 rows bitwise equal to a 3-row (one row block) launch (the interpreter on the CPU, the GPU on a GPU
    runner)."""
    p = plan_gemv(n, k, kind=kind, preload=False, bn=64, block_k=16, split=MAX_SPLIT)
    assert p.split == MAX_SPLIT and not p.even_n
    _GemvCase(kind, n, k, 1e-5, device, copies=1).check(p, rows=20, small=3)


def test_tune_shapes_argument_parses_kind_n_k():
    from lowlat.bench import _parse_shapes

    assert _parse_shapes(None) is None and _parse_shapes("") is None
    assert _parse_shapes("lm_head:49152x576, residual:2048X8192") == {("lm_head", 49152, 576),
                                                                      ("residual", 2048, 8192)}
    with pytest.raises(SystemExit, match="KIND:NxK"):
        _parse_shapes("lm_head-49152")


@triton.jit
def _prefetch_probe_kernel(w_ptr, N, K, BN: tl.constexpr, PF_K: tl.constexpr):
    """`_gemv.prefetch_l2` alone, for its sm_90 PTX."""
    _gemv.prefetch_l2(w_ptr, K, tl.program_id(0) * BN, N, 0, K, BN, PF_K)


def test_l2_prefetch_is_predicated_off_outside_the_weight():
    """Every `prefetch.global.L2` that prefetch_l2 emits is predicated on its lane's mask, so lines past K (PF_K
    1024 over K 576 leaves 7 of 16 masked, SmolLM2's out_proj plan) or past N prefetch nothing; unpredicated,
    the masked lanes all hit one line and cost the fused step 5 us per layer at 6 rows (session 10, call7)."""
    from sampling_stats import compile_sm90

    [info] = compile_sm90("test_gemv_plans:_prefetch_probe_kernel", [{
        "constexprs": {"BN": 16, "PF_K": 1024}, "pointers": {"w_ptr": "*bf16"}, "num_warps": 4, "ptx": True}])
    ptx = info["ptx"]
    n_prefetch = ptx.count("prefetch.global.L2")
    predicated = len(re.findall(r"@%?\w+\s+prefetch\.global\.L2", ptx))
    assert n_prefetch > 0 and predicated == n_prefetch, (n_prefetch, predicated)


@triton.jit
def _rstd_probe_kernel(ss_ptr, out_ptr, K_RT, eps, K: tl.constexpr, RUNTIME_K: tl.constexpr):
    """`_gemv.rstd_of(..., EXACT=True)` alone (K as the runtime int or the constexpr its callers pass), for its
    sm_90 PTX."""
    ss = tl.load(ss_ptr + tl.arange(0, 16))
    if RUNTIME_K:
        r = _gemv.rstd_of(ss, K_RT, eps, EXACT=True)
    else:
        r = _gemv.rstd_of(ss, K, eps, EXACT=True)
    tl.store(out_ptr + tl.arange(0, 16), r)


@pytest.mark.parametrize("runtime_k", [False, True])
def test_rstd_of_is_correctly_rounded_on_sm90(runtime_k):
    """rstd_of(EXACT=True)'s mean, sqrt and reciprocal are each correctly rounded in the sm_90 PTX (div.rn /
    sqrt.rn, no approximate div.full.f32, which Triton's `/` on fp32 emits and the CPU interpreter cannot show),
    so the RMSNorm kernel's statistic is torch's mean / rsqrt of the same sum of squares."""
    from sampling_stats import compile_sm90

    [info] = compile_sm90("test_gemv_plans:_rstd_probe_kernel", [{
        "constexprs": {"K": 576, "RUNTIME_K": runtime_k}, "pointers": {"ss_ptr": "*fp32", "out_ptr": "*fp32"},
        "scalars": {"eps": "fp32"}, "num_warps": 1, "ptx": True}])
    ptx = info["ptx"]
    assert "div.full" not in ptx and "div.approx" not in ptx, "an approximate divide in rstd_of"
    assert ptx.count("div.rn.f32") >= 2 and "sqrt.rn.f32" in ptx, ptx[-2000:]


def test_tuner_case_of_out_proj_checks_h_and_x(device):
    """`_GemvCase("out_proj")` (the tuner's case of the MoE layers' out_proj with its RMSNorm epilogue) fails a
    plan whose h is wrong, and one whose x is wrong: its check reads both outputs."""
    case = _GemvCase("out_proj", 96, 80, 1e-5, device, copies=1)
    plan = plan_gemv(96, 80, kind="out_proj", table={})
    case.check(plan, rows=20, small=3)
    launch = case.launch
    for broken in ("h", "out"):
        def bad(p, rows, idx, broken=broken, launch=launch):
            h = launch(p, rows, idx)
            case.inputs(rows)[broken][-1, 5] += 1.0            # one element of one output wrong
            return h
        case.launch = bad
        with pytest.raises(AssertionError, match=f"out_proj.{'h' if broken == 'h' else 'x'}"):
            case.check(plan, rows=20, small=3)
        case.launch = launch


def test_by_row_blocks_moves_the_weight_stream_only_and_survives_json():
    """`GemvPlan.by_row_blocks` (session 16): a launch of nmb row blocks runs `plan.at(nmb)`, the plan with that
    count's ROW_BLOCK_FIELDS (preload / stages / pf_k) and nothing else, and `launch_constexprs` is that plan's;
    the normal form goes through describe() -> JSON -> plans_from_json unchanged; an override whose plan is beyond the
    preload limits raises StepContractError (other refusals: the next tests)."""
    base = plan_gemv(96, 80, kind="residual", preload=False, bn=16, block_k=16, split=2)
    p = replace(base, by_row_blocks={2: dict(preload=True, stages=1, pf_k=0)})
    assert p.by_row_blocks == ((2, (("pf_k", 0), ("preload", True), ("stages", 1))),)
    assert p.at(1) == base and p.at(3) == base and p.at(2).by_row_blocks == ()
    assert p.at(2) == replace(base, preload=True, stages=1, pf_k=0)
    assert launch_constexprs(p, 2)["PRELOAD"] and launch_constexprs(p, 2)["num_stages"] == 1
    assert launch_constexprs(p, 1) == launch_constexprs(base, 1) and not launch_constexprs(p, 3)["PRELOAD"]
    doc = json.loads(json.dumps([dict(kind="residual", n=96, k=80, plan=p.describe())]))
    assert plan_gemv(96, 80, kind="residual", table=plans_from_json(doc)) == p
    wide = dict(block_k=128, split=1, chunks_per_split=64, bn=64, preload=False, warps=4, stages=4, pf_k=0,
                by_row_blocks={1: dict(preload=True)})           # 1 MB a program preloaded: over the limit
    with pytest.raises(StepContractError, match="preload plan"):
        plan_gemv(2048, 8192, kind="residual", table={("residual", 2048, 8192): wide})


def test_committed_width_dependent_plans():
    """The entries of TUNED_PLANS whose plan depends on the width: SmolLM2's down projection preloads at 2 row blocks
    only, Qwen3-30B-A3B's out_proj at 1 row block only (session 16); Llama-3.2-1B's prologue runs bn 32 at 1 row
    block and bn 64 at 2-3, its out_proj bn 32 at 2 row blocks and a stream at 3, its gate/up 6 stages at 2-3
    (session 17). Only residual and qkv entries change bn. Every entry is valid."""
    for (kind, n, k) in _gemv.TUNED_PLANS:
        plan = plan_gemv(n, k, kind=kind)                             # checked, by_row_blocks included
        assert not plan.bn_by_width or kind in _gemv.BN_BY_ROW_BLOCKS_KINDS
    down = plan_gemv(576, 1536, kind="residual")
    assert [down.at(b).preload for b in (1, 2, 3)] == [False, True, False]
    qwen = plan_gemv(2048, 4096, kind="out_proj")
    assert [qwen.at(b).preload for b in (1, 2, 3)] == [True, False, False]
    assert qwen.at(3) == default_plan(2048, 4096, kind="out_proj")   # the default tiling, streamed
    prologue = plan_gemv(1536, 2048, kind="qkv")
    assert [(prologue.at(b).bn, prologue.at(b).preload) for b in (1, 2, 3)] == [(32, True), (64, True), (64, True)]
    out = plan_gemv(2048, 2048, kind="residual")
    assert out.at(1) == default_plan(2048, 2048, kind="residual")
    assert [(out.at(b).bn, out.at(b).preload) for b in (1, 2, 3)] == [(64, True), (32, True), (64, False)]
    gate_up = plan_gemv(8192, 2048, kind="gate_up")
    assert [gate_up.at(b).stages for b in (1, 2, 3)] == [4, 6, 6] and not gate_up.bn_by_width


@pytest.mark.parametrize("kind, n, k", [("residual", 96, 80), ("out_proj", 96, 80), ("gate_up", 80, 64),
                                        ("lm_head", 200, 256)])
@pytest.mark.parametrize("stream_at", [1, 2])
def test_width_dependent_weight_stream_keeps_rows_bitwise(device, kind, n, k, stream_at):
    """A plan that streams at one row-block count and preloads at the other passes the tuner's gate (the
    interpreter on the CPU, the GPU on a GPU runner): the policy at 20 rows (2 row blocks) and the first 3 rows (1
    row block) bitwise equal to it. Under the interpreter only the fp32 logits of lm_head show a change of summation
    order here (bf16 outputs round it away: the preload chunks summed in reverse K order still passed for the other
    kinds); the GPU row-invariance tests of out_proj and the MLP (17 / 33 rows against 48) are the proof on the
    shapes that use it."""
    split = 1 if kind == "lm_head" else 2
    base = plan_gemv(n, k, kind=kind, preload=False, bn=16, block_k=16, split=split, stages=3, pf_k=32)
    other = 2 if stream_at == 1 else 1
    p = replace(base, by_row_blocks={other: dict(preload=True, stages=1, pf_k=0)})
    assert p.at(stream_at).preload is False and p.at(other).preload is True
    _GemvCase(kind, n, k, 1e-5, device, copies=1).check(p, rows=20, small=3)


@pytest.mark.parametrize("kind, module", [("residual", "out_proj"), ("out_proj", "out_proj"), ("gate_up", "mlp"),
                                          ("lm_head", "lm_head")])
@pytest.mark.interpreter
def test_launchers_run_the_plan_of_their_row_block_count(kind, module, monkeypatch):
    """Every GEMV launcher launches a width-dependent plan (`by_row_blocks`: preload at 2 row blocks only) with the
    weight stream of its launch's row-block count: 3 / 20 / 40 rows run stream / preload / stream."""
    import importlib

    from lowlat.testing import spy_launch_constexprs

    seen = spy_launch_constexprs(monkeypatch, importlib.import_module(f"lowlat.kernels.{module}"))
    n, k = (80, 64) if kind == "gate_up" else (96, 80)
    base = plan_gemv(n, k, kind=kind, preload=False, bn=16, block_k=16, split=1 if kind == "lm_head" else 2,
                     stages=3, pf_k=32)
    p = replace(base, by_row_blocks={2: dict(preload=True, stages=1, pf_k=0)})
    case = _GemvCase(kind, n, k, 1e-5, "cpu", copies=1)
    for rows in (3, 20, 40):
        case.launch(p, rows, 0)
    assert [(lc["PRELOAD"], lc["NUM_MB"]) for lc in seen] == [(False, 1), (True, 2), (False, 3)]
    assert [lc["num_stages"] for lc in seen] == [3, 1, 2]           # the stream loop one stage less at 3 blocks


def test_row_block_fields_normal_form_and_typed_refusals():
    """ROW_BLOCK_FIELDS holds no field that moves the arithmetic; overrides equal to the plan's own values (and counts
    left with none) are dropped, so plans that launch alike compare equal; JSON object keys ("2") are read; bad
    specs (fields that move the arithmetic, counts outside 1..3 or named twice, wrong types) raise StepContractError
    naming what is wrong (never a bare TypeError / ValueError, never a coercion)."""
    assert not set(_gemv.ROW_BLOCK_FIELDS) & {"n", "k", "block_k", "split", "chunks_per_split", "bn", "warps"}
    base = plan_gemv(96, 80, kind="residual", preload=False, bn=16, block_k=16, split=2, stages=3, pf_k=32)
    assert replace(base, by_row_blocks={1: {}, 3: dict(preload=False, stages=3)}) == base
    assert replace(base, by_row_blocks={"2": dict(preload=True)}).by_row_blocks == ((2, (("preload", True),)),)
    for bad, match in [({2: dict(split=4)}, "['split']"), ({1: dict(warps=8)}, "['warps']"),
                       ({4: dict(preload=True)}, "4 row blocks"), ([(1, {}), (1, dict(stages=3))], "twice"),
                       (5, "must map"), ([1, 2], "must map"), ({2: 5}, "must map"), ({"x": {}}, "'x' row blocks"),
                       ({0.5: {}}, "0.5 row blocks"), ({True: {}}, "True row blocks"),
                       ({2: dict(preload="false")}, "must be a bool"), ({2: dict(stages=2.7)}, "must be an int"),
                       ({2: dict(pf_k=True)}, "must be an int")]:
        with pytest.raises(StepContractError, match=re.escape(match)):
            replace(base, by_row_blocks=bad)
    with pytest.raises(StepContractError, match=re.escape("by_row_blocks[3]: stages=1 must be >= 2")):
        plan_gemv(96, 80, kind="residual", table={("residual", 96, 80): dict(
            block_k=16, split=2, chunks_per_split=3, bn=16, preload=False, warps=4, stages=3, pf_k=32,
            by_row_blocks={3: dict(stages=1)})})


def test_tuner_keeps_a_width_dependent_plan_that_ties_at_the_timed_widths():
    """`lowlat.bench.pick_tuned`: the fastest candidate, except that a candidate with `by_row_blocks` that launches the
    same plans as the winner at every row-block count the tuner timed is kept instead (Qwen3's out_proj: the table
    preloads at 1 row block only, `preload_bn64_maxsplit` preloads everywhere; at 1 and 6 rows they are the same
    launches and tie up to noise); a width-dependent candidate that differs at a timed width does not win that way."""
    from lowlat.bench import pick_tuned

    table = plan_gemv(2048, 4096, kind="out_proj")
    everywhere = table.at(1)
    stream = table.at(3)
    timed = [(21.8, "default", stream, {1: 10.8, 6: 11.0}), (18.2, "preload_bn64_maxsplit", everywhere, {1: 9.0, 6: 9.2}),
             (18.3, "tuned", table, {1: 9.1, 6: 9.2})]
    assert pick_tuned(timed, (1, 6)) == ("tuned", table, {1: 9.1, 6: 9.2})
    assert pick_tuned(timed[:2], (1, 6))[1] == everywhere
    assert pick_tuned(timed, (1, 48))[1] == everywhere        # 48 rows: the table streams, the winner preloads


@pytest.mark.interpreter
def test_bn_may_depend_on_the_width_for_residual_and_qkv_only():
    """Session 17: bn may be set per row-block count (`by_row_blocks` {b: {"bn": ...}}, `GemvPlan.bn_by_width`) for the
    kinds of BN_BY_ROW_BLOCKS_KINDS (residual, qkv: bn changes the MMA instruction, not the summation order; equal
    bits on the H200). `plan_gemv` refuses a table entry doing so for another kind, and the launchers whose
    epilogue reduces over a tile or that nothing measured (out_proj with its norm, gate/up, LM head) refuse such a
    plan with a StepContractError, their outputs untouched."""
    import torch

    from lowlat.numerics import poison

    assert _gemv.BN_BY_ROW_BLOCKS_KINDS == ("residual", "qkv")
    base = plan_gemv(96, 80, kind="residual", preload=False, bn=64, block_k=16, split=2, stages=3, pf_k=32)
    p = replace(base, by_row_blocks={1: dict(bn=16)})
    assert p.bn_by_width and not base.bn_by_width and not replace(base, by_row_blocks={1: dict(stages=2)}).bn_by_width
    assert p.at(1).bn == 16 and p.at(1).n_tiles == 6 and p.at(3) == base
    fields = {f: getattr(p, f) for f in ("block_k", "split", "chunks_per_split", "bn", "preload", "warps", "stages",
                                         "pf_k", "by_row_blocks")}
    assert plan_gemv(96, 80, kind="residual", table={("residual", 96, 80): fields}) == p
    for kind in ("out_proj", "gate_up", "lm_head"):
        with pytest.raises(StepContractError, match=f"the {kind} GEMV 96x80 cannot take a plan whose bn"):
            plan_gemv(96, 80, kind=kind, table={(kind, 96, 80): {**fields, "split": 1 if kind == "lm_head" else 2}})
    for kind, n, k in (("out_proj", 96, 80), ("gate_up", 80, 64), ("lm_head", 200, 256)):
        q = replace(plan_gemv(n, k, kind=kind, preload=False, bn=64, block_k=16, split=1 if kind == "lm_head" else 2,
                              stages=3, pf_k=32), by_row_blocks={1: dict(bn=16)})
        case = _GemvCase(kind, n, k, 1e-5, "cpu", copies=1)
        d = case.inputs(3)
        outs = [d[name] for name in ("out", "h", "rstd") if name in d]
        for t in outs:
            poison(t)
        with pytest.raises(StepContractError, match="cannot take a plan whose bn depends on the row-block count"):
            case.launch(q, 3, 0)
        assert all(bool(torch.isnan(t).all()) for t in outs), kind


def test_bn_by_width_launches_its_own_grid_and_keeps_rows_bitwise(device):
    """A residual plan of bn 64 that runs bn 16 at 1 row block and bn 32 at 2 is launched with each width's own grid
    (6 / 3 / 2 tiles of 96 columns: the base plan's 2 tiles would leave most columns of 3 rows unwritten, which the
    poisoned outputs show) and passes the tuner's gate: the policy at 40 rows, 3 and 20 rows bitwise equal to it.
    The base plan is checked first on the same case, as the tuner checks every candidate on one: its correct 3- and
    20-row outputs must not hide columns the bn-by-width plan leaves unwritten (`_GemvCase.check` poisons them)."""
    base = plan_gemv(96, 80, kind="residual", preload=False, bn=64, block_k=16, split=2, stages=3, pf_k=32)
    p = replace(base, by_row_blocks={1: dict(bn=16), 2: dict(bn=32, preload=True, stages=1, pf_k=0)})
    assert [p.at(b).n_tiles for b in (1, 2, 3)] == [6, 3, 2]
    case = _GemvCase("residual", 96, 80, 1e-5, device, copies=1)
    case.check(base, rows=40, small=(3, 20))
    case.check(p, rows=40, small=(3, 20))


def test_host_checks_for_aliasing_rows_eps_and_valid_rows():
    """The launchers' host-side checks (`_gemv`): `same_view` (the in-place form some outputs may take),
    `refuse_aliasing` (both tensors named, in-place pairs only as the same view), `check_rows_apart` (an output's rows
    need memory of their own), `check_eps` and `valid_rows_tensor` (typed refusals naming the value)."""
    import numpy as np
    import torch

    buf = torch.randn(4 * 64, generator=torch.Generator().manual_seed(0)).bfloat16()
    t = buf[:3 * 64].view(3, 64)
    assert _gemv.same_view(t, t) and _gemv.same_view(t, t.view(3, 64)[:])
    assert not _gemv.same_view(t, buf[64:4 * 64].view(3, 64)) and not _gemv.same_view(t, t.view(torch.int16))
    assert _gemv.same_view(buf[:64].view(1, 64), buf.as_strided((1, 64), (7, 1)))   # one row: its stride is free
    _gemv.refuse_aliasing(dict(out=t), dict(residual=t, w=buf[3 * 64:].view(1, 64), none=None), "{a} {b}",
                          in_place=dict(out=("residual",)))
    with pytest.raises(StepContractError, match="^out overlaps a: kernel reads a$"):
        _gemv.refuse_aliasing(dict(out=t), dict(a=t), "kernel reads {b}")
    with pytest.raises(StepContractError, match="out overlaps residual without being the same view"):
        _gemv.refuse_aliasing(dict(out=buf[64:4 * 64].view(3, 64)), dict(residual=t), "{a} {b}",
                              in_place=dict(out=("residual",)))
    with pytest.raises(StepContractError, match="h overlaps rstd: both are outputs"):
        _gemv.refuse_aliasing(dict(h=t, rstd=buf[100:102]), dict(), "{a} {b}")
    for ok in (t, buf[:64].view(1, 64).expand(1, 64), buf[:3].view(3, 1), buf.as_strided((2, 64), (100, 1))):
        _gemv.check_rows_apart("out", ok)
    for bad, stride in ((buf[:64].view(1, 64).expand(3, 64), 0), (buf.as_strided((3, 64), (63, 1)), 63)):
        with pytest.raises(StepContractError, match=rf"^out's rows overlap \(row stride {stride} < N=64\)"):
            _gemv.check_rows_apart("out", bad)
    assert _gemv.check_eps(1e-5) == 1e-5 and _gemv.check_eps(np.float32(0.5)) == 0.5
    for bad in ("1e-5", True, 0, -1.0, float("nan"), float("inf"), torch.tensor(1e-5), None):
        with pytest.raises(StepContractError, match=r"^eps=.* must be > 0 and finite"):
            _gemv.check_eps(bad)
    assert _gemv.valid_rows_tensor(2, 3, torch.device("cpu")).tolist() == [2]
    for bad in (True, 2.0, "2", np.int64(2), None):
        with pytest.raises(StepContractError, match=r"^num_valid_rows must be an int or a one-element int32 tensor"):
            _gemv.valid_rows_tensor(bad, 3, torch.device("cpu"))
    with pytest.raises(StepContractError, match=r"^num_valid_rows=4 must be in 1..M=3"):
        _gemv.valid_rows_tensor(4, 3, torch.device("cpu"))
