"""Fused SwiGLU MLP (gate/up + SiLU*mul, down + residual) vs the reference, under CUDA graphs.

    python bench/bench_mlp.py --out mlp.json [--models ...] [--rows 1,6,8,16,48]

Runs the `kernels` section of `lowlat.bench` (which times out_proj, mlp and lm_head together; see
its docstring for the method, the HBM floor and the JSON fields). Needs a CUDA GPU.
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))     # run from a checkout, installed or not

from lowlat.bench import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(["--sections", "kernels"] + sys.argv[1:]))
