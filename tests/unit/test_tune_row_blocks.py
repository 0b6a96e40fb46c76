"""The tuner's wide stage (`lowlat.bench.compose_row_block_plan`, `_tune_row_blocks`): after the narrow widths pick a
winner, the candidates of the same arithmetic are timed at 2 and 3 row blocks and the fastest weight stream (preload /
stages / pf_k; and bn for the residual / qkv kinds, session 18) becomes the winner's `by_row_blocks` override
there. The composition is tested as a pure function on
SmolLM2's down projection [576, 1536] (its default preload plan and the legacy / table stream plans tile alike); the
stage itself end to end at a tiny shape under the interpreter, with the GPU timer replaced by a table of fake times
(every timed launch still runs once) and the composed plan's `_GemvCase.check` run for real.
"""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from lowlat import bench
from lowlat.bench import _GemvCase, _parse_rows, compose_row_block_plan
from lowlat.benchmarking import Budget
from lowlat.kernels._gemv import candidate_plans, plan_gemv, plans_from_json, row_blocks


def down_plans():
    """(preload default, legacy stream, table stream with a preload override at 2 row blocks, bn 16 stream): the
    first three tile SmolLM2's down projection alike (block_k 128, split 6, bn 64), the fourth does not."""
    c = dict(candidate_plans("residual", 576, 1536))
    pre, legacy, table, narrow = c["default"], c["legacy"], c["tuned"], c["stream_bn16_split1_deep"]
    assert pre.preload and not legacy.preload and table.at(1) != legacy and table.at(2).preload
    assert (pre.block_k, pre.split, pre.bn) == (legacy.block_k, legacy.split, legacy.bn) == (128, 6, 64)
    assert narrow.bn == 16
    return pre, legacy, table, narrow


def test_a_stream_faster_at_three_row_blocks_overrides_a_preload_winner_there_only():
    pre, legacy, _, _ = down_plans()
    got = compose_row_block_plan(pre, {2: [(10.0, pre), (11.0, legacy)], 3: [(10.0, pre), (7.0, legacy)]})
    assert got.by_row_blocks == ((3, (("pf_k", legacy.pf_k), ("preload", False), ("stages", legacy.stages))),)
    assert got.at(1) == pre and got.at(2) == pre and got.at(3) == legacy


def test_the_winner_fastest_everywhere_gets_no_override():
    pre, legacy, table, _ = down_plans()
    got = compose_row_block_plan(pre, {2: [(10.0, pre), (11.0, legacy), (12.0, table)],
                                       3: [(10.0, pre), (10.5, legacy)]})
    assert got == pre and got.by_row_blocks == ()
    assert compose_row_block_plan(pre, {}) == pre


def test_a_plan_of_other_arithmetic_is_never_mixed_in():
    """The bn 16 plan is fastest at both counts: ignored; at 3 row blocks the fastest plan of the winner's tiling
    (legacy) wins instead, at 2 the winner's own stream stays."""
    pre, legacy, _, narrow = down_plans()
    got = compose_row_block_plan(pre, {2: [(10.0, pre), (1.0, narrow)],
                                       3: [(1.0, narrow), (10.0, pre), (7.0, legacy)]})
    assert got.at(2) == pre and got.at(3) == legacy
    assert all(got.at(b).bn == pre.bn for b in (1, 2, 3))


def test_ties_keep_the_winners_stream():
    pre, legacy, table, _ = down_plans()
    assert compose_row_block_plan(pre, {3: [(10.0, pre), (10.0, legacy)]}) == pre
    assert compose_row_block_plan(pre, {3: [(10.0, legacy), (10.0, pre)]}) == pre     # order does not matter
    # a width-dependent winner (the table: preload at 2 row blocks) keeps its override on a tie there
    assert compose_row_block_plan(table, {2: [(10.0, table), (10.0, legacy), (10.0, pre)]}) == table


def test_a_width_dependent_winner_is_recomposed_at_the_timed_counts_only():
    """The table's plan (stream, preload at 2 row blocks): where its base stream wins at 2 row blocks the override is
    dropped (normal form); a count whose list lacks the winner's own stream keeps it (nothing to compare with)."""
    pre, legacy, table, _ = down_plans()
    base = table.at(1)
    assert compose_row_block_plan(table, {2: [(10.0, table), (8.0, base)]}) == base
    assert compose_row_block_plan(table, {2: [(8.0, legacy)]}) == table              # no timing of table.at(2)
    got = compose_row_block_plan(table, {3: [(10.0, table), (5.0, pre)]})
    assert got.at(2) == table.at(2) and got.at(3) == replace(base, preload=True, stages=1, pf_k=0)


