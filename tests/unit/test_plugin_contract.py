"""The plugin contract (lowlat/runtime/contract.py) and our SGLang built object (lowlat/sglang_plugin).

`forward` is driven through SGLang 0.5.23's own dispatch (`binding._Dispatch`) with ForwardBatch-shaped
objects built from SGLang's documented fields (lowlat/sglang_plugin/testing.py), and must produce the
same logits and KV writes as our reference; CUDA-graph padded rows may write only the dummy slot 0.
The step runner on CPU is the reference model (and FusedModel under the Triton interpreter when it
exists).
"""

from __future__ import annotations

import dataclasses

import importlib.util
import logging
import sys
import types

import pytest
import torch

from lowlat import numerics
from lowlat.config import ModelConfig
from lowlat.errors import UnsupportedConfigError
from lowlat.reference.model import ReferenceModel
from lowlat.runtime import contract
from lowlat.runtime.engine import SamplingParams, reference_engine
from lowlat.step import StepBatch
from lowlat.weights import random_model_weights

from lowlat.sglang_plugin import testing as fakes
from lowlat.sglang_plugin.built import SGLangBuilt, SGLangKV

try:   # the SGLang-side tests need sglang==0.5.23 (setup.sh installs it --no-deps); the rest do not
    import sglang.kernels.plugin_kernels.nvidia.spec as sgl_spec
    import sglang.srt.kernel_plugins.nvidia.binding as binding

    from lowlat.sglang_plugin import spec as ours
except ImportError as e:    # pragma: no cover - depends on the machine (the H200 image has no sglang)
    sgl_spec = binding = ours = None
    NO_SGLANG = f"sglang==0.5.23 is not importable here ({e}); setup.sh installs it"
else:
    NO_SGLANG = ""
needs_sglang = pytest.mark.skipif(bool(NO_SGLANG), reason=NO_SGLANG or "-")

H200 = contract.DeviceFacts("sm_90", 132, "NVIDIA H200")
TINY = dict(architectures=["LlamaForCausalLM"], model_type="llama", hidden_size=128, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, head_dim=64, intermediate_size=256, vocab_size=256,
            rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=False, hidden_act="silu")
NUM_SLOTS, MAX_REQS, MAX_CTX = 96, 8, 40
HAS_FUSED = importlib.util.find_spec("lowlat.runtime.fused_model") is not None


@pytest.fixture(scope="module")
def tiny():
    cfg = ModelConfig.from_hf(TINY)
    return cfg, random_model_weights(cfg, seed=7)


#: tiny HF configs per architecture: Qwen2 adds the QKV bias, Qwen3 the per-head QK RMSNorm
ARCH_HF = {
    "llama": (contract.LLAMA, TINY),
    "qwen2": (contract.QWEN2, dict(TINY, architectures=["Qwen2ForCausalLM"], model_type="qwen2")),
    "qwen3": (contract.QWEN3, dict(TINY, architectures=["Qwen3ForCausalLM"], model_type="qwen3")),
}


def _built(cfg, w, *, tokens_per_request=1, runner_factory=contract.reference_runner, runner_kwargs=None,
           arch="llama"):
    lowlat_spec, hf = ARCH_HF[arch]
    spec = ours.make_megakernel_spec(lowlat_spec, runner_factory=runner_factory,
                                     runner_kwargs=runner_kwargs or {"validate": False}, hardware=H200)
    model = fakes.fake_sglang_model(cfg, w, vocab_pad=64)
    ctx = sgl_spec.BuildContext(widths=tuple(range(tokens_per_request, 49, tokens_per_request)),
                                tokens_per_request=tokens_per_request, deadline_s=30.0)
    return spec.build(model, hf, ctx), model


# ------------------------------------------------------------------------------------------ plan
def _fb(mode, rows, bs, **extra):
    z = torch.zeros(rows, dtype=torch.int64)
    return fakes.fake_forward_batch(mode, input_ids=z, positions=z, req_pool_indices=torch.zeros(bs, dtype=torch.int64),
                                    seq_lens=torch.ones(bs, dtype=torch.int64), out_cache_loc=z, **extra)


@needs_sglang
def test_plan_covers_decode_widths_up_to_max_rows(tiny):
    built, _ = _built(*tiny)
    assert built.widths == tuple(range(1, 49))
    for bs in range(1, 49):
        fb = _fb(fakes.ForwardMode.DECODE, bs, bs)
        assert built.plan(fb.input_ids, fb) == sgl_spec.Step(mode="decode", rows=bs)
    for bs in (49, 64):
        fb = _fb(fakes.ForwardMode.DECODE, bs, bs)
        assert built.plan(fb.input_ids, fb) is None
    for mode in (fakes.ForwardMode.EXTEND, fakes.ForwardMode.MIXED, fakes.ForwardMode.IDLE):
        fb = _fb(mode, 4, 4)
        assert built.plan(fb.input_ids, fb) is None
    fb = _fb(fakes.ForwardMode.DECODE, 4, 4)
    assert built.plan(fb.input_ids, fb, input_embeds=torch.zeros(4, 128)) is None
    # the reference runner gives hidden states: the model's own LogitsProcessor serves hidden capture
    assert built.output == "logits_processor"
    fb = _fb(fakes.ForwardMode.DECODE, 4, 4, capture_hidden_mode=fakes.CaptureHiddenMode.FULL)
    assert built.plan(fb.input_ids, fb) is not None


