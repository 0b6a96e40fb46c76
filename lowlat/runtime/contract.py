"""The plugin contract: Register -> Guard -> Build -> Run, shared by SGLang's plugin and our engine.

    Register  an architecture names the "module:attribute" path of its spec (`SPEC_ATTRS`; SGLang's
              entry point registers the same architectures, lowlat/sglang_plugin/__init__.py).
              `find_spec` imports the path; a module that does not import, an object that is not a
              spec, a wrong API version or an ISA the spec does not list is a reason, never a crash.
    Guard     `LowlatSpec.guard(...)`: model config, GPU ISA and SM count, TP size, dtype -> a list of
              human-readable reasons; empty means eligible. Step type and rows are guarded per step
              by `Built.plan_rows`.
    Build     `build(...)`: every rank's guard verdict is agreed first (any reason on any rank refuses
              on every rank, naming each rank's reasons); the step runner repacks the weights once and
              allocates its buffers / graphs per width; the built widths are agreed the same way.
              `Built.summary()` says what was built, in how long and how much memory it took.
    Run       `Built.plan_rows(mode, rows)` decides host-side, from host values only, whether a step is
              covered (the same inputs give the same answer on every rank); each rank then checks
              the step contract against its own KV pool, and `Built.agree_step` agrees plan AND
              validity in one gather: a step invalid on any rank raises `RankStepContractError` on
              every rank (none enters the fused step), differing plans fall back on every rank;
              `Built.run` runs a covered step; anything else goes to the general (reference) forward.
              A guard or spec lookup that raises on a rank is a reason, agreed like any other.

This follows SGLang's NVIDIA megakernel contract (sglang 0.5.23,
`sglang/kernels/plugin_kernels/nvidia/spec.py`, `sglang/srt/kernel_plugins/nvidia/binding.py`;
summary in ../shared/sglang-contract.md). SGLang itself is not imported here: our engine runs the
contract without it, `fused_engine` below.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Protocol, Sequence

import torch

from lowlat import numerics
from lowlat.config import ModelConfig, int_field, name_list
from lowlat.errors import LowlatError, StepContractError, UnsupportedConfigError
from lowlat.step import MAX_ROWS, StepBatch
from lowlat.weights import ModelWeights, shape_problems

log = logging.getLogger("lowlat.contract")

#: The version of SGLang's megakernel API (MEGAKERNEL_API_VERSION) our specs are written against.
API_VERSION = 1

#: The ISAs the fused kernels are built and tested for (Hopper: H100 / H200).
ISAS = frozenset({"sm_90"})
#: Activation / weight / KV dtypes the fused step reads.
DTYPES = frozenset({"bfloat16"})
#: KV-cache dtype names (SGLang's --kv-cache-dtype) that mean a bf16 cache for a bf16 model.
BF16_KV_CACHE_DTYPES = frozenset({"auto", "bf16", "bfloat16"})
#: TP sizes the fused step runs at. The fused step (lowlat/runtime/fused_model.py) is single-GPU;
#: the cross-GPU reduction (lowlat/comm) is not wired into it yet, so only 1 is claimed.
TP_SIZES = frozenset({1})
#: head_dim values the fused attention kernels are instantiated for.
HEAD_DIMS = (64, 128)
#: Blocks that must be resident at once: the cross-GPU waits of lowlat/comm spin inside the grid,
#: which is sized one block per SM of an H100 / H200 SXM (132 SMs); a partitioned GPU (MIG, green
#: contexts) with fewer SMs cannot hold it.
RESIDENT_BLOCKS = 132
#: SGLang features (`sglang...spec.Feature` names) the fused step accepts: speculative decoding,
#: whose target-verify steps have k+1 rows per request (uniform k; ragged verify is refused).
FEATURES = frozenset({"SPECULATIVE_DECODING"})

#: HF architecture -> attribute of this module holding its spec (our engine's registry). SGLang's
#: plugin registers the dense ones under the same attribute names (lowlat.sglang_plugin.spec); the
#: MoE ones run in our engine only (FusedModel + lowlat.kernels.moe), see SGLANG_ARCHITECTURES.
SPEC_ATTRS = {
    "LlamaForCausalLM": "LLAMA",
    "Qwen2ForCausalLM": "QWEN2",
    "Qwen3ForCausalLM": "QWEN3",
    "Qwen3MoeForCausalLM": "QWEN3_MOE",
    "MixtralForCausalLM": "MIXTRAL",
}
#: The architectures the SGLang plugin registers: it reads SGLang's dense parameter layout only
#: (SGLang's FusedMoE expert weights change layout with --moe-runner-backend; not read yet).
SGLANG_ARCHITECTURES = ("LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM")
SPEC_MODULE = "lowlat.runtime.contract"

#: Step modes a built step covers (SGLang's ForwardMode DECODE and TARGET_VERIFY).
COVERED_MODES = ("decode", "target_verify")


class RankStepContractError(StepContractError):
    """A step breaks the step contract on at least one TP rank; raised on EVERY rank before any of
    them enters the fused step. problems_by_rank: {rank (or "every rank"): the rank's reason}."""

    def __init__(self, problems_by_rank: Mapping[Any, str]) -> None:
        self.problems_by_rank = dict(problems_by_rank)
        listing = "; ".join(f"{r}: {p}" if isinstance(r, str) else f"rank {r}: {p}"
                            for r, p in self.problems_by_rank.items())
        super().__init__(f"the step breaks the step contract, so no rank runs it: {listing}")

    def __reduce__(self):   # picklable, so it can cross process boundaries
        return (RankStepContractError, (self.problems_by_rank,))


class ContractRefusal(LowlatError, ValueError):
    """The contract refuses to build: `reasons` lists every reason (on every rank, each named)."""

    def __init__(self, reasons: Sequence[str]) -> None:
        self.reasons = list(reasons)
        super().__init__("the fused step cannot run this setup:\n  - " + "\n  - ".join(self.reasons))


# ---------------------------------------------------------------------------- hardware
@dataclass(frozen=True)
class DeviceFacts:
    """What the guard reads about a GPU: ISA as SGLang writes it ("sm_90"), SM count, name.
    `isa` None means no CUDA GPU is visible."""

    isa: str | None
    sm_count: int
    name: str


def device_facts(device: str | torch.device | None = None) -> DeviceFacts:
    """Facts of `device` (default: the current CUDA device); isa None without a visible GPU."""
    dev = torch.device(device) if device is not None else None
    if (dev is not None and dev.type != "cuda") or not torch.cuda.is_available():
        return DeviceFacts(None, 0, "cpu")
    idx = dev.index if dev is not None and dev.index is not None else torch.cuda.current_device()
    p = torch.cuda.get_device_properties(idx)
    return DeviceFacts(f"sm_{p.major}{p.minor}", int(p.multi_processor_count), p.name)


# ---------------------------------------------------------------------------- the spec
@dataclass(frozen=True)
class LowlatSpec:
    """What the fused step requires and accepts, for one HF architecture.

    The SGLang plugin translates it field by field into a `MegakernelSpec`
    (lowlat/sglang_plugin/spec.py); our engine uses it directly.
    """

    name: str
    architecture: str
    isas: frozenset[str] = ISAS
    tp_sizes: frozenset[int] = TP_SIZES
    resident_blocks: int = RESIDENT_BLOCKS
    dtypes: frozenset[str] = DTYPES
    features: frozenset[str] = FEATURES
    max_rows: int = MAX_ROWS
    api_version: int = API_VERSION

    # ------------------------------------------------------------------ guard
    def config_reasons(self, hf: Mapping[str, Any], *, tp_size: int = 1, dtype: str | None = None,
                       kv_cache_dtype: str | None = None, quantization: str | None = None,
                       check_tp_sizes: bool = True) -> list[str]:
        """Every reason the model config (HF `config.json` dict) and serving options cannot run.

        dtype: the resolved activation dtype name ("bfloat16"); None skips the check (SGLang checks
        it through `requires.dtypes`). kv_cache_dtype: SGLang's --kv-cache-dtype; quantization:
        SGLang's --quantization. check_tp_sizes False leaves `tp_sizes` to the caller (SGLang states
        it from `requires.tp_sizes`). Returns [] when eligible.
        """
        reasons: list[str] = []
        try:                    # read as ModelConfig reads them: a field of the wrong type is a reason
            archs, layer_types = name_list(hf, "architectures"), name_list(hf, "layer_types")
        except UnsupportedConfigError as e:
            return [str(e)]
        if self.architecture not in archs:
            reasons.append(f"config.architectures {archs!r} does not name {self.architecture}")
        counts, not_whole = {}, []
        for key in ("num_attention_heads", "hidden_size", "num_key_value_heads", "head_dim", "intermediate_size"):
            try:
                counts[key] = int_field(hf, key, None) or 0
            except UnsupportedConfigError as e:
                not_whole.append(str(e))
        if not_whole:
            return reasons + not_whole
        window = hf.get("sliding_window")
        if window and hf.get("use_sliding_window", True):
            reasons.append(f"config.sliding_window={window}: sliding-window attention is not implemented "
                           "by the fused step")
        if any(t != "full_attention" for t in layer_types):
            kinds = sorted({t for t in layer_types if t != "full_attention"})
            reasons.append(f"config.layer_types has {kinds}: only full attention in every layer")
        heads, hidden = counts["num_attention_heads"], counts["hidden_size"]
        kv_heads = counts["num_key_value_heads"] or heads
        head_dim = counts["head_dim"] or (hidden // heads if heads else 0)
        if heads <= 0 or kv_heads <= 0 or heads % kv_heads:
            reasons.append(f"config.num_attention_heads={heads} is not a multiple of "
                           f"config.num_key_value_heads={kv_heads} (GQA groups)")
        if head_dim not in HEAD_DIMS:
            reasons.append(f"head_dim={head_dim}: the fused attention kernels are built for head_dim in "
                           f"{list(HEAD_DIMS)}")
        if hidden % 16:
            reasons.append(f"config.hidden_size={hidden}: the fused GEMVs take a multiple of 16")
        quant = hf.get("quantization_config")
        if quant:
            method = quant.get("quant_method") if isinstance(quant, Mapping) else quant
            reasons.append(f"config.quantization_config quant_method={method!r}: quantized (e.g. fp8) "
                           "weights; the fused step reads bf16 weights")
        if quantization:
            reasons.append(f"--quantization {quantization!r}: the fused step reads bf16 weights")
        if kv_cache_dtype is not None and kv_cache_dtype not in BF16_KV_CACHE_DTYPES:
            reasons.append(f"--kv-cache-dtype {kv_cache_dtype!r}: the fused step reads a bf16 KV cache "
                           f"({sorted(BF16_KV_CACHE_DTYPES)})")
        if dtype is not None and self.dtypes and dtype not in self.dtypes:
            reasons.append(f"dtype {dtype!r} is not one of {sorted(self.dtypes)}")
        if check_tp_sizes and self.tp_sizes and tp_size not in self.tp_sizes:
            reasons.append(f"tp_size {tp_size} is not one of {sorted(self.tp_sizes)}")
        if tp_size > 0 and kv_heads > 0 and kv_heads % tp_size:
            reasons.append(f"tp_size {tp_size} does not divide config.num_key_value_heads={kv_heads}: "
                           "each rank must hold whole KV heads")
        elif tp_size > 0 and heads % tp_size:
            reasons.append(f"tp_size {tp_size} does not divide config.num_attention_heads={heads}")
        width = counts["intermediate_size"]
        if tp_size > 0 and width and width % tp_size:
            reasons.append(f"tp_size {tp_size} does not divide config.intermediate_size={width}")
        reasons += self._model_config_reasons(hf)
        return reasons

    def _model_config_reasons(self, hf: Mapping[str, Any]) -> list[str]:
        """What lowlat's ModelConfig reader refuses besides the fields checked above."""
        checked = {"sliding_window", "use_sliding_window", "layer_types", "quantization_config"}
        rest = {k: v for k, v in hf.items() if k not in checked}
        try:
            cfg = ModelConfig.from_hf(rest)
        except UnsupportedConfigError as e:
            if e.field in ("num_key_value_heads", "head_dim", "architectures"):
                return []           # already stated above in the guard's own words
            return [str(e)]
        except KeyError as e:
            return [f"config lacks field {e.args[0]!r}"]
        return coverage_reasons(cfg)

    def hardware_reasons(self, hw: DeviceFacts) -> list[str]:
        """GPU ISA and SM count."""
        if hw.isa is None:
            return ["no CUDA GPU is visible"]
        reasons = []
        if hw.isa not in self.isas:
            reasons.append(f"GPU {hw.name} is {hw.isa}, not one of {sorted(self.isas)}")
        if hw.sm_count < self.resident_blocks:
            reasons.append(f"GPU {hw.name} has {hw.sm_count} SMs; the fused step needs "
                           f"{self.resident_blocks} resident blocks (a partitioned GPU?)")
        return reasons

    def weights_reasons(self, cfg: ModelConfig, weights: ModelWeights) -> list[str]:
        """The loaded weights: dtype and shapes the fused step reads."""
        reasons = []
        dtypes = {str(t.dtype).replace("torch.", "") for t in _tensors(weights)}
        bad = sorted(d for d in dtypes if d not in self.dtypes)
        if self.dtypes and bad:
            reasons.append(f"weights hold dtype {bad}; the fused step reads {sorted(self.dtypes)}")
        if len(weights.layers) != cfg.num_layers:
            reasons.append(f"weights have {len(weights.layers)} layers, the config {cfg.num_layers}")
        problems = shape_problems(cfg, weights)
        if problems:
            more = f" (and {len(problems) - 3} more)" if len(problems) > 3 else ""
            reasons.append("weights do not fit the config: " + "; ".join(problems[:3]) + more)
        return reasons

    def guard(self, cfg: ModelConfig, weights: ModelWeights | None, hw: DeviceFacts, *, tp_size: int = 1,
              hf: Mapping[str, Any] | None = None) -> list[str]:
        """All reasons (config, weights, hardware, TP) this rank cannot build; [] = eligible."""
        reasons = self.config_reasons(hf if hf is not None else hf_dict_of(cfg), tp_size=tp_size)
        if weights is not None:
            reasons += self.weights_reasons(cfg, weights)
        return reasons + self.hardware_reasons(hw)

    def numerics(self) -> dict[str, float]:
        """The tolerance the fused logits are tested to (lowlat/numerics.py, op "fused_model")."""
        tol = numerics.tolerance("fused_model", "logits")
        return {
            "logits_max_error_multiple_of_bf16_reference_error": tol.multiple,
            "logits_floor_relative_to_max_abs_logit": tol.floor_rel,
            "logits_floor_abs": tol.floor_abs,
        }


def coverage_reasons(cfg: ModelConfig) -> list[str]:
    """What the fused step (FusedModel) does not cover in a config the reference accepts."""
    reasons = []
    if cfg.is_moe and importlib.util.find_spec("lowlat.kernels.moe") is None:
        reasons.append(f"{cfg.num_experts} MoE experts per layer: lowlat.kernels.moe is not installed")
    return reasons


def hf_dict_of(cfg: ModelConfig) -> dict[str, Any]:
    """The HF config fields the guard reads, from a ModelConfig (our engine has no config.json).

    Q/K/V biases are left out: the fused step reads them whatever the architecture, and HF's
    `attention_bias` would also mean an o_proj bias for Llama / Qwen3 (which `ModelConfig.from_hf`
    refuses), while a ModelConfig's qkv_bias is the Q/K/V biases alone."""
    d: dict[str, Any] = dict(
        architectures=[cfg.architecture], hidden_size=cfg.hidden_size, num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads, num_key_value_heads=cfg.num_kv_heads, head_dim=cfg.head_dim,
        intermediate_size=cfg.intermediate_size, vocab_size=cfg.vocab_size, rope_theta=cfg.rope_theta,
        rms_norm_eps=cfg.rms_eps, tie_word_embeddings=cfg.tie_word_embeddings,
        max_position_embeddings=cfg.max_position_embeddings)
    if cfg.rope_scaling is not None:
        s = cfg.rope_scaling
        d["rope_scaling"] = dict(rope_type="llama3", factor=s.factor, low_freq_factor=s.low_freq_factor,
                                 high_freq_factor=s.high_freq_factor,
                                 original_max_position_embeddings=s.original_max_position_embeddings)
    if cfg.is_moe:
        d.update(num_experts=cfg.num_experts, num_experts_per_tok=cfg.top_k,
                 moe_intermediate_size=cfg.moe_intermediate_size, norm_topk_prob=cfg.norm_topk_prob)
    return d


def _tensors(weights: ModelWeights) -> list[torch.Tensor]:
    out = [weights.embed, weights.final_norm, weights.lm_head]
    for lw in weights.layers:
        out += [t for t in vars(lw).values() if isinstance(t, torch.Tensor)]
    return out


def weight_bytes(weights: ModelWeights) -> int:
    """Bytes of the distinct tensors in `weights` (a tied LM head counted once)."""
    seen, total = set(), 0
    for t in _tensors(weights):
        key = (t.data_ptr(), t.numel(), t.dtype)
        if key not in seen:
            seen.add(key)
            total += t.numel() * t.element_size()
    return total


# ---------------------------------------------------------------------------- specs + register
LLAMA = LowlatSpec(name="lowlat-fused-llama", architecture="LlamaForCausalLM")
QWEN2 = LowlatSpec(name="lowlat-fused-qwen2", architecture="Qwen2ForCausalLM")
QWEN3 = LowlatSpec(name="lowlat-fused-qwen3", architecture="Qwen3ForCausalLM")
QWEN3_MOE = LowlatSpec(name="lowlat-fused-qwen3-moe", architecture="Qwen3MoeForCausalLM")
MIXTRAL = LowlatSpec(name="lowlat-fused-mixtral", architecture="MixtralForCausalLM")

#: architecture -> "module:attribute" of its LowlatSpec (our engine's registry).
REGISTRY: dict[str, str] = {arch: f"{SPEC_MODULE}:{attr}" for arch, attr in SPEC_ATTRS.items()}


def find_spec(architectures: Sequence[str] | None, isa: str | None,
              registry: Mapping[str, str] | None = None) -> tuple[LowlatSpec | None, str]:
    """The compatible spec and "", or None and every reason (SGLang's `find_spec` rules).

    A path that does not import, is not a LowlatSpec, has another API version, does not list
    `isa` or raises while being checked is a reason, not an exception, so every rank reports it alike.
    """
    if isa is None:
        return None, "no CUDA GPU is visible"
    registry = REGISTRY if registry is None else registry
    why = []
    for arch in architectures or ():
        path = registry.get(arch)
        if path is None:
            continue
        module, _, attr = path.partition(":")
        try:
            spec = getattr(importlib.import_module(module), attr)
        except Exception as e:  # noqa: BLE001 - a broken plugin is a reason on every rank, not a crash
            why.append(f"{path} does not import: {type(e).__name__}: {e}")
            continue
        try:
            if not isinstance(spec, LowlatSpec):
                why.append(f"{path} is not a LowlatSpec")
            elif spec.api_version != API_VERSION:
                why.append(f"{path} uses megakernel API version {spec.api_version}; lowlat requires "
                           f"version {API_VERSION}")
            elif isa not in spec.isas:
                why.append(f"{path} supports {sorted(spec.isas)}, not {isa}")
            else:
                return spec, ""
        except Exception as e:  # noqa: BLE001 - e.g. isas=None: a broken spec is a reason, not a crash
            why.append(f"{path} cannot be checked: {type(e).__name__}: {e}")
    return None, "; ".join(why) or (
        f"no spec is registered for {list(architectures or ())} (registered: {sorted(registry)})")


def find_spec_on_every_rank(architectures: Sequence[str] | None, isa: str | None, group: Any,
                            registry: Mapping[str, str] | None = None) -> tuple[LowlatSpec | None, list[str]]:
    """`find_spec` on every rank, then agreed: the spec every rank found and [], or None and the
    reasons (each rank's, named, when the ranks found different things), identical on every rank.
    Ranks branch together on the answer, so none builds (or enters a collective) alone. A lookup
    that raises on a rank (a broken registry, say) is that rank's reason, agreed like any other."""
    try:
        spec, why = find_spec(architectures, isa, registry)
        found = ("found", str(spec.name), int(spec.api_version)) if spec is not None else ("refused", why)
    except Exception as e:  # noqa: BLE001 - a rank-local crash would leave the others in the agreement
        spec, why = None, f"finding the spec raised {type(e).__name__}: {e}"
        found = ("refused", why)
    if world_size(group) == 1:
        return (spec, []) if spec is not None else (None, [why])
    from lowlat.comm.agreement import RankDisagreement, agree

    try:
        agree(found, group, name="spec lookups")
    except RankDisagreement as e:
        return None, [f"rank {r}: " + (f"found {v[1]}" if v[0] == "found" else v[1])
                      for r, v in sorted(e.values_by_rank.items())]
    return (spec, []) if spec is not None else (None, [why])


# ---------------------------------------------------------------------------- rank agreement
def world_size(group: Any) -> int:
    """Ranks in `group` (None: this process alone)."""
    if group is None:
        return 1
    import torch.distributed as dist

    return dist.get_world_size(group)


def agree_across_ranks(value: Any, group: Any, *, what: str) -> Any:
    """`value` if every rank of `group` holds the same; else raise `ContractRefusal` on every rank,
    naming each rank's value. The gather is lowlat.comm.agreement.agree: an all-gather over the CPU
    (gloo) group, bounded by that group's timeout (torch.distributed has no per-call deadline)."""
    if world_size(group) == 1:
        return value
    from lowlat.comm.agreement import RankDisagreement, agree

    try:
        return agree(value, group, name=what)
    except RankDisagreement as e:
        raise ContractRefusal([f"the ranks' {what} differ: {_per_rank(e)}"]) from e


def _per_rank(e: Exception) -> str:
    values = getattr(e, "values_by_rank", None)
    if values is None:
        return str(e)
    items = values.items() if isinstance(values, Mapping) else enumerate(values)
    return "; ".join(f"rank {r}: {v!r}" for r, v in items)


def agree_reasons(reasons: Sequence[str], group: Any) -> list[str]:
    """Gather every rank's guard reasons; returns them prefixed by rank when any rank has one (or
    when the ranks differ), [] when every rank is eligible. Identical on every rank."""
    reasons = list(reasons)
    if world_size(group) == 1:
        return reasons
    from lowlat.comm.agreement import RankDisagreement, agree

    try:
        agreed = agree(reasons, group, name="guard verdicts")
    except RankDisagreement as e:
        values = getattr(e, "values_by_rank", None)
        items = values.items() if isinstance(values, Mapping) else enumerate(values or [])
        out = [f"rank {r}: {reason}" for r, rs in items for reason in rs]
        out += [f"rank {r}: eligible" for r, rs in items if not rs]
        return out or [f"the ranks' guard verdicts differ: {e}"]
    return [f"every rank: {reason}" for reason in agreed]


def guard_reasons(spec: LowlatSpec, cfg: ModelConfig, weights: ModelWeights, hw: DeviceFacts, *,
                  tp_size: int = 1, hf: Mapping[str, Any] | None = None) -> list[str]:
    """`spec.guard(...)` as a list of str; a guard that raises (a plugin bug, an odd config on one
    rank) or returns something other than reasons is a reason itself, never a crash, so the verdicts
    can still be agreed on every rank."""
    try:
        return [str(r) for r in spec.guard(cfg, weights, hw, tp_size=tp_size, hf=hf)]
    except Exception as e:  # noqa: BLE001 - a rank that crashed here would leave the others in the agreement
        name = getattr(spec, "name", type(spec).__name__)
        log.error("the guard of %s raised %s: %s", name, type(e).__name__, e)
        return [f"the guard of {name} raised {type(e).__name__}: {e}"]


# ---------------------------------------------------------------------------- build + run
class StepRunner(Protocol):
    """What a build makes: a step runner reading the KV cache in place (lowlat's engine Backend
    protocol). `kv` has `k_caches` / `v_caches` lists of [S, Hkv, D] tensors (slot 0 the dummy slot)."""

    def forward(self, step: StepBatch, kv: Any) -> torch.Tensor: ...


#: Called once per build as factory(cfg, weights, device=..., widths=..., **runner_kwargs); returns a
#: StepRunner whose `widths` (if it has them) are the widths it actually built.
RunnerFactory = Callable[..., StepRunner]


def fused_runner(cfg: ModelConfig, weights: ModelWeights, *, device: torch.device, widths: Sequence[int],
                 use_cuda_graphs: bool = True, validate: bool = True) -> StepRunner:
    """The fused step: lowlat.runtime.fused_model.FusedModel (weights repacked once, buffers and one
    CUDA graph per width). validate: host-side step-contract check per step (off under SGLang, whose
    padded rows write the dummy slot and whose graphs forbid host syncs)."""
    from lowlat.runtime.fused_model import FusedModel

    return FusedModel(cfg, weights, device=device, widths=tuple(widths), use_cuda_graphs=use_cuda_graphs,
                      validate=validate)


class ReferenceRunner:
    """The reference model as a step runner (CPU CI, and the general forward a step falls back to).

    forward: logits [M, V] float32; hidden_states: final-normed [M, H] in the weights' dtype.
    validate: check the step contract first (host syncs; off where the step is built by SGLang,
    whose padded rows legitimately write the dummy slot 0).
    """

    name = "reference"

    def __init__(self, cfg: ModelConfig, weights: ModelWeights, *, validate: bool = True, **_: Any) -> None:
        from lowlat.reference.model import ReferenceModel

        self.model = ReferenceModel(cfg, weights)
        self.validate = validate

    def forward(self, step: StepBatch, kv: Any) -> torch.Tensor:
        return self.model.forward(step, kv.k_caches, kv.v_caches, validate=self.validate)

    def hidden_states(self, step: StepBatch, kv: Any) -> torch.Tensor:
        if self.validate:
            step.validate(vocab_size=self.model.cfg.vocab_size, num_slots=kv.k_caches[0].shape[0])
        return self.model.hidden_states(step, kv.k_caches, kv.v_caches)


def reference_runner(cfg: ModelConfig, weights: ModelWeights, *, validate: bool = True, **_: Any) -> ReferenceRunner:
    """Runner factory of the reference model (injectable wherever `fused_runner` is the default)."""
    return ReferenceRunner(cfg, weights, validate=validate)


@dataclass(frozen=True)
class PlannedStep:
    """A covered step: SGLang's `Step(mode, rows)` without the view."""

    mode: str
    rows: int


@dataclass
class BuildStats:
    runner: str
    device: str
    seconds: float
    weight_bytes: int
    memory_bytes: int | None          # device memory the build allocated (None on CPU)


class Built:
    """A built fused step: widths, plan, run. Made by `build`; SGLang's built object and our
    engine's backend both wrap one."""

    def __init__(self, *, spec: LowlatSpec, cfg: ModelConfig, runner: StepRunner, widths: Sequence[int],
                 tokens_per_request: int, deadline_s: float, group: Any, stats: BuildStats,
                 device: torch.device) -> None:
        self.spec, self.cfg, self.runner, self.device = spec, cfg, runner, device
        self.widths = tuple(widths)
        self.tokens_per_request, self.deadline_s, self.group = tokens_per_request, deadline_s, group
        self.stats = stats
        self.disagreements = 0

    def summary(self) -> str:
        s = self.stats
        mem = "n/a" if s.memory_bytes is None else f"{s.memory_bytes / 2**20:.1f} MiB"
        return (f"{self.spec.name}: {s.runner} on {s.device}, widths {list(self.widths)}, "
                f"{self.tokens_per_request} token(s) per request, weights {s.weight_bytes / 2**20:.1f} MiB, "
                f"built in {s.seconds:.2f} s, device memory {mem}, wait deadline {self.deadline_s:g} s")

    def plan_rows(self, mode: str, rows: int) -> PlannedStep | None:
        """The covered step for `mode` ("decode" | "target_verify" | anything else) and `rows`, or
        None. Pure host logic on host values: every rank given the same values plans alike."""
        if mode not in COVERED_MODES or rows < 1 or rows > self.spec.max_rows:
            return None
        if mode == "target_verify" and (self.tokens_per_request < 2 or rows % self.tokens_per_request):
            return None
        if rows not in self.widths:
            return None
        return PlannedStep(mode, rows)

    def agree_plan(self, planned: PlannedStep | None) -> PlannedStep | None:
        """`planned` if every rank planned the same step, else None on every rank (all fall back)."""
        return self.agree_step(planned, None)

    def agree_step(self, planned: PlannedStep | None, problem: str | None) -> PlannedStep | None:
        """Agree, in one gather, on every rank's plan and on whether its step is valid (`problem`:
        None, or why this rank's step breaks the step contract, checked BEFORE any collective).

        Any rank's problem: `RankStepContractError` on every rank, naming each rank's problem (no
        rank enters the fused step; the step is refused, as a single rank refuses an invalid step).
        Else `planned` if every rank planned the same step, or None on every rank (all fall back).
        Alone (no group), `problem` raises StepContractError(problem) here."""
        if world_size(self.group) == 1:
            if problem is not None:
                raise StepContractError(problem)
            return planned
        from lowlat.comm.agreement import RankDisagreement, agree

        key = None if planned is None else (planned.mode, planned.rows)
        try:
            agree((key, problem), self.group, name="planned steps")
            by_rank = None if problem is None else {"every rank": problem}
        except RankDisagreement as e:
            by_rank = {r: p for r, (_, p) in sorted(e.values_by_rank.items()) if p is not None}
            if not by_rank:
                self.disagreements += 1
                plans = "; ".join(f"rank {r}: {k!r}" for r, (k, _) in sorted(e.values_by_rank.items()))
                log.warning("step falls back on every rank: the ranks' planned steps differ: %s", plans)
                return None
        if by_rank:
            raise RankStepContractError(by_rank)
        return planned

    def run(self, step: StepBatch, kv: Any) -> torch.Tensor:
        """Logits [M, V] float32 of a covered step. Mutates: the KV caches at out_cache_loc."""
        return self.runner.forward(step, kv)


def build(spec: LowlatSpec, cfg: ModelConfig, weights: ModelWeights, *, device: str | torch.device,
          widths: Sequence[int], tokens_per_request: int = 1, deadline_s: float = 60.0,
          runner_factory: RunnerFactory | None = None, group: Any = None, hardware: DeviceFacts | None = None,
          tp_size: int = 1, hf: Mapping[str, Any] | None = None,
          runner_kwargs: Mapping[str, Any] | None = None) -> Built:
    """Guard on every rank, agree, build the runner, agree on the built widths.

    widths: step rows to build (ascending); tokens_per_request: 1, or k+1 under speculation;
    deadline_s: every cross-GPU wait's deadline; group: the TP group's CPU (gloo) process group, or
    None alone; hardware: the GPU facts (default: probed from `device`).
    Raises ContractRefusal on every rank (each rank's reasons named) when any rank is ineligible
    (a guard that raises counts as ineligible: `guard_reasons`), its runner factory raised, or the
    ranks built different widths.
    """
    if not 1 <= tokens_per_request <= spec.max_rows:
        raise ContractRefusal([f"tokens_per_request={tokens_per_request} outside 1..{spec.max_rows}"])
    if not math.isfinite(deadline_s) or deadline_s <= 0:
        raise ContractRefusal([f"deadline_s={deadline_s} must be a positive number of seconds"])
    dev = torch.device(device)
    hw = hardware if hardware is not None else device_facts(dev)
    reasons = agree_reasons(guard_reasons(spec, cfg, weights, hw, tp_size=tp_size, hf=hf), group)
    if reasons:
        raise ContractRefusal(reasons)
    want = tuple(w for w in widths if 1 <= w <= spec.max_rows and w % tokens_per_request == 0)
    factory = runner_factory or fused_runner
    free0 = _device_used(dev)
    t0 = time.perf_counter()
    try:
        runner, failed = factory(cfg, weights, device=dev, widths=want, **dict(runner_kwargs or {})), None
    except Exception as e:  # noqa: BLE001 - a build that fails on one rank refuses on every rank
        runner, failed = None, f"building {getattr(factory, '__name__', 'the runner')} failed: {type(e).__name__}: {e}"
        log.error("%s", failed)
    seconds = time.perf_counter() - t0
    used = None if free0 is None else _device_used(dev) - free0
    built_widths = () if runner is None else tuple(sorted(set(getattr(runner, "widths", want)) & set(want)))
    agree_across_ranks(built_widths if failed is None else failed, group, what="built widths")
    if failed is not None:
        raise ContractRefusal([failed])
    if not built_widths:
        raise ContractRefusal([f"{spec.name} built no width of {list(want)}"])
    stats = BuildStats(runner=getattr(runner, "name", type(runner).__name__), device=str(dev), seconds=seconds,
                       weight_bytes=weight_bytes(weights), memory_bytes=used)
    return Built(spec=spec, cfg=cfg, runner=runner, widths=built_widths, tokens_per_request=tokens_per_request,
                 deadline_s=deadline_s, group=group, stats=stats, device=dev)


def _device_used(dev: torch.device) -> int | None:
    if dev.type != "cuda" or not torch.cuda.is_available():
        return None
    torch.cuda.synchronize(dev)
    free, total = torch.cuda.mem_get_info(dev)
    return total - free


# ---------------------------------------------------------------------------- our engine
def step_mode(step: StepBatch, tokens_per_request: int = 1) -> str:
    """SGLang's forward mode of an engine step, from host values only: "decode" when every
    request has one row, "target_verify" when every request has `tokens_per_request` (> 1) rows,
    else "extend" (prefill chunks, mixed steps)."""
    n, b = step.num_valid_rows, step.num_requests
    if n == b:
        return "decode"
    if tokens_per_request > 1 and n == b * tokens_per_request:
        return "target_verify"
    return "extend"


@dataclass
class ContractBackend:
    """The engine backend of `--backend fused`: plan -> fused forward, or the reference forward.

    `built` None means the contract refused (`refusal` lists why): every step falls back.
    `counts` tallies steps by path ("fused", "fallback").
    """

    built: Built | None
    fallback: Any
    refusal: list[str] = field(default_factory=list)
    validate: bool = True
    counts: dict[str, int] = field(default_factory=lambda: {"fused": 0, "fallback": 0})
    name: str = "fused"

    def plan(self, step: StepBatch, pool: Any = None) -> PlannedStep | None:
        """This rank plans the step, validates it against `pool` (when `validate` and a pool is given,
        and the step is planned fused here), then the plan and the validity are agreed over the group
        (`Built.agree_step`): the agreed plan, or None (every rank falls back); a step invalid on any
        rank raises RankStepContractError on every rank before any rank enters the fused step."""
        if self.built is None:
            return None
        planned = self.built.plan_rows(step_mode(step, self.built.tokens_per_request), step.num_rows)
        problem = None
        if planned is not None and self.validate and pool is not None:
            try:
                step.validate(vocab_size=self.built.cfg.vocab_size, num_slots=pool.k_caches[0].shape[0],
                              max_rows=self.built.spec.max_rows)
            except Exception as e:  # noqa: BLE001 - a rank-local error is agreed, never raised alone
                if world_size(self.built.group) == 1:
                    raise                                        # alone: the step's own error
                problem = str(e) if isinstance(e, StepContractError) else f"{type(e).__name__}: {e}"
        return self.built.agree_step(planned, problem)

    def forward(self, step: StepBatch, pool: Any) -> torch.Tensor:
        planned = self.plan(step, pool)
        if planned is None:
            self.counts["fallback"] += 1
            return self.fallback.forward(step, pool)
        self.counts["fused"] += 1
        return self.built.run(step, pool)

    def headline(self) -> str:
        """What was built, or why not (the reasons, one a line)."""
        if self.built is not None:
            return f"fused: {self.built.summary()}"
        return "fused: refused, every step runs the reference forward:\n  - " + "\n  - ".join(self.refusal)

    def report(self, *, reasons: bool = True) -> str:
        """One paragraph: what was built (or why not) and how many steps took each path. reasons=False leaves
        out a refusal's reasons (already logged when the engine was made) and keeps the step counts."""
        head = self.headline() if reasons or self.built is not None else "fused: refused (reasons logged above)"
        return f"{head}\nsteps: {self.counts['fused']} fused, {self.counts['fallback']} fallback"


def fused_engine(cfg: ModelConfig, weights: ModelWeights, *, device: str | torch.device = "cuda",
                 num_slots: int = 4096, max_reqs: int = 16, max_ctx: int = 2048,
                 widths: Sequence[int] | None = None, tokens_per_request: int = 1, deadline_s: float = 60.0,
                 runner_factory: RunnerFactory | None = None, hardware: DeviceFacts | None = None,
                 group: Any = None, validate: bool = True, registry: Mapping[str, str] | None = None):
    """An Engine whose every step goes through the contract: find our spec, guard, build, then
    plan -> fused forward, or the reference forward of the same step (SGLang's dispatch semantics).

    When the contract refuses (no GPU, not sm_90, unsupported config, ...), the engine still runs,
    on the reference forward, and the reasons are logged (logger "lowlat.contract", WARNING) and kept
    in `engine.backend.refusal`; `engine.backend.report()` says what ran.
    runner_factory (default `fused_runner`, FusedModel) and hardware (default: probed) are
    injectable so CPU CI runs the whole path on the reference runner or the Triton interpreter.
    group: the TP ranks' CPU (gloo) group; the spec lookup, guard verdicts, built widths and every
    step's plan are agreed over it (any difference: every rank refuses / falls back).
    """
    from lowlat.runtime.engine import WIDTHS, Engine, ReferenceBackend
    from lowlat.runtime.kv_cache import KVCachePool

    dev = torch.device(device)
    w = weights.to(device=dev)
    pool = KVCachePool(cfg, num_slots=num_slots, max_reqs=max_reqs, max_ctx=max_ctx, dtype=w.embed.dtype,
                       device=dev)
    fallback = ReferenceBackend(cfg, w)
    hw = hardware if hardware is not None else device_facts(dev)
    want = tuple(widths or WIDTHS)
    spec, refusal = find_spec_on_every_rank([cfg.architecture], hw.isa, group, registry)
    if hw.isa is None and dev.type != "cuda" and torch.cuda.is_available():
        refusal = [f"device {dev} is not a CUDA GPU"]
    built = None
    if spec is not None:
        try:    # the backend validates each step itself; the runner need not repeat it
            built = build(spec, cfg, w, device=dev, widths=want, tokens_per_request=tokens_per_request,
                          deadline_s=deadline_s, runner_factory=runner_factory, group=group, hardware=hw,
                          tp_size=world_size(group), runner_kwargs={"validate": False})
        except ContractRefusal as e:
            refusal = e.reasons
    backend = ContractBackend(built, fallback, refusal, validate=validate)
    if built is None:
        log.warning("%s", backend.headline())
        return Engine(cfg, backend, pool)
    log.info("%s", built.summary())
    return Engine(cfg, backend, pool, widths=built.widths, max_rows=max(built.widths))
