"""lowlat's MegakernelSpec against SGLang 0.5.23's own spec / binding modules (CPU, no server).

Verified here with SGLang's code: the entry point is installed and found by SGLang's `plugin_reasons`,
SGLang's `find_spec` returns our spec on sm_90 and refuses other ISAs / broken plugins with its own
reason strings, SGLang's `megakernel_disable_reasons` combines `requires` with our disable reasons.
"""

from __future__ import annotations

import sys
import types
from importlib.metadata import entry_points

import pytest
import torch

sgl_spec = pytest.importorskip("sglang.kernels.plugin_kernels.nvidia.spec",
                               reason="sglang==0.5.23 is installed by setup.sh (--no-deps)")
binding = pytest.importorskip("sglang.srt.kernel_plugins.nvidia.binding")

import msgspec  # noqa: E402
import transformers  # noqa: E402

from lowlat import numerics  # noqa: E402
from lowlat.config import ModelConfig, preset_hf_config  # noqa: E402
from lowlat.runtime import contract  # noqa: E402
from lowlat.sglang_plugin import register_specs, spec_paths  # noqa: E402
from lowlat.sglang_plugin import spec as ours  # noqa: E402
from lowlat.sglang_plugin import testing as fakes  # noqa: E402
from lowlat.weights import random_model_weights  # noqa: E402

H200 = contract.DeviceFacts("sm_90", 132, "NVIDIA H200")
ARCHS = {"LlamaForCausalLM": ours.LLAMA, "Qwen2ForCausalLM": ours.QWEN2, "Qwen3ForCausalLM": ours.QWEN3}


@pytest.fixture
def registered(monkeypatch):
    """SGLang's registry as after loading our entry point (restored after the test)."""
    monkeypatch.delenv("SGLANG_PLUGINS", raising=False)
    monkeypatch.setattr(sgl_spec, "_REGISTRY", {})
    [ep] = [e for e in entry_points(group="sglang.srt.plugins") if e.name == sgl_spec.ENTRY_POINT]
    ep.load()()
    return sgl_spec._REGISTRY


def test_entry_point_is_installed_and_sglang_sees_it(monkeypatch):
    monkeypatch.delenv("SGLANG_PLUGINS", raising=False)
    eps = {e.name: e.value for e in entry_points(group="sglang.srt.plugins")}
    assert eps.get("nvidia_megakernel") == "lowlat.sglang_plugin:register_specs"
    assert binding.plugin_reasons() == []
    monkeypatch.setenv("SGLANG_PLUGINS", "someone_else")
    assert binding.plugin_reasons() == [
        "SGLANG_PLUGINS='someone_else' does not list the 'nvidia_megakernel' plugin"]


def test_entry_point_registers_every_architecture(registered):
    assert registered == spec_paths()
    assert sgl_spec.registered_architectures() == sorted(ARCHS)
    register_specs()                       # SGLang may load it again: same paths, no error
    with pytest.raises(ValueError, match="already registered"):
        sgl_spec.register(architecture="LlamaForCausalLM", path="elsewhere:SPEC")


@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_find_spec_returns_ours_on_sm_90(registered, arch):
    spec, why = sgl_spec.find_spec(architectures=[arch], isa="sm_90")
    assert why == "" and spec is ARCHS[arch]
    assert isinstance(spec, sgl_spec.MegakernelSpec)


@pytest.mark.parametrize("isa", ["sm_80", "sm_89", "sm_100", "sm_103", "sm_120"])
def test_find_spec_refuses_other_isas_with_sglangs_reason(registered, isa):
    spec, why = sgl_spec.find_spec(architectures=["LlamaForCausalLM"], isa=isa)
    assert spec is None
    assert why == f"lowlat.sglang_plugin.spec:LLAMA supports ['sm_90'], not {isa}"
    spec, reasons = binding.megakernel_disable_reasons(cfg=fakes.fake_server_args(),
                                                      hf_config=transformers.LlamaConfig(architectures=["LlamaForCausalLM"]), isa=isa)
    assert spec is None and reasons == [why]


def test_api_version_matches():
    assert sgl_spec.MEGAKERNEL_API_VERSION == contract.API_VERSION == 1
    assert all(s.api_version == sgl_spec.MEGAKERNEL_API_VERSION for s in ARCHS.values())


