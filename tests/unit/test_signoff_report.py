"""`lowlat signoff` reports every check with its tolerance, error and verdict, and what did not run."""

import json
import textwrap

import pytest

from lowlat.signoff import run_signoff


def test_signoff_report_lists_checks_failures_and_not_run(tmp_path):
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "test_fake.py").write_text(textwrap.dedent('''
        import pytest, torch
        from lowlat.numerics import check_accuracy

        def test_within_policy():
            ref = torch.linspace(-1, 1, 64, dtype=torch.float64)
            check_accuracy("fake_op", ref.bfloat16(), ref, ref.bfloat16())

        def test_broken():
            ref = torch.ones(4, dtype=torch.float64)
            check_accuracy("fake_op", ref + 1, ref, ref, output="broken")

        @pytest.mark.skip(reason="needs 8 GPUs")
        def test_needs_hardware():
            pass
    '''))
    out = tmp_path / "report"
    code = run_signoff(str(out), workers="0", paths=[str(suite)], extra=["-p", "no:randomly"])
    assert code == 1                                          # one test failed
    rep = json.loads((out / "signoff.json").read_text())
    assert rep["summary"] == {"passed": 1, "failed": 1, "not run": 1}
    by_name = {t["test"].split("::")[-1]: t for t in rep["tests"]}
    ok = by_name["test_within_policy"]["numerics"][0]
    assert ok["passed"] and ok["max_err"] <= ok["allowed"] and "2x" in ok["tolerance"]
    assert ok["examples"] == 1, "one check made once (the teardown report repeats the call's records)"
    bad = by_name["test_broken"]["numerics"][0]
    assert not bad["passed"] and bad["max_err"] == 1.0
    assert by_name["test_needs_hardware"]["reason"].endswith("needs 8 GPUs")
    md = (out / "signoff.md").read_text()
    assert "fake_op.out" in md and "FAIL" in md and "needs 8 GPUs" in md
    assert (out / "numerics.png").stat().st_size > 1000


def _fake_suite(tmp_path):
    """A suite folder whose conftest skips `interpreter` tests unless TRITON_INTERPRET=1, as the repo's does where
    the interpreter is off; markers interpreter / other / slow."""
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "conftest.py").write_text(textwrap.dedent('''
        import os, pytest

        def pytest_configure(config):
            for m in ("interpreter", "other", "slow"):
                config.addinivalue_line("markers", f"{m}: a marker")

        def pytest_collection_modifyitems(config, items):
            for item in items:
                if item.get_closest_marker("interpreter") and os.environ.get("TRITON_INTERPRET") != "1":
                    item.add_marker(pytest.mark.skip(reason="interpreter off"))
    '''))
    return suite


def test_signoff_runs_the_interpreter_tests_again_where_the_first_run_skipped_them(tmp_path, monkeypatch):
    """On a GPU machine the first run skips the `interpreter` tests (conftest: the interpreter is off there); the
    sign-off runs them again in a process with no GPU visible and TRITON_INTERPRET=1, and their outcomes replace
    the skips (one passes, one fails: the sign-off fails). Here the first run is given TRITON_INTERPRET=0 and the
    fake suite's conftest skips as the repo's does; a -m of the caller narrows both runs."""
    suite = _fake_suite(tmp_path)
    # a module name of its own: the in-process runs of the other test import a test_fake.py
    (suite / "test_fake_interpreter.py").write_text(textwrap.dedent('''
        import os, pytest

        @pytest.mark.interpreter
        @pytest.mark.other
        def test_on_the_interpreter():
            assert os.environ["TRITON_INTERPRET"] == "1" and os.environ["CUDA_VISIBLE_DEVICES"] == ""

        @pytest.mark.interpreter
        @pytest.mark.other
        def test_broken_on_the_interpreter():
            assert False

        @pytest.mark.interpreter
        def test_left_out_by_the_callers_marker():
            pass

        @pytest.mark.other
        def test_anywhere():
            pass
    '''))
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    out = tmp_path / "report"
    code = run_signoff(str(out), workers="0", paths=[str(suite)], extra=["-p", "no:randomly", "-m", "other"],
                       interpreter_pass=True)
    assert code == 1
    rep = json.loads((out / "signoff.json").read_text())
    by_name = {t["test"].split("::")[-1]: t for t in rep["tests"]}
    assert by_name["test_on_the_interpreter"]["outcome"] == "passed"
    assert by_name["test_on_the_interpreter"]["run"] == "interpreter"
    assert by_name["test_broken_on_the_interpreter"]["outcome"] == "failed"
    assert by_name["test_anywhere"]["outcome"] == "passed" and "run" not in by_name["test_anywhere"]
    assert "test_left_out_by_the_callers_marker" not in by_name
    assert rep["summary"] == {"passed": 2, "failed": 1, "not run": 0}
    assert rep["runs"][1]["pytest_args"][-1] == "interpreter and (other)"
    assert "second run, the `interpreter` tests" in (out / "signoff.md").read_text()