@needs_sglang
def test_plan_covers_target_verify_widths_up_to_max_rows(tiny):
    built, _ = _built(*tiny, tokens_per_request=3)
    assert built.widths == tuple(range(3, 49, 3))
    for bs in range(1, 17):
        fb = _fb(fakes.ForwardMode.TARGET_VERIFY, 3 * bs, bs, spec_info=types.SimpleNamespace(topk=1))
        assert built.plan(fb.input_ids, fb) == sgl_spec.Step(mode="target_verify", rows=3 * bs)
    fb = _fb(fakes.ForwardMode.TARGET_VERIFY, 51, 17, spec_info=types.SimpleNamespace(topk=1))
    assert built.plan(fb.input_ids, fb) is None                      # past max_rows
    fb = _fb(fakes.ForwardMode.TARGET_VERIFY, 5, 2, spec_info=types.SimpleNamespace(topk=1))
    assert built.plan(fb.input_ids, fb) is None                      # ragged verify
    fb = _fb(fakes.ForwardMode.TARGET_VERIFY, 6, 2, spec_info=types.SimpleNamespace(topk=4))
    assert built.plan(fb.input_ids, fb) is None                      # tree verify
    # NGRAM's verify input has no `topk`, only tree_topk -1 (an irregular tree): never a chain
    ngram = types.SimpleNamespace(tree_topk=-1, draft_token_num=3, custom_mask=torch.ones(1, dtype=torch.bool))
    fb = _fb(fakes.ForwardMode.TARGET_VERIFY, 6, 2, spec_info=ngram)
    assert built.plan(fb.input_ids, fb) is None
    fb = _fb(fakes.ForwardMode.TARGET_VERIFY, 6, 2, spec_info=types.SimpleNamespace(tree_topk=1, topk=1))
    assert built.plan(fb.input_ids, fb) == sgl_spec.Step(mode="target_verify", rows=6)
    fb = _fb(fakes.ForwardMode.DECODE, 4, 4)
    assert built.plan(fb.input_ids, fb) is None                      # 4 is not a built width


def test_plan_rows_is_pure_host_logic():
    b = contract.Built(spec=contract.LLAMA, cfg=None, runner=None, widths=(1, 2, 4, 8), tokens_per_request=2,
                       deadline_s=5.0, group=None, stats=None, device=torch.device("cpu"))
    assert b.plan_rows("decode", 4) == contract.PlannedStep("decode", 4)
    assert b.plan_rows("decode", 3) is None and b.plan_rows("extend", 4) is None
    assert b.plan_rows("target_verify", 8) == contract.PlannedStep("target_verify", 8)
    assert b.plan_rows("target_verify", 2) == contract.PlannedStep("target_verify", 2)
    assert b.plan_rows("decode", 0) is None and b.plan_rows("decode", 49) is None


# ------------------------------------------------------------------------------------------ forward
def _kv_world(cfg, lengths, extra, *, seed):
    """KV caches with `lengths[b]` cached tokens per request at scattered slots and `extra` more slots
    per request assigned for this step; every other slot (the dummy slot 0 included) holds NaN.
    Requests live in req_to_token rows 1..B (row 0 is SGLang's padding row)."""
    g = torch.Generator().manual_seed(seed)
    shape = (NUM_SLOTS, cfg.num_kv_heads, cfg.head_dim)
    k = [numerics.poison(torch.empty(shape, dtype=torch.bfloat16)) for _ in range(cfg.num_layers)]
    v = [numerics.poison(torch.empty(shape, dtype=torch.bfloat16)) for _ in range(cfg.num_layers)]
    req_to_token = torch.zeros((MAX_REQS + 1, MAX_CTX), dtype=torch.int32)
    perm = (torch.randperm(NUM_SLOTS - 1, generator=g) + 1).tolist()
    new_slots = []
    for b, n in enumerate(lengths):
        slots = [perm.pop() for _ in range(n + extra)]
        req_to_token[b + 1, : n + extra] = torch.tensor(slots, dtype=torch.int32)
        for layer in range(cfg.num_layers):
            k[layer][slots[:n]] = torch.randn(n, *shape[1:], generator=g).to(torch.bfloat16)
            v[layer][slots[:n]] = torch.randn(n, *shape[1:], generator=g).to(torch.bfloat16)
        new_slots.append(slots[n:])
    return k, v, req_to_token, new_slots