def test_broken_plugins_are_reasons_not_crashes(registered, monkeypatch):
    wrong_api = types.ModuleType("lowlat_test_wrong_api")
    wrong_api.SPEC = msgspec.structs.replace(ours.LLAMA, api_version=2)
    wrong_api.NOT_A_SPEC = contract.LLAMA          # our own spec type, not SGLang's
    monkeypatch.setitem(sys.modules, "lowlat_test_wrong_api", wrong_api)
    broken = {"BrokenImportForCausalLM": "lowlat_no_such_module:SPEC",
              "WrongApiForCausalLM": "lowlat_test_wrong_api:SPEC",
              "NotASpecForCausalLM": "lowlat_test_wrong_api:NOT_A_SPEC"}
    for arch, path in broken.items():
        sgl_spec.register(architecture=arch, path=path)
    spec, why = sgl_spec.find_spec(architectures=list(broken), isa="sm_90")
    assert spec is None
    assert why == "; ".join([
        "lowlat_no_such_module:SPEC does not import: ModuleNotFoundError: No module named 'lowlat_no_such_module'",
        "lowlat_test_wrong_api:SPEC uses megakernel API version 2; this SGLang requires version 1",
        "lowlat_test_wrong_api:NOT_A_SPEC is not a MegakernelSpec",
    ])
    # a working spec later in the list still wins
    spec, why = sgl_spec.find_spec(architectures=list(broken) + ["LlamaForCausalLM"], isa="sm_90")
    assert spec is ours.LLAMA and why == ""


def test_requires_features_numerics_state_what_the_kernels_take():
    for arch, s in ARCHS.items():
        r = s.requires
        assert r.isas == frozenset({"sm_90"}) and r.dtypes == frozenset({"bfloat16"})
        assert r.tp_sizes == contract.TP_SIZES and r.resident_blocks == contract.RESIDENT_BLOCKS
        assert r.decode_graph_backends == frozenset({"full", "disabled"})
        assert r.server_args["attention_backend"] == frozenset({"fa3"})
        assert r.hf_config == {"model_type": ours.MODEL_TYPES[arch], "hidden_act": "silu"}
        assert s.features == frozenset({sgl_spec.Feature.SPECULATIVE_DECODING})
        assert s.max_rows == 48
        assert s.numerics.kind is sgl_spec.NumericsKind.TOLERANCE
        tol = numerics.tolerance("fused_model", "logits")
        assert sorted(s.numerics.tolerances.values()) == sorted([tol.multiple, tol.floor_rel, tol.floor_abs])
        assert s.config_disable_reasons is not None and s.model_disable_reasons is not None


def _llama(**changes):
    hf = preset_hf_config("SmolLM2-135M")     # 9 query / 3 KV heads, head_dim 64
    hf.update(changes)
    return transformers.LlamaConfig(**hf)


SLIDING = "config.sliding_window=4096: sliding-window attention is not implemented by the fused step"
CONFIG_CASES = {
    "eligible": (_llama(), {}, []),
    "sliding window": (_llama(sliding_window=4096), {}, [SLIDING]),
    "qwen2 window switched off": (transformers.Qwen2Config(**preset_hf_config("Qwen2.5-0.5B")), {}, []),
    "heads not a multiple of kv heads": (_llama(num_key_value_heads=4), {}, [
        "config.num_attention_heads=9 is not a multiple of config.num_key_value_heads=4 (GQA groups)"]),
    "head_dim 80": (_llama(head_dim=80), {}, [
        "head_dim=80: the fused attention kernels are built for head_dim in [64, 128]"]),
    "fp8 checkpoint": (_llama(quantization_config={"quant_method": "fp8"}), {}, [
        "config.quantization_config quant_method='fp8': quantized (e.g. fp8) weights; the fused step reads "
        "bf16 weights"]),
    "fp8 kv cache": (_llama(), {"kv_cache_dtype": "fp8_e4m3"}, [
        "--kv-cache-dtype 'fp8_e4m3': the fused step reads a bf16 KV cache (['auto', 'bf16', 'bfloat16'])"]),
    "fp8 quantization flag": (_llama(), {"quantization": "fp8"}, [
        "--quantization 'fp8': the fused step reads bf16 weights"]),
    "tp 2 does not divide 3 kv heads": (_llama(), {"tp_size": 2}, [
        "tp_size 2 does not divide config.num_key_value_heads=3: each rank must hold whole KV heads"]),
    "tree verify": (_llama(), {"speculative_algorithm": "EAGLE", "speculative_eagle_topk": 4}, [
        "--speculative-eagle-topk 4: tree verify; the fused step verifies one chain of drafts per request "
        "(topk 1)"]),
    "ngram verify": (_llama(), {"speculative_algorithm": "NGRAM", "speculative_eagle_topk": 1}, [
        "--speculative-algorithm NGRAM: its verify is an irregular draft tree (tree_topk -1); the fused step "
        "verifies one chain of drafts per request"]),
    "two at once": (_llama(sliding_window=4096), {"tp_size": 2}, [
        SLIDING, "tp_size 2 does not divide config.num_key_value_heads=3: each rank must hold whole KV heads"]),
}


