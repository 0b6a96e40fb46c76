"""Speculative (rejection) sampling reference: Leviathan et al. 2023 ("Fast inference from transformers
via speculative decoding", Algorithm 1) and Chen et al. 2023 ("Accelerating large language model
decoding with speculative sampling", Algorithm 2).

For request b with n = num_drafts[b] draft tokens x_0..x_{n-1}, drafted from distributions q_i [V]
and scored by the target distributions p_i [V] (i = 0..n; p_n scores the bonus position):

    for i in 0..n-1:   accept x_i  iff  u_i * q_i(x_i) < p_i(x_i)      (u_i ~ U(0,1): P = min(1, p/q))
    j = the first rejected i, or n when all n are accepted
    emitted[b, :j] = x_0..x_{j-1};   accepted[b] = j
    emitted[b, j]  = a sample of normalise(max(0, p_j - q_j))   if j < n   (the residual)
                   = a sample of p_n                             if j == n  (the bonus token)
    emitted[b, j+1:] = -1

so every request emits accepted + 1 tokens, and each emitted token is distributed exactly as the target
model's sampler would have drawn it. If the residual is zero everywhere (only possible through fp32
rounding, since a rejection implies p_j != q_j) the token is drawn from p_j instead.

Greedy mode is the temperature-0 limit: accept x_i iff x_i == argmax p_i, and the token at j is
argmax p_j (ties to the lowest token id); no randomness and q is not read.

Randomness is counter-based (`lowlat.reference.philox`): the acceptance uniform of position i is
uniform(seed_b, offset_b, index=i, STREAM_ACCEPT) and the token at j is the exponential race
argmax_t w_t / E_t with E_t = exponential(seed_b, offset_b, index=t, STREAM_FINAL) (ties to the lowest
id), w = the residual or p_n. The Triton kernel (`lowlat.kernels.rejection_sampling`) draws the same
numbers, so kernel and reference agree token for token.

Padded draft slots (i >= num_drafts[b]) are never read as tokens, never accepted and never emitted.
"""

from __future__ import annotations

import torch

from lowlat.errors import StepContractError
from lowlat.reference import philox


def _check_inputs(draft_tokens, draft_probs, target_probs, num_drafts, seeds, offsets, greedy) -> None:
    if draft_tokens.dim() != 2:
        raise StepContractError(f"draft_tokens must be [B, k], got shape {tuple(draft_tokens.shape)}")
    b, k = draft_tokens.shape
    if draft_tokens.dtype != torch.int64:
        raise StepContractError(f"draft_tokens must be int64, got {draft_tokens.dtype}")
    if target_probs.dim() != 3 or target_probs.shape[:2] != (b, k + 1):
        raise StepContractError(
            f"target_probs must be [B, k+1, V] = [{b}, {k + 1}, V], got shape {tuple(target_probs.shape)}")
    v = target_probs.shape[2]
    if not greedy and (draft_probs is None or tuple(draft_probs.shape) != (b, k, v)):
        raise StepContractError(
            f"draft_probs must be [B, k, V] = [{b}, {k}, {v}], got "
            f"{None if draft_probs is None else tuple(draft_probs.shape)}")
    for name, t in (("target_probs", target_probs), ("draft_probs", draft_probs)):
        if t is not None and t.dtype not in (torch.float32, torch.float64):
            raise StepContractError(f"{name} must be float32 (or float64), got {t.dtype}")
    if tuple(num_drafts.shape) != (b,) or num_drafts.dtype not in (torch.int32, torch.int64):
        raise StepContractError(
            f"num_drafts must be [B] = [{b}] int32, got shape {tuple(num_drafts.shape)} {num_drafts.dtype}")
    bad = (num_drafts < 0) | (num_drafts > k)
    if bad.any():
        i = int(bad.nonzero()[0, 0])
        raise StepContractError(f"num_drafts[{i}]={int(num_drafts[i])} outside [0, k={k}]")
    valid = torch.arange(k, device=draft_tokens.device)[None, :] < num_drafts[:, None].to(draft_tokens.device)
    bad = valid & ((draft_tokens < 0) | (draft_tokens >= v))
    if bad.any():
        i, j = bad.nonzero()[0].tolist()
        raise StepContractError(f"draft_tokens[{i}, {j}]={int(draft_tokens[i, j])} outside [0, V={v})")
    if not greedy:
        for name, t in (("seeds", seeds), ("offsets", offsets)):
            if t is None or tuple(t.shape) != (b,) or t.dtype != torch.int64:
                raise StepContractError(
                    f"{name} must be [B] = [{b}] int64, got {None if t is None else (tuple(t.shape), t.dtype)}")


