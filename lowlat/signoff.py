"""`lowlat signoff`: run every test this machine's hardware allows and write a report.

One source of truth: the pytest suite under tests/. Each test's markers and skip conditions decide
whether it can run here (no GPU, one GPU, ...); the sign-off runs the whole suite in-process and
records, for every test, its outcome, the numerics checks it made (op, output, tolerance rule,
measured error, allowed error: lowlat/numerics.py) and, for what could not run, the reason.

Writes <out>/signoff.json, <out>/signoff.md and <out>/numerics.png (measured / allowed error of
every numerics check). Returns 0 only when nothing failed.
"""

from __future__ import annotations

import datetime as _dt
import importlib.metadata
import json
import os
import platform
import shlex
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent


def hardware() -> dict:
    import torch

    info = {"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.cuda.is_available(),
            "gpus": torch.cuda.device_count() if torch.cuda.is_available() else 0, "gpu_names": []}
    try:        # the installed version, without importing triton: an import here, before the test session's
        # conftest sets TRITON_INTERPRET on a machine without a GPU, left triton without its interpreter
        # (`--workers 0` runs the tests in this process): 21 kernel tests failed
        info["triton"] = importlib.metadata.version("triton")
    except importlib.metadata.PackageNotFoundError:
        info["triton"] = None
    for i in range(info["gpus"]):
        p = torch.cuda.get_device_properties(i)
        info["gpu_names"].append(f"{p.name} (sm_{p.major}{p.minor}, {p.multi_processor_count} SMs)")
    return info


class _Collector:
    """pytest plugin: one record per test (setup skips, call outcomes, numerics properties)."""

    def __init__(self) -> None:
        self.tests: dict[str, dict] = {}
        self.started = time.perf_counter()
        self.done = 0

    def pytest_runtest_logreport(self, report) -> None:
        rec = self.tests.setdefault(report.nodeid, {"test": report.nodeid, "outcome": "passed",
                                                    "duration_s": 0.0, "numerics": [], "reason": ""})
        rec["duration_s"] += report.duration
        if report.skipped:
            rec["outcome"] = "not run"
            lr = report.longrepr
            rec["reason"] = lr[2] if isinstance(lr, tuple) else str(lr)
        elif report.failed:
            rec["outcome"] = "failed"
            rec["reason"] = str(report.longrepr).splitlines()[-1][:300] if report.longrepr else ""
        for key, value in report.user_properties if report.when == "call" else ():   # teardown's repeat them
            if key == "numerics":
                _merge_check(rec["numerics"], value)
        if report.when == "teardown":
            self.done += 1
            if self.done % 25 == 0:
                print(f"[signoff] {self.done} tests done, {time.perf_counter() - self.started:.0f} s",
                      file=sys.stderr, flush=True)


def _merge_check(checks: list[dict], new: dict) -> None:
    """Keep one entry per (op, output, kind) per test: the worst example (largest error / allowed)
    and how many examples were checked (hypothesis runs many)."""
    for c in checks:
        if (c["op"], c["output"], c["kind"]) == (new["op"], new["output"], new["kind"]):
            c["examples"] += 1
            c["passed"] = c["passed"] and new["passed"]
            if _ratio(new) > _ratio(c):
                c.update({k: v for k, v in new.items() if k not in ("examples", "passed")})
            return
    checks.append({**new, "examples": 1})


def _ratio(c: dict) -> float:
    return c["max_err"] / c["allowed"] if c["allowed"] > 0 else (0.0 if c["max_err"] == 0 else float("inf"))


def _interpreter_on() -> bool:
    """TRITON_INTERPRET read as Triton reads it, without importing triton (see `hardware`)."""
    return os.environ.get("TRITON_INTERPRET", "").strip().lower() in ("1", "true", "yes", "on")


def _pytest_in_process(args: list[str]) -> tuple[int, dict[str, dict]]:
    """pytest.main(args) from the repo root with a `_Collector`: (exit code, records by test id)."""
    import pytest

    collector = _Collector()
    cwd = os.getcwd()
    os.chdir(REPO_ROOT)
    try:
        code = pytest.main(list(args), plugins=[collector])     # a copy: pytest.main edits its list
    finally:
        os.chdir(cwd)
    return int(code), collector.tests


