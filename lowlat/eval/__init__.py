"""Task-quality evaluation: the lm-eval model `lowlat` (lm_model.py), offline tasks (tasks/), the
quality sign-off (signoff.py). Importing this package imports neither lm-eval nor torch-heavy modules."""

from __future__ import annotations

import os
from pathlib import Path

TASKS_DIR = Path(__file__).resolve().parent / "tasks"

#: lowlat's offline lm-eval tasks (YAMLs in TASKS_DIR); the first four score log-likelihoods, the
#: last two generate.
TASKS = ("lowlat_arc_easy", "lowlat_lambada", "lowlat_hellaswag", "lowlat_piqa", "lowlat_nq_open",
         "lowlat_gsm8k")
GENERATION_TASKS = ("lowlat_nq_open", "lowlat_gsm8k")


def task_manager():
    """An lm-eval TaskManager over lowlat's task YAMLs only (no built-in tasks, no network). Sets
    HF_DATASETS_OFFLINE=1 / HF_HUB_OFFLINE=1 unless already set, and registers the `lowlat` model."""
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from lm_eval.tasks import TaskManager

    import lowlat.eval.lm_model  # noqa: F401  (registers "lowlat")

    return TaskManager(include_path=str(TASKS_DIR), include_defaults=False)