def _bits(t):
    return t.view(torch.int16)


def _reference(cfg, w, k, v, step):
    """Reference logits (bf16 baseline) and the float64 oracle on copies of the caches."""
    kb, vb = [t.clone() for t in k], [t.clone() for t in v]
    base = ReferenceModel(cfg, w).forward(step, kb, vb, validate=False)
    kd, vd = [t.double() for t in k], [t.double() for t in v]
    oracle = ReferenceModel(cfg, w.to(dtype=torch.float64)).forward(step, kd, vd, validate=False)
    return base, oracle, kb, vb, kd, vd


@pytest.fixture(autouse=True)
def _not_capturing(monkeypatch):
    """CPU torch cannot ask whether a CUDA stream is capturing (SGLang's dispatch asks): it is not."""
    if not torch.cuda.is_available():
        monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)


def _dispatch(built, model, pool, metadata):
    """SGLang's installed forward (binding._Dispatch) around the model's original forward."""
    calls = []

    def original(input_ids, positions, forward_batch, *args, **kwargs):
        calls.append(int(forward_batch.batch_size))
        return "original forward"

    b = types.SimpleNamespace(forward_view=lambda: fakes.fake_view(pool, metadata))
    return binding._Dispatch(built=built, original=original, binding=b).wrapped(), calls


def _check_kv(cfg, before_k, before_v, k, v, ref_k, ref_v, written):
    """Written slots equal the reference's writes; every other slot except the dummy slot 0 is
    bit-for-bit what it was (NaN-poisoned unused slots included)."""
    others = torch.ones(NUM_SLOTS, dtype=torch.bool)
    others[0] = False
    others[torch.tensor(written)] = False
    for layer in range(cfg.num_layers):
        for got, ref, old in ((k[layer], ref_k[layer], before_k[layer]), (v[layer], ref_v[layer], before_v[layer])):
            assert torch.isfinite(got[written].float()).all()
            numerics.check_bitwise("sglang_plugin", got[written], ref[written], output="kv_written")
            assert torch.equal(_bits(got[others]), _bits(old[others])), "a row wrote outside its slot"


@needs_sglang
@pytest.mark.parametrize("arch,metadata", [("llama", "fa3"), ("llama", "req_to_token"), ("qwen2", "fa3"),
                                           ("qwen3", "fa3")])
def test_decode_forward_matches_reference_and_padding_writes_only_the_dummy_slot(tiny, arch, metadata):
    if arch == "llama":
        cfg, w = tiny
    else:
        cfg = ModelConfig.from_hf(ARCH_HF[arch][1])
        w = random_model_weights(cfg, seed=8)
        assert cfg.qkv_bias == (arch == "qwen2") and cfg.qk_norm == (arch == "qwen3")
    built, model = _built(cfg, w, arch=arch)
    assert isinstance(built, SGLangBuilt), built.summary()
    lengths = [5, 1, 13]                              # 3 requests, padded to a graph width of 4
    k, v, rtt, new = _kv_world(cfg, lengths, 1, seed=11)
    before_k, before_v = [t.clone() for t in k], [t.clone() for t in v]
    ids = torch.randint(0, cfg.vocab_size, (3,), generator=torch.Generator().manual_seed(5))
    pad = 1
    fb = fakes.fake_forward_batch(
        fakes.ForwardMode.DECODE,
        input_ids=torch.cat([ids, torch.zeros(pad, dtype=torch.int64)]),
        positions=torch.tensor(lengths + [0] * pad, dtype=torch.int64),
        req_pool_indices=torch.tensor([1, 2, 3] + [0] * pad, dtype=torch.int64),
        seq_lens=torch.tensor([n + 1 for n in lengths] + [1] * pad, dtype=torch.int64),
        out_cache_loc=torch.tensor([s[0] for s in new] + [0] * pad, dtype=torch.int64))
    pool = fakes.FakeKVPool(k, v, rtt if metadata == "req_to_token" else None)
    meta = fakes.fa3_metadata(rtt, fb) if metadata == "fa3" else None
    forward, calls = _dispatch(built, model, pool, meta)
    out = forward(fb.input_ids, fb.positions, fb)
    assert calls == [] and model.logits_processor.calls == 1
    assert sorted(set(pool.reads)) == [0, 1]

    step = StepBatch(input_ids=fb.input_ids, positions=fb.positions,
                     out_cache_loc=fb.out_cache_loc.to(torch.int32), req_indices=torch.arange(4, dtype=torch.int32),
                     seq_lens=fb.seq_lens.to(torch.int32), page_table=rtt[fb.req_pool_indices],
                     num_valid_rows=3)
    step.validate(vocab_size=cfg.vocab_size, num_slots=NUM_SLOTS)
    base, oracle, ref_k, ref_v, _, _ = _reference(cfg, w, before_k, before_v, step)
    logits = out.next_token_logits
    assert logits.shape == (4, cfg.vocab_size) and torch.isfinite(logits).all()
    numerics.check_bitwise("sglang_plugin", logits[:3], base[:3], output="logits")
    numerics.check_accuracy("sglang_plugin", logits[:3], oracle[:3], base[:3], output="logits")
    _check_kv(cfg, before_k, before_v, k, v, ref_k, ref_v, [s[0] for s in new])


