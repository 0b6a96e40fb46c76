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

Draft sampling follows the request's sampling parameters (`sample_drafts`): greedy requests take the
argmax of the draft logits; sampled requests draw, with counter-based randomness, from the draft's
filtered distribution q (the same temperature / top-k / top-p the target's distribution gets), and q is
returned for the rejection step. On CUDA one launch per draft position does LM head + filter + sample
(lowlat/kernels/draft_sampling.py); elsewhere its reference (lowlat/reference/draft_sampling.py) runs.

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

from lowlat.errors import StepContractError
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
    captured width. Raises StepContractError (before allocating) when the rows exceed max_rows or a
    start position leaves a hole.
    """
    rows = sum(len(t) for _, _, t in chunks)
    if rows > engine.max_rows:
        raise StepContractError(f"{rows} rows exceed max_rows={engine.max_rows}")
    pool = engine.pool
    for idx, start, _ in chunks:
        if start > pool.seq_lens[idx]:
            raise StepContractError(f"request {idx}: start position {start} leaves a hole after "
                                    f"seq_len={pool.seq_lens[idx]}")
    ids, pos, loc, req_idx, seq = [], [], [], [], []
    for b, (idx, start, tokens) in enumerate(chunks):
        end = start + len(tokens)
        if end > pool.seq_lens[idx]:
            pool.extend(idx, end - pool.seq_lens[idx])
        ids += list(tokens)
        pos += range(start, end)
        loc += pool.req_to_token[idx, start:end].tolist()
        req_idx += [b] * len(tokens)
        seq.append(end)
    width = pad_width(rows, engine.widths)
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


def sample_drafts(h: torch.Tensor, lm_head: torch.Tensor, states: Sequence[SpecState],
                  position: int) -> tuple[list[int], torch.Tensor]:
    """One draft token per row from final-normed hidden states h [R, H] (row r = states[r]).

    Runs the single-launch draft sampler (`lowlat.kernels.draft_sampling.draft_sample`: LM-head GEMV,
    temperature, top-k/top-p, counter-based sample) on CUDA when every row's top-k fits it (<= 64, or
    off), else its reference (`lowlat.reference.draft_sampling.draft_sample`). Philox key = the request's
    seed, offset = rng_offset * DRAFT_OFFSET_STRIDE + position. Greedy rows (temperature 0) take argmax.
    Returns (tokens, q [R, V] float32: the distribution each token was drawn from).
    """
    dev = h.device
    temp = [s.params.temperature for s in states]
    top_k = [s.params.top_k if 0 < s.params.top_k < lm_head.shape[0] else 0 for s in states]
    top_p = [s.params.top_p for s in states]
    seeds = torch.tensor([s.params.seed for s in states], dtype=torch.int64, device=dev)
    offsets = torch.tensor([s.rng_offset * DRAFT_OFFSET_STRIDE + position for s in states],
                           dtype=torch.int64, device=dev)
    fits = all(k <= 64 for k in top_k) and all(p >= 1 or 1 <= k for p, k in zip(top_p, top_k))
    if use_kernels(dev) and fits:
        from lowlat.kernels.draft_sampling import draft_sample

        out = draft_sample(h.contiguous(), lm_head, torch.tensor(temp), torch.tensor(top_k), torch.tensor(top_p),
                           seeds=seeds, offsets=offsets)
        return out.tokens.tolist(), out.probs()
    from lowlat.reference.draft_sampling import draft_sample as ref_draft_sample

    # the reference runs its GEMV in float32: convert the [V, H] weight once, not every draft position
    w32 = _float32_copy(lm_head)
    tokens, q, _ = ref_draft_sample(h.to(w32.dtype), w32, torch.tensor(temp), torch.tensor(top_k),
                                    torch.tensor(top_p), seeds, offsets)
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

    Parameters:
        num_layers  n, 1..N-1 (default DEFAULT_DRAFT_LAYERS, capped at N-1)
        model       the ReferenceModel whose first n layers draft; default: the engine backend's
                    `.model` (reference backend) or its fallback's (the fused backend's reference forward)
        forward     optional draft forward `(step, pool, num_layers) -> final-normed hidden states
                    [M, H]`; it overrides `model` and `fused` (then pass `lm_head`)
        lm_head     [V, H] LM-head weight for the draft sampler (default: the model's)
        fused       when the engine's backend is the fused contract backend with a built runner that
                    has `early_exit_hidden` (FusedModel), draft through it: the same fused launches
                    for layers 0..n-1 in a CUDA graph per (width, n) (default True; TP 1 only, as
                    FusedModel). False: always the reference model.
    Draft tokens come from `sample_drafts` (the single-launch draft-sampling kernel on CUDA).
    Raises ValueError for n outside 1..N-1 (checked when the engine is first seen).
    """

    name = "layers"

    def __init__(self, num_layers: int = DEFAULT_DRAFT_LAYERS, *, model: ReferenceModel | None = None,
                 forward: Callable[[StepBatch, object, int], torch.Tensor] | None = None,
                 lm_head: torch.Tensor | None = None, fused: bool = True) -> None:
        self.num_layers, self.model, self._forward, self.lm_head = num_layers, model, forward, lm_head
        self.fused = fused

    def _draft_hidden(self, engine: Engine, step: StepBatch) -> torch.Tensor:
        n_total = engine.cfg.num_layers
        if not 1 <= self.num_layers < n_total:
            raise ValueError(f"draft num_layers={self.num_layers} must be in 1..{n_total - 1}")
        if self._forward is not None:
            return self._forward(step, engine.pool, self.num_layers)
        runner = getattr(getattr(engine.backend, "built", None), "runner", None)
        if self.fused and hasattr(runner, "early_exit_hidden"):
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

    def propose(self, engine: Engine, states: Sequence[SpecState]) -> DraftProposal:
        tokens: list[list[int]] = [[] for _ in states]
        probs: list[list[torch.Tensor]] = [[] for _ in states]
        inputs = [s.pending for s in states]
        start = [engine.pool.seq_lens[s.pool_idx] for s in states]
        lm_head = self.lm_head if self.lm_head is not None else self._model(engine).weights.lm_head
        for j in range(max((s.max_draft for s in states), default=0)):
            live = [b for b, s in enumerate(states) if s.max_draft > j]
            step = rows_step(engine, [(states[b].pool_idx, start[b] + j, [inputs[b]]) for b in live])
            h = self._draft_hidden(engine, step)[: step.num_valid_rows]
            toks, q = sample_drafts(h.to(lm_head.dtype), lm_head, [states[b] for b in live], j)
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
