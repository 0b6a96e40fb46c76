"""SGLang-shaped test doubles, built from the fields SGLang 0.5.23 documents and our plugin reads.

No SGLang server runs on the CPU machines (and importing SGLang's ForwardBatch, LogitsProcessor or
memory pools needs GPU-only packages), so tests drive the plugin with these:

    ForwardMode          the enum's names and the methods plan calls (forward_batch_info.ForwardMode)
    FakeKVPool           MHATokenToKVPool's read surface: get_key_buffer / get_value_buffer per layer,
                         page_size, start_layer, plus ReqToTokenPool's req_to_token
    fake_sglang_model    an nn.Module with SGLang's parameter names (qkv_proj, gate_up_proj, ...) holding
                         the given ModelWeights, and a logits processor computing h @ lm_head^T in fp32
    fake_forward_batch   ForwardBatch's fields a decode / target-verify step uses
    fa3_metadata         FlashAttentionMetadata's page_table / cache_seqlens_int32 as FA3 builds them
    fake_server_args     the resolved server arguments SGLang's megakernel_disable_reasons reads
"""

from __future__ import annotations

import enum
from types import SimpleNamespace
from typing import Any, Sequence

import torch

from lowlat.config import ModelConfig
from lowlat.weights import ModelWeights


class ForwardMode(enum.IntEnum):
    EXTEND = enum.auto()
    DECODE = enum.auto()
    MIXED = enum.auto()
    IDLE = enum.auto()
    TARGET_VERIFY = enum.auto()

    def is_decode(self) -> bool:
        return self == ForwardMode.DECODE

    def is_target_verify(self) -> bool:
        return self == ForwardMode.TARGET_VERIFY

    def is_idle(self) -> bool:
        return self == ForwardMode.IDLE


class CaptureHiddenMode(enum.IntEnum):
    NULL = 0
    LAST = 1
    FULL = 2

    def need_capture(self) -> bool:
        return self != CaptureHiddenMode.NULL


class FakeKVPool:
    """Per-layer K/V buffers [num_slots, Hkv, D] (slot 0 the dummy slot) and req_to_token
    [max_reqs + 1, max_ctx] (row 0 the padding row CUDA-graph padded batches point at)."""

    def __init__(self, k_caches: Sequence[torch.Tensor], v_caches: Sequence[torch.Tensor],
                 req_to_token: torch.Tensor | None, page_size: int = 1) -> None:
        self.k_buffer, self.v_buffer = list(k_caches), list(v_caches)
        self.req_to_token, self.page_size, self.start_layer = req_to_token, page_size, 0
        self.reads: list[int] = []

    def get_key_buffer(self, layer_id: int) -> torch.Tensor:
        self.reads.append(layer_id)
        return self.k_buffer[layer_id - self.start_layer]

    def get_value_buffer(self, layer_id: int) -> torch.Tensor:
        return self.v_buffer[layer_id - self.start_layer]


class _Linear(torch.nn.Module):
    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(weight, requires_grad=False)
        self.bias = None if bias is None else torch.nn.Parameter(bias, requires_grad=False)


def _cat(*ts: torch.Tensor) -> torch.Tensor:
    return torch.cat(ts, dim=0)


class FakeLogitsProcessor:
    """SGLang's LogitsProcessor for a decode / verify step at TP 1: next_token_logits = h @ W^T in fp32
    for every row, vocab padding sliced off (hidden_states and logprobs are not modelled). Records
    its calls."""

    def __init__(self, vocab_size: int) -> None:
        self.vocab_size, self.calls = vocab_size, 0

    def __call__(self, input_ids, hidden_states, lm_head, forward_batch, aux_hidden_states=None):
        self.calls += 1
        logits = torch.nn.functional.linear(hidden_states, lm_head.weight)[:, : self.vocab_size].float()
        return SimpleNamespace(next_token_logits=logits, hidden_states=None)