@needs_sglang
def test_target_verify_forward_matches_reference(tiny):
    cfg, w = tiny
    built, model = _built(cfg, w, tokens_per_request=3)
    lengths = [4, 9]
    k, v, rtt, new = _kv_world(cfg, lengths, 3, seed=12)
    before_k, before_v = [t.clone() for t in k], [t.clone() for t in v]
    ids = torch.randint(0, cfg.vocab_size, (6,), generator=torch.Generator().manual_seed(6))
    positions = torch.tensor([n + j for n in lengths for j in range(3)], dtype=torch.int64)
    loc = torch.tensor([s for ss in new for s in ss], dtype=torch.int64)
    fb = fakes.fake_forward_batch(
        fakes.ForwardMode.TARGET_VERIFY, input_ids=ids, positions=positions,
        req_pool_indices=torch.tensor([1, 2], dtype=torch.int64), seq_lens=torch.tensor(lengths, dtype=torch.int64),
        out_cache_loc=loc, spec_info=types.SimpleNamespace(topk=1, positions=positions))
    pool = fakes.FakeKVPool(k, v, None)
    forward, calls = _dispatch(built, model, pool, fakes.fa3_metadata(rtt, fb, draft_tokens=3))
    logits = forward(fb.input_ids, fb.positions, fb).next_token_logits
    assert calls == []

    step = StepBatch(input_ids=ids, positions=positions, out_cache_loc=loc.to(torch.int32),
                     req_indices=torch.tensor([0, 0, 0, 1, 1, 1], dtype=torch.int32),
                     seq_lens=torch.tensor([n + 3 for n in lengths], dtype=torch.int32),
                     page_table=rtt[torch.tensor([1, 2])], num_valid_rows=6)
    step.validate(vocab_size=cfg.vocab_size, num_slots=NUM_SLOTS)
    base, oracle, ref_k, ref_v, _, _ = _reference(cfg, w, before_k, before_v, step)
    numerics.check_bitwise("sglang_plugin", logits, base, output="logits")
    numerics.check_accuracy("sglang_plugin", logits, oracle, base, output="logits")
    _check_kv(cfg, before_k, before_v, k, v, ref_k, ref_v, loc.tolist())


@needs_sglang
def test_uncovered_steps_run_the_original_forward(tiny):
    cfg, w = tiny
    built, model = _built(cfg, w)
    pool = fakes.FakeKVPool([], [], None)
    forward, calls = _dispatch(built, model, pool, None)
    fb = _fb(fakes.ForwardMode.EXTEND, 7, 1)
    assert forward(fb.input_ids, fb.positions, fb) == "original forward" and calls == [1]
    fb = _fb(fakes.ForwardMode.DECODE, 49, 49)
    assert forward(fb.input_ids, fb.positions, fb) == "original forward" and calls == [1, 49]


def test_kv_view_reads_the_pools_own_tensors(tiny):
    cfg, _ = tiny
    k, v, rtt, _ = _kv_world(cfg, [3], 1, seed=1)
    kv = SGLangKV(fakes.FakeKVPool(k, v, rtt), cfg.num_layers)
    assert all(a.data_ptr() == b.data_ptr() for a, b in zip(kv.k_caches + kv.v_caches, k + v))
    assert kv.req_to_token is rtt and kv.num_slots == NUM_SLOTS


@needs_sglang
def test_weights_are_views_of_the_loaded_model(tiny):
    cfg, w = tiny
    built, model = _built(cfg, w)
    got = built.core.runner.model.weights
    qkv = model.model.layers[1].self_attn.qkv_proj.weight
    assert got.layers[1].wk.data_ptr() == qkv[cfg.q_size:].data_ptr()
    assert torch.equal(got.layers[1].wv, w.layers[1].wv) and torch.equal(got.lm_head, w.lm_head)
    assert got.embed.shape == (cfg.vocab_size, cfg.hidden_size)      # SGLang's vocab padding sliced off
    assert "widths [1, 2" in built.summary() and "built in" in built.summary()