def residual_weights(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """max(0, p - q), float64 [.., V]: the unnormalised distribution sampled after a rejection."""
    return torch.clamp(p.double() - q.double(), min=0.0)


def race(weights: torch.Tensor, expo: torch.Tensor) -> torch.Tensor:
    """Exponential race: argmax_t weights_t / expo_t over the last dim, ties to the lowest id.

    weights [.., V] float64 >= 0, expo [.., V] float64 > 0 -> [..] int64. Picks t with probability
    weights_t / sum(weights) when expo are iid standard exponentials."""
    return torch.argmax(weights / expo, dim=-1)


def rejection_sample(draft_tokens: torch.Tensor, draft_probs: torch.Tensor | None, target_probs: torch.Tensor,
                     num_drafts: torch.Tensor, seeds: torch.Tensor | None = None,
                     offsets: torch.Tensor | None = None, *, greedy: bool = False
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """Verify draft tokens against the target model: speculative sampling (see the module docstring).

    Parameters
    ----------
    draft_tokens : [B, k] int64 — draft token ids; slots i >= num_drafts[b] are padding (any value).
    draft_probs : [B, k, V] float32 — q_i, the distribution each draft token was sampled from (the
        draft sampler's filtered, normalised distribution). Not read in greedy mode (may be None).
    target_probs : [B, k+1, V] float32 — p_i, the target's sampling distribution (temperature, top-k,
        top-p applied, rows sum to 1) at each draft position plus the bonus position.
    num_drafts : [B] int32 — n_b in [0, k], number of real draft tokens of request b.
    seeds, offsets : [B] int64 — Philox key and step counter per request (unused in greedy mode). The
        caller advances `offsets` every verify step so draws never repeat.
    greedy : temperature-0 limit (accept iff x_i == argmax p_i; emit argmax).

    Returns
    -------
    emitted : [B, k+1] int64 — accepted drafts, then the residual/bonus token, then -1 padding.
    accepted : [B] int32 — number of accepted drafts per request (emitted count = accepted + 1).

    Raises StepContractError naming the offending shape, dtype or value (num_drafts outside [0, k],
    a real draft token outside [0, V)).
    """
    _check_inputs(draft_tokens, draft_probs, target_probs, num_drafts, seeds, offsets, greedy)
    b, k = draft_tokens.shape
    v = target_probs.shape[2]
    dev = target_probs.device
    n = num_drafts.to(device=dev, dtype=torch.int64)
    pos = torch.arange(k, device=dev)
    valid = pos[None, :] < n[:, None]                                               # [B, k]
    x = torch.where(valid, draft_tokens, 0)                                         # safe gather index
    p_x = target_probs[:, :k].gather(2, x[..., None])[..., 0].double()              # [B, k]
    if greedy:
        ok = x == torch.argmax(target_probs[:, :k], dim=-1)
    else:
        q_x = draft_probs.gather(2, x[..., None])[..., 0].double()
        u = philox.uniforms(seeds[:, None], offsets[:, None], pos[None, :], philox.STREAM_ACCEPT)
        ok = u * q_x < p_x
    ok = ok & valid
    # j = index of the first rejection, or n when every real draft is accepted
    rejected = ~ok & valid
    first = torch.argmax(rejected.int(), dim=1) if k > 0 else n
    j = torch.where(rejected.any(1), first, n)                                      # [B]
    rows = torch.arange(b, device=dev)
    p_j = target_probs[rows, j]                                                     # [B, V]
    if greedy:
        final = torch.argmax(p_j, dim=-1)
    else:
        is_residual = j < n
        q_j = draft_probs[rows, torch.clamp(j, max=k - 1)] if k > 0 else torch.zeros_like(p_j)
        w = torch.where(is_residual[:, None], residual_weights(p_j, q_j), p_j.double())
        w = torch.where((w.sum(-1, keepdim=True) > 0), w, p_j.double())              # zero residual -> p_j
        expo = philox.exponentials(seeds[:, None], offsets[:, None], torch.arange(v, device=dev)[None, :],
                                   philox.STREAM_FINAL)
        final = race(w, expo)
    emitted = torch.full((b, k + 1), -1, dtype=torch.int64, device=dev)
    emitted[:, :k] = torch.where(pos[None, :] < j[:, None], x, -1)
    emitted[rows, j] = final
    return emitted, j.to(torch.int32)
