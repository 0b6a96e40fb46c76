"""Rotary position embedding (Su et al. 2021, RoFormer), HF transformers' "rotate_half" layout.

The first and second halves of each head form the (real, imaginary) pairs:
    out[:D/2] = x[:D/2] * cos - x[D/2:] * sin
    out[D/2:] = x[D/2:] * cos + x[:D/2] * sin
with angle(position, i) = position * inv_freq[i], inv_freq[i] = theta^(-2i/D), optionally rescaled by
Llama-3's rule (`rope_scaling.rope_type == "llama3"`, as in HF `_compute_llama3_parameters`).
"""

from __future__ import annotations

import math

import torch

from lowlat.config import RopeScaling


def rope_inv_freq(head_dim: int, theta: float, scaling: RopeScaling | None = None,
                  dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """inverse frequencies [D/2] in `dtype` (float32 as HF computes them; float64 for the oracle)."""
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).to(dtype) / head_dim))
    if scaling is None:
        return inv
    low_wavelen = scaling.original_max_position_embeddings / scaling.low_freq_factor
    high_wavelen = scaling.original_max_position_embeddings / scaling.high_freq_factor
    wavelen = 2 * math.pi / inv
    scaled = torch.where(wavelen > low_wavelen, inv / scaling.factor, inv)
    smooth = (scaling.original_max_position_embeddings / wavelen - scaling.low_freq_factor) / (
        scaling.high_freq_factor - scaling.low_freq_factor)
    smoothed = (1 - smooth) * scaled / scaling.factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
    return torch.where(medium, smoothed, scaled)


def rope_cos_sin(positions: torch.Tensor, inv_freq: torch.Tensor, dtype: torch.dtype):
    """cos, sin [M, D] for int positions [M]: angles in inv_freq's dtype, then cast to `dtype`."""
    angles = positions.to(inv_freq.dtype)[:, None] * inv_freq[None, :]
    emb = torch.cat([angles, angles], dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate x [M, heads, D] by cos/sin [M, D] (broadcast over heads); returns x's dtype."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos[:, None, :] + rotated * sin[:, None, :]