@needs_sglang
@pytest.mark.skipif(not HAS_FUSED, reason="lowlat/runtime/fused_model.py (helper k1b, issue 3) not there yet")
@pytest.mark.interpreter
def test_decode_forward_with_fused_model_under_interpreter(tiny, monkeypatch):
    """FusedModel gives logits, not hidden states, so the output is LogitsProcessorOutput(next_token_logits=...).
    SGLang's logits_processor module needs GPU-only packages to import: a stand-in with the same
    constructor keyword (the dataclass's first field, read from sglang 0.5.23) takes its place."""
    stub = types.ModuleType("sglang.srt.layers.logits_processor")
    stub.LogitsProcessorOutput = lambda next_token_logits: types.SimpleNamespace(next_token_logits=next_token_logits)
    monkeypatch.setitem(sys.modules, "sglang.srt.layers.logits_processor", stub)
    cfg, w = tiny
    built, model = _built(cfg, w, runner_factory=contract.fused_runner,
                          runner_kwargs={"use_cuda_graphs": False, "validate": False})
    assert built.output == "logits"
    fb = _fb(fakes.ForwardMode.DECODE, 2, 2, capture_hidden_mode=fakes.CaptureHiddenMode.FULL)
    assert built.plan(fb.input_ids, fb) is None                     # logits alone give no hidden states
    fb = _fb(fakes.ForwardMode.DECODE, 2, 2, return_logprob=True)
    assert built.plan(fb.input_ids, fb) is not None                 # decode logprobs come from the logits
    lengths = [6, 2]
    k, v, rtt, new = _kv_world(cfg, lengths, 1, seed=13)
    before_k, before_v = [t.clone() for t in k], [t.clone() for t in v]
    fb = fakes.fake_forward_batch(
        fakes.ForwardMode.DECODE, input_ids=torch.tensor([17, 201], dtype=torch.int64),
        positions=torch.tensor(lengths, dtype=torch.int64), req_pool_indices=torch.tensor([1, 2], dtype=torch.int64),
        seq_lens=torch.tensor([n + 1 for n in lengths], dtype=torch.int64),
        out_cache_loc=torch.tensor([s[0] for s in new], dtype=torch.int64))
    forward, calls = _dispatch(built, model, fakes.FakeKVPool(k, v, None), fakes.fa3_metadata(rtt, fb))
    logits = forward(fb.input_ids, fb.positions, fb).next_token_logits
    step = StepBatch(input_ids=fb.input_ids, positions=fb.positions, out_cache_loc=fb.out_cache_loc.to(torch.int32),
                     req_indices=torch.arange(2, dtype=torch.int32), seq_lens=fb.seq_lens.to(torch.int32),
                     page_table=rtt[fb.req_pool_indices], num_valid_rows=2)
    base, oracle, base_k, base_v, oracle_k, oracle_v = _reference(cfg, w, before_k, before_v, step)
    assert calls == []
    numerics.check_accuracy("fused_model", logits, oracle, base, output="logits")
    written = fb.out_cache_loc.tolist()
    others = torch.ones(NUM_SLOTS, dtype=torch.bool)
    others[[0] + written] = False
    for layer in range(cfg.num_layers):
        for got, bk, ok, old in ((k[layer], base_k[layer], oracle_k[layer], before_k[layer]),
                                 (v[layer], base_v[layer], oracle_v[layer], before_v[layer])):
            numerics.check_accuracy("fused_model", got[written], ok[written], bk[written], output="kv")
            assert torch.equal(_bits(got[others]), _bits(old[others])), "a row wrote outside its slot"


# ------------------------------------------------------------------------------------------ our engine
PROMPTS = [[3, 17, 42, 5], [250, 1, 9]]


def _generate(engine):
    return [r.output_ids for r in engine.generate(PROMPTS, SamplingParams(max_new_tokens=5, ignore_eos=True))]


def test_fused_engine_without_a_gpu_falls_back_and_says_why(tiny, caplog):
    cfg, w = tiny
    with caplog.at_level(logging.WARNING, logger="lowlat.contract"):
        eng = contract.fused_engine(cfg, w, device="cpu", num_slots=128, max_reqs=4, max_ctx=64)
    why = "device cpu is not a CUDA GPU" if torch.cuda.is_available() else "no CUDA GPU is visible"
    assert eng.backend.built is None and eng.backend.refusal == [why]
    assert why in caplog.text
    want = _generate(reference_engine(cfg, w, num_slots=128, max_reqs=4, max_ctx=64))
    assert _generate(eng) == want
    assert eng.backend.counts["fused"] == 0 and eng.backend.counts["fallback"] > 0
    assert "refused" in eng.backend.report() and why in eng.backend.report()
    # the CLI's end-of-run line: the counts, the reasons not a second time (they were logged at build)
    brief = eng.backend.report(reasons=False)
    assert why not in brief and "refused" in brief and f"{eng.backend.counts['fallback']} fallback" in brief
    assert caplog.text.count(why) == 1 and "steps:" not in caplog.text


