"""What our MegakernelSpec's `build` returns to SGLang: widths, summary, plan, forward.

The built object wraps the contract's `Built` (lowlat/runtime/contract.py), so SGLang's dispatch and
our engine plan the same way. It reads SGLang's state in place (sglang 0.5.23):

    weights     the loaded model's parameters (`model.model.layers[i].self_attn.qkv_proj.weight`, ...),
                as views; the step runner repacks them once at build
    KV cache    `step.view.kv_pool.pool.get_key_buffer(l)` / `get_value_buffer(l)`, each
                [num_slots + page_size, Hkv, D], slot 0 the dummy slot: MHATokenToKVPool's own tensors
    page table  the FA3 metadata's `page_table [B, C]` + `cache_seqlens_int32 [B]` (the Hopper
                default backend, pinned by the spec), else a gather of `req_to_token[req_pool_indices]`
    rows        `input_ids [M]`, `positions [M]`, `forward_batch.out_cache_loc [M]`; decode has one row
                per request, target verify k+1 consecutive rows per request (uniform k)

CUDA-graph padding (SGLang's decode registry): padded requests have req_pool_indices 0 (req_to_token's
padding row), seq_lens 1, positions 0 and out_cache_loc 0, so their rows write and read only the
dummy slot 0 and never change a valid row. A captured graph cannot know how many rows are real,
so every row is computed.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

import torch

from lowlat.config import ModelConfig
from lowlat.errors import LowlatError
from lowlat.runtime.contract import Built, ContractRefusal
from lowlat.step import StepBatch
from lowlat.weights import LayerWeights, ModelWeights


class SGLangModelLayoutError(LowlatError, ValueError):
    """The loaded SGLang model does not have the parameter layout the plugin reads (names the path)."""


def hf_dict(hf_config: Any) -> dict[str, Any]:
    """An HF config (transformers PretrainedConfig, or a dict) as a plain dict."""
    if isinstance(hf_config, Mapping):
        return dict(hf_config)
    if hasattr(hf_config, "to_dict"):
        return hf_config.to_dict()
    return dict(vars(hf_config))


def _param(obj: Any, path: str) -> torch.Tensor:
    """The tensor at dotted `path` ("model.layers.3.mlp.down_proj.weight"); SGLangModelLayoutError naming
    the path when a part is missing, an index is out of range (fewer layers than the config's) or the
    object there is not a tensor."""
    cur = obj
    for part in path.split("."):
        if part.isdigit():
            try:
                cur = cur[int(part)]
            except (IndexError, KeyError, TypeError):
                n = len(cur) if hasattr(cur, "__len__") else "no"
                raise SGLangModelLayoutError(f"the model has no {path} (index {part} of {n} entries)") from None
        else:
            cur = getattr(cur, part, None)
        if cur is None:
            raise SGLangModelLayoutError(f"the model has no {path} (missing at {part!r})")
    if not isinstance(cur, torch.Tensor):
        raise SGLangModelLayoutError(f"model.{path} is a {type(cur).__name__}, not a tensor")
    return cur


def _shape(t: torch.Tensor, want: tuple[int, ...], path: str) -> torch.Tensor:
    if tuple(t.shape) != want:
        raise SGLangModelLayoutError(
            f"model.{path} has shape {tuple(t.shape)}, expected {want} (a TP shard or a quantized layout?)")
    return t


def _absent(obj: Any, path: str, why: str) -> None:
    """Refuse a parameter the fused step would silently leave out (a bias, a norm) when the model has it."""
    try:
        _param(obj, path)
    except SGLangModelLayoutError:
        return                  # absent (or not a tensor): nothing is left out
    raise SGLangModelLayoutError(f"model.{path} exists ({why}); the fused step would leave it out")


def weights_from_sglang_model(model: torch.nn.Module, cfg: ModelConfig) -> ModelWeights:
    """lowlat's ModelWeights as views of an SGLang Llama / Qwen2 / Qwen3 model's parameters (TP 1).

    SGLang fuses Q/K/V into `qkv_proj` [(Hq + 2 Hkv) D, H] and gate/up into `gate_up_proj` [2 I, H];
    both are split by views, nothing is copied. The vocab rows SGLang pads the embedding / LM head
    with (VocabParallelEmbedding) are sliced off. Raises SGLangModelLayoutError naming the path: a
    parameter missing or of another shape, fewer or more decoder layers than cfg.num_layers, or a
    parameter the fused step does not read (a Q/K/V bias the config does not declare, an o_proj /
    MLP bias, a QK norm on a model without one), which would otherwise be dropped silently.
    """
    h, d, v = cfg.hidden_size, cfg.head_dim, cfg.vocab_size
    q, kv, inter = cfg.q_size, cfg.kv_size, cfg.intermediate_size
    if cfg.is_moe:
        raise SGLangModelLayoutError(f"{cfg.architecture} has MoE layers; the plugin reads dense layers only")
    embed_full = _param(model, "model.embed_tokens.weight")
    if embed_full.shape[0] < v or embed_full.shape[1] != h:
        raise SGLangModelLayoutError(f"model.model.embed_tokens.weight has shape {tuple(embed_full.shape)}, "
                                     f"expected at least ({v}, {h})")
    embed = embed_full[:v]
    decoder = getattr(getattr(model, "model", None), "layers", None)
    if hasattr(decoder, "__len__") and len(decoder) != cfg.num_layers:
        raise SGLangModelLayoutError(f"model.model.layers has {len(decoder)} layers, the config "
                                     f"num_hidden_layers={cfg.num_layers}")
    layers = []
    for i in range(cfg.num_layers):
        p = f"model.layers.{i}"
        qkv = _shape(_param(model, f"{p}.self_attn.qkv_proj.weight"), (q + 2 * kv, h), f"{p}.self_attn.qkv_proj.weight")
        gate_up = _shape(_param(model, f"{p}.mlp.gate_up_proj.weight"), (2 * inter, h), f"{p}.mlp.gate_up_proj.weight")
        lw = LayerWeights(
            attn_norm=_shape(_param(model, f"{p}.input_layernorm.weight"), (h,), f"{p}.input_layernorm.weight"),
            wq=qkv[:q], wk=qkv[q:q + kv], wv=qkv[q + kv:],
            wo=_shape(_param(model, f"{p}.self_attn.o_proj.weight"), (h, q), f"{p}.self_attn.o_proj.weight"),
            mlp_norm=_shape(_param(model, f"{p}.post_attention_layernorm.weight"), (h,),
                            f"{p}.post_attention_layernorm.weight"),
            w_gate=gate_up[:inter], w_up=gate_up[inter:],
            w_down=_shape(_param(model, f"{p}.mlp.down_proj.weight"), (h, inter), f"{p}.mlp.down_proj.weight"))
        if cfg.qkv_bias:
            b = _shape(_param(model, f"{p}.self_attn.qkv_proj.bias"), (q + 2 * kv,), f"{p}.self_attn.qkv_proj.bias")
            lw.bq, lw.bk, lw.bv = b[:q], b[q:q + kv], b[q + kv:]
        else:
            _absent(model, f"{p}.self_attn.qkv_proj.bias", "the config declares no Q/K/V bias")
        if cfg.qk_norm:
            lw.q_norm = _shape(_param(model, f"{p}.self_attn.q_norm.weight"), (d,), f"{p}.self_attn.q_norm.weight")
            lw.k_norm = _shape(_param(model, f"{p}.self_attn.k_norm.weight"), (d,), f"{p}.self_attn.k_norm.weight")
        else:
            for norm in ("q_norm", "k_norm"):
                _absent(model, f"{p}.self_attn.{norm}.weight", f"{cfg.architecture} has no per-head QK norm")
        for lin in ("self_attn.o_proj", "mlp.gate_up_proj", "mlp.down_proj"):
            _absent(model, f"{p}.{lin}.bias", "lowlat implements no bias there")
        layers.append(lw)
    final_norm = _shape(_param(model, "model.norm.weight"), (h,), "model.norm.weight")
    lm_module = getattr(model, "lm_head", None)
    if lm_module is None or lm_module is getattr(model.model, "embed_tokens", None):
        lm_head = embed
    else:
        lm_full = _param(model, "lm_head.weight")
        if lm_full.shape[0] < v or lm_full.shape[1] != h:
            raise SGLangModelLayoutError(f"model.lm_head.weight has shape {tuple(lm_full.shape)}, "
                                         f"expected at least ({v}, {h})")
        lm_head = lm_full[:v]
    return ModelWeights(embed=embed, layers=layers, final_norm=final_norm, lm_head=lm_head)


class SGLangKV:
    """The running forward's KV pool as a step runner reads it: per-layer buffers, no copies.

    k_caches[l], v_caches[l]: `pool.get_key_buffer(start_layer + l)` / `get_value_buffer(...)`,
    [num_slots + page_size, Hkv, D]; req_to_token: the pool's, when it has one (else None).
    """

    def __init__(self, pool: Any, num_layers: int, start_layer: int = 0) -> None:
        self.pool = pool
        self.k_caches = [pool.get_key_buffer(start_layer + i) for i in range(num_layers)]
        self.v_caches = [pool.get_value_buffer(start_layer + i) for i in range(num_layers)]
        self.req_to_token = getattr(pool, "req_to_token", None)
        self.num_slots = int(self.k_caches[0].shape[0])


def _mode(forward_batch: Any) -> str | None:
    fm = forward_batch.forward_mode
    if fm.is_decode():
        return "decode"
    if fm.is_target_verify():
        return "target_verify"
    return None


def _tree_topk(spec_info: Any) -> int:
    """The verify tree's branching: SpecInput.tree_topk where the input has it (EAGLE: its topk; NGRAM: -1,
    an irregular tree), else `topk` (DFLASH: 1, a chain); 1 (a chain) for an input naming neither."""
    topk = getattr(spec_info, "tree_topk", None)
    if topk is None:
        topk = getattr(spec_info, "topk", None)
    return 1 if topk is None else int(topk)


class SGLangBuilt:
    """SGLang's BuiltMegakernel (sglang.kernels.plugin_kernels.nvidia.spec) over the contract's Built.

    output: "logits_processor" runs the model's own LogitsProcessor on our final hidden states (so the
    return value is exactly the original's, logprobs and hidden-state capture included); "logits"
    wraps the runner's logits with `make_output` (default: SGLang's LogitsProcessorOutput) and plan
    declines steps that need more (hidden-state capture for EAGLE drafters).
    """

    draft_sampler = None

    def __init__(self, core: Built, model: torch.nn.Module, *, binding: Any = None,
                 make_output: Callable[[torch.Tensor], Any] | None = None) -> None:
        self.core, self.model, self.binding = core, model, binding
        self._make_output = make_output or _logits_processor_output
        self.widths: tuple[int, ...] = core.widths
        has_lp = hasattr(model, "logits_processor") and hasattr(model, "lm_head")
        self.output = "logits_processor" if has_lp and hasattr(core.runner, "hidden_states") else "logits"
        self._req_indices = self._row_maps(core.device)

    def _row_maps(self, dev: torch.device) -> dict[tuple[str, int], torch.Tensor]:
        """Static request-of-row tensors per (mode, width), made once at build."""
        k = self.core.tokens_per_request
        maps = {}
        for w in self.widths:
            maps[("decode", w)] = torch.arange(w, dtype=torch.int32, device=dev)
            if k > 1 and w % k == 0:
                maps[("target_verify", w)] = torch.arange(w // k, dtype=torch.int32, device=dev).repeat_interleave(k)
        return maps

    def summary(self) -> str:
        return f"{self.core.summary()}; output via {self.output}"

    # ------------------------------------------------------------------ plan
    def plan(self, input_ids: torch.Tensor, forward_batch: Any, *args: Any, **kwargs: Any):
        """A `Step(mode, rows)` for a decode / uniform target-verify step of a built width, else None.
        Host-only (reads the mode, shapes and host flags), so a captured graph replays it."""
        from sglang.kernels.plugin_kernels.nvidia.spec import Step

        mode = _mode(forward_batch)
        if mode is None:
            return None
        extras = list(args) + [kwargs.get(k) for k in ("input_embeds", "get_embedding", "pp_proxy_tensors")]
        if any(a is not None and a is not False for a in extras):
            return None             # embeddings in, pooled embeddings out, or pipeline stages
        if getattr(forward_batch, "input_embeds", None) is not None:
            return None
        if getattr(self.model, "capture_aux_hidden_states", False):
            return None
        if self.output == "logits":
            # The hidden states a drafter (EAGLE) asks for come from the LogitsProcessor, which the
            # logits-only path skips. (Decode / verify logprobs are the sampler's, from the logits.)
            chm = getattr(forward_batch, "capture_hidden_mode", None)
            if chm is not None and chm.need_capture():
                return None
        rows, bs = int(input_ids.shape[0]), int(forward_batch.batch_size)
        if mode == "decode" and rows != bs:
            return None
        if mode == "target_verify":
            if rows != bs * self.core.tokens_per_request:
                return None
            if _tree_topk(forward_batch.spec_info) != 1:
                return None         # tree verify: rows do not attend causally to the earlier drafts
        planned = self.core.agree_plan(self.core.plan_rows(mode, rows))
        return None if planned is None else Step(mode=planned.mode, rows=planned.rows)

    # ------------------------------------------------------------------ forward
    def step_batch(self, step: Any, input_ids: torch.Tensor, positions: torch.Tensor,
                   forward_batch: Any) -> tuple[StepBatch, SGLangKV]:
        """The step contract's tensors from SGLang's (views, plus dtype casts of [M] / [B] vectors)."""
        view = step.view
        pool = view.kv_pool.pool
        page_size = getattr(pool, "page_size", 1)
        if page_size != 1:
            raise ContractRefusal([f"KV pool page_size {page_size}: the fused step reads page size 1"])
        kv = SGLangKV(pool, self.core.cfg.num_layers, getattr(pool, "start_layer", 0) or 0)
        meta = getattr(view, "metadata", None)
        page_table = getattr(meta, "page_table", None)
        seq_lens = getattr(meta, "cache_seqlens_int32", None)
        if page_table is None or seq_lens is None:
            req_to_token = kv.req_to_token
            if req_to_token is None:
                rtp = getattr(forward_batch, "req_to_token_pool", None)
                req_to_token = None if rtp is None else rtp.req_to_token
            if req_to_token is None:
                raise ContractRefusal(["no page table: the attention metadata has no page_table and the "
                                       "KV pool no req_to_token"])
            page_table = req_to_token[forward_batch.req_pool_indices]
            extra = self.core.tokens_per_request if step.mode == "target_verify" else 0
            seq_lens = forward_batch.seq_lens + extra if extra else forward_batch.seq_lens
        sb = StepBatch(
            input_ids=input_ids.long(), positions=positions.long(),
            out_cache_loc=forward_batch.out_cache_loc.to(torch.int32),
            req_indices=self._req_indices[(step.mode, step.rows)],
            seq_lens=seq_lens.to(torch.int32), page_table=page_table.to(torch.int32),
            num_valid_rows=step.rows)
        return sb, kv

    def forward(self, step: Any, original: Any, input_ids: torch.Tensor, positions: torch.Tensor,
                forward_batch: Any, *args: Any, **kwargs: Any) -> Any:
        """Run a planned step in place of `original`, returning what it returns (LogitsProcessorOutput).
        Capturable: no host sync. Mutates: the KV pool at out_cache_loc (padded rows: slot 0 only)."""
        sb, kv = self.step_batch(step, input_ids, positions, forward_batch)
        if self.output == "logits_processor":
            hidden = self.core.runner.hidden_states(sb, kv)
            return self.model.logits_processor(input_ids, hidden, self.model.lm_head, forward_batch)
        return self._make_output(self.core.run(sb, kv))


def _logits_processor_output(logits: torch.Tensor) -> Any:
    """SGLang's LogitsProcessorOutput holding next_token_logits [M, V] (what a decode / verify
    forward returns when nothing else was asked for)."""
    from sglang.srt.layers.logits_processor import LogitsProcessorOutput

    return LogitsProcessorOutput(next_token_logits=logits)



class RefusedBuild:
    """What build returns when the contract refuses at build time: no widths. SGLang then gathers
    the (empty) widths from every rank and refuses on every rank ("built no width"), instead of one
    rank crashing while its peers wait in the gather; the reasons are logged and in summary()."""

    draft_sampler = None
    widths: tuple[int, ...] = ()

    def __init__(self, reasons: Sequence[str]) -> None:
        self.reasons = list(reasons)

    def summary(self) -> str:
        return "refused: " + "; ".join(self.reasons)

    def plan(self, input_ids: Any, forward_batch: Any, *args: Any, **kwargs: Any) -> None:
        return None

    def forward(self, step: Any, original: Any, *args: Any, **kwargs: Any) -> Any:
        raise ContractRefusal(self.reasons)
