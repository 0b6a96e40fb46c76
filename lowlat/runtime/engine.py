"""Decode engine v0: requests, KV slots, chunked prefill, greedy / sampled decode, padding to a
captured width. Every forward goes through a backend with `forward(step, pool) -> logits [M, V]`.

Steps follow lowlat/step.py: prefill runs in chunks of at most `max_rows` rows; a decode step holds
one row per running request, padded with dummy rows up to the next captured width in `widths`.
"""

from __future__ import annotations

import numbers
import time
from dataclasses import dataclass, field
from typing import Callable, Protocol, Sequence

import torch

from lowlat.config import ModelConfig
from lowlat.errors import StepContractError, UnsupportedConfigError
from lowlat.reference import sampling
from lowlat.reference.model import ReferenceModel
from lowlat.runtime.kv_cache import KVCachePool
from lowlat.step import MAX_ROWS, StepBatch, as_int
from lowlat.weights import ModelWeights

#: Step widths a fused backend captures one CUDA graph for (decode rows are padded up to one).
WIDTHS = (1, 2, 4, 6, 8, 12, 16, 24, 32, 48)


class Backend(Protocol):
    def forward(self, step: StepBatch, pool: KVCachePool) -> torch.Tensor: ...


class ReferenceBackend:
    """The plain-PyTorch model (lowlat/reference/model.py) as an engine backend."""

    name = "reference"

    def __init__(self, cfg: ModelConfig, weights: ModelWeights) -> None:
        self.model = ReferenceModel(cfg, weights)

    def forward(self, step: StepBatch, pool: KVCachePool) -> torch.Tensor:
        return self.model.forward(step, pool.k_caches, pool.v_caches)


#: Smallest temperature > 0 a request may ask for: below it logits / T overflows float32 for ordinary
#: logits (T = 1e-38 gave NaN probabilities: a plain decode raised in torch.multinomial, a speculative one
#: emitted token 0). Use temperature 0 for greedy decoding.
MIN_TEMPERATURE = 1e-5
_INT64 = (-(1 << 63), (1 << 63) - 1)


@dataclass
class SamplingParams:
    """Sampling parameters of one request.

    temperature     0 = greedy, else a finite number >= MIN_TEMPERATURE (float or int)
    top_k           int; <= 0 (or >= V) keeps every token
    top_p           number in (0, 1]; 1 keeps every token
    seed            int in int64's range: the request's torch generator (plain sampling) and Philox key
                    (speculative decoding), so sampling is reproducible per request
    max_new_tokens  int >= 1
    ignore_eos      bool
    Raises UnsupportedConfigError (a ValueError) naming the first bad field: a value out of range, a bool
    or float where an int is needed, a non-number (bools are refused for numbers too).
    """

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0
    max_new_tokens: int = 32
    ignore_eos: bool = False

    def __post_init__(self) -> None:
        def number(name: str) -> float:
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, numbers.Real):
                raise UnsupportedConfigError(name, v, "must be a number")
            return float(v)

        def integer(name: str, lo: int, hi: int, why: str) -> None:
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, numbers.Integral):
                raise UnsupportedConfigError(name, v, "must be an int")
            if not lo <= v <= hi:
                raise UnsupportedConfigError(name, v, why)

        t = number("temperature")
        if not 0 <= t < float("inf"):          # NaN fails too
            raise UnsupportedConfigError("temperature", self.temperature, "must be a finite number >= 0")
        if 0 < t < MIN_TEMPERATURE:
            raise UnsupportedConfigError("temperature", self.temperature,
                                         f"must be 0 (greedy) or >= {MIN_TEMPERATURE:g}: logits / T overflows")
        if not 0 < number("top_p") <= 1:
            raise UnsupportedConfigError("top_p", self.top_p, "must be in (0, 1]")
        integer("top_k", *_INT64, "must fit in int64 (<= 0 keeps every token)")
        integer("seed", *_INT64, f"must be in int64's range {list(_INT64)}")
        integer("max_new_tokens", 1, _INT64[1], "must be >= 1")
        if not isinstance(self.ignore_eos, bool):
            raise UnsupportedConfigError("ignore_eos", self.ignore_eos, "must be a bool")


@dataclass
class Request:
    prompt_ids: list[int]
    params: SamplingParams
    req_pool_idx: int = -1
    output_ids: list[int] = field(default_factory=list)
    finished: bool = False
    generator: torch.Generator | None = None
    ttft_s: float = 0.0
    token_times: list[float] = field(default_factory=list)   # host time of each output token

    @property
    def itl_s(self) -> list[float]:
        """Inter-token latencies (s) after the first token."""
        return [b - a for a, b in zip(self.token_times, self.token_times[1:])]