def test_fused_engine_runs_plan_then_forward_or_fallback(tiny):
    cfg, w = tiny
    eng = contract.fused_engine(cfg, w, device="cpu", num_slots=128, max_reqs=4, max_ctx=64, hardware=H200,
                                runner_factory=contract.reference_runner)
    assert eng.backend.refusal == [] and eng.backend.built.widths == eng.widths
    want = _generate(reference_engine(cfg, w, num_slots=128, max_reqs=4, max_ctx=64))
    assert _generate(eng) == want
    # two prefills (extend: fallback), then 4 decode steps of 2 rows each (fused)
    assert eng.backend.counts == {"fused": 4, "fallback": 2}


def test_fused_engine_refuses_what_the_guard_refuses(tiny):
    cfg, w = tiny
    eng = contract.fused_engine(cfg, w.to(dtype=torch.float32), device="cpu", num_slots=64, max_reqs=2,
                                max_ctx=32, hardware=contract.DeviceFacts("sm_90", 78, "H100 MIG"),
                                runner_factory=contract.reference_runner)
    assert eng.backend.refusal == [
        "weights hold dtype ['float32']; the fused step reads ['bfloat16']",
        "GPU H100 MIG has 78 SMs; the fused step needs 132 resident blocks (a partitioned GPU?)"]
    odd = ModelConfig.from_hf(dict(TINY, hidden_size=120))
    assert contract.LLAMA.guard(odd, None, H200) == [
        "config.hidden_size=120: the fused GEMVs take a multiple of 16"]
    # a ModelConfig's qkv_bias is the Q/K/V biases alone (the fused step reads them): not HF's attention_bias,
    # which for Llama also means an o_proj bias that ModelConfig.from_hf refuses
    biased = dataclasses.replace(ModelConfig.from_hf(TINY), qkv_bias=True)
    assert contract.LLAMA.guard(biased, None, H200) == []


@pytest.mark.parametrize("key,value", [("num_attention_heads", "abc"), ("hidden_size", [64]),
                                       ("num_key_value_heads", 2.5), ("head_dim", True),
                                       ("intermediate_size", "96")])
def test_config_reasons_name_a_count_that_is_not_a_whole_number(key, value):
    """Before: `int(hf.get(...))` raised ValueError / TypeError from the guard on "abc" or [64] and truncated 2.5
    to 2; now the field is named, in ModelConfig.from_hf's words, as the one reason besides the others."""
    reasons = contract.LLAMA.config_reasons(dict(TINY, **{key: value}))
    assert reasons == [f"unsupported config field {key}={value!r}: must be an integer"]
    assert contract.LLAMA.config_reasons(dict(TINY, architectures=["Foo"], **{key: value}))[1:] == reasons


def test_the_guard_refuses_weights_that_do_not_fit_the_config(tiny):
    """Weights of another shape, a tensor the config needs missing, or one it would leave unread: a reason
    naming each (the engine path had no shape check; the reference failed later in a matmul)."""
    cfg, w = tiny
    assert contract.LLAMA.weights_reasons(cfg, w) == []
    bad = w.map(lambda t: t)
    bad.layers[1].wk = bad.layers[1].wk[:, :-16]
    bad.layers[0].bq = torch.zeros(cfg.q_size, dtype=torch.bfloat16)
    bad.layers[0].w_up = None
    (reason,) = contract.LLAMA.weights_reasons(cfg, bad)
    assert reason == (f"weights do not fit the config: layers.0.bq is set, but the config does not use it (it would "
                      f"be left unread); layers.0.w_up is missing (the config needs ({cfg.intermediate_size}, "
                      f"{cfg.hidden_size})); layers.1.wk has shape ({cfg.kv_size}, {cfg.hidden_size - 16}), the "
                      f"config gives ({cfg.kv_size}, {cfg.hidden_size})")
    eng = contract.fused_engine(cfg, bad, device="cpu", num_slots=64, max_reqs=2, max_ctx=32, hardware=H200,
                                runner_factory=contract.reference_runner)
    assert eng.backend.built is None and eng.backend.refusal == [reason]


def test_moe_is_covered_only_with_the_moe_kernels(tiny, monkeypatch):
    moe = ModelConfig.from_hf(dict(TINY, architectures=["Qwen3MoeForCausalLM"], model_type="qwen3_moe",
                                   num_experts=4, num_experts_per_tok=2, moe_intermediate_size=64))
    assert contract.QWEN3_MOE.guard(moe, None, H200) == []
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n == "lowlat.kernels.moe" else real(n, *a))
    assert contract.QWEN3_MOE.guard(moe, None, H200) == [
        "4 MoE experts per layer: lowlat.kernels.moe is not installed"]


