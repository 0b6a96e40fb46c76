"""Draft proposers for speculative decoding (Leviathan et al. 2023, "Fast Inference from Transformers via
Speculative Decoding"; Chen et al. 2023, "Accelerating LLM Decoding with Speculative Sampling").

A drafter proposes up to k tokens per request; the target model then checks them in one verify step of
k+1 rows per request (lowlat/runtime/speculative.py). Two drafters:

* `LayerSkipDrafter` -- self-speculation (early exit, as in LayerSkip, Elhoushi et al. 2024, and Draft &
  Verify, Zhang et al. 2023): the target model's own first n layers, then its final RMSNorm and LM head.
  No second set of weights and, as explained in its docstring, no second KV cache.
* `NgramDrafter` -- prompt lookup (Saxena 2023, "Prompt Lookup Decoding"): the tokens that followed the
  most recent earlier occurrence of the request's last n-gram. Deterministic: its draft distribution q
  is one-hot on the proposed token.

Draft sampling follows the request's sampling parameters: greedy requests take the argmax of the draft
logits; sampled requests draw, with counter-based randomness (Philox key = the request's seed, offset =
rng_offset * DRAFT_OFFSET_STRIDE + draft position), from the draft's filtered distribution q (the same
temperature / top-k / top-p the target's distribution gets), and q is returned for the rejection step.
On the fused backend (a runner with `draft_position`, FusedModel) a whole draft position -- embed, layers
0..n-1, final RMSNorm, and the single-launch draft sampler (LM head + filter + sample,
lowlat/kernels/draft_sampling.py) -- is one CUDA graph whose launches are chained by PDL, whenever the
rows' parameters fit the sampler (`draft_params(...).fits`). Otherwise the hidden states come from the
runner's `early_exit_hidden` or the reference model and `sample_drafts` draws: the same sampler launched
on its own on CUDA, its reference (lowlat/reference/draft_sampling.py) elsewhere; the same counters give
the same tokens on every route.

DEFAULT_DRAFT_LAYERS comes from measured acceptance on real prompts: `python bench/bench_speculative.py
--sweep-layers ...`, results in bench/results/draft_layers_sweep.json (SmolLM2-135M-Instruct, reference
backend, greedy, k=5, 16 prompts of lowlat/eval/prompts.py x 32 tokens). Acceptance length tau (tokens
per verify step) by draft layers n (of N=30):

    n    4     8     12    16    20    24    26    28    29
    tau  1.04  1.03  1.08  1.12  1.18  1.54  1.75  2.15  2.37

The untrained early exit rarely agrees with the full model before the last layers (teacher-forced argmax
agreement, measured ad hoc on 4 prompts: 4% at n=4, 18% at n=20, 59% at n=29), so the modelled speed-up,
tau / (1 + k n / N), is below 1 for every n (0.63 at n=4, where drafts are almost never accepted; 0.41 at
n=29): self-speculation cannot speed SmolLM2-135M up. The default is therefore the n with the highest
measured acceptance, n=29 (about 60% of drafts accepted), which is what the quality sign-off needs to
exercise both the acceptance and the residual path of rejection sampling with a real draft distribution
q. For speed on this model use the n-gram drafter (no model cost). A model trained for early exit
(LayerSkip) would show tau well above 1 at small n; re-run the sweep for it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Protocol, Sequence

import torch

from lowlat.errors import KVCacheError, StepContractError
from lowlat.reference.model import ReferenceModel
from lowlat.runtime.engine import Engine, SamplingParams, pad_width
from lowlat.step import StepBatch

#: Draft tokens per verify step (a verify step has k+1 rows per request).
DEFAULT_K = 5

#: Layers the self-speculative draft runs (of SmolLM2-135M's 30): the highest measured acceptance,
#: tau = 2.37 at k=5 (bench/results/draft_layers_sweep.json; the module docstring has every n and why
#: acceptance, not modelled speed, decided). Change it only with a new measurement.
DEFAULT_DRAFT_LAYERS = 29


@dataclass
class SpecState:
    """Per-request decoding state the speculative loop and the drafters share.

    `pending` is the last emitted token: it is not in the KV cache yet (the next step's first row).
    `history` is prompt + emitted tokens (pending included). `rng_offset` counts verify steps: the
    Philox step counter of the draft sampler (offset rng_offset * DRAFT_OFFSET_STRIDE + draft position)
    and of the rejection sampler (offset rng_offset); the Philox key is the request's seed, and the
    stream tags of lowlat.reference.philox keep draft, acceptance and final draws apart.
    """

    req: object                                  # lowlat.runtime.engine.Request
    pending: int
    history: list[int]
    max_draft: int = DEFAULT_K                   # drafts this step (fewer near max_new_tokens)
    rng_offset: int = 0                          # Philox step counter of the rejection sampler
    accept_lengths: list[int] = field(default_factory=list)   # tokens emitted per verify step
    token_latency_s: list[float] = field(default_factory=list)  # amortised per-token latency
    finished: bool = False

    @property
    def params(self) -> SamplingParams:
        return self.req.params

    @property
    def pool_idx(self) -> int:
        return self.req.req_pool_idx


@dataclass
class DraftProposal:
    """Drafts of B requests.

    tokens[b]  list of n_b <= k proposed token ids for request b (may be empty)
    probs[b]   [n_b, V] float32 draft distribution q each token was drawn from (rows sum to 1), or
               None when the drafter is deterministic (q is then one-hot on each proposed token) or the
               request is greedy.
    """

    tokens: list[list[int]]
    probs: list[torch.Tensor | None]


class Drafter(Protocol):
    name: str

    def propose(self, engine: Engine, states: Sequence[SpecState]) -> DraftProposal:
        """Up to states[b].max_draft tokens for each request. May write KV for positions >= the pending
        token's position (the verify step rewrites them); must leave positions before it untouched."""
        ...


def rows_step(engine: Engine, chunks: Sequence[tuple[int, int, Sequence[int]]]) -> StepBatch:
    """A step of rows at given positions, for requests whose KV slots may already be allocated.

    chunks: (req_pool_idx, start position, tokens) per request; the rows of a chunk take positions
    start .. start+len-1. Slots missing for those positions are allocated (`KVCachePool.extend`);
    positions already allocated keep their slot, so a row rewrites the slot an earlier draft row wrote.
    seq_lens[b] = start + len (the step's view of the request). Rows are padded to the engine's next
    captured width. Raises StepContractError (before allocating) when the rows exceed max_rows or the
    widest captured width, or a start position leaves a hole; KVCacheError / StepContractError from
    `KVCachePool.extend` (slots run out, max_ctx) with every slot this call allocated freed again.
    """
    rows = sum(len(t) for _, _, t in chunks)
    if rows > engine.max_rows:
        raise StepContractError(f"{rows} rows exceed max_rows={engine.max_rows}")
    pool = engine.pool
    for idx, start, _ in chunks:
        if idx not in pool.seq_lens:
            raise KVCacheError(f"request row {idx!r} is not allocated (allocated: {sorted(pool.seq_lens)})")
        if start > pool.seq_lens[idx]:
            raise StepContractError(f"request {idx}: start position {start} leaves a hole after "
                                    f"seq_len={pool.seq_lens[idx]}")
    width = pad_width(rows, engine.widths)
    ids, pos, loc, req_idx, seq = [], [], [], [], []
    held = {idx: pool.seq_lens[idx] for idx, _, _ in chunks}
    try:
        for b, (idx, start, tokens) in enumerate(chunks):
            end = start + len(tokens)
            if end > pool.seq_lens[idx]:
                pool.extend(idx, end - pool.seq_lens[idx])
            ids += list(tokens)
            pos += range(start, end)
            loc += pool.req_to_token[idx, start:end].tolist()
            req_idx += [b] * len(tokens)
            seq.append(end)
    except Exception:
        for idx, n in held.items():          # a refused step (e.g. the KV cache full) allocates nothing
            if pool.seq_lens[idx] > n:
                pool.truncate(idx, n)
        raise
    pad = width - rows
    dev = engine.device
    pool_rows = torch.tensor([c[0] for c in chunks], dtype=torch.long, device=dev)
    return StepBatch(
        input_ids=torch.tensor(ids + [0] * pad, dtype=torch.int64, device=dev),
        positions=torch.tensor(pos + [0] * pad, dtype=torch.int64, device=dev),
        out_cache_loc=torch.tensor(loc + [0] * pad, dtype=torch.int32, device=dev),
        req_indices=torch.tensor(req_idx + [0] * pad, dtype=torch.int32, device=dev),
        seq_lens=torch.tensor(seq, dtype=torch.int32, device=dev),
        page_table=pool.req_to_token[pool_rows],
        num_valid_rows=rows,
    )


#: draft position j of verify step s uses Philox offset s * DRAFT_OFFSET_STRIDE + j (k < stride)
DRAFT_OFFSET_STRIDE = 64


def use_kernels(device: torch.device | str) -> bool:
    """The fused Triton samplers run on CUDA devices; elsewhere the PyTorch references run."""
    return torch.device(device).type == "cuda"


@dataclass
class DraftParams:
    """Per-row sampling values of one draft position (row r = states[r]), as host (CPU) tensors.

    temperature [R] float32 (0 = greedy); top_k [R] int32 (0 = off, also for top_k <= 0 or >= V);
    top_p [R] float32; seeds [R] int64 (the requests' Philox keys); offsets [R] int64 (rng_offset *
    DRAFT_OFFSET_STRIDE + position). fits: the single-launch draft sampler takes every row (every sampled
    row's top_k <= 64 or off, and its top_p < 1 only with top_k >= 1; greedy rows always fit).
    """

    temperature: torch.Tensor
    top_k: torch.Tensor
    top_p: torch.Tensor
    seeds: torch.Tensor
    offsets: torch.Tensor
    fits: bool


def draft_params(states: Sequence[SpecState], position: int, vocab_size: int) -> DraftParams:
    """The `DraftParams` of draft position `position` for these requests' rows."""
    temp = [s.params.temperature for s in states]
    top_k = [s.params.top_k if 0 < s.params.top_k < vocab_size else 0 for s in states]
    top_p = [s.params.top_p for s in states]
    # greedy rows take the argmax whatever their top-k / top-p (the kernel ignores both for them)
    fits = all(k <= 64 and (p >= 1 or 1 <= k) for t, k, p in zip(temp, top_k, top_p) if t > 0)
    return DraftParams(
        temperature=torch.tensor(temp, dtype=torch.float32), top_k=torch.tensor(top_k, dtype=torch.int32),
        top_p=torch.tensor(top_p, dtype=torch.float32),
        seeds=torch.tensor([s.params.seed for s in states], dtype=torch.int64),
        offsets=torch.tensor([s.rng_offset * DRAFT_OFFSET_STRIDE + position for s in states], dtype=torch.int64),
        fits=fits)


def sample_drafts(h: torch.Tensor, lm_head: torch.Tensor, states: Sequence[SpecState],
                  position: int) -> tuple[list[int], torch.Tensor]:
    """One draft token per row from final-normed hidden states h [R, H] (row r = states[r]).

    Runs the single-launch draft sampler (`lowlat.kernels.draft_sampling.draft_sample`: LM-head GEMV,
    temperature, top-k/top-p, counter-based sample) on CUDA when the rows fit it (`draft_params`), else
    its reference (`lowlat.reference.draft_sampling.draft_sample`). Philox key = the request's seed,
    offset = rng_offset * DRAFT_OFFSET_STRIDE + position. Greedy rows (temperature 0) take argmax.
    Returns (tokens, q [R, V] float32: the distribution each token was drawn from).
    """
    dev = h.device
    p = draft_params(states, position, lm_head.shape[0])
    seeds, offsets = p.seeds.to(dev), p.offsets.to(dev)
    if use_kernels(dev) and p.fits:
        from lowlat.kernels.draft_sampling import draft_sample

        out = draft_sample(h.contiguous(), lm_head, p.temperature, p.top_k, p.top_p, seeds=seeds, offsets=offsets)
        return out.tokens.tolist(), out.probs()
    from lowlat.reference.draft_sampling import draft_sample as ref_draft_sample

    # the reference runs its GEMV in float32: convert the [V, H] weight once, not every draft position
    w32 = _float32_copy(lm_head)
    tokens, q, _ = ref_draft_sample(h.to(w32.dtype), w32, p.temperature, p.top_k, p.top_p, seeds, offsets)
    return tokens.tolist(), q


_F32_CACHE: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}