def fake_sglang_model(cfg: ModelConfig, w: ModelWeights, *, vocab_pad: int = 0) -> torch.nn.Module:
    """An SGLang-layout model holding copies of `w` (Q/K/V and gate/up fused as SGLang loads them);
    the embedding / LM head get `vocab_pad` extra rows as VocabParallelEmbedding pads."""
    root, inner = torch.nn.Module(), torch.nn.Module()

    def padded(t: torch.Tensor) -> torch.Tensor:
        return torch.cat([t, torch.randn(vocab_pad, t.shape[1]).to(t.dtype)]) if vocab_pad else t.clone()

    inner.embed_tokens = _Linear(padded(w.embed))
    inner.norm = _Linear(w.final_norm.clone())
    layers = torch.nn.ModuleList()
    for lw in w.layers:
        layer, attn, mlp = torch.nn.Module(), torch.nn.Module(), torch.nn.Module()
        bias = None if lw.bq is None else _cat(lw.bq, lw.bk, lw.bv)
        attn.qkv_proj = _Linear(_cat(lw.wq, lw.wk, lw.wv), bias)
        attn.o_proj = _Linear(lw.wo.clone())
        if lw.q_norm is not None:
            attn.q_norm, attn.k_norm = _Linear(lw.q_norm.clone()), _Linear(lw.k_norm.clone())
        mlp.gate_up_proj = _Linear(_cat(lw.w_gate, lw.w_up))
        mlp.down_proj = _Linear(lw.w_down.clone())
        layer.self_attn, layer.mlp = attn, mlp
        layer.input_layernorm, layer.post_attention_layernorm = _Linear(lw.attn_norm.clone()), _Linear(lw.mlp_norm.clone())
        layers.append(layer)
    inner.layers = layers
    root.model = inner
    root.lm_head = inner.embed_tokens if w.lm_head is w.embed else _Linear(padded(w.lm_head))
    root.logits_processor = FakeLogitsProcessor(cfg.vocab_size)
    root.config = SimpleNamespace(architectures=[cfg.architecture])
    root.capture_aux_hidden_states = False
    return root


def fake_forward_batch(mode: ForwardMode, *, input_ids: torch.Tensor, positions: torch.Tensor,
                       req_pool_indices: torch.Tensor, seq_lens: torch.Tensor, out_cache_loc: torch.Tensor,
                       spec_info: Any = None, **extra: Any) -> SimpleNamespace:
    """ForwardBatch's decode / target-verify fields (forward_batch_info.ForwardBatch). For decode
    seq_lens counts the new token (positions = seq_lens - 1); for target verify it is the prefix
    length before the drafts (positions = seq_lens + j)."""
    fb = SimpleNamespace(
        forward_mode=mode, batch_size=int(req_pool_indices.shape[0]), input_ids=input_ids, positions=positions,
        req_pool_indices=req_pool_indices, seq_lens=seq_lens, out_cache_loc=out_cache_loc, spec_info=spec_info,
        return_logprob=False, capture_hidden_mode=CaptureHiddenMode.NULL, input_embeds=None)
    for k, v in extra.items():
        setattr(fb, k, v)
    return fb


def fa3_metadata(req_to_token: torch.Tensor, fb: SimpleNamespace, draft_tokens: int = 0) -> SimpleNamespace:
    """FlashAttentionMetadata as FA3's init_forward_metadata builds it for decode (draft_tokens 0) or
    target verify (topk 1): cache_seqlens_int32 = seq_lens (+ draft tokens), page_table =
    req_to_token[req_pool_indices, :max_seq_len_k]."""
    cache = (fb.seq_lens + draft_tokens).to(torch.int32)
    max_k = int(cache.max())
    return SimpleNamespace(cache_seqlens_int32=cache, page_table=req_to_token[fb.req_pool_indices, :max_k])


def fake_view(pool: FakeKVPool, metadata: Any = None) -> SimpleNamespace:
    """binding.ForwardView's fields the plugin reads: metadata and kv_pool.pool."""
    return SimpleNamespace(metadata=metadata, kv_pool=SimpleNamespace(pool=pool))


def fake_server_args(**overrides: Any) -> SimpleNamespace:
    """Resolved server arguments as binding.megakernel_disable_reasons reads them (every feature off,
    TP 1, FA3, full decode graphs)."""
    cfg = SimpleNamespace(
        pp_size=1, nnodes=1, enable_dp_attention=False, attn_dp_size=1, ep_size=1, enable_eplb=False,
        attn_cp_size=1, dcp_size=1, enable_prefill_cp=False, speculative_algorithm=None,
        speculative_eagle_topk=None, enable_two_batch_overlap=False, enable_single_batch_overlap=False,
        enable_lora=False, lora_paths=None, disaggregation_mode="null", enable_return_routed_experts=False,
        enable_return_indexer_topk=False, enable_hierarchical_cache=False,
        disaggregation_decode_enable_offload_kvcache=False, enable_lmcache=False, enable_flexkv=False,
        enable_hisparse=False, enable_memory_saver=False, enable_weights_cpu_backup=False, cpu_offload_gb=0,
        offload_group_size=0, enable_torch_compile=False, enable_deterministic_inference=False,
        rl_on_policy_target=None, tp_size=1, watchdog_timeout=300.0, attention_backend="fa3",
        decode_attention_backend=None, page_size=1, kv_cache_dtype="auto", quantization=None,
        cuda_graph_config=SimpleNamespace(decode=SimpleNamespace(backend="full")))
    for k, v in overrides.items():
        setattr(cfg, k, v)
    return cfg