def _broken_runner(*args, **kwargs):
    raise RuntimeError("CUDA out of memory")


def test_a_runner_that_fails_to_build_is_a_refusal_not_a_crash(tiny):
    cfg, w = tiny
    eng = contract.fused_engine(cfg, w, device="cpu", num_slots=64, max_reqs=2, max_ctx=32, hardware=H200,
                                runner_factory=_broken_runner)
    assert eng.backend.built is None
    assert eng.backend.refusal == ["building _broken_runner failed: RuntimeError: CUDA out of memory"]
    assert _generate(eng) == _generate(reference_engine(cfg, w, num_slots=64, max_reqs=2, max_ctx=32))


@needs_sglang
def test_a_runner_that_fails_to_build_in_sglang_builds_no_width(tiny):
    """SGLang gathers the built widths from every rank and refuses on all when none was built."""
    cfg, w = tiny
    spec = ours.make_megakernel_spec(contract.LLAMA, runner_factory=_broken_runner, hardware=H200)
    ctx = sgl_spec.BuildContext(widths=(1, 2), tokens_per_request=1, deadline_s=30.0)
    refused = spec.build(fakes.fake_sglang_model(cfg, w), TINY, ctx)
    assert refused.widths == () and "CUDA out of memory" in refused.summary()
    fb = _fb(fakes.ForwardMode.DECODE, 1, 1)
    assert refused.plan(fb.input_ids, fb) is None


def test_contract_find_spec_turns_broken_specs_into_reasons(monkeypatch):
    mod = types.ModuleType("lowlat_test_specs")
    mod.OLD = contract.LowlatSpec(name="old", architecture="LlamaForCausalLM", api_version=0)
    mod.JUNK = object()
    monkeypatch.setitem(sys.modules, "lowlat_test_specs", mod)
    registry = {"A": "lowlat_missing_mod:X", "B": "lowlat_test_specs:OLD", "C": "lowlat_test_specs:JUNK",
                "LlamaForCausalLM": contract.REGISTRY["LlamaForCausalLM"]}
    spec, why = contract.find_spec(["A", "B", "C"], "sm_90", registry)
    assert spec is None and why == "; ".join([
        "lowlat_missing_mod:X does not import: ModuleNotFoundError: No module named 'lowlat_missing_mod'",
        "lowlat_test_specs:OLD uses megakernel API version 0; lowlat requires version 1",
        "lowlat_test_specs:JUNK is not a LowlatSpec"])
    assert contract.find_spec(["LlamaForCausalLM"], "sm_100", registry) == (
        None, "lowlat.runtime.contract:LLAMA supports ['sm_90'], not sm_100")
    assert contract.find_spec(["A", "LlamaForCausalLM"], "sm_90", registry) == (contract.LLAMA, "")
    assert contract.find_spec(["GPT2LMHeadModel"], "sm_90", registry)[1].startswith("no spec is registered")


