"""Attention prologue reference: everything of a decoder layer's attention block before attention.

    h       = rms_norm(x, attn_norm)                                   [M, H]
    q, k, v = split(h W_qkv^T (+ b_qkv))                                per head: [M, Hq|Hkv, D]
    q, k    = rms_norm per head with q_norm / k_norm                    (Qwen3 only)
    q, k    = apply_rope(q | k, cos, sin) at `positions`                (HF rotate_half)
    write k, v into the KV cache at out_cache_loc (valid rows only)

This composes the pieces `lowlat.reference.layer.attention_block` uses, in its order, so the fused
kernel `lowlat.kernels.attn_prologue.attn_prologue` has one specification. `qkv_weight` is the fused
weight [Hq*D + 2*Hkv*D, H] (rows: Wq, then Wk, then Wv), as `lowlat.kernels.attn_prologue.pack_qkv`
builds it; this reference splits it back and runs three `F.linear`s, exactly as attention_block does.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from lowlat.reference.attention import write_kv
from lowlat.reference.rms_norm import rms_norm
from lowlat.reference.rope import apply_rope, rope_cos_sin


def attn_prologue(x: torch.Tensor, qkv_weight: torch.Tensor, qkv_bias: torch.Tensor | None,
                  attn_norm: torch.Tensor, q_norm: torch.Tensor | None, k_norm: torch.Tensor | None,
                  positions: torch.Tensor, out_cache_loc: torch.Tensor, num_valid_rows: int,
                  k_cache: torch.Tensor, v_cache: torch.Tensor, inv_freq: torch.Tensor, *,
                  eps: float) -> torch.Tensor:
    """RMSNorm -> fused QKV projection -> optional QK-norm -> RoPE -> KV write; returns q.

    Parameters:
        x             [M, H]  rows (bf16 baseline; fp64 for the oracle). Every op runs in x's dtype.
        qkv_weight    [Hq*D + 2*Hkv*D, H]  rows Wq | Wk | Wv (x's dtype)
        qkv_bias      [Hq*D + 2*Hkv*D] or None (Qwen2)
        attn_norm     [H]; q_norm, k_norm [D] or both None (Qwen3 per-head QK RMSNorm)
        positions     [M] int64 (position of each row; angles = position * inv_freq)
        out_cache_loc [M] int32 (KV slot of each row); num_valid_rows: rows >= it are padding
        k_cache, v_cache [S, Hkv, D]; D and Hkv are read from the cache, Hq from the weight
        inv_freq      [D/2] (float32 as HF computes it for the bf16 baseline, float64 for the oracle)
        eps           RMSNorm epsilon (`ModelConfig.rms_eps`)
    Returns: q [M, Hq, D] in x's dtype, post-RoPE (padding rows are computed like any row).
    Mutates: k_cache, v_cache at out_cache_loc[:num_valid_rows]; padding rows write nothing.
    """
    m = x.shape[0]
    hkv, d = k_cache.shape[1], k_cache.shape[2]
    q_size = qkv_weight.shape[0] - 2 * hkv * d
    wq, wk, wv = qkv_weight.split([q_size, hkv * d, hkv * d], dim=0)
    bq, bk, bv = (None, None, None) if qkv_bias is None else qkv_bias.split([q_size, hkv * d, hkv * d])
    h = rms_norm(x, attn_norm, eps)
    q = F.linear(h, wq, bq).view(m, -1, d)
    k = F.linear(h, wk, bk).view(m, -1, d)
    v = F.linear(h, wv, bv).view(m, -1, d)
    if q_norm is not None:
        q, k = rms_norm(q, q_norm, eps), rms_norm(k, k_norm, eps)
    cos, sin = rope_cos_sin(positions, inv_freq, x.dtype)
    q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
    write_kv(k_cache, v_cache, k, v, out_cache_loc, num_valid_rows)
    return q
