"""Tensor-parallel view of a decoder layer (Megatron-LM style, Shoeybi et al. 2019).

Rank r of `world` holds KV heads [r*Hkv/world, (r+1)*Hkv/world) with their query heads, columns of Wo
for those heads, and a contiguous 1/world slice of the FFN intermediate dim (every expert's, for MoE;
the router is replicated). Each rank computes a partial output of the output projection and of the
FFN down projection; the partials are combined by `ordered_sum`:

    y = round_to_dtype( sum_{r = 0..world-1} float32(partial_r) )     (in rank order)

which is what lowlat's push + rank-ordered all-reduce computes on every rank (lowlat/comm), so every
rank gets bitwise the same result whatever order the partials arrive in.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from lowlat.config import ModelConfig
from lowlat.errors import UnsupportedConfigError
from lowlat.reference.layer import attention_block, ffn
from lowlat.reference.rms_norm import rms_norm
from lowlat.step import StepBatch
from lowlat.weights import LayerWeights


def ordered_sum(partials: list[torch.Tensor]) -> torch.Tensor:
    """Sum same-shaped partials in list (rank) order in float32 (float64 stays float64); returns
    the partials' dtype."""
    acc = torch.promote_types(partials[0].dtype, torch.float32)
    total = partials[0].to(acc)
    for p in partials[1:]:
        total = total + p.to(acc)
    return total.to(partials[0].dtype)


def shard_layer(cfg: ModelConfig, lw: LayerWeights, world: int) -> list[LayerWeights]:
    """Split one layer's weights over `world` TP ranks (views, no copies).

    Raises `UnsupportedConfigError` when world does not divide the KV heads, the FFN width or the shared
    expert's width.
    """
    if cfg.num_kv_heads % world:
        raise UnsupportedConfigError("tp_size", world, f"must divide num_key_value_heads={cfg.num_kv_heads}")
    width = cfg.moe_intermediate_size if cfg.is_moe else cfg.intermediate_size
    if width % world:
        raise UnsupportedConfigError("tp_size", world, f"must divide the FFN intermediate size {width}")
    shared_width = 0 if lw.shared_gate is None else lw.shared_gate.shape[0]
    if shared_width % world:
        raise UnsupportedConfigError("tp_size", world,
                                     f"must divide the shared expert's intermediate size {shared_width}")
    d, g = cfg.head_dim, cfg.gqa_group
    kv_per, q_per, f_per = cfg.num_kv_heads // world, cfg.num_kv_heads // world * g, width // world
    shards = []
    for r in range(world):
        q_rows = slice(r * q_per * d, (r + 1) * q_per * d)
        kv_rows = slice(r * kv_per * d, (r + 1) * kv_per * d)
        f = slice(r * f_per, (r + 1) * f_per)
        s = LayerWeights(
            attn_norm=lw.attn_norm, wq=lw.wq[q_rows], wk=lw.wk[kv_rows], wv=lw.wv[kv_rows],
            wo=lw.wo[:, q_rows], mlp_norm=lw.mlp_norm, q_norm=lw.q_norm, k_norm=lw.k_norm,
            bq=None if lw.bq is None else lw.bq[q_rows], bk=None if lw.bk is None else lw.bk[kv_rows],
            bv=None if lw.bv is None else lw.bv[kv_rows])
        if lw.router is None:
            s.w_gate, s.w_up, s.w_down = lw.w_gate[f], lw.w_up[f], lw.w_down[:, f]
        else:
            s.router = lw.router
            s.expert_gate, s.expert_up = lw.expert_gate[:, f], lw.expert_up[:, f]
            s.expert_down = lw.expert_down[:, :, f]
            if lw.shared_gate is not None:
                fs = shared_width // world
                sf = slice(r * fs, (r + 1) * fs)
                s.shared_gate, s.shared_up, s.shared_down = (
                    lw.shared_gate[sf], lw.shared_up[sf], lw.shared_down[:, sf])
        shards.append(s)
    return shards


def tp_decoder_layer(cfg: ModelConfig, shards: list[LayerWeights], x: torch.Tensor, step: StepBatch,
                     k_cache: torch.Tensor, v_cache: torch.Tensor, cos: torch.Tensor,
                     sin: torch.Tensor) -> torch.Tensor:
    """The decoder layer computed as `len(shards)` TP ranks would, combined with `ordered_sum`.

    k_cache / v_cache [S, Hkv, D] are the full caches; rank r reads and writes its head slice.
    Returns [M, H], identical on every rank by construction.
    """
    world = len(shards)
    kv_per = cfg.num_kv_heads // world
    h = rms_norm(x, shards[0].attn_norm, cfg.rms_eps)
    partials = []
    for r, s in enumerate(shards):
        heads = slice(r * kv_per, (r + 1) * kv_per)
        o = attention_block(cfg, s, h, step, k_cache[:, heads], v_cache[:, heads], cos, sin)
        partials.append(F.linear(o, s.wo))
    x = x + ordered_sum(partials)
    h = rms_norm(x, shards[0].mlp_norm, cfg.rms_eps)
    return x + ordered_sum([ffn(cfg, s, h, step.num_valid_rows) for s in shards])
