"""The bench scripts that have a `--smoke` mode (tiny shapes on the CPU: every variant runs once, its outputs
are checked, nothing is timed) still run end to end, so a bench does not rot between device sessions."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


@pytest.mark.parametrize("script", ["bench_allreduce.py", "bench_draft_sampling.py", "bench_tp_layer.py"])
def test_bench_smoke_mode_runs(script, tmp_path):
    res = subprocess.run([sys.executable, str(BENCH / script), "--smoke"], capture_output=True, text=True,
                         timeout=600, cwd=tmp_path)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-4000:]