def test_signoff_quick_and_an_attached_m_narrow_both_runs(tmp_path, monkeypatch):
    """`-mEXPR` (pytest's attached form) narrows the interpreter pass as `-m EXPR` does, and --quick's "not slow"
    is ANDed with it in the first run too (pytest keeps only the last -m: either one was dropped)."""
    from lowlat.signoff import _split_markexpr

    assert _split_markexpr(["-k", "x", "-mother", "-q"]) == (["-k", "x", "-q"], "other")
    assert _split_markexpr(["-m", "a", "-m", "b"]) == ([], "b")
    suite = _fake_suite(tmp_path)
    (suite / "test_fake_quick_marks.py").write_text(textwrap.dedent('''
        import pytest

        @pytest.mark.interpreter
        @pytest.mark.other
        def test_interp_other(): pass

        @pytest.mark.interpreter
        def test_interp_plain(): pass

        @pytest.mark.other
        @pytest.mark.slow
        def test_other_slow(): pass

        @pytest.mark.other
        def test_other(): pass

        def test_plain(): pass
    '''))
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    out = tmp_path / "report"
    assert run_signoff(str(out), workers="0", paths=[str(suite)], extra=["-p", "no:randomly", "-mother"], quick=True,
                       interpreter_pass=True) == 0
    rep = json.loads((out / "signoff.json").read_text())
    assert sorted(t["test"].split("::")[-1] for t in rep["tests"]) == ["test_interp_other", "test_other"]
    assert rep["summary"] == {"passed": 2, "failed": 0, "not run": 0}


def test_a_crashed_interpreter_pass_keeps_the_first_runs_report_and_fails_the_signoff(tmp_path, monkeypatch):
    """The second run's process dying without records (a segfault) fails the sign-off, naming it, and keeps the
    first run's records and report (a GPU suite's run may have taken hours)."""
    import lowlat.signoff as so

    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "test_fake_crash.py").write_text("def test_fine():\n    pass\n")

    def crash(*a, **kw):
        raise RuntimeError("the interpreter pass wrote no records (python -m lowlat.signoff ...: exit status -11)")

    monkeypatch.setattr(so, "_interpreter_pass", crash)
    out = tmp_path / "report"
    assert run_signoff(str(out), workers="0", paths=[str(suite)], extra=["-p", "no:randomly"],
                       interpreter_pass=True) == 1
    rep = json.loads((out / "signoff.json").read_text())
    assert rep["summary"] == {"passed": 1, "failed": 0, "not run": 0} and "exit status -11" in rep["runs"][1]["error"]
    assert "it crashed" in (out / "signoff.md").read_text()


def test_a_signoff_in_which_no_test_ran_fails(tmp_path):
    """A -k that selects nothing (a typo) signs nothing off: exit 1, not 0 (pytest's exit code 5 was taken as
    success)."""
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "test_fake_none.py").write_text("def test_fine():\n    pass\n")
    out = tmp_path / "report"
    assert run_signoff(str(out), workers="0", paths=[str(suite)], extra=["-k", "no_such_test"],
                       interpreter_pass=False) == 1
    assert json.loads((out / "signoff.json").read_text())["summary"] == {"passed": 0, "failed": 0, "not run": 0}


def test_quality_only_runs_no_suite_and_refuses_suite_arguments(monkeypatch, tmp_path):
    """`lowlat signoff --quality-only` goes straight to the task-quality sign-off (no pytest suite) and
    its exit code is that sign-off's verdict; --quick or pytest arguments with it, or --quality beside it,
    are a clear error."""
    import lowlat.eval.signoff as quality
    import lowlat.signoff as suites
    from lowlat.cli import build_parser

    calls = []
    monkeypatch.setattr(suites, "run_signoff", lambda **kw: calls.append("suites") or 0)
    monkeypatch.setattr(quality, "run_quality_signoff",
                        lambda out, **kw: calls.append(("quality", str(out), kw["limit"], kw["drafter"]))
                        or {"passed": False})
    args = build_parser().parse_args(["signoff", "--out", str(tmp_path), "--quality-only", "--quality-limit", "3",
                                      "--drafter", "ngram"])
    assert args.func(args) == 1                       # the quality verdict (failed) is the exit code
    assert calls == [("quality", str(tmp_path / "quality"), 3, "ngram")]      # the report goes to OUT/quality
    from lowlat.cli import main
    from lowlat.errors import UnsupportedConfigError

    for extra in (["--quick"], ["--", "-k", "attention"]):
        args = build_parser().parse_args(["signoff", "--quality-only", *extra])
        with pytest.raises(UnsupportedConfigError, match="runs no test suite"):
            args.func(args)
        assert main(["signoff", "--quality-only", *extra]) == 2          # a usage error, not exit 1
    assert len(calls) == 1
    with pytest.raises(SystemExit):                   # argparse: --quality and --quality-only exclude each other
        build_parser().parse_args(["signoff", "--quality", "--quality-only"])