def _split_markexpr(args: list[str]) -> tuple[list[str], str | None]:
    """(args without their -m EXPR / -mEXPR, the mark expression pytest would use: the last one, or None)."""
    rest, expr, i = [], None, 0
    while i < len(args):
        a = args[i]
        if a == "-m" and i + 1 < len(args):
            expr, i = args[i + 1], i + 2
            continue
        if a.startswith("-m") and len(a) > 2:
            expr, i = a[2:], i + 1
            continue
        rest.append(a)
        i += 1
    return rest, expr


def _interpreter_pass(args: list[str], quick: bool,
                      markexpr: str | None = None) -> tuple[int, dict[str, dict], list[str]]:
    """The `interpreter` tests (Triton kernels on CPU tensors), which a GPU machine's run skips, run again in a
    process of their own with no GPU visible and TRITON_INTERPRET=1 (set before triton is imported there), as CI
    runs them: (exit code, records by test id, its pytest args). Raises RuntimeError when that process writes no
    records."""
    import subprocess
    import tempfile

    # a -m of the caller's (args carry none: `_split_markexpr`) narrows this run too
    marks = ["interpreter"] + (["not slow"] if quick else []) + ([f"({markexpr})"] if markexpr else [])
    pass_args = [*args, "-m", " and ".join(marks)]
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", TRITON_INTERPRET="1")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "records.json"
        res = subprocess.run([sys.executable, "-m", "lowlat.signoff", str(path), *pass_args], cwd=REPO_ROOT, env=env,
                             check=False)
        if not path.exists():
            raise RuntimeError(f"the interpreter pass wrote no records ({sys.executable} -m lowlat.signoff ...: "
                               f"exit status {res.returncode})")
        doc = json.loads(path.read_text())
    return int(doc["exit_code"]), doc["tests"], pass_args


