"""lowlat's MegakernelSpecs for SGLang (sglang 0.5.23, MEGAKERNEL_API_VERSION 1), one per architecture.

Each is the contract's LowlatSpec (lowlat/runtime/contract.py) written in SGLang's types:

    requires   isas {"sm_90"}, tp_sizes, resident_blocks, dtypes {"bfloat16"}, decode graph backends
               {"full", "disabled"} (forward is capturable: no host sync), server_args pinning the FA3
               attention backend (whose metadata page_table we read) with page size 1, and the HF
               config fields the kernels are built for (model_type, hidden_act "silu")
    features   SPECULATIVE_DECODING (uniform k+1-row target verify)
    numerics   TOLERANCE, the numbers of lowlat/numerics.py the fused logits are tested to
    max_rows   48
    config_disable_reasons / model_disable_reasons   what `requires` cannot state: sliding window,
               head counts, fp8 / quantized weights or KV cache, TP not dividing KV heads, tree verify
               (EAGLE topk > 1), the loaded weights' layout and dtype, too few SMs
    build      BuildContext -> SGLangBuilt (lowlat/sglang_plugin/built.py)

Registered under the same architectures as the contract's own registry (`SPEC_ATTRS`), by the
`nvidia_megakernel` entry point (lowlat/sglang_plugin/__init__.py).
"""

from __future__ import annotations

import functools
import logging
from typing import Any, Mapping

from sglang.kernels.plugin_kernels.nvidia.spec import (
    Feature,
    MegakernelSpec,
    Numerics,
    NumericsKind,
    Requirements,
)

from lowlat.config import ModelConfig
from lowlat.errors import UnsupportedConfigError
from lowlat.runtime import contract
from lowlat.runtime.contract import ContractRefusal, DeviceFacts, LowlatSpec, RunnerFactory
from lowlat.sglang_plugin.built import (RefusedBuild, SGLangBuilt, SGLangModelLayoutError, hf_dict,
                                        weights_from_sglang_model)

log = logging.getLogger("lowlat.sglang_plugin")

#: Server arguments the plugin reads through: FA3 (Hopper's default) holds `page_table` +
#: `cache_seqlens_int32`; page size 1 makes it a token-level page table. decode_attention_backend
#: None means "same as attention_backend".
SERVER_ARGS: Mapping[str, frozenset] = {
    "attention_backend": frozenset({"fa3"}),
    "decode_attention_backend": frozenset({None, "fa3"}),
    "page_size": frozenset({None, 1}),
}
DECODE_GRAPH_BACKENDS = frozenset({"full", "disabled"})
MODEL_TYPES = {"LlamaForCausalLM": "llama", "Qwen2ForCausalLM": "qwen2", "Qwen3ForCausalLM": "qwen3"}


def config_disable_reasons(spec: LowlatSpec, cfg: Any, hf_config: Any) -> list[str]:
    """Before weights load: the checks `requires` cannot state. cfg is SGLang's resolved server
    arguments (tp_size, kv_cache_dtype, quantization, speculative_eagle_topk), hf_config the HF config."""
    reasons = spec.config_reasons(
        hf_dict(hf_config), tp_size=int(getattr(cfg, "tp_size", 1) or 1),
        kv_cache_dtype=getattr(cfg, "kv_cache_dtype", None), quantization=getattr(cfg, "quantization", None),
        check_tp_sizes=False)
    topk = getattr(cfg, "speculative_eagle_topk", None)
    algorithm = getattr(cfg, "speculative_algorithm", None)
    if algorithm is not None and str(getattr(algorithm, "name", algorithm)).upper() == "NGRAM":
        reasons.append("--speculative-algorithm NGRAM: its verify is an irregular draft tree (tree_topk -1); "
                       "the fused step verifies one chain of drafts per request")
    elif algorithm is not None and topk not in (None, 1):
        reasons.append(f"--speculative-eagle-topk {topk}: tree verify; the fused step verifies one chain "
                       "of drafts per request (topk 1)")
    return reasons


def model_disable_reasons(spec: LowlatSpec, model: Any, hf_config: Any, *,
                          hardware: DeviceFacts | None = None) -> list[str]:
    """After weights load, per rank: the HF config's own limits (head_dim, hidden size, quantized
    checkpoint, ...: SGLang checks a draft model only here, never through config_disable_reasons), the
    parameter layout and dtype the plugin reads, and the GPU (ISA, SMs) the weights sit on.

    Returns the reasons (strings), [] when eligible. Never raises: SGLang gathers every rank's reasons
    right after, so an exception on one rank would leave its peers waiting in that gather; anything
    raised here (a malformed config, an unexpected model object) is this rank's reason instead."""
    try:
        hf = hf_dict(hf_config)
        reasons = spec.config_reasons(hf, check_tp_sizes=False, tp_size=1)
        if reasons:
            return reasons          # the config alone refuses: its layout is not worth reading
        cfg = ModelConfig.from_hf(_readable(hf))
        weights = weights_from_sglang_model(model, cfg)
        hw = hardware if hardware is not None else contract.device_facts(weights.embed.device)
        return spec.weights_reasons(cfg, weights) + spec.hardware_reasons(hw)
    except (UnsupportedConfigError, SGLangModelLayoutError) as e:
        return [str(e)]
    except Exception as e:  # noqa: BLE001 - a rank-local crash would hang the peers in SGLang's gather
        log.error("%s: model_disable_reasons raised %s: %s", spec.name, type(e).__name__, e)
        return [f"{spec.name} cannot check the loaded model: {type(e).__name__}: {e}"]