@pytest.mark.parametrize("case", sorted(CONFIG_CASES))
def test_config_disable_reasons_list_exactly_the_expected_reasons(case):
    hf_config, server, expected = CONFIG_CASES[case]
    spec = ARCHS[hf_config.architectures[0]]
    assert spec.config_disable_reasons(fakes.fake_server_args(**server), hf_config) == expected


def test_sglang_disable_reasons_combine_requires_and_ours(registered):
    cfg = fakes.fake_server_args(tp_size=2, attention_backend="triton", enable_torch_compile=True)
    spec, reasons = binding.megakernel_disable_reasons(cfg=cfg, hf_config=_llama(sliding_window=4096), isa="sm_90")
    assert spec is ours.LLAMA
    assert reasons == [
        "torch-compiled decode is in use and lowlat-fused-llama does not accept it",
        "tp_size 2 is not one of ['1']",
        "attention_backend 'triton' is not one of ['fa3']",
        SLIDING,
        "tp_size 2 does not divide config.num_key_value_heads=3: each rank must hold whole KV heads",
    ]
    spec, reasons = binding.megakernel_disable_reasons(
        cfg=fakes.fake_server_args(speculative_algorithm="EAGLE", speculative_eagle_topk=1),
        hf_config=_llama(), isa="sm_90")
    assert spec is ours.LLAMA and reasons == []


TINY = dict(architectures=["LlamaForCausalLM"], model_type="llama", hidden_size=128, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, head_dim=64, intermediate_size=256, vocab_size=256,
            rms_norm_eps=1e-5, tie_word_embeddings=False)


@pytest.fixture(scope="module")
def tiny():
    cfg = ModelConfig.from_hf(TINY)
    return cfg, random_model_weights(cfg, seed=3)


def test_model_disable_reasons_on_an_eligible_model_is_empty(tiny):
    cfg, w = tiny
    model = fakes.fake_sglang_model(cfg, w, vocab_pad=64)
    reasons = ours.model_disable_reasons(contract.LLAMA, model, transformers.LlamaConfig(**TINY), hardware=H200)
    assert reasons == []


def test_model_disable_reasons_name_too_few_sms_and_no_gpu(tiny):
    cfg, w = tiny
    model, hf = fakes.fake_sglang_model(cfg, w), transformers.LlamaConfig(**TINY)
    h100_pcie = contract.DeviceFacts("sm_90", 114, "NVIDIA H100 PCIe")
    assert ours.model_disable_reasons(contract.LLAMA, model, hf, hardware=h100_pcie) == [
        "GPU NVIDIA H100 PCIe has 114 SMs; the fused step needs 132 resident blocks (a partitioned GPU?)"]
    cpu = contract.DeviceFacts(None, 0, "cpu")
    assert ours.model_disable_reasons(contract.LLAMA, model, hf, hardware=cpu) == ["no CUDA GPU is visible"]