def _float32_copy(w: torch.Tensor) -> torch.Tensor:
    """w in float32 (float64 stays float64), cached per tensor object (one entry: the LM head)."""
    if w.dtype in (torch.float32, torch.float64):
        return w
    hit = _F32_CACHE.get(id(w))
    if hit is None or hit[0] is not w:
        _F32_CACHE.clear()
        hit = _F32_CACHE[id(w)] = (w, w.float())
    return hit[1]


class LayerSkipDrafter:
    """Self-speculation: the target's first n layers + its final norm + LM head draft k tokens.

    KV sharing. Layer l's K/V at position p is a function of the tokens at positions <= p only (through
    layers 0..l-1). The draft runs layers 0..n-1 of the same weights on the same tokens, so the K/V it
    produces for layers < n at a position is what the target produces there (equal up to the rounding of
    a differently-shaped step). The draft therefore needs no cache of its own: draft row j (input token
    at position L+j) writes layers 0..n-1 of the slot the verify step will use for position L+j, and
    reads layers 0..n-1 of earlier draft rows from there. Layers n..N-1 of those slots are left as they
    were. The verify step then rewrites every layer of positions L..L+k with the target's own values
    (`rows_step` keeps the slots), and rollback (`KVCachePool.truncate`) frees the positions after the
    last accepted token. Positions < L (the committed context) are never written by the draft.

    Routes, per draft position:
      1. fused runner with `draft_position` (FusedModel), rows that fit the single-launch sampler
         (`draft_params(...).fits`) and no `lm_head=` override (the graph samples with the runner's own LM
         head): the whole position -- embed, layers 0..n-1, final RMSNorm, draft
         sampling -- is one CUDA graph per (width, n, sampler launch flags), every launch chained by PDL
         (`FusedModel.draft_position`); tokens come back in one `.tolist()`, q through
         `DraftSample.probs()` for the rows with temperature > 0;
      2. fused runner, rows that do not fit (or an `lm_head=` override): its `early_exit_hidden` (layers +
         norm, a graph per (width, n)), then `sample_drafts`;
      3. no fused runner, `fused=False`, or `forward=`: the reference model's (or `forward`'s) hidden
         states, then `sample_drafts`.
    Every route uses the same Philox counters (`draft_params`), so the same hidden states give the same
    tokens.

    Parameters:
        num_layers  n, 1..N-1 (default DEFAULT_DRAFT_LAYERS, capped at N-1)
        model       the ReferenceModel whose first n layers draft on route 3; default: the engine
                    backend's `.model` (reference backend) or its fallback's (the fused backend's reference
                    forward)
        forward     optional draft forward `(step, pool, num_layers) -> final-normed hidden states
                    [M, H]`; it overrides `model` and `fused` (then pass `lm_head`)
        lm_head     [V, H] LM-head weight for `sample_drafts` (default: the fused runner's `lm_head_w`,
                    else the model's)
        fused       draft through the fused runner (routes 1-2) when the engine has one: the fused
                    contract backend's built runner, or a backend that is itself one (`Engine(cfg,
                    FusedModel(...), pool)`); default True (TP 1 only, as FusedModel). False: always the
                    reference model.
    Raises ValueError for n outside 1..N-1 (checked before the first draft step).
    """

    name = "layers"

    def __init__(self, num_layers: int = DEFAULT_DRAFT_LAYERS, *, model: ReferenceModel | None = None,
                 forward: Callable[[StepBatch, object, int], torch.Tensor] | None = None,
                 lm_head: torch.Tensor | None = None, fused: bool = True) -> None:
        self.num_layers, self.model, self._forward, self.lm_head = num_layers, model, forward, lm_head
        self.fused = fused

    def _check_layers(self, engine: Engine) -> None:
        n_total = engine.cfg.num_layers
        if not 1 <= self.num_layers < n_total:
            raise ValueError(f"draft num_layers={self.num_layers} must be in 1..{n_total - 1}")

    def _runner(self, engine: Engine):
        """The fused runner to draft through (an object with `early_exit_hidden`), or None."""
        if self._forward is not None or not self.fused:
            return None
        built = getattr(engine.backend, "built", None)
        runner = getattr(built, "runner", None) if built is not None else engine.backend
        return runner if hasattr(runner, "early_exit_hidden") else None

    def _draft_hidden(self, engine: Engine, step: StepBatch) -> torch.Tensor:
        """Final-normed hidden states of one draft position (routes 2-3; `propose` checked n first)."""
        if self._forward is not None:
            return self._forward(step, engine.pool, self.num_layers)
        runner = self._runner(engine)
        if runner is not None:
            return runner.early_exit_hidden(step, engine.pool, self.num_layers)
        model = self._model(engine)
        return model.hidden_states(step, engine.pool.k_caches, engine.pool.v_caches, self.num_layers)

    def _model(self, engine: Engine) -> ReferenceModel:
        # the reference backend's model, or the fused backend's reference fallback (same weights, device)
        model = self.model or getattr(engine.backend, "model", None) or getattr(
            getattr(engine.backend, "fallback", None), "model", None)
        if not isinstance(model, ReferenceModel):
            raise TypeError("LayerSkipDrafter needs `model=` (a ReferenceModel) or `forward=` for a backend "
                            f"without a reference model ({type(engine.backend).__name__})")
        return model

    def _lm_head(self, engine: Engine, runner) -> torch.Tensor:
        if self.lm_head is not None:
            return self.lm_head
        if getattr(runner, "lm_head_w", None) is not None:
            return runner.lm_head_w
        return self._model(engine).weights.lm_head

    def _draft_position(self, engine: Engine, runner, step: StepBatch,
                        p: DraftParams) -> tuple[list[int], torch.Tensor | None]:
        """Route 1: (tokens, q [R, V] float32 or None when every row is greedy) of one draft position."""
        from lowlat.kernels.draft_sampling import launch_flags

        k_cap, need_noise = launch_flags(p.temperature, p.top_k, engine.cfg.vocab_size)
        out = runner.draft_position(step, engine.pool, self.num_layers, p.temperature, p.top_k, p.top_p,
                                    p.seeds, p.offsets, k_cap=k_cap, need_noise=need_noise)
        tokens = out.tokens.tolist()
        v = engine.cfg.vocab_size
        if any(not 0 <= t < v for t in tokens):   # the launch flags come from these very rows: a bug, not an input
            raise RuntimeError(f"draft_position marked rows as outside its launch (tokens {tokens}, k_cap {k_cap}, "
                               f"need_noise {need_noise})")
        return tokens, (out.probs() if bool((p.temperature > 0).any()) else None)

    def propose(self, engine: Engine, states: Sequence[SpecState]) -> DraftProposal:
        self._check_layers(engine)
        tokens: list[list[int]] = [[] for _ in states]
        probs: list[list[torch.Tensor]] = [[] for _ in states]
        inputs = [s.pending for s in states]
        start = [engine.pool.seq_lens[s.pool_idx] for s in states]
        runner = self._runner(engine)
        lm_head = None
        for j in range(max((s.max_draft for s in states), default=0)):
            live = [b for b, s in enumerate(states) if s.max_draft > j]
            step = rows_step(engine, [(states[b].pool_idx, start[b] + j, [inputs[b]]) for b in live])
            rows = [states[b] for b in live]
            params = draft_params(rows, j, engine.cfg.vocab_size)
            if params.fits and hasattr(runner, "draft_position") and self.lm_head is None:
                toks, q = self._draft_position(engine, runner, step, params)
            else:
                h = self._draft_hidden(engine, step)[: step.num_valid_rows]
                lm_head = self._lm_head(engine, runner) if lm_head is None else lm_head
                toks, q = sample_drafts(h.to(lm_head.dtype), lm_head, rows, j)
            for row, b in enumerate(live):
                tokens[b].append(toks[row])
                if states[b].params.temperature > 0:
                    probs[b].append(q[row])
                inputs[b] = toks[row]
        return DraftProposal(tokens, [torch.stack(p) if p else None for p in probs])