# ------------------------------------------------------------------------------------------ GPU
@pytest.mark.gpu
@pytest.mark.skipif(not HAS_FUSED, reason="lowlat/runtime/fused_model.py (helper k1b, issue 3) not there yet")
def test_sglang_forward_with_fused_model_is_capturable_in_a_cuda_graph(tiny):
    """SGLang captures the decode graph around our forward: capture it, replay it on the restored
    caches, and the replay's logits and KV writes meet the numerics policy (no SGLang needed)."""
    hw = contract.device_facts("cuda")
    if hw.isa not in contract.ISAS:
        pytest.skip(f"the fused step targets {sorted(contract.ISAS)}; this GPU is {hw.isa}")
    dev = torch.device("cuda", torch.cuda.current_device())
    cfg, w = tiny
    core = contract.build(contract.LLAMA, cfg, w.to(device=dev), device=dev, widths=(1, 2, 4),
                          runner_factory=contract.fused_runner,
                          runner_kwargs={"use_cuda_graphs": False, "validate": False})
    built = SGLangBuilt(core, fakes.fake_sglang_model(cfg, w).to(dev),
                        make_output=lambda logits: types.SimpleNamespace(next_token_logits=logits))
    assert built.output == "logits"
    lengths = [5, 1, 13]
    k, v, rtt, new = _kv_world(cfg, lengths, 1, seed=21)
    before_k, before_v = [t.clone() for t in k], [t.clone() for t in v]
    kd, vd, rttd = [t.to(dev) for t in k], [t.to(dev) for t in v], rtt.to(dev)
    fb = fakes.fake_forward_batch(
        fakes.ForwardMode.DECODE, input_ids=torch.tensor([9, 99, 199, 0], device=dev),
        positions=torch.tensor(lengths + [0], device=dev), req_pool_indices=torch.tensor([1, 2, 3, 0], device=dev),
        seq_lens=torch.tensor([n + 1 for n in lengths] + [1], device=dev),
        out_cache_loc=torch.tensor([s[0] for s in new] + [0], device=dev))
    step = types.SimpleNamespace(mode="decode", rows=4,
                                 view=fakes.fake_view(fakes.FakeKVPool(kd, vd, None), fakes.fa3_metadata(rttd, fb)))
    side = torch.cuda.Stream(dev)
    side.wait_stream(torch.cuda.current_stream(dev))
    with torch.cuda.stream(side):                       # warm-up: compiles the kernels
        built.forward(step, None, fb.input_ids, fb.positions, fb)
    torch.cuda.current_stream(dev).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = built.forward(step, None, fb.input_ids, fb.positions, fb)
    for got, old in zip(kd + vd, before_k + before_v):
        got.copy_(old.to(dev))
    graph.replay()
    torch.cuda.synchronize(dev)
    cpu_step = StepBatch(input_ids=fb.input_ids.cpu(), positions=fb.positions.cpu(),
                         out_cache_loc=fb.out_cache_loc.cpu().to(torch.int32),
                         req_indices=torch.arange(4, dtype=torch.int32), seq_lens=fb.seq_lens.cpu().to(torch.int32),
                         page_table=rtt[fb.req_pool_indices.cpu()], num_valid_rows=3)
    base, oracle, base_k, base_v, oracle_k, oracle_v = _reference(cfg, w, before_k, before_v, cpu_step)
    numerics.check_accuracy("fused_model", out.next_token_logits[:3].cpu(), oracle[:3], base[:3], output="logits")
    written = [s[0] for s in new]
    others = torch.ones(NUM_SLOTS, dtype=torch.bool)
    others[[0] + written] = False
    for layer in range(cfg.num_layers):
        for got, bk, ok, old in ((kd[layer].cpu(), base_k[layer], oracle_k[layer], before_k[layer]),
                                 (vd[layer].cpu(), base_v[layer], oracle_v[layer], before_v[layer])):
            numerics.check_accuracy("fused_model", got[written], ok[written], bk[written], output="kv")
            assert torch.equal(_bits(got[others]), _bits(old[others])), "a row wrote outside its slot"


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_FUSED, reason="lowlat/runtime/fused_model.py (helper k1b, issue 3) not there yet")
def test_fused_engine_on_the_gpu_runs_decode_steps_fused(tiny):
    hw = contract.device_facts("cuda")
    if hw.isa not in contract.ISAS:
        pytest.skip(f"the fused step targets {sorted(contract.ISAS)}; this GPU is {hw.isa}")
    cfg, w = tiny
    eng = contract.fused_engine(cfg, w, device="cuda", num_slots=128, max_reqs=4, max_ctx=64)
    assert eng.backend.refusal == [] and eng.backend.built.stats.memory_bytes is not None
    outs = _generate(eng)
    assert [len(o) for o in outs] == [5, 5]
    assert eng.backend.counts == {"fused": 4, "fallback": 2}


def test_entry_point_is_registered_by_the_install():
    """`pip install -e .` (setup.sh) registers the plugin whether or not SGLang is importable."""
    from importlib.metadata import entry_points

    from lowlat.sglang_plugin import spec_paths

    eps = {e.name: e.value for e in entry_points(group="sglang.srt.plugins")}
    assert eps.get("nvidia_megakernel") == "lowlat.sglang_plugin:register_specs"
    assert spec_paths() == {arch: f"lowlat.sglang_plugin.spec:{contract.SPEC_ATTRS[arch]}"
                            for arch in contract.SGLANG_ARCHITECTURES}


@pytest.mark.parametrize("key,value", [("hidden_size", float("inf")), ("layer_types", 5), ("layer_types", [1, "x"]),
                                       ("architectures", 5), ("architectures", "LlamaForCausalLM"),
                                       ("rope_scaling", "yarn"), ("eos_token_id", "abc"),
                                       ("eos_token_id", float("inf"))])
def test_config_reasons_turn_odd_field_types_into_reasons(key, value):
    """Before: OverflowError (an infinite count: json reads `Infinity`), TypeError / AttributeError / ValueError
    (a non-list layer_types or architectures, a string rope_scaling, a non-numeric eos_token_id) escaped the
    guard's config check; now each is one reason naming the field, as ModelConfig.from_hf refuses it."""
    reasons = contract.LLAMA.config_reasons(dict(TINY, **{key: value}))
    assert len(reasons) == 1 and reasons[0].startswith(f"unsupported config field {key}={value!r}: "), reasons
    with pytest.raises(UnsupportedConfigError, match=rf"^unsupported config field {key}="):
        ModelConfig.from_hf(dict(TINY, **{key: value}))
