"""The whole fused decode step (FusedModel, one CUDA graph per width) vs a plain-PyTorch step under
CUDA graphs and under torch.compile + CUDA graphs, and vs the HBM floor; plus one Qwen3-30B-A3B layer.

    python bench/bench_fused_model.py --out step.json [--models ...] [--rows ...] [--ctx 512]

Runs the `step`, `moe` and `compiled` sections of `lowlat.bench` (`lowlat bench` runs all). Needs a
CUDA GPU.
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))     # run from a checkout, installed or not

from lowlat.bench import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(["--sections", "step,moe,compiled"] + sys.argv[1:]))