def pad_width(rows: int, widths: Sequence[int] = WIDTHS) -> int:
    """Smallest captured width >= rows. Raises StepContractError above the largest."""
    for w in widths:
        if w >= rows:
            return w
    raise StepContractError(f"{rows} rows exceed max_rows={max(widths)}")


class Engine:
    def __init__(self, cfg: ModelConfig, backend: Backend, pool: KVCachePool, *,
                 widths: Sequence[int] = WIDTHS, max_rows: int = MAX_ROWS) -> None:
        self.cfg, self.backend, self.pool = cfg, backend, pool
        self.widths, self.max_rows = tuple(widths), max_rows
        self.device = pool.req_to_token.device

    # ---------------------------------------------------------------- steps
    def build_step(self, chunks: Sequence[tuple[Request, Sequence[int]]], *, pad: bool = True) -> StepBatch:
        """One step from (request, new tokens) chunks: allocates their KV slots and lays out rows.

        Rows are padded to the next captured width when `pad`. Raises StepContractError (nothing
        allocated) when the rows exceed max_rows.
        """
        rows = sum(len(t) for _, t in chunks)
        if rows > self.max_rows:
            raise StepContractError(f"{rows} rows exceed max_rows={self.max_rows}")
        width = pad_width(rows, self.widths) if pad else rows
        ids, pos, loc, req_idx = [], [], [], []
        done: list[tuple[Request, int]] = []
        try:
            for b, (req, tokens) in enumerate(chunks):
                start = self.pool.seq_lens[req.req_pool_idx]
                slots = self.pool.extend(req.req_pool_idx, len(tokens))
                done.append((req, start))
                ids += list(tokens)
                pos += range(start, start + len(tokens))
                loc += slots.tolist()
                req_idx += [b] * len(tokens)
        except Exception:
            for req, start in reversed(done):          # nothing of a refused step stays allocated
                self.pool.truncate(req.req_pool_idx, start)
            raise
        pad_rows = width - rows
        dev = self.device
        pool_rows = torch.tensor([r.req_pool_idx for r, _ in chunks], dtype=torch.long, device=dev)
        return StepBatch(
            input_ids=torch.tensor(ids + [0] * pad_rows, dtype=torch.int64, device=dev),
            positions=torch.tensor(pos + [0] * pad_rows, dtype=torch.int64, device=dev),
            out_cache_loc=torch.tensor(loc + [0] * pad_rows, dtype=torch.int32, device=dev),
            req_indices=torch.tensor(req_idx + [0] * pad_rows, dtype=torch.int32, device=dev),
            seq_lens=torch.tensor([self.pool.seq_lens[r.req_pool_idx] for r, _ in chunks],
                                  dtype=torch.int32, device=dev),
            page_table=self.pool.req_to_token[pool_rows],
            num_valid_rows=rows,
        )

    def run_step(self, chunks: Sequence[tuple[Request, Sequence[int]]]) -> torch.Tensor:
        """Build, forward; returns logits [valid rows, V] (float32)."""
        step = self.build_step(chunks)
        try:
            logits = self.backend.forward(step, self.pool)
        except Exception:
            for req, tokens in chunks:          # nothing of a refused step stays allocated
                self.pool.truncate(req.req_pool_idx, self.pool.seq_lens[req.req_pool_idx] - len(tokens))
            raise
        return logits[: step.num_valid_rows]

    # ---------------------------------------------------------------- requests
    def add_request(self, prompt_ids: Sequence[int], params: SamplingParams | None = None) -> Request:
        """Allocate a request row for prompt_ids (a non-empty sequence of int token ids in [0, V): Python,
        numpy or 0-d torch integers; a 1-D integer tensor works too) with `params` (default greedy).

        Raises StepContractError for an empty prompt, a token id that is not an int (float, bool) or outside
        [0, V), or prompt + max_new_tokens beyond max_ctx; KVCacheError when no request row is free.
        Nothing is allocated when it raises.
        """
        params = params or SamplingParams()
        if not isinstance(params, SamplingParams):
            raise StepContractError(f"params must be a SamplingParams, got {type(params).__name__}")
        if isinstance(prompt_ids, (str, bytes)) or (isinstance(prompt_ids, torch.Tensor) and prompt_ids.dim() != 1):
            raise StepContractError(f"prompt_ids must be a sequence of token ids, got {prompt_ids!r:.80}")
        ids = list(prompt_ids)
        if not ids:
            raise StepContractError("prompt_ids is empty: a request needs at least one prompt token")
        for i, t in enumerate(ids):
            ids[i] = as_int(t)
            if ids[i] is None:
                raise StepContractError(f"prompt_ids[{i}]={t!r} is not an int token id")
        bad = [t for t in ids if not 0 <= t < self.cfg.vocab_size]
        if bad:
            raise StepContractError(f"token id {bad[0]} outside [0, {self.cfg.vocab_size})")
        if len(ids) + params.max_new_tokens > self.pool.max_ctx:
            raise StepContractError(f"prompt ({len(ids)}) + max_new_tokens ({params.max_new_tokens}) "
                                    f"exceeds max_ctx={self.pool.max_ctx}")
        req = Request(ids, params, req_pool_idx=self.pool.alloc_request())
        req.generator = torch.Generator().manual_seed(params.seed)
        return req

    def prefill(self, req: Request) -> torch.Tensor:
        """Run the prompt in chunks of <= max_rows rows; returns the last row's logits [V]."""
        p = req.prompt_ids
        logits = None
        for s in range(0, len(p), self.max_rows):
            logits = self.run_step([(req, p[s:s + self.max_rows])])
        return logits[-1]

    def _accept(self, req: Request, logits: torch.Tensor, now: float) -> int:
        sp = req.params
        tok = int(sampling.sample(logits[None], sp.temperature, sp.top_k, sp.top_p, req.generator)[0])
        req.output_ids.append(tok)
        req.token_times.append(now)
        if (not sp.ignore_eos and tok in self.cfg.eos_token_ids) or len(req.output_ids) >= sp.max_new_tokens:
            req.finished = True
        return tok

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams | Sequence[SamplingParams] | None = None,
                 on_token: Callable[[int, int], None] | None = None) -> list[Request]:
        """Generate for several prompts; running requests share each decode step.

        on_token(request_index, token_id) is called as each token is chosen (streaming).
        Returns the finished requests (output_ids, ttft_s, token_times). Their KV slots are freed.
        Raises StepContractError / UnsupportedConfigError for bad prompts or params (as `add_request`), or
        a params list whose length differs from the prompts'; every request row and slot is freed then too.
        """
        if params is None or isinstance(params, SamplingParams):
            params = [params or SamplingParams()] * len(prompts)
        if len(params) != len(prompts):
            raise StepContractError(f"{len(params)} SamplingParams for {len(prompts)} prompts")
        reqs: list[Request] = []
        try:
            for p, sp in zip(prompts, params):       # a refused prompt frees the rows of those before it
                reqs.append(self.add_request(p, sp))
            t0 = time.perf_counter()
            for i, req in enumerate(reqs):
                last = self.prefill(req)
                tok = self._accept(req, last, time.perf_counter())
                req.ttft_s = req.token_times[0] - t0
                if on_token:
                    on_token(i, tok)
            while True:
                running = [(i, r) for i, r in enumerate(reqs) if not r.finished]
                if not running:
                    break
                for s in range(0, len(running), self.max_rows):
                    group = running[s:s + self.max_rows]
                    logits = self.run_step([(r, [r.output_ids[-1]]) for _, r in group])
                    now = time.perf_counter()
                    for row, (i, r) in enumerate(group):
                        tok = self._accept(r, logits[row], now)
                        if on_token:
                            on_token(i, tok)
        finally:
            for r in reqs:
                self.pool.free_request(r.req_pool_idx)
        return reqs


