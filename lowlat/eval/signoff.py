"""Quality sign-off: lowlat's offline lm-eval tasks through (a) the reference backend with plain decoding
and (b) the fused backend with speculative decoding and real rejection sampling, greedy and sampled.

Runs (every run sees the same items of every task, `limit` per task, the same seeds):

    A  ref_plain_greedy      backend a, plain decoding, greedy              all tasks
    B  cand_spec_greedy      backend b, speculative,    greedy              all tasks
    E  cand_plain_greedy     backend b, plain decoding, greedy              generation tasks (skipped when
                                                                            a == b: A is the same run)
    D  ref_plain_sampled     backend a, plain decoding, temperature T       generation tasks
    C  cand_spec_sampled     backend b, speculative,    temperature T       generation tasks

Log-likelihood tasks do not decode, so only A and B run them (they compare the backends' numerics).

Pass rules (all must hold):
  1. score difference within a statistical bound, per task, for B vs A (greedy) and C vs D (sampled):
     each item's primary metric is 0/1, so the pair of runs is a 2x2 table over the same items and the
     paired test is McNemar's exact test (two-sided binomial test on the discordant items, McNemar 1947).
     A task fails when p < alpha / m, where m = the number of such tests in the sign-off (Bonferroni):
     if the configurations are equally accurate, the whole sign-off falsely fails with probability
     <= alpha (default 0.01). A seeded paired bootstrap gives the (1 - alpha/m) interval of the accuracy
     difference that the report prints next to the p-value. A task with no paired item fails (no evidence).
  2. greedy speculative outputs == greedy plain outputs on backend b, item for item (E vs B; A vs B when
     a == b): speculative decoding must not change a single greedy token (and there is at least one item).
     This is exact on the fused backend (row-invariant: its decode steps run the built FusedModel). The bf16
     reference backend is not row-invariant (b falls back to it without a GPU; so does a fused engine whose
     contract refused to build, every step falling back), so there an item may also part at a measured logit tie
     (`lowlat.eval.greedy_ties`: the float64 oracle's gap between the two tokens at the first difference is
     within the reference's own logit error). Such items are listed in the report; any other difference fails.
Speed (reported, not gated): acceptance length (tokens per verify step), P50/P90 per-token latency,
interactivity (1 / P90 per-token latency, tokens/s/user), TTFT (mean, P90), output tokens/s -- from the
decode log of each generating run -- with plots (matplotlib, Agg).

When the fused backend is unavailable (no CUDA, or lowlat.runtime.contract missing) backend b falls back
to "reference" and the report says so in `candidate_backend_note`.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import platform
import random
import time
from pathlib import Path
from typing import Callable, Sequence

#: the 0/1 per-item metric each task is tested on
PRIMARY_METRIC = {"lowlat_arc_easy": "acc", "lowlat_lambada": "acc", "lowlat_hellaswag": "acc_norm",
                  "lowlat_piqa": "acc", "lowlat_nq_open": "exact_match", "lowlat_gsm8k": "exact_match"}


# ------------------------------------------------------------------ statistics
def mcnemar_exact(a: Sequence[float], b: Sequence[float]) -> dict:
    """McNemar's exact test on paired 0/1 outcomes a[i], b[i] of the same items.

    n01 = items a got wrong and b right, n10 = the reverse; under H0 (equal accuracy) n01 ~ Binomial(
    n01 + n10, 1/2). Returns n, n01, n10, delta = mean(b) - mean(a), and the two-sided p-value
    min(1, 2 * P[X <= min(n01, n10)]) (1.0 when there are no discordant items).
    Raises ValueError for different lengths or outcomes other than 0/1.
    """
    if len(a) != len(b):
        raise ValueError(f"paired outcomes differ in length: {len(a)} vs {len(b)}")
    if any(x not in (0, 1) for x in list(a) + list(b)):
        raise ValueError("McNemar's test needs 0/1 outcomes")
    n01 = sum(1 for x, y in zip(a, b) if x == 0 and y == 1)
    n10 = sum(1 for x, y in zip(a, b) if x == 1 and y == 0)
    d = n01 + n10
    if d == 0:
        p = 1.0
    else:
        lo = min(n01, n10)
        p = min(1.0, 2.0 * sum(math.comb(d, i) for i in range(lo + 1)) / 2.0 ** d)
    n = len(a)
    return {"n": n, "n01": n01, "n10": n10, "delta": (sum(b) - sum(a)) / n if n else 0.0, "p_value": p}


def paired_bootstrap_ci(a: Sequence[float], b: Sequence[float], *, level: float, seed: int,
                        resamples: int = 10000) -> tuple[float, float]:
    """Percentile interval at `level` of mean(b) - mean(a), resampling items (pairs kept together)."""
    n = len(a)
    if n == 0:
        return (0.0, 0.0)
    rng = random.Random(seed)
    diffs = [b[i] - a[i] for i in range(n)]
    stats = sorted(sum(diffs[rng.randrange(n)] for _ in range(n)) / n for _ in range(resamples))
    lo = stats[int(math.floor((1 - level) / 2 * (resamples - 1)))]
    hi = stats[int(math.ceil((1 + level) / 2 * (resamples - 1)))]
    return (lo, hi)


# ------------------------------------------------------------------ runs
def _fused_available() -> tuple[bool, str]:
    import importlib.util

    import torch

    if not torch.cuda.is_available():
        return False, "no CUDA device: configuration (b) ran on the reference backend"
    if importlib.util.find_spec("lowlat.runtime.contract") is None:
        return False, "lowlat.runtime.contract (fused engine) is missing: (b) ran on the reference backend"
    return True, ""


def _per_item(samples: list[dict], metric: str) -> dict[int, float]:
    return {int(s["doc_id"]): float(s[metric]) for s in samples}


def check_quality_args(*, limit: int | None, alpha: float, temperature: float, k: int | None,
                       draft_layers: int | None, drafter: str, batch_size: int = 8, max_length: int = 2048) -> None:
    """Refuse a sign-off configuration before any run (a run takes minutes to hours): limit None or an int
    >= 1 (lm-eval would read 0 < limit < 1 as a fraction and 0 as no item: a vacuous pass), alpha in (0, 1)
    (alpha 0 passes every test), a temperature `SamplingParams` takes, k None or an int in 1..min(MAX_ROWS - 1,
    DRAFT_OFFSET_STRIDE - 1), draft_layers None or an int >= 1, drafter "layers" | "ngram", batch_size >= 1,
    max_length >= 2. Raises UnsupportedConfigError naming the field."""
    from lowlat.errors import UnsupportedConfigError
    from lowlat.runtime.drafters import DRAFT_OFFSET_STRIDE
    from lowlat.runtime.engine import SamplingParams
    from lowlat.step import MAX_ROWS

    def is_int(x) -> bool:
        return isinstance(x, int) and not isinstance(x, bool)

    if limit is not None and not (is_int(limit) and limit >= 1):
        raise UnsupportedConfigError("limit", limit, "items per task must be an int >= 1 (or None: every item)")
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not 0 < alpha < 1:
        raise UnsupportedConfigError("alpha", alpha, "the family-wise false-failure rate must be in (0, 1)")
    SamplingParams(temperature=temperature)
    k_hi = min(MAX_ROWS - 1, DRAFT_OFFSET_STRIDE - 1)
    if k is not None and not (is_int(k) and 1 <= k <= k_hi):
        raise UnsupportedConfigError("k", k, f"draft tokens per verify step must be an int in 1..{k_hi}")
    if draft_layers is not None and not (is_int(draft_layers) and draft_layers >= 1):
        raise UnsupportedConfigError("draft_layers", draft_layers, "must be an int >= 1 (and < the model's layers)")
    if drafter not in ("layers", "ngram"):
        raise UnsupportedConfigError("drafter", drafter, "choose 'layers' or 'ngram'")
    if not (is_int(batch_size) and batch_size >= 1):
        raise UnsupportedConfigError("batch_size", batch_size, "must be an int >= 1")
    if not (is_int(max_length) and max_length >= 2):
        raise UnsupportedConfigError("max_length", max_length, "must be an int >= 2")


def run_quality_signoff(out_dir: str | Path, *, limit: int | None = 200,
                        backends: Sequence[str] | None = None, seed: int = 1234,
                        progress: bool | Callable[[str], None] = True,
                        tasks: Sequence[str] | None = None, temperature: float = 0.8,
                        drafter: str = "layers", draft_layers: int | None = None, k: int | None = None,
                        alpha: float = 0.01, device: str = "auto", batch_size: int = 8,
                        max_length: int = 2048, engines: dict | None = None, tokenizer=None) -> dict:
    """Run the quality sign-off (module docstring) and write <out_dir>/quality_signoff.{json,md} + plots.

    Parameters:
        out_dir      report folder (created)
        limit        items per task (None: every item)
        backends     (a, b): baseline backend for plain decoding, candidate backend for speculative
                     decoding; default ("reference", "fused"), b -> "reference" when fused is unavailable
        seed         base seed of sampling (request i of a call gets seed + i), lm-eval's seeds and the
                     bootstrap
        progress     True prints progress lines, a callable receives them, False is silent
        tasks        lm-eval task names (default lowlat.eval.TASKS)
        temperature  T of the sampled runs (C, D); greedy runs use T = 0
        drafter, draft_layers, k   the speculative configuration (defaults: lowlat/runtime/drafters.py)
        alpha        family-wise false-failure rate of the paired tests (Bonferroni over all tests)
        engines      optional prebuilt engines by backend name (tests); tokenizer likewise
    Returns the report dict; report["passed"] is the verdict (a paired test or a greedy-equality check over
    no item fails). Raises UnsupportedConfigError (`check_quality_args`) before any run.
    """
    import lm_eval
    import torch

    from lowlat.eval import GENERATION_TASKS, TASKS, task_manager
    from lowlat.eval.greedy_ties import divergence_tie
    from lowlat.eval.lm_model import LowlatLM
    from lowlat.gguf_loader import load_gguf_model, load_tokenizer
    from lowlat.runtime.drafters import DEFAULT_K
    from lowlat.runtime.engine import make_engine
    from lowlat.runtime.speculative import summarize

    check_quality_args(limit=limit, alpha=alpha, temperature=temperature, k=k, draft_layers=draft_layers,
                       drafter=drafter, batch_size=batch_size, max_length=max_length)
    say = (print if progress is True else progress) if progress else (lambda _m: None)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tasks = list(tasks or TASKS)
    unknown = [t for t in tasks if t not in PRIMARY_METRIC]
    if unknown:
        raise ValueError(f"unknown task(s) {unknown}; known: {sorted(PRIMARY_METRIC)}")
    gen_tasks = [t for t in tasks if t in GENERATION_TASKS]
    a_backend, b_backend = tuple(backends) if backends else ("reference", "fused")
    note = ""
    if b_backend == "fused":
        ok, why = _fused_available()
        if not ok:
            b_backend, note = "reference", why
    dev = ("cuda" if torch.cuda.is_available() else "cpu") if device == "auto" else device
    tok = tokenizer if tokenizer is not None else load_tokenizer()
    engines = dict(engines or {})
    weights = None

    def engine_for(name: str):
        nonlocal weights
        if name not in engines:
            if weights is None:
                weights = load_gguf_model()
            cfg, w = weights
            extra = {"tokens_per_request": (k or DEFAULT_K) + 1} if name == "fused" else {}
            engines[name] = make_engine(name, cfg, w, device=dev, num_slots=(max_length + 8) * batch_size + 64,
                                        max_reqs=batch_size + 1, max_ctx=max_length + 8, **extra)
        return engines[name]

    n_layers = engine_for(a_backend).cfg.num_layers
    if draft_layers is not None and draft_layers >= n_layers:     # before run A, not after it
        from lowlat.errors import UnsupportedConfigError

        raise UnsupportedConfigError("draft_layers", draft_layers, f"must be in 1..{n_layers - 1}")
    tm = task_manager()
    runs_spec = [("A", "ref_plain_greedy", a_backend, "plain", 0.0, tasks),
                 ("B", "cand_spec_greedy", b_backend, "speculative", 0.0, tasks)]
    if a_backend != b_backend and gen_tasks:
        runs_spec.append(("E", "cand_plain_greedy", b_backend, "plain", 0.0, gen_tasks))
    if gen_tasks:
        runs_spec += [("D", "ref_plain_sampled", a_backend, "plain", temperature, gen_tasks),
                      ("C", "cand_spec_sampled", b_backend, "speculative", temperature, gen_tasks)]
    runs: dict[str, dict] = {}
    for key, label, backend, mode, temp, run_tasks in runs_spec:
        say(f"[signoff] run {key} ({label}): backend={backend} mode={mode} T={temp} tasks={run_tasks} limit={limit}")
        lm = LowlatLM(backend=backend, mode=mode, drafter=drafter, draft_layers=draft_layers, k=k,
                      temperature=temp, seed=seed, device=dev, batch_size=batch_size, max_length=max_length,
                      engine=engine_for(backend), tokenizer=tok)
        counts_before = dict(getattr(lm.engine.backend, "counts", {}))
        t0 = time.perf_counter()
        res = lm_eval.simple_evaluate(model=lm, tasks=list(run_tasks), task_manager=tm, limit=limit,
                                      log_samples=True, random_seed=seed, numpy_random_seed=seed,
                                      torch_random_seed=seed, fewshot_random_seed=seed)
        wall = time.perf_counter() - t0
        log = lm.decode_log
        speed = summarize(log.results, log.wall_s).as_dict() if log.results else None
        items = {t: _per_item(res["samples"][t], PRIMARY_METRIC[t]) for t in run_tasks}
        gens = {t: {int(s["doc_id"]): s["filtered_resps"][0] for s in res["samples"][t]}
                for t in run_tasks if t in GENERATION_TASKS}
        by_context = {c: (r.prompt_ids, r.output_ids) for c, r in zip(log.contexts, log.results)}
        token_ids = {t: {int(s["doc_id"]): by_context.get(_context_of(s)) for s in res["samples"][t]}
                     for t in run_tasks if t in GENERATION_TASKS}
        runs[key] = {"label": label, "backend": backend, "mode": mode, "temperature": temp, "tasks": list(run_tasks),
                     "wall_s": wall, "scores": {t: res["results"][t] for t in run_tasks}, "items": items,
                     "generations": gens, "token_ids": token_ids, "speed": speed,
                     "backend_steps": {x: n - counts_before.get(x, 0)
                                       for x, n in getattr(lm.engine.backend, "counts", {}).items()},
                     "accept_lengths": [a for r in log.results for a in r.accept_lengths],
                     "token_latency_s": [x for r in log.results for x in r.token_latency_s]}
        (out / "runs_partial.json").write_text(json.dumps(      # kept if a later run is cut short
            {name: {x: run[x] for x in ("label", "backend", "mode", "temperature", "wall_s", "scores", "items")}
             for name, run in runs.items()}, indent=1, default=str))
        say(f"[signoff] run {key} done in {wall:.1f} s: " + ", ".join(
            f"{t}={sum(items[t].values()) / max(1, len(items[t])):.3f}" for t in run_tasks))

    # ---- paired tests
    pairs = [("B", "A", tasks)] + ([("C", "D", gen_tasks)] if gen_tasks else [])
    m = sum(len(ts) for _, _, ts in pairs)
    per_test_alpha = alpha / m
    tests = []
    for cand, base, ts in pairs:
        for t in ts:
            ia, ib = runs[base]["items"][t], runs[cand]["items"][t]
            ids = sorted(set(ia) & set(ib))
            xa, xb = [ia[i] for i in ids], [ib[i] for i in ids]
            mc = mcnemar_exact(xa, xb)
            ci = paired_bootstrap_ci(xa, xb, level=1 - per_test_alpha, seed=seed)
            tests.append({"task": t, "metric": PRIMARY_METRIC[t], "candidate": cand, "baseline": base,
                          "score_baseline": sum(xa) / len(xa) if xa else None,
                          "score_candidate": sum(xb) / len(xb) if xb else None, **mc,
                          "alpha_per_test": per_test_alpha, "bootstrap_ci": ci,
                          "passed": bool(ids) and mc["p_value"] >= per_test_alpha})    # no item: no evidence
    # ---- greedy equality on backend b (ties allowed only where b is not row-invariant)
    plain_key = "E" if "E" in runs else "A"
    row_invariant = getattr(engine_for(b_backend).backend, "built", None) is not None
    oracle = []

    def tie_of(t: str, i: int) -> dict | None:
        plain, spec = runs[plain_key]["token_ids"][t].get(i), runs["B"]["token_ids"][t].get(i)
        if row_invariant or plain is None or spec is None:
            return None
        ref = engine_for("reference")
        if not oracle:                  # the same weights in float64 (the reference model's own copy)
            model = ref.backend.model
            oracle.append(make_engine("reference", ref.cfg, model.weights, device=model.weights.embed.device,
                                      num_slots=max_length + 72, max_reqs=2, max_ctx=max_length + 8,
                                      compute_dtype=torch.float64))
        return divergence_tie(ref, oracle[0], plain[0], plain[1], spec[1])

    equality = []
    for t in gen_tasks:
        gp, gs = runs[plain_key]["generations"][t], runs["B"]["generations"][t]
        diff = [i for i in sorted(gp) if gp[i] != gs.get(i)]
        ties = {i: tie_of(t, i) for i in diff}
        unexplained = [i for i in diff if not (ties[i] and ties[i]["tie"])]
        equality.append({"task": t, "plain_run": plain_key, "spec_run": "B", "items": len(gp),
                         "mismatches": len(diff), "unexplained": len(unexplained), "first_mismatch": (
                             {"doc_id": diff[0], "plain": gp[diff[0]], "speculative": gs.get(diff[0])} if diff else None),
                         "ties": [{"doc_id": i, **ties[i]} for i in diff if ties[i]],
                         "passed": bool(gp) and not unexplained})
    passed = all(x["passed"] for x in tests) and all(x["passed"] for x in equality)
    import lm_eval as _le

    report = {
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "passed": passed, "device": torch.cuda.get_device_name() if dev == "cuda" else "cpu",
        "versions": {"torch": torch.__version__, "lm_eval": _le.__version__ if hasattr(_le, "__version__") else "0.4.13",
                     "python": platform.python_version()},
        "baseline_backend": a_backend, "candidate_backend": b_backend, "candidate_backend_note": note,
        "limit": limit, "seed": seed, "temperature": temperature, "drafter": drafter,
        "draft_layers": draft_layers, "k": k, "alpha": alpha, "tests_m": m,
        "rule": ("McNemar exact test per task on paired 0/1 item scores; fail if p < alpha / m (Bonferroni); "
                 "greedy speculative generations must equal greedy plain generations item for item (on the "
                 "reference backend, which is not row-invariant, an item may part at a measured logit tie)"),
        "paired_tests": tests, "greedy_equality": equality,
        "runs": {k_: {x: v for x, v in r.items() if x not in ("items", "generations", "token_ids", "token_latency_s",
                                                               "accept_lengths")} for k_, r in runs.items()},
    }
    (out / "quality_signoff.json").write_text(json.dumps(report, indent=1, default=str))
    (out / "quality_signoff.md").write_text(_markdown(report))
    report["plots"] = _plots(runs, tests, out)
    (out / "quality_signoff.json").write_text(json.dumps(report, indent=1, default=str))
    say(f"[signoff] quality sign-off {'PASSED' if passed else 'FAILED'}; report in {out}/quality_signoff.md")
    return report


def _context_of(sample: dict) -> str | None:
    """The context string of a logged lm-eval sample of a generate_until task (its first request's args[0]);
    None when the sample does not carry it in that form."""
    try:
        return sample["arguments"][0][0]
    except (KeyError, IndexError, TypeError):
        return None


def _fmt(x, spec=".3f") -> str:
    return "n/a" if x is None else format(x, spec)


def _markdown(r: dict) -> str:
    lines = [f"# lowlat quality sign-off — {r['date']}", "",
             f"- verdict: **{'PASSED' if r['passed'] else 'FAILED'}**",
             f"- device {r['device']}; baseline (a) `{r['baseline_backend']}` plain decoding; candidate (b) "
             f"`{r['candidate_backend']}` speculative decoding (drafter {r['drafter']}, draft layers "
             f"{r['draft_layers'] or 'default'}, k {r['k'] or 'default'})"
             + (f" — **{r['candidate_backend_note']}**" if r["candidate_backend_note"] else ""),
             f"- items per task: {r['limit']}; seed {r['seed']}; sampled runs at temperature {r['temperature']}",
             f"- rule: {r['rule']}; alpha {r['alpha']} over m = {r['tests_m']} tests "
             f"(per test {r['alpha'] / max(1, r['tests_m']):.2e})", "",
             "## Paired tests", "",
             "| task | metric | runs (cand vs base) | base | cand | delta | n01/n10 | p | CI of delta | verdict |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for t in r["paired_tests"]:
        lines.append(f"| {t['task']} | {t['metric']} | {t['candidate']} vs {t['baseline']} | "
                     f"{_fmt(t['score_baseline'])} | {_fmt(t['score_candidate'])} | {t['delta']:+.3f} | "
                     f"{t['n01']}/{t['n10']} | {t['p_value']:.3g} | [{t['bootstrap_ci'][0]:+.3f}, "
                     f"{t['bootstrap_ci'][1]:+.3f}] | {'pass' if t['passed'] else 'FAIL'} |")
    lines += ["", "## Greedy speculative == greedy plain", "",
              "| task | runs | items | mismatches | at a measured logit tie | verdict |",
              "| --- | --- | --- | --- | --- | --- |"]
    for e in r["greedy_equality"]:
        n_ties = e["mismatches"] - e["unexplained"]
        lines.append(f"| {e['task']} | {e['spec_run']} vs {e['plain_run']} | {e['items']} | {e['mismatches']} | "
                     f"{n_ties} | {'pass' if e['passed'] else 'FAIL'} |")
    ties = [(e["task"], x) for e in r["greedy_equality"] for x in e["ties"]]
    if ties:
        lines += ["", "First differences on the reference backend (not row-invariant): a tie when the float64 "
                  "oracle's gap between the two tokens is within the bf16 reference's own logit error there.", "",
                  "| task | doc | token position | plain / speculative token | oracle gap | reference error | tie |",
                  "| --- | --- | --- | --- | --- | --- | --- |"]
        for task, x in ties:
            lines.append(f"| {task} | {x['doc_id']} | {x['position']} | {x['plain_token']} / {x['spec_token']} | "
                         f"{x['oracle_gap']:.3e} | {x['reference_error']:.3e} | {'yes' if x['tie'] else 'NO'} |")
    lines += ["", "## Speed (generation tasks)", "",
              "| run | backend | mode | T | accept length | P50 ITL ms | P90 ITL ms | interactivity tok/s/user "
              "| mean TTFT ms | P90 TTFT ms | output tok/s |",
              "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for key, run in r["runs"].items():
        s = run["speed"]
        if not s:
            continue
        lines.append(f"| {key} {run['label']} | {run['backend']} | {run['mode']} | {run['temperature']} | "
                     f"{_fmt(s['mean_accept_length'], '.2f')} | {_fmt(s['p50_itl_ms'], '.2f')} | "
                     f"{_fmt(s['p90_itl_ms'], '.2f')} | {_fmt(s['interactivity_tok_s_user'], '.1f')} | "
                     f"{s['mean_ttft_ms']:.1f} | {s['p90_ttft_ms']:.1f} | {s['output_tok_s']:.1f} |")
    steps = [f"{key}: {run['backend_steps']}" for key, run in r["runs"].items() if run.get("backend_steps")]
    if steps:
        lines += ["", "Fused backend steps by path (fused / fallback to the reference forward): " + "; ".join(steps)]
    lines += ["", "Per-token latency = time since the request's previous token / tokens its step emitted (a "
              "speculative step's tokens arrive together); interactivity = 1 / P90 per-token latency; output tok/s = all output tokens / decode wall time.",
              "", "Plots: scores.png, itl_cdf.png, accept_lengths.png"]
    return "\n".join(lines) + "\n"


def _plots(runs: dict, tests: list[dict], out: Path) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    made = []
    # scores with the paired-bootstrap interval of each candidate's difference
    fig, ax = plt.subplots(figsize=(8, 0.5 + 0.45 * max(1, len(tests))))
    labels = [f"{t['task']} ({t['candidate']} vs {t['baseline']})" for t in tests]
    ys = range(len(tests))
    ax.errorbar([t["delta"] for t in tests], ys,
                xerr=[[t["delta"] - t["bootstrap_ci"][0] for t in tests], [t["bootstrap_ci"][1] - t["delta"] for t in tests]],
                fmt="o", color="k", capsize=3)
    for y, t in zip(ys, tests):
        if not t["passed"]:
            ax.plot([t["delta"]], [y], "o", color="tab:red")
    ax.axvline(0, color="tab:blue", lw=1)
    ax.set_yticks(list(ys), labels, fontsize=7)
    ax.set_xlabel("score difference candidate - baseline (paired bootstrap interval at 1 - alpha/m)")
    ax.set_title("lowlat quality sign-off: paired score differences")
    fig.tight_layout()
    fig.savefig(out / "scores.png", dpi=120)
    plt.close(fig)
    made.append("scores.png")
    # per-token latency CDFs
    fig, ax = plt.subplots(figsize=(7, 4))
    any_lat = False
    for key, r in runs.items():
        lat = sorted(x * 1e3 for x in r["token_latency_s"])
        if lat:
            any_lat = True
            ax.plot(lat, [(i + 1) / len(lat) for i in range(len(lat))], label=f"{key} {r['label']}")
    if any_lat:
        ax.axhline(0.9, color="grey", lw=0.8, ls="--")
        ax.set_xscale("log")
        ax.set_xlabel("per-token latency (ms)")
        ax.set_ylabel("fraction of tokens")
        ax.legend(fontsize=7)
        ax.set_title("per-token latency (P90 at the dashed line)")
        fig.tight_layout()
        fig.savefig(out / "itl_cdf.png", dpi=120)
        made.append("itl_cdf.png")
    plt.close(fig)
    # acceptance lengths
    spec = {k_: r["accept_lengths"] for k_, r in runs.items() if r["accept_lengths"]}
    if spec:
        fig, ax = plt.subplots(figsize=(7, 4))
        top = max(max(v) for v in spec.values())
        for i, (key, acc) in enumerate(spec.items()):
            counts = [acc.count(n) / len(acc) for n in range(1, top + 1)]
            ax.bar([n + 0.35 * i for n in range(1, top + 1)], counts, width=0.35,
                   label=f"{key} {runs[key]['label']} (mean {sum(acc) / len(acc):.2f})")
        ax.set_xlabel("tokens emitted per verify step (acceptance length)")
        ax.set_ylabel("fraction of verify steps")
        ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(out / "accept_lengths.png", dpi=120)
        plt.close(fig)
        made.append("accept_lengths.png")
    return made