def test_cli_refuses_bad_values_before_loading_the_model_or_running_suites(monkeypatch, capsys):
    """Before: `lowlat generate --max-new-tokens 0` (or a NaN temperature, top-p 0, device "bogus", an empty
    prompt) loaded the model for ~10 s and died with a traceback; `lowlat signoff --quality --k 70` (or
    --quality-limit 0, --alpha 0: a vacuous pass) ran the whole test suite first."""
    import lowlat.gguf_loader as loader
    import lowlat.signoff as suites
    from lowlat.cli import main

    def no_load(*_a, **_k):
        raise AssertionError("the model was loaded before the arguments were checked")

    monkeypatch.setattr(loader, "load_gguf_model", no_load)
    monkeypatch.setattr(loader, "load_tokenizer", no_load)
    ran = []
    monkeypatch.setattr(suites, "run_signoff", lambda **kw: ran.append(kw) or 0)
    usage = [["generate", "--prompt", "x", "--max-new-tokens", "0"], ["generate", "--prompt", "x", "--top-p", "0"],
             ["generate", "--prompt", "x", "--temperature", "nan"], ["generate", "--prompt", "x", "--device", "bogus"],
             ["signoff", "--quality", "--quality-limit", "0"], ["signoff", "--quality", "--alpha", "0"],
             ["signoff", "--quality", "--k", "0"], ["signoff", "--workers", "many"]]
    for argv in usage:
        with pytest.raises(SystemExit) as e:
            main(argv)
        assert e.value.code == 2, argv
    refused = {("generate", "--prompt", "x", "--temperature", "1e-30"): "temperature=1e-30",
               ("generate", "--prompt", ""): "prompt=''",
               ("signoff", "--quality", "--k", "70"): "k=70"}
    for argv, what in refused.items():
        capsys.readouterr()
        assert main(list(argv)) == 2, argv
        assert f"lowlat {argv[0]}: error: unsupported config field {what}" in capsys.readouterr().err
    assert ran == []


def test_hardware_probe_does_not_import_triton():
    """`lowlat signoff --workers 0` runs the suite in the process that probed the hardware: importing
    triton there, before conftest sets TRITON_INTERPRET on a machine without a GPU, left triton without its
    interpreter (21 kernel tests failed). The probe reads the installed version instead."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    code = ("import sys; from lowlat.signoff import hardware; h = hardware(); "
            "print(h['triton'], 'triton' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    version, imported = out.stdout.split()
    assert imported == "False" and version[0].isdigit(), out.stdout


def test_every_cli_option_has_help_and_help_names_the_defaults(capsys):
    """`lowlat generate / signoff / bench --help` give each option a help text and name its default (session 34's
    new-user pass found none named): argparse prints "(default: X)" only for options with a help text, so an option
    added without one would hide its default again."""
    import argparse

    from lowlat.cli import HelpWithDefaults, build_parser, main

    subs = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)).choices
    assert {"generate", "signoff", "bench"} <= set(subs)
    for name in ("generate", "signoff", "bench"):
        assert subs[name].formatter_class is HelpWithDefaults, name
        for action in subs[name]._actions:
            assert action.help, f"lowlat {name} {action.option_strings or action.dest}: no help text"
    want = {"generate": ["--max-new-tokens", "(default: 32)", "(default: reference)"],
            "signoff": ["(default: signoff-report)", "(default: 200)", "(default: 0.01)"],
            "bench": ["(default: 512)", "(default: 600.0)"]}
    for name, parts in want.items():
        with pytest.raises(SystemExit) as e:
            main([name, "--help"])
        assert e.value.code == 0
        out = " ".join(capsys.readouterr().out.split())        # argparse wraps lines
        for part in parts:
            assert part in out, (name, part, out[-1500:])
        assert "(default: None)" not in out and "(default: False)" not in out, name