def run_signoff(out_dir: str = "signoff-report", *, quick: bool = False, workers: str = "auto",
                extra: list[str] | None = None, paths: list[str] | None = None,
                interpreter_pass: bool | None = None) -> int:
    """Run the suite (`paths`, default the repo's tests/), write the report, return 0 when nothing failed.

    interpreter_pass: also run the tests marked `interpreter` in a second process with no GPU visible and
    Triton's CPU interpreter on, where the first run could not (a GPU machine: the interpreter is off there, so
    conftest skips them); their outcomes replace the first run's "not run" records. None: when this machine
    has a GPU and TRITON_INTERPRET is off (a `-m` in `extra` narrows both runs)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    hw = hardware()
    print(f"[signoff] hardware: {hw['gpus']} GPU(s) {hw['gpu_names']}, torch {hw['torch']}, "
          f"triton {hw['triton']}", file=sys.stderr)
    base = [*(paths or [str(REPO_ROOT / "tests")]), "-q", "-rs", "-p", "no:cacheprovider", "-p",
            "lowlat.pytest_plugin", "--rootdir", str(REPO_ROOT)]
    if workers not in ("0", ""):
        base += ["-n", workers]
    rest, markexpr = _split_markexpr(list(extra or []))
    base += rest
    # quick and a caller's -m narrow the run together (pytest keeps only the last -m it is given)
    first = " and ".join(f"({m})" for m in (["not slow"] if quick else []) + ([markexpr] if markexpr else []))
    args = base + (["-m", first] if first else [])
    t0 = time.perf_counter()
    code, records = _pytest_in_process(args)
    runs = [{"pytest_args": args, "exit_code": code}]
    if interpreter_pass is None:
        interpreter_pass = bool(hw["cuda"]) and not _interpreter_on()
    if interpreter_pass:
        print("[signoff] the interpreter tests: a second run, no GPU visible, TRITON_INTERPRET=1", file=sys.stderr)
        error = None
        try:
            code2, records2, args2 = _interpreter_pass(base, quick, markexpr)
        except RuntimeError as e:      # keep the first run's report: the sign-off fails, naming why
            print(f"[signoff] {e}", file=sys.stderr)
            code2, records2, args2, error = 3, {}, ["-m", "interpreter"], str(e)
        runs.append({"pytest_args": args2, "exit_code": code2, "env": "CUDA_VISIBLE_DEVICES= TRITON_INTERPRET=1",
                     **({"error": error} if error else {})})
        for test_id, rec in records2.items():
            if records.get(test_id, {"outcome": "not run"})["outcome"] == "not run" and rec["outcome"] != "not run":
                records[test_id] = dict(rec, run="interpreter")
        code = code if code not in (0, 5) else code2
    tests = sorted(records.values(), key=lambda r: r["test"])
    summary = {k: sum(1 for t in tests if t["outcome"] == k) for k in ("passed", "failed", "not run")}
    report = {
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "command": "lowlat signoff " + " ".join(sys.argv[2:]),
        "hardware": hw, "pytest_args": args, "pytest_exit_code": int(code), "runs": runs,
        "wall_s": round(time.perf_counter() - t0, 1), "summary": summary, "tests": tests,
    }
    (out / "signoff.json").write_text(json.dumps(report, indent=1, default=str))
    (out / "signoff.md").write_text(_markdown(report))
    _plot(tests, out / "numerics.png")
    ran = summary["passed"] + summary["failed"]
    ok = summary["failed"] == 0 and int(code) in (0, 5) and ran > 0     # nothing run signs nothing off
    if ran == 0:
        print("[signoff] no test ran (a -k / -m that selects nothing here?): the sign-off fails", file=sys.stderr)
    print(f"[signoff] {summary['passed']} passed, {summary['failed']} failed, {summary['not run']} not run; "
          f"report in {out}/signoff.md", file=sys.stderr)
    return 0 if ok else 1


def _markdown(r: dict) -> str:
    hw = r["hardware"]
    lines = [f"# lowlat sign-off — {r['date']}", "",
             f"- command: `{r['command']}`; pytest exit code {r['pytest_exit_code']}; wall {r['wall_s']} s",
             f"- hardware: {hw['gpus']} GPU(s) {', '.join(hw['gpu_names']) or '(none)'}; torch {hw['torch']}, "
             f"triton {hw['triton']}, python {hw['python']}",
             *[f"- second run, the `interpreter` tests (`{run['env']} pytest {shlex.join(run['pytest_args'])}`): "
               f"pytest exit code {run['exit_code']}; " + (f"**it crashed: {run['error']}**; the first run's skips "
               "stand" if run.get("error") else "their outcomes replace the first run's skips")
               for run in r.get("runs", [])[1:]],
             f"- **{r['summary']['passed']} passed, {r['summary']['failed']} failed, "
             f"{r['summary']['not run']} not run**", "", "## Numerics checks", "",
             "Worst example of each check (hypothesis tests check many examples).", "",
             "| test | check | tolerance | worst max error | allowed there | examples | verdict |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for t in r["tests"]:
        for n in t["numerics"]:
            lines.append(f"| `{t['test']}` | {n['op']}.{n['output']} ({n['kind']}) | {n['tolerance']} | "
                         f"{n['max_err']:.3e} | {n['allowed']:.3e} | {n['examples']} | {'pass' if n['passed'] else 'FAIL'} |")
    lines += ["", "## Every test", "", "| test | outcome | s | reason |", "| --- | --- | --- | --- |"]
    for t in r["tests"]:
        reason = t["reason"].replace("|", "\\|").replace("\n", " ")
        lines.append(f"| `{t['test']}` | {t['outcome']} | {t['duration_s']:.2f} | {reason} |")
    not_run = [t for t in r["tests"] if t["outcome"] == "not run"]
    if not_run:
        lines += ["", "## Not run here, and why", ""]
        reasons: dict[str, int] = {}
        for t in not_run:
            reasons[t["reason"]] = reasons.get(t["reason"], 0) + 1
        lines += [f"- {n} test(s): {why}" for why, n in sorted(reasons.items(), key=lambda kv: -kv[1])]
    return "\n".join(lines) + "\n"


def _plot(tests: list[dict], path: Path) -> None:
    checks = [(f"{n['op']}.{n['output']}", n["max_err"], n["allowed"]) for t in tests for n in t["numerics"]
              if n["kind"] == "accuracy" and n["allowed"] > 0]
    if not checks:
        return
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ratio = [max(e / a, 1e-4) for _, e, a in checks]
    fig, ax = plt.subplots(figsize=(8, max(2.5, 0.18 * len(checks))))
    ax.barh(range(len(checks)), ratio, color=["tab:red" if r > 1 else "tab:blue" for r in ratio])
    ax.axvline(1.0, color="k", lw=1)
    ax.set_xscale("log")
    ax.set_yticks(range(len(checks)), [c[0] for c in checks], fontsize=6)
    ax.set_xlabel("measured max error / allowed error (< 1 passes)")
    ax.set_title("lowlat numerics checks")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    # one run of the suite for `_interpreter_pass`: python -m lowlat.signoff RECORDS.json PYTEST_ARGS...
    _code, _records = _pytest_in_process(sys.argv[2:])
    Path(sys.argv[1]).write_text(json.dumps({"exit_code": _code, "tests": _records}, default=str))
