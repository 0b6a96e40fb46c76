"""Draft sampling reference: LM-head GEMV over the whole vocabulary, temperature, top-k / top-p, and a
counter-based sample, returning the token and the draft distribution q that verification needs.

    logits = h @ W^T                               (float32 accumulation; float64 for the oracle)
    x      = logits / T                            (T = temperature; T <= 0 is greedy)
    q      = filtered_probs(logits, T, top_k, top_p)   (lowlat.reference.sampling: softmax, top-k, top-p)
    token  = argmax_{t : q_t > 0}  x_t - log(E_t)  (Gumbel-max; E_t = exponential(seed, offset, t, STREAM_DRAFT))
    greedy: token = argmax_t logits_t (ties -> lowest id), q = one-hot(token)

The Gumbel-max draw picks t with probability q_t (Gumbel 1954), and it is a pure function of the
counters (seed, offset, token id) (`lowlat.reference.philox`), so a fused kernel that splits the
vocabulary across programs draws the very same token as long as its logits match. Ties in the score
go to the lowest token id.

The Triton kernel `lowlat.kernels.draft_sampling` matches `draft_sample`.
"""

from __future__ import annotations

import torch

from lowlat.errors import StepContractError, UnsupportedConfigError
from lowlat.reference import philox
from lowlat.reference.sampling import filtered_probs


def _per_row(value, r: int, dtype: torch.dtype, name: str, device) -> torch.Tensor:
    t = torch.as_tensor(value, dtype=dtype, device=device)
    if t.dim() == 0:
        t = t.expand(r)
    if tuple(t.shape) != (r,):
        raise StepContractError(f"{name} must be a scalar or [R] = [{r}], got shape {tuple(t.shape)}")
    return t


def check_sampling_params(temperature: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> None:
    """Raise UnsupportedConfigError naming the first out-of-range per-row value.

    temperature [R] >= 0 (0 = greedy) and finite; top_k [R] >= 0 (0 = off); top_p [R] in (0, 1]."""
    for name, t, bad in (("temperature", temperature, ~torch.isfinite(temperature) | (temperature < 0)),
                         ("top_k", top_k, top_k < 0),
                         ("top_p", top_p, ~((top_p > 0) & (top_p <= 1)))):
        if bad.any():
            i = int(bad.nonzero()[0, 0])
            raise UnsupportedConfigError(f"{name}[{i}]", t[i].item(), "out of range (temperature >= 0, "
                                         "top_k >= 0, 0 < top_p <= 1)")


def draft_sample(h: torch.Tensor, lm_head: torch.Tensor, temperature, top_k, top_p,
                 seeds: torch.Tensor, offsets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Sample one draft token per row from the LM head's distribution.

    Parameters
    ----------
    h : [R, H] bf16/fp32/fp64 — final-normed hidden states of the draft rows.
    lm_head : [V, H], h's dtype — LM-head weight (the embedding when tied).
    temperature : float or [R] float32 — T > 0 samples, T == 0 is greedy.
    top_k : int or [R] int — keep the k most likely tokens; 0 (or >= V) keeps all.
    top_p : float or [R] float32 — nucleus mass in (0, 1]; 1 keeps all.
    seeds, offsets : [R] int64 — Philox key and step counter of each row (`lowlat.reference.philox`).

    Returns
    -------
    tokens : [R] int64 — the sampled (or greedy) token of each row.
    q : [R, V] float32 — the distribution the token was drawn from (filtered, renormalised; one-hot for
        greedy rows), as speculative verification needs it.
    logits : [R, V] float32 (float64 for float64 inputs) — h @ W^T before temperature.

    The matmul runs in float32 for bf16/fp32 inputs and float64 for float64 inputs (the oracle).
    Raises StepContractError (shapes, dtypes) or UnsupportedConfigError (parameter values), naming them.
    """
    if h.dim() != 2 or lm_head.dim() != 2 or h.shape[1] != lm_head.shape[1]:
        raise StepContractError(f"h must be [R, H] and lm_head [V, H] with the same H, got "
                                f"{tuple(h.shape)} and {tuple(lm_head.shape)}")
    r, v = h.shape[0], lm_head.shape[0]
    dev = h.device
    temperature = _per_row(temperature, r, torch.float32, "temperature", dev)
    top_k = _per_row(top_k, r, torch.int64, "top_k", dev)
    top_p = _per_row(top_p, r, torch.float32, "top_p", dev)
    check_sampling_params(temperature, top_k, top_p)
    for name, t in (("seeds", seeds), ("offsets", offsets)):
        if tuple(t.shape) != (r,) or t.dtype != torch.int64:
            raise StepContractError(f"{name} must be [R] = [{r}] int64, got {tuple(t.shape)} {t.dtype}")

    acc = torch.float64 if h.dtype == torch.float64 else torch.float32
    logits = h.to(acc) @ lm_head.to(acc).T                                           # [R, V]
    tokens = torch.empty(r, dtype=torch.int64, device=dev)
    q = torch.zeros(r, v, dtype=torch.float32, device=dev)
    ids = torch.arange(v, device=dev)
    greedy_rows = temperature == 0
    if greedy_rows.any():
        g = greedy_rows.nonzero()[:, 0]
        tokens[g] = torch.argmax(logits[g], dim=-1)
        q[g, tokens[g]] = 1.0
    # rows sharing (temperature, top_k, top_p) are filtered together (filtered_probs takes scalars)
    params = torch.stack([temperature.double(), top_k.double(), top_p.double()], 1).cpu()
    for key in torch.unique(params[~greedy_rows.cpu()], dim=0):
        rows = (params == key).all(1).nonzero()[:, 0].to(dev)
        t, k, p = float(key[0]), int(key[1]), float(key[2])
        q[rows] = filtered_probs(logits[rows], t, k, p)
        x = logits[rows].float() / temperature[rows, None]                           # IEEE division
        expo = philox.exponentials(seeds[rows, None], offsets[rows, None], ids[None, :], philox.STREAM_DRAFT)
        score = torch.where(q[rows] > 0, x.double() - torch.log(expo), float("-inf"))
        tokens[rows] = torch.argmax(score, dim=-1)
    return tokens, q, logits