class NgramDrafter:
    """Prompt lookup: match the request's last n tokens (n = max_ngram down to min_ngram) against its
    earlier history (prompt + emitted tokens) and propose the tokens that followed the most recent
    earlier match, up to k. No match proposes nothing (the step is then a plain decode row).

    Deterministic: q is one-hot on each proposed token, so speculative sampling accepts token x with
    probability p(x) and resamples from p without x -- still exactly the target's distribution.
    Writes no KV. Raises ValueError unless 1 <= min_ngram <= max_ngram.
    """

    name = "ngram"

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1) -> None:
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"need 1 <= min_ngram={min_ngram} <= max_ngram={max_ngram}")
        self.max_ngram, self.min_ngram = max_ngram, min_ngram

    def lookup(self, history: Sequence[int], k: int) -> list[int]:
        """Up to k tokens following the most recent earlier occurrence of history's longest suffix
        n-gram (n in max_ngram..min_ngram); [] when none matches."""
        h = list(history)
        if k <= 0:
            return []
        for n in range(min(self.max_ngram, len(h) - 1), self.min_ngram - 1, -1):
            suffix = h[-n:]
            for s in range(len(h) - n - 1, -1, -1):        # most recent earlier occurrence first
                if h[s:s + n] == suffix:
                    return h[s + n: s + n + k]
        return []

    def propose(self, engine: Engine, states: Sequence[SpecState]) -> DraftProposal:
        return DraftProposal([self.lookup(s.history, s.max_draft) for s in states], [None] * len(states))


def make_drafter(name: str, *, num_layers: int = DEFAULT_DRAFT_LAYERS, max_ngram: int = 3) -> Drafter:
    """A drafter by name: "layers" (self-speculation, `num_layers`) or "ngram" (prompt lookup)."""
    if name == "layers":
        return LayerSkipDrafter(num_layers)
    if name == "ngram":
        return NgramDrafter(max_ngram)
    raise ValueError(f"drafter={name!r}: choose 'layers' or 'ngram'")
