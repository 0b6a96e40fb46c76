"""Speculative decoding loop on the lowlat Engine (Leviathan et al. 2023; Chen et al. 2023).

One iteration, for up to max_rows // (k+1) running requests at a time:

    1. draft     the drafter proposes n_b <= k tokens d_1..d_n per request (lowlat/runtime/drafters.py)
    2. verify    ONE target step of n_b + 1 consecutive rows per request: row j holds the token at
                 position L+j (row 0 the pending token t0, rows 1.. the drafts) and attends to the cache
                 plus rows <= j -- the step contract's causal rule (lowlat/step.py), so the target's
                 logits at row j are its next-token logits after t0, d_1..d_j
    3. accept    speculative (rejection) sampling, lowlat/reference/rejection_sampling.py: accept d_j
                 with probability min(1, p_j(d_j) / q_j(d_j)); at the first rejection draw from
                 normalise(max(0, p_j - q_j)); if all n_b are accepted draw a bonus token from p_n.
                 Greedy requests take the temperature-0 limit (accept while d_j == argmax p_{j-1}).
                 The emitted tokens (a accepted drafts + 1) are distributed exactly as plain sampling.
    4. rollback  positions L..L+a keep the target's K/V (written in step 2); the slots of positions
                 > L+a are freed with `KVCachePool.truncate` -- earlier entries are untouched.

With no drafter the loop is plain decoding (one row per request, `reference.sampling.sample` with the
request's generator): it emits exactly what `Engine.generate` emits.

Timing (host clock, `time.perf_counter`; on a GPU backend each step's logits are read on the host, which
synchronises):
    TTFT             prompt submission -> first token, per request
    per-token latency  time since the request's previous token (its draft + verify + accept step, and any
                     wait while other request groups stepped) / tokens the step emitted for it
                     (amortised ITL; tokens of one step arrive together)
    acceptance length  tokens emitted per verify step (accepted drafts + 1), per request and mean
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from lowlat.errors import StepContractError, UnsupportedConfigError
from lowlat.reference import sampling
from lowlat.runtime.drafters import DEFAULT_K, DRAFT_OFFSET_STRIDE, DraftProposal, Drafter, SpecState, rows_step
from lowlat.runtime.engine import Engine, Request, SamplingParams

@dataclass
class SpecResult:
    """One finished request.

    output_ids        emitted tokens (EOS included when it ended the request)
    ttft_s            seconds from submission to the first token
    token_latency_s   per-token latency of every token after the first (amortised, see module doc)
    accept_lengths    tokens emitted by each verify step (empty for plain decoding)
    """

    prompt_ids: list[int]
    output_ids: list[int]
    ttft_s: float
    token_latency_s: list[float]
    accept_lengths: list[int]
    finish_reason: str = "length"


@dataclass
class DecodeStats:
    """Aggregate metrics over finished requests (units in the names)."""

    requests: int
    output_tokens: int
    wall_s: float
    mean_accept_length: float | None
    p50_itl_ms: float | None
    p90_itl_ms: float | None
    interactivity_tok_s_user: float | None       # 1 / P90 per-token latency
    mean_ttft_ms: float
    p90_ttft_ms: float
    output_tok_s: float                          # all requests' output tokens / wall time

    def as_dict(self) -> dict:
        return dict(self.__dict__)


def summarize(results: Sequence[SpecResult], wall_s: float) -> DecodeStats:
    """Aggregate `SpecResult`s of one run that took `wall_s` seconds."""
    lat = [x for r in results for x in r.token_latency_s]
    acc = [x for r in results for x in r.accept_lengths]
    ttft = [r.ttft_s for r in results]
    p90 = _quantile(lat, 0.9) if lat else None
    return DecodeStats(
        requests=len(results), output_tokens=sum(len(r.output_ids) for r in results), wall_s=wall_s,
        mean_accept_length=statistics.fmean(acc) if acc else None,
        p50_itl_ms=_quantile(lat, 0.5) * 1e3 if lat else None,
        p90_itl_ms=p90 * 1e3 if p90 is not None else None,
        interactivity_tok_s_user=(1.0 / p90) if p90 else None,
        mean_ttft_ms=statistics.fmean(ttft) * 1e3 if ttft else 0.0,
        p90_ttft_ms=_quantile(ttft, 0.9) * 1e3 if ttft else 0.0,
        output_tok_s=sum(len(r.output_ids) for r in results) / wall_s if wall_s > 0 else 0.0)


def _quantile(xs: Sequence[float], q: float) -> float:
    """Linear-interpolation quantile (numpy's default) of a non-empty sequence."""
    s = sorted(xs)
    pos = q * (len(s) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def accept_drafts(rows: Sequence[torch.Tensor], drafts: Sequence[Sequence[int]],
                  draft_probs: Sequence[torch.Tensor | None], params: Sequence[SamplingParams],
                  seeds: Sequence[int], offsets: Sequence[int]) -> list[list[int]]:
    """Tokens one verify step emits for each of B requests: accepted drafts + the residual/bonus token.

    rows[b]         [n_b+1, V] float32 target logits of request b's verify rows
    drafts[b]       its n_b draft tokens; draft_probs[b] [n_b, V] their draft distribution q, or None
                    (a deterministic drafter: q is one-hot on each draft token; or a greedy request)
    params[b]       sampling parameters (the target distribution p = filtered_probs(logits, T, top-k, top-p);
                    the drafter filtered q with the same parameters)
    seeds, offsets  Philox key and step counter of each request (`lowlat.reference.philox`); the caller
                    advances the offset every verify step
    Greedy requests (temperature 0) and sampled ones go through `rejection_sample` in two batched calls
    (the single-launch Triton kernel `lowlat.kernels.rejection_sampling` on CUDA, its reference
    `lowlat.reference.rejection_sampling` elsewhere) (greedy=True reads only argmax, so it gets the logits themselves: argmax of the
    logits is exactly what plain greedy decoding takes). Returns 1..n_b+1 token ids per request.
    """
    from lowlat.runtime.drafters import use_kernels

    out: list[list[int]] = [[] for _ in rows]
    if rows and use_kernels(rows[0].device):
        from lowlat.kernels.rejection_sampling import rejection_sample
    else:
        from lowlat.reference.rejection_sampling import rejection_sample
    for greedy in (True, False):
        idx = [b for b, sp in enumerate(params) if (sp.temperature == 0) == greedy]
        if not idx:
            continue
        k = max(len(drafts[b]) for b in idx)
        v = rows[idx[0]].shape[-1]
        dev = rows[idx[0]].device
        tokens = torch.zeros(len(idx), k, dtype=torch.int64, device=dev)
        target = torch.zeros(len(idx), k + 1, v, dtype=torch.float32, device=dev)
        q = None if greedy else torch.zeros(len(idx), k, v, dtype=torch.float32, device=dev)
        for r, b in enumerate(idx):
            n, sp = len(drafts[b]), params[b]
            if n:
                tokens[r, :n] = torch.tensor(list(drafts[b]), dtype=torch.int64, device=dev)
            if greedy:
                target[r, : n + 1] = rows[b].float()
                continue
            target[r, : n + 1] = sampling.filtered_probs(rows[b], sp.temperature, sp.top_k, sp.top_p)
            if n and draft_probs[b] is None:
                q[r, torch.arange(n, device=dev), tokens[r, :n]] = 1.0
            elif n:
                q[r, :n] = draft_probs[b].to(device=dev, dtype=torch.float32)
        num = torch.tensor([len(drafts[b]) for b in idx], dtype=torch.int32, device=dev)
        sd = torch.tensor([seeds[b] for b in idx], dtype=torch.int64, device=dev)
        off = torch.tensor([offsets[b] for b in idx], dtype=torch.int64, device=dev)
        emitted, accepted = rejection_sample(tokens, q, target, num, None if greedy else sd,
                                             None if greedy else off, greedy=greedy)
        emitted, accepted = emitted.cpu(), accepted.cpu()
        for r, b in enumerate(idx):
            out[b] = emitted[r, : int(accepted[r]) + 1].tolist()
    return out


def _check_proposal(prop: DraftProposal, states: Sequence[SpecState], vocab_size: int, name: str) -> None:
    """Refuse a drafter's proposal that breaks `DraftProposal`'s contract, before any KV slot is allocated:
    one entry per request, at most max_draft int token ids in [0, V) each, and probs None or a floating
    [n_b, V] tensor. Raises StepContractError naming the drafter, the request and the value (shapes only:
    q's values stay on the device)."""
    if len(prop.tokens) != len(states) or len(prop.probs) != len(states):
        raise StepContractError(f"drafter {name} returned {len(prop.tokens)} token lists and {len(prop.probs)} "
                                f"probs for {len(states)} requests")
    for b, s in enumerate(states):
        toks, q = prop.tokens[b], prop.probs[b]
        if len(toks) > s.max_draft:
            raise StepContractError(f"drafter {name} proposed {len(toks)} tokens for request {b}, max {s.max_draft}")
        for j, t in enumerate(toks):
            if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < vocab_size:
                raise StepContractError(f"drafter {name}: request {b} draft {j} = {t!r} is not a token id in "
                                        f"[0, {vocab_size})")
        if q is not None and toks and (not isinstance(q, torch.Tensor) or not q.is_floating_point()
                                       or tuple(q.shape) != (len(toks), vocab_size)):
            got = f"{tuple(q.shape)} {q.dtype}" if isinstance(q, torch.Tensor) else type(q).__name__
            raise StepContractError(f"drafter {name}: request {b}'s probs must be [n_b, V] = [{len(toks)}, "
                                    f"{vocab_size}] floating, got {got}")


class SpeculativeDecoder:
    """Draft -> verify -> accept -> rollback on an `Engine` (any backend with forward(step, pool)).

    Parameters:
        engine    the target (its backend runs the verify steps, its pool holds the KV cache)
        drafter   a `Drafter` (LayerSkipDrafter, NgramDrafter) or None for plain decoding
        k         draft tokens per verify step (default 5: 6 rows per request); k+1 <= engine.max_rows
        uniform_verify  give every request exactly k+1 verify rows, padding missing drafts (a drafter
                  proposed fewer, or max_new_tokens is near) with rows whose drafts are never accepted
                  (num_drafts excludes them; their KV slots are rolled back). The fused backend covers
                  only uniform verify steps (SGLang's target_verify), so this keeps every verify step on
                  it. Default: on when the engine's fused backend was built for k+1 tokens per request.
    Raises UnsupportedConfigError (a ValueError) unless k is an int in 1..min(max_rows - 1,
    DRAFT_OFFSET_STRIDE - 1) (the draft sampler's Philox offsets of consecutive steps would overlap past it).
    """

    def __init__(self, engine: Engine, drafter: Drafter | None = None, *, k: int = DEFAULT_K,
                 uniform_verify: bool | None = None) -> None:
        if drafter is not None:
            hi = min(engine.max_rows - 1, DRAFT_OFFSET_STRIDE - 1)   # Philox offsets of two steps must not overlap
            if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= hi:
                raise UnsupportedConfigError("k", k, f"must be an int in 1..{hi} (k+1 rows per request <= max_rows="
                                             f"{engine.max_rows}; k < DRAFT_OFFSET_STRIDE={DRAFT_OFFSET_STRIDE})")
        self.engine, self.drafter, self.k = engine, drafter, (k if drafter else 0)
        if uniform_verify is None:      # a fused backend built for k+1-row verify steps covers only those
            built = getattr(engine.backend, "built", None)
            uniform_verify = getattr(built, "tokens_per_request", 1) == self.k + 1 and self.k > 0
        self.uniform_verify = bool(uniform_verify)

    @property
    def requests_per_step(self) -> int:
        return max(1, self.engine.max_rows // (self.k + 1))

    def generate(self, prompts: Sequence[Sequence[int]],
                 params: SamplingParams | Sequence[SamplingParams] | None = None, *,
                 stop: Callable[[int, list[int]], bool] | None = None,
                 on_tokens: Callable[[int, list[int]], None] | None = None) -> list[SpecResult]:
        """Generate for several prompts; running requests share each draft and verify step.

        prompts   token id lists; params one `SamplingParams` or one per prompt (seed, temperature ...)
        stop(i, output_ids) -> True ends request i after a step (e.g. a stop string was produced);
        on_tokens(i, new_ids) streams each step's emitted tokens.
        Returns one `SpecResult` per prompt, in order. Every KV slot the call allocated is freed.
        Raises StepContractError / ValueError for bad prompts before any step runs.
        """
        eng = self.engine
        if params is None or isinstance(params, SamplingParams):
            params = [params or SamplingParams()] * len(prompts)
        if len(params) != len(prompts):
            raise StepContractError(f"{len(params)} SamplingParams for {len(prompts)} prompts")
        reqs: list[Request] = []
        try:
            for p, sp in zip(prompts, params):
                # room for a full verify step past max_new_tokens is not needed: drafts are capped
                reqs.append(eng.add_request(p, sp))
            t_submit = time.perf_counter()
            states: list[SpecState] = []
            for i, req in enumerate(reqs):
                last = eng.prefill(req)
                tok = int(sampling.sample(last[None], req.params.temperature, req.params.top_k,
                                          req.params.top_p, req.generator)[0])
                now = time.perf_counter()
                req.ttft_s = now - t_submit
                st = SpecState(req=req, pending=tok, history=list(req.prompt_ids) + [tok])
                states.append(st)
                self._emit(i, st, [tok], stop, on_tokens, first=True)
            while True:
                running = [i for i, s in enumerate(states) if not s.finished]
                if not running:
                    break
                per = self.requests_per_step
                for g in range(0, len(running), per):
                    self._iteration([(i, states[i]) for i in running[g:g + per]], stop, on_tokens)
        finally:
            for r in reqs:
                eng.pool.free_request(r.req_pool_idx)
        out = []
        for s in states:
            r = s.req
            reason = "eos" if (r.output_ids and not r.params.ignore_eos
                               and r.output_ids[-1] in eng.cfg.eos_token_ids) else (
                "length" if len(r.output_ids) >= r.params.max_new_tokens else "stop")
            out.append(SpecResult(list(r.prompt_ids), list(r.output_ids), r.ttft_s, list(s.token_latency_s),
                                  list(s.accept_lengths), reason))
        return out

    # ------------------------------------------------------------------ one iteration
    def _iteration(self, group: list[tuple[int, SpecState]], stop, on_tokens) -> None:
        eng, pool = self.engine, self.engine.pool
        states = [s for _, s in group]
        for s in states:
            remaining = s.params.max_new_tokens - len(s.req.output_ids)
            s.max_draft = max(0, min(self.k, remaining - 1))
        start = [pool.seq_lens[s.pool_idx] for s in states]       # position of each pending token
        try:        # draft, verify, accept: on any error nothing the step allocated stays allocated
            if self.drafter is not None and any(s.max_draft for s in states):
                prop = self.drafter.propose(eng, states)
            else:
                prop = DraftProposal([[] for _ in states], [None] * len(states))
            _check_proposal(prop, states, eng.cfg.vocab_size, getattr(self.drafter, "name", "?"))
            widths = [len(prop.tokens[b]) + 1 for b in range(len(states))]
            if self.uniform_verify and all(start[b] + self.k + 1 <= pool.max_ctx for b in range(len(states))):
                widths = [self.k + 1] * len(states)
            chunks = [(s.pool_idx, start[b], ([s.pending] + prop.tokens[b] + [s.pending] * self.k)[: widths[b]])
                      for b, s in enumerate(states)]
            step = rows_step(eng, chunks)
            logits = eng.backend.forward(step, pool)[: step.num_valid_rows]
            row, rows = 0, []
            for b in range(len(states)):
                rows.append(logits[row: row + len(prop.tokens[b]) + 1])
                row += widths[b]
            if self.drafter is None:
                emitted = [[int(sampling.sample(rows[b], s.params.temperature, s.params.top_k, s.params.top_p,
                                                s.req.generator)[0])] for b, s in enumerate(states)]
            else:
                emitted = accept_drafts(rows, prop.tokens, prop.probs, [s.params for s in states],
                                        [s.params.seed for s in states], [s.rng_offset for s in states])
        except Exception:
            for b, s in enumerate(states):
                if pool.seq_lens.get(s.pool_idx, 0) > start[b]:
                    pool.truncate(s.pool_idx, start[b])
            raise
        for b, s in enumerate(states):
            s.rng_offset += 1
            # keep pending + accepted drafts (their K/V are the target's, from this verify step)
            pool.truncate(s.pool_idx, start[b] + len(emitted[b]))
        for (i, s), toks in zip(group, emitted):
            if self.drafter is not None:
                s.accept_lengths.append(len(toks))
            self._emit(i, s, toks, stop, on_tokens)

    def _emit(self, i: int, s: SpecState, toks: list[int], stop, on_tokens, first: bool = False) -> None:
        """Append tokens to request i, cutting at EOS / max_new_tokens; mark it finished.

        Per-token latency of the appended tokens: the time since the request's previous token (this
        step, plus any wait while other request groups ran their steps) / the tokens appended."""
        req, sp, eos = s.req, s.params, self.engine.cfg.eos_token_ids
        now = time.perf_counter()
        kept = []
        for t in toks:
            kept.append(t)
            if (not sp.ignore_eos and t in eos) or len(req.output_ids) + len(kept) >= sp.max_new_tokens:
                s.finished = True
                break
        if not first:
            s.token_latency_s.extend([(now - req.token_times[-1]) / len(kept)] * len(kept))
        req.output_ids.extend(kept)
        req.token_times.extend([now] * len(kept))
        s.pending = kept[-1]
        s.history.extend(kept if not first else [])
        if on_tokens:
            on_tokens(i, kept)
        if not s.finished and stop is not None and stop(i, req.output_ids):
            s.finished = True
        req.finished = s.finished