def test_bn_is_an_override_field_for_the_residual_kind_only():
    """For the residual kind (`_gemv.BN_BY_ROW_BLOCKS_KINDS`) a faster plan that differs from the winner only in bn
    and its stream wins a row-block count, bn included; for gate_up / lm_head (or no kind) it is other arithmetic."""
    pre, legacy, _, _ = down_plans()
    wide = replace(legacy, bn=32)
    assert bench._arithmetic(wide, "residual") == bench._arithmetic(pre, "residual")
    assert bench._arithmetic(wide) != bench._arithmetic(pre)
    got = compose_row_block_plan(pre, {3: [(10.0, pre), (7.0, legacy), (5.0, wide)]}, "residual")
    assert got.at(1) == pre and got.at(2) == pre and got.at(3) == wide and got.bn_by_width
    assert compose_row_block_plan(pre, {3: [(10.0, pre), (7.0, legacy), (5.0, wide)]}, "gate_up").at(3) == legacy
    assert compose_row_block_plan(pre, {3: [(10.0, pre), (5.0, wide)]}) == pre


def test_tune_wide_rows_argument_parses():
    assert _parse_rows("24,48") == (24, 48) and _parse_rows(" 17 , 33,") == (17, 33)
    assert _parse_rows("") == () and _parse_rows(None) == ()
    for bad in ("49", "0", "x"):
        with pytest.raises(SystemExit, match="--tune-wide-rows"):
            _parse_rows(bad)


# ------------------------------------------------------------------------------------ the stage under the interpreter
N, K = 96, 80
STREAM = plan_gemv(N, K, kind="residual", preload=False, bn=16, block_k=16, split=2, stages=3, pf_k=32)
PRE = replace(STREAM, preload=True, stages=1, pf_k=0)
OTHER = plan_gemv(N, K, kind="residual", preload=False, bn=32, block_k=16, split=1, stages=3, pf_k=32)
WIDER = plan_gemv(N, K, kind="residual", preload=False, bn=32, block_k=16, split=2, stages=4, pf_k=32)


def fake_us(plan, rows):
    """us of a launched plan (no by_row_blocks) at rows: the stream wins at 1-16 and 17-32 rows, the preload at
    33-48; the bn 32 plans (OTHER: split 1, other arithmetic; WIDER: the stream's tiling but bn 32) are slowest
    narrow and fastest wide."""
    if plan.bn == 32:
        return 3.0 if rows <= 16 else (1.0 if plan.split == 1 else 2.0)
    if rows <= 16:
        return 2.0 if plan.preload else 1.0
    return {24: (11.0, 10.0), 48: (5.0, 10.0)}[rows][0 if plan.preload else 1]


@pytest.fixture
def tuner(monkeypatch):
    """(case, timed launches [(launched plan, rows)], checked plans, recorder, run(budget, wide_rows, candidates) ->
    entry) for the tiny residual shape, candidates stream / preload / bn 32 by default, with `graph_time_us` replaced
    by `fake_us` of the plan its launch ran (the launch runs once, under the interpreter)."""
    case = _GemvCase("residual", N, K, 1e-5, "cpu", copies=1)
    launches, timed, checked = [], [], []
    launch, check = case.launch, case.check

    def spy_launch(plan, rows, idx):
        launches.append((plan.at(row_blocks(rows)), rows))
        return launch(plan, rows, idx)

    def spy_check(plan, *a, **kw):
        checked.append(plan)
        return check(plan, *a, **kw)

    def fake_time(fn, n, iters):
        fn(0)
        timed.append(launches[-1])
        return fake_us(*launches[-1])

    case.launch, case.check = spy_launch, spy_check
    monkeypatch.setattr(bench, "graph_time_us", fake_time)
    rec = bench._Recorder(None, {})

    def run(budget=None, wide_rows=(24, 48), candidates=(("stream", STREAM), ("preload", PRE), ("bn32", OTHER))):
        return bench._tune_shape(case, list(candidates), rec,
                                 budget or Budget(3600), "tiny", 1000.0, dict(model="tiny", op="residual", n=N, k=K),
                                 rows_list=(1, 6), wide_rows=wide_rows)
    return case, timed, checked, rec, run


@pytest.mark.interpreter
def test_tuner_proposes_a_row_block_override_that_passes_the_check_and_survives_json(tuner):
    """Stream wins at 1 and 6 rows; at 24 rows (2 row blocks) too; at 48 (3) the preload: the entry's plan is the
    stream with a preload override at 3 row blocks, checked (`_GemvCase.check`, every row-block count) before it is
    returned; the bn 32 plan is not timed wide; every wide time is recorded; the JSON table gives the plan back."""
    case, timed, checked, rec, run = tuner
    entry = run()
    want = replace(STREAM, by_row_blocks={3: dict(preload=True, stages=1, pf_k=0)})
    assert entry["label"] == "stream+by_row_blocks" and entry["us"] == {"1": 1.0, "6": 1.0}
    assert [(p.bn, p.preload, r) for p, r in timed if r > 16] == [(16, False, 24), (16, True, 24),
                                                                 (16, False, 48), (16, True, 48)]
    assert entry["wide_us"] == {"24": {"stream": 10.0, "preload": 11.0}, "48": {"stream": 10.0, "preload": 5.0}}
    assert checked[-1] == want                                     # the composed plan was checked, last
    wide = [(r["rows"], r["variant"], r["us"]) for r in rec.doc["results"] if r["rows"] > 16]
    assert wide == [(24, "stream", 10.0), (24, "preload", 11.0), (48, "stream", 10.0), (48, "preload", 5.0)]
    assert not rec.doc["errors"] and not rec.doc["skipped"]
    table = plans_from_json(json.loads(json.dumps([entry])))
    assert plan_gemv(N, K, kind="residual", table=table) == want


