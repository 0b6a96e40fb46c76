"""The bench scripts that have a `--smoke` mode (tiny shapes on the CPU: every variant runs once, its outputs
are checked, nothing is timed) still run end to end, so a bench does not rot between device sessions."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


@pytest.mark.parametrize("script", ["bench_allreduce.py", "bench_draft_sampling.py", "bench_tp_layer.py"])
@pytest.mark.interpreter
def test_bench_smoke_mode_runs(script, tmp_path):
    res = subprocess.run([sys.executable, str(BENCH / script), "--smoke"], capture_output=True, text=True,
                         timeout=600, cwd=tmp_path)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-4000:]


@pytest.mark.parametrize("args,message", [
    (["--rows", "1,abc"], "--rows: 'abc' is not a row count in 1..48"),
    (["--rows", "8,64"], "--rows: '64' is not a row count in 1..48"),
    (["--models", "SmolLM2-135M,Nope"], "unknown presets ['Nope']"),
    (["--models", "", "--sections", "step,moe"], "sections ['step'] run per model"),
    (["--models", ",", "--sections", "profile"], "sections ['profile'] run per model"),
    (["--sections", "step,foo"], "unknown sections ['foo']"),
    (["--sections", ","], "names no section"),
    (["--ctx", "0"], "--ctx 0"),
    (["--budget-s", "nan"], "--budget-s nan"),
    (["--tune-shapes", "lm_head"], "--tune-shapes: 'lm_head' is not KIND:NxK"),
    (["--models", "Qwen3-30B-A3B", "--sections", "tune", "--tune-shapes", "out_proj:2048x4096,bogus:1x1"],
     "['bogus:1x1'] not among the shapes tuned for --models 'Qwen3-30B-A3B'"),
    (["--models", "SmolLM2-135M", "--tune-shapes", "out_proj:2048x4096"], "['out_proj:2048x4096'] not among"),
])
def test_lowlat_bench_refuses_a_bad_argument_before_any_device_work(args, message, capsys):
    """A bad value is refused at once, naming it, with exit 2 (on the CPU too): before, the GPU check came first,
    and on a GPU `--rows abc` crashed after the bandwidth measurement while `--models Nope` ran to exit 0."""
    from lowlat.cli import main

    assert main(["bench", *args]) == 2
    err = capsys.readouterr().err
    assert message in err and "needs a CUDA GPU" not in err


def test_lowlat_bench_runs_the_moe_layer_without_a_model_preset(capsys):
    """--models "" with only the preset-free sections (the MoE layer and its profile) passes the argument checks
    (session 34's device script was refused so)."""
    import argparse

    from lowlat.bench import check_args

    for sections in ("moe,profile", "moe,compiled", "moe,profile,compiled,copy"):
        ns = argparse.Namespace(rows="1,6,48", models="", sections=sections, ctx=512, budget_s=60.0,
                                tune_budget_s=120.0, tune_shapes=None, tune_wide_rows=None)
        assert check_args(ns) is None, sections


def test_lowlat_bench_takes_a_tune_shape_of_the_named_models():
    """--tune-shapes names shapes `tune_gemv` tunes for --models (README's example); outside the tune section it is
    not read, so it is not checked there."""
    import argparse

    from lowlat.bench import check_args, tune_shapes

    def ns(models, sections, shapes):
        return argparse.Namespace(rows="1,6", models=models, sections=sections, ctx=512, budget_s=60.0,
                                  tune_budget_s=120.0, tune_shapes=shapes, tune_wide_rows=None)

    assert check_args(ns("Qwen3-30B-A3B", "tune", "out_proj:2048x4096")) is None
    assert check_args(ns("SmolLM2-135M", "step", "bogus:1x1")) is None
    first = tune_shapes(["SmolLM2-135M"])
    assert [t[1] for t in first] == ["residual", "gate_up", "residual", "lm_head"]
    assert check_args(ns("SmolLM2-135M", "tune", ",".join(f"{k}:{n}x{kk}" for _, k, n, kk, _ in first))) is None


def test_lowlat_bench_on_the_cpu_says_it_needs_a_gpu(capsys):
    import torch

    from lowlat.cli import main

    if torch.cuda.is_available():
        pytest.skip("a CUDA GPU is visible: the bench would run")
    assert main(["bench", "--sections", "step", "--models", "SmolLM2-135M", "--rows", "1,8"]) == 2
    assert "lowlat bench needs a CUDA GPU" in capsys.readouterr().err
