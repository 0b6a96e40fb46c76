"""One decoder layer of the Llama / Qwen2 / Qwen3 / Qwen3-MoE / Mixtral family (pre-norm):

    h   = rms_norm(x, attn_norm)
    q,k,v = h Wq^T (+bq), h Wk^T (+bk), h Wv^T (+bv)          per head: [M, Hq|Hkv, D]
    q,k = rms_norm per head (Qwen3 only), then RoPE at `positions`
    write k, v into the KV cache at out_cache_loc; attend (reference/attention.py)
    x   = x + attn Wo^T
    x   = x + FFN(rms_norm(x, mlp_norm))                         FFN = SwiGLU MLP or MoE

Every op runs in the dtype of x and the weights (bf16 baseline, fp32 / fp64 oracle).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from lowlat.config import ModelConfig
from lowlat.reference.attention import paged_attention, write_kv
from lowlat.reference.mlp import swiglu_mlp
from lowlat.reference.moe import moe
from lowlat.reference.rms_norm import rms_norm
from lowlat.reference.rope import apply_rope
from lowlat.step import StepBatch
from lowlat.weights import LayerWeights


def attention_block(cfg: ModelConfig, lw: LayerWeights, h: torch.Tensor, step: StepBatch,
                    k_cache: torch.Tensor, v_cache: torch.Tensor, cos: torch.Tensor,
                    sin: torch.Tensor) -> torch.Tensor:
    """QKV projection, QK-norm, RoPE, KV write and attention of normed rows h [M, H].

    Head counts come from the weights, so a tensor-parallel shard (fewer heads) runs unchanged.
    Returns the attention output before the output projection, [M, Hq_local * D].
    Mutates: k_cache / v_cache [S, Hkv_local, D] at the valid rows' out_cache_loc.
    """
    m, d = h.shape[0], cfg.head_dim
    q = F.linear(h, lw.wq, lw.bq).view(m, -1, d)
    k = F.linear(h, lw.wk, lw.bk).view(m, -1, d)
    v = F.linear(h, lw.wv, lw.bv).view(m, -1, d)
    if lw.q_norm is not None:
        q, k = rms_norm(q, lw.q_norm, cfg.rms_eps), rms_norm(k, lw.k_norm, cfg.rms_eps)
    q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
    write_kv(k_cache, v_cache, k, v, step.out_cache_loc, step.num_valid_rows)
    o = paged_attention(q, k_cache, v_cache, step.page_table, step.req_indices, step.positions,
                        step.num_valid_rows)
    return o.reshape(m, -1)


def ffn(cfg: ModelConfig, lw: LayerWeights, h: torch.Tensor, num_valid_rows: int) -> torch.Tensor:
    """Dense SwiGLU MLP, or the MoE block (routing bitmap; padding rows never enter routing)."""
    if lw.router is None:
        return swiglu_mlp(h, lw.w_gate, lw.w_up, lw.w_down)
    shared = (lw.shared_gate, lw.shared_up, lw.shared_down) if lw.shared_gate is not None else None
    return moe(h, lw.router, lw.expert_gate, lw.expert_up, lw.expert_down, cfg.top_k,
               cfg.norm_topk_prob, num_valid_rows, shared)


def decoder_layer(cfg: ModelConfig, lw: LayerWeights, x: torch.Tensor, step: StepBatch,
                  k_cache: torch.Tensor, v_cache: torch.Tensor, cos: torch.Tensor,
                  sin: torch.Tensor) -> torch.Tensor:
    """x [M, H] -> [M, H]; cos/sin [M, D] from reference/rope.py. Mutates the layer's KV cache."""
    h = rms_norm(x, lw.attn_norm, cfg.rms_eps)
    x = x + F.linear(attention_block(cfg, lw, h, step, k_cache, v_cache, cos, sin), lw.wo)
    h = rms_norm(x, lw.mlp_norm, cfg.rms_eps)
    return x + ffn(cfg, lw, h, step.num_valid_rows)
