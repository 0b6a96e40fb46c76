"""GQA attention over the token-level paged KV cache of the step contract (lowlat/step.py).

For row i of request r = req_indices[i] at position p = positions[i], with Hkv KV heads and
G = Hq / Hkv query heads per KV head (GQA, Ainslie et al. 2023):

    slots  = page_table[r, 0..p]                                  (p + 1 KV slots)
    out[i, h] = softmax_j( q[i, h] . k_cache[slots_j, h // G] * sm_scale ) @ v_cache[slots, h // G]

Decode rows, verify-causal rows and prefill-chunk rows all follow this one rule, because every row's
own K/V is written (`write_kv`) before attention runs. Padding rows (i >= num_valid_rows) output 0.
KV slots a row may not see are never read into its output, even if they hold NaN.
"""

from __future__ import annotations

import torch


def write_kv(k_cache: torch.Tensor, v_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
             out_cache_loc: torch.Tensor, num_valid_rows: int) -> None:
    """Store each valid row's K/V at its slot.

    Parameters: k_cache, v_cache [S, Hkv, D]; k, v [M, Hkv, D]; out_cache_loc [M] int32.
    Mutates: k_cache[out_cache_loc[:n]], v_cache[out_cache_loc[:n]] (n = num_valid_rows), cast to the
    cache dtype. Padding rows write nothing.
    """
    loc = out_cache_loc[:num_valid_rows].long()
    k_cache[loc] = k[:num_valid_rows].to(k_cache.dtype)
    v_cache[loc] = v[:num_valid_rows].to(v_cache.dtype)


def paged_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                    page_table: torch.Tensor, req_indices: torch.Tensor, positions: torch.Tensor,
                    num_valid_rows: int, sm_scale: float | None = None) -> torch.Tensor:
    """Causal GQA attention of M rows over their requests' cached tokens.

    Parameters:
        q            [M, Hq, D]  queries (bf16, fp32 or fp64; computation runs in q's dtype,
                                 softmax in at least fp32)
        k_cache      [S, Hkv, D] cache keys, v_cache likewise
        page_table   [B, C] int32; req_indices [M] int32; positions [M] int64
        num_valid_rows  rows past it are padding
        sm_scale     defaults to 1 / sqrt(D)
    Returns: [M, Hq, D] in q's dtype; padding rows are 0.
    """
    m, hq, d = q.shape
    hkv = k_cache.shape[1]
    group = hq // hkv
    scale = d ** -0.5 if sm_scale is None else sm_scale
    n = num_valid_rows
    out = torch.zeros_like(q)
    if n == 0:
        return out
    length = int(positions[:n].max()) + 1                               # L: longest visible prefix
    cols = torch.arange(length, device=q.device)
    visible = cols[None, :] <= positions[:n, None]                       # [n, L]
    slots = page_table[req_indices[:n].long(), :length].long()           # [n, L]
    slots = torch.where(visible, slots, torch.zeros_like(slots))         # hidden columns read slot 0 ...
    k = k_cache[slots].to(q.dtype)                                       # [n, L, Hkv, D]
    v = v_cache[slots].to(q.dtype).masked_fill(~visible[:, :, None, None], 0)  # ... and never use it
    k = k.repeat_interleave(group, dim=2)                                # [n, L, Hq, D]
    v = v.repeat_interleave(group, dim=2)
    scores = torch.einsum("nhd,nlhd->nhl", q[:n], k) * scale             # [n, Hq, L]
    scores = scores.masked_fill(~visible[:, None, :], float("-inf"))
    probs = torch.softmax(scores.to(torch.promote_types(q.dtype, torch.float32)), dim=-1).to(q.dtype)
    out[:n] = torch.einsum("nhl,nlhd->nhd", probs, v)
    return out