@pytest.mark.interpreter
def test_tuner_keeps_the_winner_when_the_composed_plan_fails_its_check(tuner):
    """(The candidates' own checks are skipped here: the previous test runs them.)"""
    case, _, _, rec, run = tuner

    def failing(plan, *a, **kw):
        if plan.by_row_blocks:
            raise AssertionError("rows_20_vs_48 differ")

    case.check = failing
    entry = run()
    assert entry["label"] == "stream" and plan_gemv(N, K, kind="residual", table=plans_from_json([entry])) == STREAM
    assert [e["where"] for e in rec.doc["errors"]] == ["tiny/by_row_blocks"]


@pytest.mark.interpreter
def test_tuner_skips_the_wide_stage_when_the_budget_runs_short(tuner):
    """A budget spent after the narrow timings (3 candidates x 2 rows): no wide launch is timed, the narrow winner is
    kept and the skip recorded; wide_rows=() turns the stage off, and so do rows of one row block (the narrow
    timing's). (No check runs: the first test runs them.)"""
    case, timed, _, rec, run = tuner
    case.check = lambda plan, *a, **kw: None
    budget = type("B", (), {"left": lambda self: 100.0 if len(timed) < 6 else 0.0})()
    entry = run(budget)
    assert len(timed) == 6 and entry["label"] == "stream" and entry["plan"]["by_row_blocks"] == ()
    assert [s["where"] for s in rec.doc["skipped"]] == ["tiny/rows=24,48"]
    for wide_rows in ((), (16,)):
        timed.clear()
        entry = run(wide_rows=wide_rows)
        assert len(timed) == 6 and entry["label"] == "stream" and entry["wide_us"] == {}


@pytest.mark.interpreter
def test_tuner_proposes_a_wider_bn_of_the_winners_tiling_for_the_residual_kind(tuner):
    """WIDER (the stream's block_k / split / warps, bn 32, 4 stages) is slower narrow, faster than the stream at 24
    rows (2.0 against 10.0 us) and than the preload at 48 (2.0 against 5.0): for the residual kind its bn and stream
    become the overrides at 2 and 3 row blocks; OTHER (split 1) is never timed wide. The composed plan passes
    `_GemvCase.check` (bitwise 6 / 20 rows against 48 under the interpreter) and survives JSON."""
    case, timed, checked, rec, run = tuner
    entry = run(candidates=(("stream", STREAM), ("preload", PRE), ("bn32", OTHER), ("wider", WIDER)))
    stream_of_wider = dict(bn=32, preload=False, stages=4, pf_k=32)
    want = replace(STREAM, by_row_blocks={2: stream_of_wider, 3: stream_of_wider})
    assert entry["label"] == "stream+by_row_blocks" and entry["wide_us"]["48"]["wider"] == 2.0
    assert not any(p.split == 1 for p, r in timed if r > 16)
    assert checked[-1] == want
    assert plan_gemv(N, K, kind="residual", table=plans_from_json(json.loads(json.dumps([entry])))) == want


@pytest.mark.interpreter
def test_a_bn_by_width_winner_keeps_its_bn_and_every_row_records_the_launched_plan(tuner):
    """A candidate that launches the stream plan at 1 row block and bn 32 at 3 (`by_row_blocks` bn, allowed for the
    residual kind) ties with the stream at 1 and 6 rows, so `pick_tuned` keeps it; at 48 rows the plans of its
    arithmetic there (for the residual kind bn is not part of it: the bn 16 stream too) are compared, and its own bn
    32 launch is faster (2.0 against 10.0 us): the entry is that plan, bn by width included, and it survives JSON.
    Each recorded row names the candidate (`plan`) and what its launch ran (`launched`: bn 32, 3 tiles at 48 rows,
    where the candidate's base is bn 16, 6 tiles)."""
    case, timed, _, rec, run = tuner
    by_bn = replace(STREAM, by_row_blocks={3: dict(bn=32)})
    entry = run(wide_rows=(48,), candidates=(("stream", STREAM), ("by_bn", by_bn)))
    assert entry["label"] == "by_bn" and entry["wide_us"] == {"48": {"stream": 10.0, "by_bn": 2.0}}
    assert plan_gemv(N, K, kind="residual", table=plans_from_json(json.loads(json.dumps([entry])))) == by_bn
    assert [(p.bn, r) for p, r in timed] == [(16, 1), (16, 6), (16, 1), (16, 6), (16, 48), (32, 48)]
    rows = [(r["variant"], r["rows"], r["plan"]["n_tiles"], r["launched"]["bn"], r["launched"]["n_tiles"])
            for r in rec.doc["results"]]
    assert rows == [("stream", 1, 6, 16, 6), ("stream", 6, 6, 16, 6), ("by_bn", 1, 6, 16, 6), ("by_bn", 6, 6, 16, 6),
                    ("stream", 48, 6, 16, 6), ("by_bn", 48, 6, 32, 3)]
