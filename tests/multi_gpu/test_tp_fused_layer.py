"""The TP-sharded fused decoder layer on emulated ranks (lowlat.runtime.tp_fused_layer, kernels in
lowlat/kernels/tp_layer.py) vs the TP-1 reference layer (lowlat.reference.layer.decoder_layer).

CPU (Triton interpreter, tiny shapes; push and waiting reduce are separate launches, PDL off, so
`overlap=True` falls back to the serial order): world 2, 3, 4 within the numerics policy against the
float64 oracle, bitwise identical on every rank and run to run, KV writes where the reference writes
them; a rank that never arrives (or publishes a stale epoch) raises `CollectiveTimeout` on every rank
and the next step is correct; bad inputs refused; both kernels compile for sm_90 serial and with PDL,
and the PDL machine code has the order the overlap argument needs (push: wait, trigger, then any
store; reduce: no trigger, its only wait after every flag poll and store).
GPU (`gpu`), both modes (overlap = reduce launched as the push GEMV's PDL dependent, and serial):
SmolLM2-135M's layer shape at world 3 and Llama-3.2-1B's at world 2 and 4 (random weights), rows
1..48; overlap and serial bitwise equal to each other over repeated steps and CUDA-graph replays; a
rank that never arrives (or exits mid-step) aborts every rank within deadline + margin, and the next
step is correct.
"""

from __future__ import annotations

import os
import re
import sys
import time

import pytest
import torch

from lowlat.comm.fault import Fault, FaultKind
from lowlat.config import preset
from lowlat.errors import CollectiveTimeout, StepContractError, UnsupportedConfigError
from lowlat.comm.emulated import EmulatedGroup
from lowlat.comm.testing import make_partials
from lowlat.kernels._gemv import pdl_available
from lowlat.kernels.tp_layer import partial_gemv_push, reduce_residual_norm, sm90_compile_specs
from lowlat.numerics import check_accuracy, check_bitwise, poison
from lowlat.reference.layer import decoder_layer
from lowlat.reference.rms_norm import rms_norm
from lowlat.reference.tp import ordered_sum
from lowlat.reference.rope import rope_cos_sin, rope_inv_freq
from lowlat.runtime.tp_fused_layer import TPFusedLayer, gather_kv_cache, shard_kv_cache
from lowlat.testing import random_step, tiny_config
from lowlat.weights import random_layer_weights

OP = "tp_layer"
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tests", "unit"))
from sampling_stats import compile_sm90  # noqa: E402  (the sm_90 compile harness of the unit tests)


def tiny_tp(world: int):
    """Smallest shape the fused kernels take, two column tiles (H 256), one KV head per rank."""
    return tiny_config(hidden_size=256, num_heads=2 * world, num_kv_heads=world, head_dim=32,
                       intermediate_size=96, num_layers=1)