def reference_engine(cfg: ModelConfig, weights: ModelWeights, *, num_slots: int = 4096, max_reqs: int = 16,
                     max_ctx: int = 2048, device: str | torch.device = "cpu",
                     compute_dtype: torch.dtype | None = None) -> Engine:
    """An engine on the reference backend; `compute_dtype` (e.g. float32) upcasts the bf16 weights."""
    w = weights.to(device=device, dtype=compute_dtype) if compute_dtype else weights.to(device=device)
    dtype = compute_dtype or w.embed.dtype
    pool = KVCachePool(cfg, num_slots=num_slots, max_reqs=max_reqs, max_ctx=max_ctx, dtype=dtype, device=device)
    return Engine(cfg, ReferenceBackend(cfg, w), pool)


def make_engine(backend: str, cfg: ModelConfig, weights: ModelWeights, *, device: str | torch.device = "cpu",
                **pool_kwargs) -> Engine:
    """The engine for a backend name: "reference" (plain PyTorch) or "fused" (lowlat's plugin contract:
    guard, build, then plan -> fused forward or fallback, lowlat/runtime/contract.py)."""
    if backend == "reference":
        return reference_engine(cfg, weights, device=device, **pool_kwargs)
    if backend == "fused":
        from lowlat.runtime.contract import fused_engine

        return fused_engine(cfg, weights, device=device, **pool_kwargs)
    raise ValueError(f"backend={backend!r}: choose 'reference' or 'fused'")