def test_model_disable_reasons_name_the_weight_layout_and_dtype(tiny):
    cfg, w = tiny
    hf = transformers.LlamaConfig(**TINY)
    fp32 = fakes.fake_sglang_model(cfg, w.to(dtype=torch.float32))
    assert ours.model_disable_reasons(contract.LLAMA, fp32, hf, hardware=H200) == [
        "weights hold dtype ['float32']; the fused step reads ['bfloat16']"]
    sharded = fakes.fake_sglang_model(cfg, w)
    qkv = sharded.model.layers[1].self_attn.qkv_proj
    qkv.weight = torch.nn.Parameter(qkv.weight[: qkv.weight.shape[0] // 2], requires_grad=False)
    assert ours.model_disable_reasons(contract.LLAMA, sharded, hf, hardware=H200) == [
        "model.model.layers.1.self_attn.qkv_proj.weight has shape (256, 128), expected (512, 128) "
        "(a TP shard or a quantized layout?)"]
    del sharded.model.layers[0].mlp.gate_up_proj
    assert ours.model_disable_reasons(contract.LLAMA, sharded, hf, hardware=H200) == [
        "the model has no model.layers.0.mlp.gate_up_proj.weight (missing at 'gate_up_proj')"]


def test_model_disable_reasons_and_build_never_crash_on_a_model_with_fewer_layers(tiny):
    """SGLang gathers every rank's reasons right after model_disable_reasons: a rank that raised there
    (IndexError from model.layers[1]) would leave its peers waiting in the gather."""
    cfg, w = tiny
    model, hf = fakes.fake_sglang_model(cfg, w), transformers.LlamaConfig(**TINY)
    del model.model.layers[1]
    assert ours.model_disable_reasons(contract.LLAMA, model, hf, hardware=H200) == [
        "model.model.layers has 1 layers, the config num_hidden_layers=2"]
    spec = ours.make_megakernel_spec(contract.LLAMA, runner_factory=contract.reference_runner,
                                     runner_kwargs={"validate": False}, hardware=H200)
    built = spec.build(model, hf, sgl_spec.BuildContext(widths=(1, 2), tokens_per_request=1, deadline_s=30.0))
    assert built.widths == () and "num_hidden_layers=2" in built.summary()
    # anything else raised while reading the model is a reason too, never an exception
    broken = fakes.fake_sglang_model(cfg, w)
    del broken.model.layers
    broken.model.__dict__["layers"] = types.SimpleNamespace()      # not indexable, no length
    reasons = ours.model_disable_reasons(contract.LLAMA, broken, hf, hardware=H200)
    assert len(reasons) == 1 and "model.layers.0" in reasons[0]
    assert ours.model_disable_reasons(contract.LLAMA, model, object(), hardware=H200)[0].startswith(
        "lowlat-fused-llama cannot check the loaded model: TypeError")


@pytest.mark.parametrize("where,param,message", [
    ("self_attn.qkv_proj", "bias", "the config declares no Q/K/V bias"),
    ("self_attn.o_proj", "bias", "lowlat implements no bias there"),
    ("mlp.down_proj", "bias", "lowlat implements no bias there"),
    ("self_attn.q_norm", "weight", "LlamaForCausalLM has no per-head QK norm"),
])
def test_a_parameter_the_fused_step_would_drop_is_a_reason(tiny, where, param, message):
    """A loaded Llama holding a bias (SGLang's llama.py adds Q/K/V and o_proj biases for attention_bias or
    `bias` configs) or a QK norm the fused step does not read refuses; it is never silently left out."""
    cfg, w = tiny
    model = fakes.fake_sglang_model(cfg, w)
    owner, (attr, *rest) = model.model.layers[1], where.split(".")
    mod = getattr(owner, attr)
    if rest and not hasattr(mod, rest[0]):
        setattr(mod, rest[0], fakes._Linear(torch.ones(cfg.head_dim, dtype=torch.bfloat16)))
    else:
        lin = getattr(mod, rest[0])
        lin.bias = torch.nn.Parameter(torch.zeros(lin.weight.shape[0], dtype=torch.bfloat16), requires_grad=False)
    assert ours.model_disable_reasons(contract.LLAMA, model, transformers.LlamaConfig(**TINY), hardware=H200) == [
        f"model.model.layers.1.{where}.{param} exists ({message}); the fused step would leave it out"]


def test_model_disable_reasons_state_the_config_limits_sglang_checks_only_there_for_drafts(tiny):
    """SGLang never calls config_disable_reasons for a draft model: model_disable_reasons must name what the
    kernels cannot run (head_dim 80 here) before build, not leave it to a build that builds nothing."""
    cfg, w = tiny
    model = fakes.fake_sglang_model(cfg, w)
    hf = transformers.LlamaConfig(**dict(TINY, head_dim=80))
    assert ours.model_disable_reasons(contract.LLAMA, model, hf, hardware=H200) == [
        "head_dim=80: the fused attention kernels are built for head_dim in [64, 128]"]