def make_case(cfg, seed: int, ctx_lens, new_rows, pad_to=None, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    lw = random_layer_weights(cfg, generator=g)
    case = random_step(ctx_lens=ctx_lens, new_rows=new_rows, num_kv_heads=cfg.num_kv_heads,
                       head_dim=cfg.head_dim, generator=g, pad_to=pad_to)
    x = torch.randn(case.step.num_rows, cfg.hidden_size, generator=g).to(torch.bfloat16)
    return lw, case, x


def references(cfg, lw, case, x):
    """(oracle float64, baseline bf16) outputs and K caches of the TP-1 reference layer (on CPU)."""
    step = case.step.to("cpu")
    inv = rope_inv_freq(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling)
    cos, sin = rope_cos_sin(step.positions, inv, torch.bfloat16)
    kb, vb = case.k_cache.cpu().clone(), case.v_cache.cpu().clone()
    base = decoder_layer(cfg, lw, x.cpu(), step, kb, vb, cos, sin)
    cos64, sin64 = rope_cos_sin(step.positions, inv, torch.float64)
    k64, v64 = case.k_cache.cpu().double(), case.v_cache.cpu().double()
    oracle = decoder_layer(cfg, lw.map(lambda t: t.double()), x.cpu().double(), step, k64, v64, cos64, sin64)
    return oracle, base, (k64, v64), (kb, vb)


def run_tp(layer, case, x, device):
    kc = shard_kv_cache(case.k_cache.to(device), layer.world)
    vc = shard_kv_cache(case.v_cache.to(device), layer.world)
    out = poison(torch.empty(layer.world, case.step.num_rows, layer.cfg.hidden_size, dtype=torch.bfloat16,
                             device=device))
    layer.forward(x.to(device), case.step.to(device), kc, vc, out=out)
    return out, gather_kv_cache(kc), gather_kv_cache(vc)


def check_layer(cfg, lw, case, x, out, kc, vc):
    """Every rank within the policy vs the TP-1 oracle, ranks bitwise equal, KV writes checked."""
    oracle, base, (k64, v64), (kb, vb) = references(cfg, lw, case, x)
    out = out.cpu()
    for r in range(out.shape[0]):
        check_accuracy(OP, out[r], oracle, base)
        check_bitwise(OP, out[r], out[0], output="every_rank")
    n = case.step.num_valid_rows
    loc = case.step.out_cache_loc[:n].long().cpu()
    check_accuracy(OP, kc.cpu()[loc], k64[loc], kb[loc], output="k_cache")
    check_accuracy(OP, vc.cpu()[loc], v64[loc], vb[loc], output="v_cache")
    untouched = torch.ones(kc.shape[0], dtype=torch.bool)
    untouched[loc] = False
    check_bitwise(OP, kc.cpu()[untouched].nan_to_num(7.0), case.k_cache.cpu()[untouched].nan_to_num(7.0),
                  output="k_cache_untouched")


# ------------------------------------------------------------------------------------------- CPU
@pytest.mark.parametrize("world", [2, 3, 4])
@pytest.mark.interpreter
def test_tp_fused_layer_equals_tp1_reference_and_is_bitwise_identical_on_every_rank(world):
    """Decode + verify rows with padding; two runs bitwise equal (fresh caches each)."""
    cfg = tiny_tp(world)
    lw, case, x = make_case(cfg, 10 + world, [5, 0, 3], [1, 2, 1], pad_to=6)
    layer = TPFusedLayer(cfg, lw, world, device="cpu", deadline=1.0, max_rows=8)
    out, kc, vc = run_tp(layer, case, x, "cpu")
    check_layer(cfg, lw, case, x, out, kc, vc)
    again, _, _ = run_tp(layer, case, x, "cpu")
    check_bitwise(OP, again, out, output="run_to_run")


@pytest.mark.parametrize("world", [2, 3, 4])
@pytest.mark.interpreter
def test_push_epilogue_and_per_tile_reduce_equal_ordered_sum_bitwise(world):
    """The two TP kernels alone: partials with cancelling pairs (so any other sum order changes bits,
    world >= 3) produced by an exact GEMV (W = identity), pushed by the GEMV epilogue, reduced per
    tile: out = bf16(x + ordered_sum(partials)) bitwise on every rank, h within the policy of
    rms_norm(out)."""
    m, hdim, dev = 5, 256, torch.device("cpu")
    group = EmulatedGroup(world, hdim, max_rows=8, device=dev, deadline=1.0)
    eye = torch.eye(hdim, dtype=torch.bfloat16).expand(world, -1, -1).contiguous()
    nw = (1 + 0.1 * torch.randn(hdim)).to(torch.bfloat16)
    for call in range(2):                                   # both parities of the slots / flags
        parts = make_partials(world, m, hdim, seed=100 * world + call)
        res = torch.randn(world, m, hdim).to(torch.bfloat16)
        out, h = poison(torch.empty_like(res)), poison(torch.empty_like(res))
        group.epoch += 1
        group.bufs.epoch.add_(1)
        partial_gemv_push(group.bufs, parts, eye)
        reduce_residual_norm(group.bufs, res, out, stage=1, abort_floor=group.epoch, deadline_ns=group.deadline.ns,
                             norm_weight=nw, eps=1e-6, h_out=h)
        group.check()
        s = ordered_sum(list(parts))
        for r in range(world):
            check_bitwise(OP, out[r], res[r] + s, output="reduce_bitwise")
            check_accuracy(OP, h[r], rms_norm(out[r].double(), nw.double(), 1e-6), rms_norm(out[r], nw, 1e-6),
                           output="h")


@pytest.mark.parametrize("kind,stage", [(FaultKind.NEVER, "out_proj all-reduce"),
                                        (FaultKind.WRONG_EPOCH, "down_proj all-reduce")])
@pytest.mark.interpreter
def test_rank_that_never_arrives_raises_on_every_rank_and_next_step_is_correct(kind, stage):
    """World 3: rank 1's push is withheld (or tagged with the previous epoch) in one collective;
    every rank raises CollectiveTimeout naming the stage and rank 1; x is untouched; the next step
    (no reset) equals a fault-free layer's bitwise and is within the policy."""
    world = 3
    cfg = tiny_tp(world)
    lw, case, x = make_case(cfg, 7, [4, 2], [1, 1])
    # collective 1 = out-proj reduction of step 1, collective 4 = down-proj reduction of step 2
    fire = 3 if kind == FaultKind.NEVER else 4
    layer = TPFusedLayer(cfg, lw, world, device="cpu", deadline=1.0, max_rows=4,
                         fault=Fault(kind, rank=1, step=fire), spin_limit=16)
    clean = TPFusedLayer(cfg, lw, world, device="cpu", deadline=1.0, max_rows=4)
    run_tp(layer, case, x, "cpu")                       # step 1: collectives 1, 2 (no fault)
    x_before = x.clone()
    with pytest.raises(CollectiveTimeout) as ei:
        run_tp(layer, case, x, "cpu")                   # step 2: collectives 3, 4
    err = ei.value
    assert err.stage == stage and err.missing_peer == 1, str(err)
    assert [e is not None for e in err.per_rank] == [True] * world, err.per_rank
    assert all(e.stage == stage for e in err.per_rank)
    check_bitwise(OP, x, x_before, output="input_untouched_after_abort")
    out, kc, vc = run_tp(layer, case, x, "cpu")         # step 3: correct, no reset
    want, _, _ = run_tp(clean, case, x, "cpu")
    check_bitwise(OP, out, want, output="after_fault")
    check_layer(cfg, lw, case, x, out, kc, vc)


@pytest.mark.interpreter
def test_refuses_bad_configs_and_inputs_before_any_launch():
    cfg = tiny_tp(2)
    lw, case, x = make_case(cfg, 1, [2], [1])
    with pytest.raises(UnsupportedConfigError, match="tp_size"):
        TPFusedLayer(cfg, lw, 3, device="cpu")
    with pytest.raises(UnsupportedConfigError, match="fault"):
        TPFusedLayer(cfg, lw, 2, device="cpu", fault=Fault(FaultKind.LATE, rank=0, delay_s=0.01))
    layer = TPFusedLayer(cfg, lw, 2, device="cpu", max_rows=4)
    kc, vc = shard_kv_cache(case.k_cache, 2), shard_kv_cache(case.v_cache, 2)
    epoch = layer.group.epoch
    with pytest.raises(StepContractError, match=r"x must be"):
        layer.forward(x[:, :128].contiguous(), case.step, kc, vc)
    with pytest.raises(StepContractError, match="one K and one V cache per rank"):
        layer.forward(x, case.step, kc[:1], vc)
    x3 = x.unsqueeze(0).expand(2, -1, -1).contiguous()
    with pytest.raises(StepContractError, match="alias"):
        layer.forward(x3, case.step, kc, vc, out=x3)
    assert layer.group.epoch == epoch, "a refused call must not run a collective"
    check_bitwise(OP, kc[0].nan_to_num(7.0), shard_kv_cache(case.k_cache, 2)[0].nan_to_num(7.0),
                  output="kv_untouched_after_refusal")


@pytest.mark.interpreter
def test_overlap_falls_back_to_the_serial_order_under_the_interpreter():
    """No PDL on the CPU: overlap=True runs push then reduce as separate, ordered launches (a reduce
    program spinning before the push programs ran would never finish) and equals the serial layer."""
    world = 2
    cfg = tiny_tp(world)
    lw, case, x = make_case(cfg, 21, [3, 1], [1, 1])
    on = TPFusedLayer(cfg, lw, world, device="cpu", deadline=1.0, max_rows=4, overlap=True)
    off = TPFusedLayer(cfg, lw, world, device="cpu", deadline=1.0, max_rows=4, overlap=False)
    assert on.overlap is False and off.overlap is False
    a, _, _ = run_tp(on, case, x, "cpu")
    b, _, _ = run_tp(off, case, x, "cpu")
    check_bitwise(OP, a, b, output="overlap_vs_serial")


@pytest.mark.interpreter
def test_overlap_mode_launches_both_kernels_with_pdl(monkeypatch):
    """The host wiring of the overlap, which bitwise tests cannot see (the serial order gives the same bits):
    where PDL is available, each collective's push AND reduce get USE_PDL and `launch_pdl`; with
    overlap=False neither does; on a CPU device `pdl_enabled` is False whatever is asked. The two Triton
    kernels are replaced by recorders (PDL is forced on, which the interpreter could not run)."""
    import lowlat.kernels.tp_layer as tp
    import lowlat.runtime.tp_fused_layer as tpl

    world = 2
    cfg = tiny_tp(world)
    lw, case, x = make_case(cfg, 23, [3, 1], [1, 1])
    layer = TPFusedLayer(cfg, lw, world, device="cpu", deadline=1.0, max_rows=4)
    assert not tp.pdl_enabled(layer.group.bufs, True)                  # CPU: never
    launches = []

    class Recorder:
        def __init__(self, name):
            self.name = name

        def __getitem__(self, grid):
            return lambda *args, **kw: launches.append((self.name, kw["USE_PDL"], kw.get("launch_pdl", False)))

    monkeypatch.setattr(tp, "_partial_gemv_push_kernel", Recorder("push"))
    monkeypatch.setattr(tp, "_reduce_residual_norm_kernel", Recorder("reduce"))
    monkeypatch.setattr(tp, "pdl_available", lambda device: True)
    monkeypatch.setattr(tpl, "pdl_available", lambda device: True)
    kc, vc = shard_kv_cache(case.k_cache, world), shard_kv_cache(case.v_cache, world)
    out = torch.empty(world, case.step.num_rows, cfg.hidden_size, dtype=torch.bfloat16)
    for overlap in (True, False):
        launches.clear()
        layer = TPFusedLayer(cfg, lw, world, device="cpu", deadline=1.0, max_rows=4, overlap=overlap)
        assert layer.overlap is overlap
        layer.launch(x, case.step, kc, vc, out)
        assert launches == [("push", overlap, overlap), ("reduce", overlap, overlap)] * 2, launches


CPU_ONLY = pytest.mark.skipif(torch.cuda.is_available(),
                              reason="the CPU-side sm_90 compile check; the GPU runs the kernels")


@CPU_ONLY
@pytest.mark.parametrize("hidden,k,world,rows,fault,pdl", [(576, 192, 3, 1, FaultKind.NONE, True),
                                                           (2048, 4096, 4, 48, FaultKind.NEVER, True),
                                                           (2048, 1024, 2, 8, FaultKind.WRONG_EPOCH, False)])
def test_tp_kernels_compile_for_sm90_without_spills(hidden, k, world, rows, fault, pdl):
    for name, spec in sm90_compile_specs(hidden, k, world, rows, fault=fault, pdl=pdl).items():
        info = compile_sm90(f"lowlat.kernels.tp_layer:{name}", [spec])[0]
        assert info["ok"] and info["spill_bytes"] == 0, (name, info)


_PTX_PATTERNS = (("wait", "griddepcontrol.wait"), ("trigger", "griddepcontrol.launch_dependents"),
                 ("acquire", "ld.acquire"), ("store", "st.global"), ("atom", "atom."), ("load", "ld.global"))


@CPU_ONLY
def test_pdl_machine_code_has_the_order_the_overlap_relies_on():
    """PTX of both kernels with USE_PDL (kernels/tp_layer.py's argument): the push waits for its
    predecessor, then triggers, before any load, store or flag; the reduce never triggers and its one
    wait comes after every flag poll (acquire), store and abort CAS (so the overlap is real and the
    reduce's completion implies the push's). The reduce starts before the push grid completes, so what
    earlier kernels wrote must come from L2, never a stale L1 line: its only plain (L1-cached) global
    loads are the three pointer tables and the norm weight; the epoch and abort words are volatile, the
    residual and slots `.cg`, the flags acquire."""
    facts, ptx = {}, {}
    for name, spec in sm90_compile_specs(2048, 1024, 4, 8, pdl=True).items():
        ptx[name] = compile_sm90(f"lowlat.kernels.tp_layer:{name}", [{**spec, "launch_pdl": True, "ptx": True}])[0]
        lines = ptx[name]["ptx"].splitlines()
        facts[name] = {key: [i for i, ln in enumerate(lines) if pat in ln] for key, pat in _PTX_PATTERNS}
    plain = re.findall(r"\bld\.global\.(?!cg\b)\S+", ptx["_reduce_residual_norm_kernel"]["ptx"])
    assert sorted(plain) == ["ld.global.b16"] + ["ld.global.b64"] * 3, plain
    push, red = facts["_partial_gemv_push_kernel"], facts["_reduce_residual_norm_kernel"]
    assert len(push["wait"]) == 1 and len(push["trigger"]) == 1, push
    first_mem = min(push["store"] + push["atom"] + push["load"])
    assert push["wait"][0] < push["trigger"][0] < first_mem, push
    assert red["trigger"] == [] and len(red["wait"]) == 1, red
    assert red["acquire"] and red["store"] and red["atom"], red
    assert red["wait"][0] > max(red["acquire"] + red["store"] + red["atom"]), red


# ------------------------------------------------------------------------------------------- GPU
GPU_SHAPES = [("SmolLM2-135M", 3), ("Llama-3.2-1B", 2), ("Llama-3.2-1B", 4)]
GPU_CASES = [([37], [1], None), ([300, 0, 17, 5, 64, 2], [1] * 6, 8), ([120, 33, 9], [16, 16, 16], None)]


def _mode(device, overlap: bool) -> bool:
    if overlap and not pdl_available(torch.device(device)):
        pytest.skip("overlap needs PDL (sm_90+)")
    return overlap


@pytest.mark.gpu
@pytest.mark.parametrize("overlap", [True, False], ids=["overlap", "serial"])
@pytest.mark.parametrize("name,world", GPU_SHAPES)
@pytest.mark.parametrize("ctx_lens,new_rows,pad_to", GPU_CASES)
def test_gpu_tp_fused_layer_real_shapes(device, name, world, ctx_lens, new_rows, pad_to, overlap):
    cfg = preset(name)
    lw, case, x = make_case(cfg, world, ctx_lens, new_rows, pad_to=pad_to)
    layer = TPFusedLayer(cfg, lw, world, device=device, deadline=5.0, overlap=_mode(device, overlap))
    assert layer.overlap is overlap
    out, kc, vc = run_tp(layer, case, x, device)
    torch.cuda.synchronize(device)
    check_layer(cfg, lw, case, x, out, kc, vc)
    for _ in range(3):
        again, _, _ = run_tp(layer, case, x, device)
        check_bitwise(OP, again.cpu(), out.cpu(), output="run_to_run")


@pytest.mark.gpu
@pytest.mark.parametrize("name,world", GPU_SHAPES)
@pytest.mark.parametrize("ctx_lens,new_rows,pad_to", GPU_CASES[1:])
def test_gpu_overlap_and_serial_are_bitwise_equal_over_many_steps(device, name, world, ctx_lens, new_rows, pad_to):
    """One layer, the mode switched between calls: the serial output, then 30 overlapped steps back to
    back (no sync between them: any race between a spinning reduce and its push shows up as a
    changed bit), then serial again, all bitwise equal, and the KV caches too."""
    cfg = preset(name)
    lw, case, x = make_case(cfg, 40 + world, ctx_lens, new_rows, pad_to=pad_to)
    layer = TPFusedLayer(cfg, lw, world, device=device, deadline=5.0, overlap=False)
    want, kw, vw = run_tp(layer, case, x, device)
    layer.overlap = _mode(device, True)
    kc = shard_kv_cache(case.k_cache.to(device), world)
    vc = shard_kv_cache(case.v_cache.to(device), world)
    xd, step = x.to(device), case.step.to(device)
    outs = [poison(torch.empty_like(want)) for _ in range(30)]
    first = layer.group.epoch + 1
    for o in outs:
        layer.launch(xd, step, kc, vc, o)           # no host sync: the steps queue back to back
    layer.check(first)                  # no abort word of any of the 30 steps
    for i, o in enumerate(outs):
        check_bitwise(OP, o.cpu(), want.cpu(), output=f"overlap_step{i}_vs_serial")
    check_bitwise(OP, gather_kv_cache(kc).cpu().nan_to_num(7.0), kw.cpu().nan_to_num(7.0), output="k_overlap_vs_serial")
    check_bitwise(OP, gather_kv_cache(vc).cpu().nan_to_num(7.0), vw.cpu().nan_to_num(7.0), output="v_overlap_vs_serial")
    layer.overlap = False
    again, _, _ = run_tp(layer, case, x, device)
    check_bitwise(OP, again.cpu(), want.cpu(), output="serial_after_overlap")


@pytest.mark.gpu
@pytest.mark.parametrize("overlap", [True, False], ids=["overlap", "serial"])
def test_gpu_cuda_graph_replays_equal_eager(device, overlap):
    """`launch` captured in a CUDA graph (PDL edges kept in overlap mode) and replayed 20 times:
    bitwise the eager output every time, no abort word written (as the benchmark uses it)."""
    cfg, world = preset("Llama-3.2-1B"), 4
    lw, case, x = make_case(cfg, 9, [200, 31, 7, 64, 2, 90], [1] * 6, pad_to=8)
    layer = TPFusedLayer(cfg, lw, world, device=device, deadline=5.0, overlap=_mode(device, overlap))
    want, _, _ = run_tp(layer, case, x, device)
    kc = shard_kv_cache(case.k_cache.to(device), world)
    vc = shard_kv_cache(case.v_cache.to(device), world)
    xd, step = x.to(device), case.step.to(device)
    out = torch.empty_like(want)
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        layer.launch(xd, step, kc, vc, out)
    torch.cuda.current_stream(device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        first = layer.launch(xd, step, kc, vc, out)
    for i in range(20):
        out.fill_(float("nan"))
        graph.replay()
        check_bitwise(OP, out.cpu(), want.cpu(), output=f"replay{i}")
    layer.group.sync_epoch()
    assert all(e is None for e in layer.status(first)), layer.status(first)


@pytest.mark.gpu
@pytest.mark.fault
@pytest.mark.timeout(120)
@pytest.mark.parametrize("overlap", [True, False], ids=["overlap", "serial"])
@pytest.mark.parametrize("kind,fire,stage", [(FaultKind.NEVER, 1, "out_proj all-reduce"),
                                             (FaultKind.EXIT, 2, "down_proj all-reduce")])
def test_gpu_never_arrives_raises_within_deadline_and_next_step_correct(device, kind, fire, stage, overlap):
    """Rank 2 never arrives (collective 1) or exits mid-step (collective 2, half its tiles pushed):
    every rank's reduce aborts after the deadline, in both modes (in overlap mode the reduce programs
    are already spinning while the push runs), and the next step (no reset) is correct."""
    cfg, world, deadline = preset("SmolLM2-135M"), 3, 0.25
    lw, case, x = make_case(cfg, 5, [40, 3], [1, 1])
    layer = TPFusedLayer(cfg, lw, world, device=device, deadline=deadline,
                         fault=Fault(kind, rank=2, step=fire), overlap=_mode(device, overlap))
    assert layer.overlap is overlap
    warm = TPFusedLayer(cfg, lw, world, device=device, deadline=deadline, overlap=overlap)
    run_tp(warm, case, x, device)                       # compile outside the timed call
    torch.cuda.synchronize(device)
    t0 = time.monotonic()
    with pytest.raises(CollectiveTimeout) as ei:
        run_tp(layer, case, x, device)
    took = time.monotonic() - t0
    err = ei.value
    assert err.missing_peer == 2 and err.stage == stage, str(err)
    assert all(e is not None and e.stage == stage for e in err.per_rank), err.per_rank
    # margin: one deadline per waiting row block, launches and the host's read of the abort words
    assert took < 2 * deadline + 5.0, f"took {took:.2f} s for a {deadline} s deadline"
    out, kc, vc = run_tp(layer, case, x, device)
    check_layer(cfg, lw, case, x, out, kc, vc)
