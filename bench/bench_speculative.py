"""End-to-end decode speed with and without speculative decoding on SmolLM2-135M-Instruct.

    python bench/bench_speculative.py --out bench/results/speculative_<device>.json \
        [--backend reference|fused] [--concurrency 1 2 4 8] [--drafters none layers ngram] [--tokens 128]
    python bench/bench_speculative.py --sweep-layers 4 8 12 16 20 24 --out bench/results/draft_layers_sweep.json

For each concurrency C (C requests decoded together, prompts from lowlat/eval/prompts.py) and each
drafter: output tokens/s/user (each request's output tokens / its decode time, mean over requests),
P50/P90 per-token latency, interactivity 1/P90, TTFT, aggregate output tokens/s and the acceptance length
(tokens per verify step). Greedy, k=5 (--k). One warm-up run per configuration first.

--sweep-layers measures the self-speculative draft's acceptance for each number of draft layers n (greedy,
k=5, all prompts) and the modelled speed-up tau / (1 + k n / N) (a step's cost taken proportional to the
layers it runs); lowlat/runtime/drafters.py's DEFAULT_DRAFT_LAYERS comes from that measurement (its
comment says which rule applied).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))     # run from a checkout, installed or not

from lowlat.benchmarking import versions, write_json  # noqa: E402


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def run_config(engine, drafter, prompts, tokens: int, k: int) -> dict:
    from lowlat.runtime.engine import SamplingParams
    from lowlat.runtime.speculative import SpeculativeDecoder, summarize

    dec = SpeculativeDecoder(engine, drafter, k=k)
    sp = SamplingParams(max_new_tokens=tokens, ignore_eos=True)
    _sync()
    t0 = time.perf_counter()
    res = dec.generate(prompts, sp)
    _sync()
    wall = time.perf_counter() - t0
    st = summarize(res, wall).as_dict()
    per_user = [(len(r.output_ids) - 1) / sum(r.token_latency_s) for r in res if r.token_latency_s]
    st["tok_s_user"] = statistics.fmean(per_user) if per_user else None
    st["accept_lengths"] = [round(statistics.fmean(r.accept_lengths), 3) if r.accept_lengths else None for r in res]
    return st


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--backend", default="reference", choices=["reference", "fused"])
    ap.add_argument("--device", default="auto")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 2, 4, 8])
    ap.add_argument("--drafters", nargs="+", default=["none", "layers", "ngram"])
    ap.add_argument("--draft-layers", type=int, default=None)
    ap.add_argument("--k", type=int, default=5)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--sweep-layers", type=int, nargs="*", default=None)
    ap.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: leave as is)")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)

    from lowlat.eval.prompts import prompt_token_ids
    from lowlat.gguf_loader import load_gguf_model, load_tokenizer
    from lowlat.reference.model import ReferenceModel
    from lowlat.runtime.drafters import DEFAULT_DRAFT_LAYERS, LayerSkipDrafter, NgramDrafter
    from lowlat.runtime.engine import make_engine

    device = ("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device
    cfg, weights = load_gguf_model()
    prompts = prompt_token_ids(load_tokenizer(), args.prompts)
    def build(tokens_per_request: int):
        extra = {"tokens_per_request": tokens_per_request} if args.backend == "fused" else {}
        return make_engine(args.backend, cfg, weights, device=device, num_slots=16384, max_reqs=64, max_ctx=1024,
                           **extra)

    # the fused backend is built per step shape: k+1-row verify steps for speculation, 1-row decode
    # steps for plain decoding (its widths then include 1, 2, 4, ... rather than multiples of k+1)
    engine = build(args.k + 1)
    plain_engine = build(1) if args.backend == "fused" and "none" in args.drafters else engine
    model = getattr(engine.backend, "model", None) or getattr(getattr(engine.backend, "fallback", None), "model", None)
    if not isinstance(model, ReferenceModel):
        model = ReferenceModel(cfg, weights.to(device=device))
    if args.backend == "fused" and hasattr(engine.backend, "report"):
        print(engine.backend.report(), flush=True)
    report = {**versions(), "model": cfg.name, "backend": args.backend, "k": args.k, "tokens": args.tokens,
              "prompts": len(prompts)}

    if args.sweep_layers is not None:
        rows = []
        for n in args.sweep_layers:
            st = run_config(engine, LayerSkipDrafter(n, model=model), prompts, args.tokens, args.k)
            tau = st["mean_accept_length"]
            rows.append({"draft_layers": n, "mean_accept_length": tau,
                         "modelled_speedup": tau / (1 + args.k * n / cfg.num_layers),
                         "per_prompt_accept_length": st["accept_lengths"], "wall_s": st["wall_s"]})
            print(f"n={n:2d}  tau={tau:.3f}  modelled speed-up {rows[-1]['modelled_speedup']:.3f}", flush=True)
        best = max(rows, key=lambda r: r["modelled_speedup"])
        most = max(rows, key=lambda r: r["mean_accept_length"])
        report.update(sweep=rows, best_speedup_draft_layers=best["draft_layers"],
                      best_acceptance_draft_layers=most["draft_layers"],
                      any_modelled_speedup_above_1=any(r["modelled_speedup"] > 1 for r in rows),
                      rule=("greedy, ignore_eos; best_speedup: argmax over n of tau / (1 + k n / N); "
                            "best_acceptance: argmax over n of tau (DEFAULT_DRAFT_LAYERS when no n speeds up)"))
    else:
        n_layers = args.draft_layers or DEFAULT_DRAFT_LAYERS
        drafters = {"none": None, "layers": LayerSkipDrafter(n_layers, model=model), "ngram": NgramDrafter()}
        results = []
        for c in args.concurrency:
            batch = [prompts[i % len(prompts)] for i in range(c)]
            for name in args.drafters:
                eng = plain_engine if name == "none" else engine
                run_config(eng, drafters[name], batch, min(args.tokens, 8), args.k)      # warm-up
                st = run_config(eng, drafters[name], batch, args.tokens, args.k)
                st.update(concurrency=c, drafter=name, draft_layers=n_layers if name == "layers" else None)
                results.append(st)
                print(f"C={c} {name:6s} {st['tok_s_user']:.1f} tok/s/user, P90 ITL {st['p90_itl_ms']:.2f} ms, "
                      f"TTFT {st['mean_ttft_ms']:.1f} ms, accept {st['mean_accept_length']}", flush=True)
        report["results"] = results
        if hasattr(engine.backend, "counts"):
            report["fused_step_counts"] = {"speculative_engine": dict(engine.backend.counts),
                                           "plain_engine": dict(plain_engine.backend.counts)}
    write_json(args.out, report)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