def _readable(hf: dict[str, Any]) -> dict[str, Any]:
    """The HF fields ModelConfig reads; the guard has already judged the rest (layer_types of
    transformers 5 configs lists "full_attention" per layer, which ModelConfig would refuse)."""
    hf = dict(hf)
    if all(t == "full_attention" for t in hf.get("layer_types") or ()):
        hf.pop("layer_types", None)
    if not hf.get("use_sliding_window", True):
        hf.pop("sliding_window", None)
    return hf


def _sglang_tp_size() -> int:
    """SGLang's TP size when a server's parallel config is published (1 outside a server)."""
    from sglang.srt.runtime_context import get_context, get_parallel

    if not get_context().is_config_namespace_published("parallel"):
        return 1
    return int(get_parallel().tp_size)


def build_for_sglang(model: Any, hf_config: Any, context: Any, *, spec: LowlatSpec,
                     runner_factory: RunnerFactory | None, runner_kwargs: Mapping[str, Any] | None,
                     hardware: DeviceFacts | None) -> SGLangBuilt | RefusedBuild:
    """SGLang's build: weights as views of the loaded model, the runner built once per the
    BuildContext (widths, tokens_per_request, deadline_s). SGLang gathers the built widths across
    ranks itself (binding.megakernel_agree), so the contract's own group is None here. A refusal
    returns a RefusedBuild (no widths): SGLang then refuses on every rank, none crashes alone."""
    try:
        hf = _readable(hf_dict(hf_config))
        cfg = ModelConfig.from_hf(hf)
        weights = weights_from_sglang_model(model, cfg)
    except (UnsupportedConfigError, SGLangModelLayoutError) as e:
        return _refused(spec, [str(e)])
    except Exception as e:  # noqa: BLE001 - refuse on this rank (no widths), never crash it alone
        return _refused(spec, [f"reading the loaded model raised {type(e).__name__}: {e}"])
    if runner_factory is None:
        # SGLang captures its own decode graphs around forward: the runner must not capture inside.
        # It must not validate either: padded rows write the dummy slot 0, and captures forbid syncs.
        runner_factory, runner_kwargs = contract.fused_runner, {"use_cuda_graphs": False, "validate": False}
    try:
        core = contract.build(spec, cfg, weights, device=weights.embed.device, widths=context.widths,
                              tokens_per_request=context.tokens_per_request, deadline_s=context.deadline_s,
                              runner_factory=runner_factory, runner_kwargs=runner_kwargs, group=None,
                              hardware=hardware, tp_size=_sglang_tp_size(), hf=hf)
    except ContractRefusal as e:
        return _refused(spec, e.reasons)
    return SGLangBuilt(core, model, binding=context.binding)


def _refused(spec: LowlatSpec, reasons: list[str]) -> RefusedBuild:
    log.error("%s refused at build: %s", spec.name, "; ".join(reasons))
    return RefusedBuild(reasons)


def make_megakernel_spec(spec: LowlatSpec, *, runner_factory: RunnerFactory | None = None,
                         runner_kwargs: Mapping[str, Any] | None = None,
                         hardware: DeviceFacts | None = None) -> MegakernelSpec:
    """SGLang's MegakernelSpec for a LowlatSpec. runner_factory / runner_kwargs (default FusedModel
    without its own graphs) and hardware (default: probed) are injectable for CPU tests."""
    return MegakernelSpec(
        name=spec.name,
        requires=Requirements(
            isas=spec.isas, tp_sizes=spec.tp_sizes, resident_blocks=spec.resident_blocks, dtypes=spec.dtypes,
            decode_graph_backends=DECODE_GRAPH_BACKENDS, server_args=SERVER_ARGS,
            hf_config={"model_type": MODEL_TYPES[spec.architecture], "hidden_act": "silu"}),
        features=frozenset(Feature[f] for f in spec.features),
        numerics=Numerics(kind=NumericsKind.TOLERANCE, tolerances=spec.numerics()),
        max_rows=spec.max_rows,
        build=functools.partial(build_for_sglang, spec=spec, runner_factory=runner_factory,
                                runner_kwargs=runner_kwargs, hardware=hardware),
        api_version=spec.api_version,
        model_disable_reasons=functools.partial(model_disable_reasons, spec, hardware=hardware),
        config_disable_reasons=functools.partial(config_disable_reasons, spec),
    )


LLAMA = make_megakernel_spec(contract.LLAMA)
QWEN2 = make_megakernel_spec(contract.QWEN2)
QWEN3 = make_megakernel_spec(contract.QWEN3)
