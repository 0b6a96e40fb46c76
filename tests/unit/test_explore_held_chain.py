"""Session 38's explores of the held prologue's PDL chain (bench/explore/explore51-55.py) still build and measure what
their results claim.

CPU (Triton 3.6's sm_90 front end and ptxas, no GPU; Gluon kernels do not run under the interpreter):
- explore51's stand-in forms hold their weights the way their names say: register loads / TMA copies / the L2
  prefetch issued before griddepcontrol.wait, the release at the start in the early build, the residency the docstring
  states (no spills; reg2's 96 KB of shared memory), and its trace summary computes the documented quantities from
  records in int64 (at %globaltimer's ~1.8e18 ns a double steps by 256 ns);
- explore52's weight permutation gives each program the held prologue's 16 rows (8 lower RoPE partners, then their
  upper partners) and `tma_weight` is `fold_attn_norm`'s bits permuted; its generated kernel copies its weights by
  TMA before the wait and issues every x chunk's load before the first mma; its stamp summary;
- explore53's QK-norm edits apply to that kernel, which compiles without spills at three programs an SM;
- explore54's release edits and stamped copy apply to production's source and move the release where they say;
- explore55's flag build replaces the wait by an acquire spin and publishes with a release add.
GPU (`gpu`): explore51's forms store each program's weight sum; explore52's kernel with production's statistic is
production's bits and the others within the numerics policy; explore55's flag chain is production's bits and counts
every program.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
import torch

BENCH = Path(__file__).resolve().parents[2] / "bench"
EXPLORE = BENCH / "explore"


@pytest.fixture
def explore(monkeypatch):
    """bench/explore on this process's path and on the compile subprocess's PYTHONPATH."""
    monkeypatch.syspath_prepend(str(EXPLORE))
    monkeypatch.setenv("PYTHONPATH", str(EXPLORE))


def _ptx_before_wait(ptx: str) -> tuple[str, str]:
    i = ptx.index("griddepcontrol.wait")
    return ptx[:i], ptx[i:]


@pytest.mark.parametrize("form", ["noop", "reg2", "reg", "tma", "hyb4", "hyb", "pf"])
def test_explore51_forms_hold_their_weights_before_the_wait(explore, form):
    from explore51 import FORMS, sm90_spec
    from sampling_stats import compile_sm90

    info, = compile_sm90("explore51:_held_stream_kernel", [dict(sm90_spec(form), ptx=True)])
    before, after = _ptx_before_wait(info["ptx"])
    frac, pf, pad = FORMS[form]
    tma = "cp.async.bulk.tensor"
    kr = 0 if frac is None else int(2048 * frac)
    nt = 0 if frac is None else (2048 - kr) // 64
    assert info["spill_bytes"] == 0
    # the release right after the wait in this build (no load, mma, barrier wait or store between them); the weights
    # (16 rows x K) all requested before the wait
    between = after[:after.index("griddepcontrol.launch_dependents")]
    assert not re.search(r"\bld\.|mma\.sync|mbarrier\.|st\.global|bar\.sync", between), between
    assert before.count("ld.global.v4") == 16 * kr // 1024, "a thread's register part: 16 x KR / 1024 16-byte loads"
    assert after.count("ld.global") == 0
    if pf:
        assert "cp.async.bulk.prefetch.L2" in before and before.count(tma) == 0 and after.count(tma) == nt
    else:
        assert before.count(tma) == nt and after.count(tma) == 0
    if pad:
        assert info["shared"] >= pad * 1024
    if form == "reg2":        # two programs an SM by shared memory, as the production prologue's registers give
        assert 228 * 1024 // (info["shared"] + 1024) == 2


def test_explore51_early_build_releases_at_the_start(explore):
    from explore51 import sm90_spec
    from sampling_stats import compile_sm90

    info, = compile_sm90("explore51:_held_stream_kernel", [dict(sm90_spec("tma", early=True, trace=True), ptx=True)])
    ptx = info["ptx"]
    assert ptx.index("griddepcontrol.launch_dependents") < ptx.index("cp.async.bulk.tensor") < \
        ptx.index("griddepcontrol.wait")
    assert ptx.count("%globaltimer") == 4                 # t0, t1, t2 (the shared weights landed), t3


def _records(launches=6, programs=5, base=1_800_000_000_000_000_000):
    """Synthetic stamp records: launch j's programs start at s_j + p, s_j = base + 4000 j + 100 j^2 (periods 4300,
    4500, 4700 between launches 1-2, 2-3, 3-4: a summary over other launches than 2 .. L - 2 gives another median),
    the wait returns at s_j + 3000, x / the weights land at + 3300, the mma at + 3500, the end at + 3600 + 10 p."""
    t = torch.zeros(launches, programs, 8, dtype=torch.int64)
    for j in range(launches):
        s = base + 4000 * j + 100 * j * j
        t[j, :, 0] = s + torch.arange(programs)
        t[j, :, 1] = s + 3000
        t[j, :, 2] = s + 3300
        t[j, :, 3] = s + 3500
        t[j, :, 4] = s + 3600 + 10 * torch.arange(programs)
        t[j, :, 5] = torch.arange(programs) % 3
        t[j, :, 6] = 1
    return t


def test_explore51_summarize_trace_reads_records_in_int64():
    sys.path.insert(0, str(EXPLORE))
    from explore51 import summarize_trace

    t = _records()
    # explore51's record: t0, tw (weights landed), t1 (wait returned), t2, t3 (end), SM, 1
    t = t[:, :, [0, 2, 1, 3, 4, 5, 6, 7]]
    s = summarize_trace(t)
    assert s["period"] == 4500                       # median of 4300, 4500, 4700 (launches 2, 3, 4 of 6)
    assert s["lag"] == 3000 - 3640 + 4500            # the first wait return after the previous launch's last end
    assert s["first_start"] == -3640 + 4500 and s["last_start"] == 4 - 3640 + 4500
    assert s["weights_after_wait"] == 300 and s["stream"] == 3300 - 2   # median of 3300 - p over p = 0..4
    assert s["post_wait"] == 3620 - 3000 and s["post_wait_max"] == 640
    assert s["sms"] == 3 and s["most_an_sm"] == 2
    assert "weights_after_wait" not in summarize_trace(t, register_part=False)


def test_explore52_summarize_stamps_reads_records_in_int64():
    sys.path.insert(0, str(EXPLORE))
    from explore52 import summarize_stamps

    s = summarize_stamps(_records())
    assert s["period"] == 4500 and s["lag"] == 3000 - 3640 + 4500
    assert (s["x"], s["mma"]) == (300, 200) and s["epilogue"] == 3620 - 3500
    assert s["post_wait"] == 620 and s["post_wait_max"] == 640 and s["wait_spread"] == 0


@pytest.mark.parametrize("d,hq,hkv", [(64, 32, 8), (128, 32, 4)])
def test_explore52_permutation_gives_each_program_its_rope_pairs(d, hq, hkv):
    sys.path.insert(0, str(EXPLORE))
    from explore52 import permuted_rows, tma_weight

    from lowlat.kernels.attn_prologue_held import fold_attn_norm

    n, half = (hq + 2 * hkv) * d, d // 2
    perm = permuted_rows(n, d)
    assert sorted(perm.tolist()) == list(range(n))
    rows = perm.view(n // 16, 16)
    head, within = rows // d, rows % d
    assert (head == head[:, :1]).all(), "a program's 16 rows belong to one head"
    lo, hi = within[:, :8], within[:, 8:]
    assert (lo < half).all() and (hi == lo + half).all(), "rows 8..15 are rows 0..7's RoPE partners"
    assert (lo[:, 1:] - lo[:, :-1] == 1).all(), "8 consecutive rotary indices"
    p0 = 8 * torch.arange(n // 16)                    # the kernel's program p: head p0 // (D / 2), index p0 % (D / 2)
    assert (rows[:, 0] == (p0 // half) * d + p0 % half).all()
    g = torch.Generator().manual_seed(0)
    w = torch.randn(n, 256, generator=g).bfloat16()
    norm = (1 + torch.randn(256, generator=g) / 4).bfloat16()
    assert torch.equal(tma_weight(w, norm, d), fold_attn_norm(w, norm)[perm])


def _tma_spec(m, rel, q=4, d=64, **extra):
    """explore52's `sm90_spec`, with the PTX returned."""
    from explore52 import sm90_spec

    return dict(sm90_spec(m, rel, q, d, **extra), ptx=True)


@pytest.mark.parametrize("prod_ssw,rel,q", [(True, 1, 4), (False, 0, 4), (False, 1, 8)])
def test_explore52_kernel_copies_weights_before_the_wait_and_issues_x_before_the_mma(explore, tmp_path, monkeypatch,
                                                                                       prod_ssw, rel, q):
    from explore52 import kernel_source
    from sampling_stats import compile_sm90

    ns = 2048 // (q * 64)
    (tmp_path / "e52_test.py").write_text(kernel_source(ns, prod_ssw))
    monkeypatch.setenv("PYTHONPATH", f"{tmp_path}:{EXPLORE}")
    info, = compile_sm90("e52_test:_tma_prologue_kernel", [_tma_spec(1, rel, q)])
    before, after = _ptx_before_wait(info["ptx"])
    assert info["spill_bytes"] == 0 and info["shared"] >= 64 * 1024
    assert before.count("cp.async.bulk.tensor") == ns and after.count("cp.async.bulk.tensor") == 0
    assert ("griddepcontrol.launch_dependents" in before) == (rel == 0)
    first_mma = after.index("mma.sync")
    x_loads = len(re.findall(r"ld\.global(\.\w+)*\.v4", after[:first_mma]))
    assert x_loads >= ns, f"{x_loads} x loads before the first mma, {ns} chunks"
    assert "ld.global" not in after[first_mma:], "an x load after the first mma (a round trip in the chain)"
    assert 65536 // (((info["registers"] + 7) // 8 * 8) * 32 * q) >= 3, "three programs an SM by registers"


def test_explore53_qk_edits_apply_and_compile_at_three_programs_an_sm(explore, tmp_path, monkeypatch):
    from explore53 import qk_tma_source
    from sampling_stats import compile_sm90

    src = qk_tma_source()
    assert "_cluster_sync(d)" in src and "qn_ptr" in src and "tma.async_copy_global_to_shared" in src
    (tmp_path / "e53_test.py").write_text(src)
    monkeypatch.setenv("PYTHONPATH", f"{tmp_path}:{EXPLORE}")
    info, = compile_sm90("e53_test:_tma_prologue_kernel",
                         [_tma_spec(1, 1, d=128, qn_ptr="*bf16", kn_ptr="*bf16", xs_ptr="*fp32")])
    assert info["spill_bytes"] == 0 and info["registers"] <= 168
    assert "barrier.cluster.arrive.release" in info["ptx"]


@pytest.mark.parametrize("where", ["issue", "issue2", "x", "mma"])
def test_explore54_release_edits_move_the_release_after_the_wait(explore, where):
    from explore54 import released_source

    from lowlat.kernels import attn_prologue_held as aph

    src = released_source(open(aph.__file__).read(), where)
    body = src.split("def _held_prologue_kernel(")[1]
    wait = body.index("pdl_wait_then_release(USE_PDL, True)")
    rel = body.index({"issue": "_release_through(", "issue2": "_release_now("}.get(where, "_release_when("))
    x = body.index("xb = gl.load(x_ptr")
    ssw, mma = body.index("ssw = gl.sum(xf * xf, axis=1)"), body.index("acc = mma_v2(")
    assert wait < x < rel                                   # the wait alone, then x's loads, then the release
    assert body.count("pdl_wait_then_release(USE_PDL, EARLY_RELEASE)") == 0
    # the release right after the x loads (issue, issue2), after the statistic (x), after the mma (mma)
    assert {"issue": rel < ssw, "issue2": rel < ssw, "x": ssw < rel < mma, "mma": mma < rel}[where]


def test_explore54_xissue2_sass_is_wait_loads_release_mma(explore, tmp_path, monkeypatch):
    """On folded weights at 1 row block (what call 15 timed): after the wait every x load, then the release, then
    every mma, in the sm_90 SASS."""
    from explore54 import released_source
    from llama_prologue_sm90 import launch_spec
    from sampling_stats import compile_sm90

    from lowlat.config import preset
    from lowlat.kernels import attn_prologue_held as aph

    (tmp_path / "e54_issue2_test.py").write_text(released_source(open(aph.__file__).read(), "issue2"))
    monkeypatch.setenv("PYTHONPATH", f"{tmp_path}:{EXPLORE}")
    spec = dict(launch_spec(preset("Llama-3.2-1B"), 1, aph.SLICES, False, "timed"), dump=str(tmp_path / "issue2"))
    info, = compile_sm90("e54_issue2_test:_held_prologue_kernel", [spec])
    ops = [m.group(2).split(".")[0] for m in re.finditer(r"\*/\s+(@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)",
                                                          (tmp_path / "issue2.sass").read_text())]
    after = ops[ops.index("ACQBULK") + 1:]
    seq = [op for op in after if op in ("LDG", "PREEXIT", "HMMA")]
    assert info["spill_bytes"] == 0
    assert seq[:18] == ["LDG"] * 16 + ["PREEXIT", "HMMA"], seq[:20]


def test_explore54_stamped_copy_compiles(explore, tmp_path, monkeypatch):
    from explore54 import stamped_source
    from llama_prologue_sm90 import launch_spec
    from sampling_stats import compile_sm90

    from lowlat.config import preset
    from lowlat.kernels import attn_prologue_held as aph

    (tmp_path / "e54_stamped_test.py").write_text(stamped_source(open(aph.__file__).read()))
    monkeypatch.setenv("PYTHONPATH", f"{tmp_path}:{EXPLORE}")
    specs = []
    for trace in (False, True):
        spec = launch_spec(preset("Llama-3.2-1B"), 1, aph.SLICES, True, "timed")
        spec["constexprs"]["TRACE"] = trace
        spec["pointers"]["tr_ptr"] = "*i64"
        spec["ptx"] = True
        specs.append(spec)
    plain, traced = compile_sm90("e54_stamped_test:_held_prologue_kernel", specs)
    assert plain["spill_bytes"] == traced["spill_bytes"] == 0
    assert plain["ptx"].count("%globaltimer") == 0
    # t0, t1, t3 once each, tx / tm once per element a thread holds of the statistic / the accumulator: 8 in Triton
    # 3.6's build (a stamp dropped makes 7 or fewer)
    assert traced["ptx"].count("%globaltimer") == 8


@pytest.mark.parametrize("flag,early", [(False, False), (True, False), (True, True)])
def test_explore55_flag_build_spins_and_publishes_instead_of_waiting(explore, tmp_path, monkeypatch, flag, early):
    from explore55 import flag_source
    from llama_prologue_sm90 import launch_spec
    from sampling_stats import compile_sm90

    from lowlat.config import preset
    from lowlat.kernels import attn_prologue_held as aph

    (tmp_path / "e55_test.py").write_text(flag_source(open(aph.__file__).read()))
    monkeypatch.setenv("PYTHONPATH", f"{tmp_path}:{EXPLORE}")
    spec = launch_spec(preset("Llama-3.2-1B"), 1, aph.SLICES, True, "timed")
    spec["constexprs"].update(FLAG=flag, EARLY_RELEASE=early, NPROG=192)
    spec["pointers"]["flag_ptr"] = "*i32"
    spec["ptx"] = True
    info, = compile_sm90("e55_test:_held_prologue_kernel", [spec])
    ptx = info["ptx"]
    assert info["spill_bytes"] == 0
    assert ("griddepcontrol.wait" in ptx) != flag
    assert ("ld.acquire.gpu" in ptx) == flag and ("red.release.gpu" in ptx) == flag
    if flag:
        spin, release = ptx.index("ld.acquire.gpu"), ptx.index("griddepcontrol.launch_dependents")
        assert (release < spin) == early


# ------------------------------------------------------------------------------------------------------- GPU
@pytest.mark.gpu
@pytest.mark.parametrize("form", ["reg2", "tma", "hyb", "pf"])
@pytest.mark.parametrize("early", [False, True])
def test_gpu_explore51_forms_store_every_programs_weight_sum(explore, form, early):
    from explore51 import Chain

    ch = Chain(512, 2048, torch.device("cuda"))
    ch.out.fill_(float("nan"))
    fn = ch.launch(form, early)
    for i in range(3):
        fn(i)
    torch.cuda.synchronize()
    for i in range(3):
        want = ch.ws[i].double().view(512 // 16, -1).sum(1)
        got = ch.out[i].double()
        # fp32 sums of 32768 bf16 values of size ~2^-5.5: within 1e-3 relative + 0.05 absolute (a skipped box of
        # 1024 values moves a sum by ~sqrt(1024) 2^-5.5 ~ 0.7); NaN fails
        assert torch.isfinite(got).all() and ((got - want).abs() <= 1e-3 * want.abs() + 0.05).all(), (i, form)


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 6, 16])
def test_gpu_explore52_production_statistic_is_production_bits(explore, m):
    from _common import LlamaPrologueCase
    from explore44 import accuracy_verdict
    from explore47 import launches
    from explore52 import tma_descriptor, tma_prologue, tma_weight

    from lowlat.kernels import attn_prologue_held as aph
    from lowlat.reference.rope import rope_inv_freq

    case = LlamaPrologueCase(torch.device("cuda"))
    cfg, lw = case.cfg, case.lw
    xs, pos, locs = inputs = case.rows(m)
    fns, qs, caches = launches(case, m, {"prod": aph}, inputs)
    fns["prod"](0)
    desc = tma_descriptor(tma_weight(case.ws[0], lw.attn_norm, cfg.head_dim))
    inv = rope_inv_freq(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling, torch.float64).to(case.dev)
    loc = locs[0].long()
    for rel, pssw in ((1, True), (0, False)):
        kc, vc, q = case.cache(m, float("nan")), case.cache(m, float("nan")), case.q_out(m)
        tma_prologue(xs[0], desc, pos, locs[0], m, kc, vc, case.table, cfg, q, rel, pssw)
        torch.cuda.synchronize()
        assert not (q.isnan().any() or kc[loc].isnan().any() or vc[loc].isnan().any()), "an element not written"
        if pssw:
            assert torch.equal(q, qs["prod"][0]) and torch.equal(kc[loc], caches["prod"][0][loc])
            assert torch.equal(vc[loc], caches["prod"][1][loc])
        assert accuracy_verdict((q, kc[loc], vc[loc]), xs[0], case.w0, lw, pos, inv, cfg) == "within policy"


@pytest.mark.gpu
def test_gpu_explore55_flag_chain_is_production_bits(explore):
    from _common import LlamaPrologueCase
    from explore47 import launches
    from explore55 import flag_module

    from lowlat.kernels import attn_prologue_held as aph

    mod = flag_module()
    case = LlamaPrologueCase(torch.device("cuda"))
    m, n = 6, 5
    xs, pos, locs = inputs = case.rows(m)
    fns, qs, caches = launches(case, m, {"prod": aph, "flag": mod}, inputs)
    flag = torch.zeros(1, dtype=torch.int32, device=case.dev)
    kc, vc = caches["flag"]
    for i in range(n):
        fns["prod"](i)
        mod._FLAG[:] = [flag, i, True]
        try:
            mod.attn_prologue_held(xs[i], case.ws[i], case.lw.attn_norm, pos, locs[i], m, kc, vc, case.table,
                                   cfg=case.cfg, out_q=qs["flag"][i], use_pdl=True, early_release=True)
        finally:
            mod._FLAG[:] = [None, 0, False]
    torch.cuda.synchronize()
    assert int(flag.item()) == n * case.w0.shape[0] // 16
    for i in range(n):
        assert torch.equal(qs["flag"][i], qs["prod"][i])
    assert torch.equal(kc[1:n * m + 1], caches["prod"][0][1:n * m + 1])
    assert torch.equal(vc[1:n * m + 1], caches["prod"][1][1:n * m + 1])


# ------------------------------------------------- the explores' shared host helpers (CPU, CUDA calls stood in)
def test_run_checked_flags_an_unwritten_element_and_a_bit_difference(explore, monkeypatch):
    """`_common.run_checked`: runs every launch once, then "every element written" is False for a variant that left
    a NaN in a q output or in a cache slot 1.. (slot 0 is never written: not checked), and "bitwise the base's" False
    for one element off by one ulp."""
    import _common

    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    nan = float("nan")

    def case():
        return [torch.full((2, 3), nan) for _ in range(2)], (torch.full((5, 2), nan), torch.full((5, 2), nan))
    qs, caches, runs = {}, {}, []
    for v in ("base", "same", "q_nan", "slot_nan", "off"):
        qs[v], caches[v] = case()

    def launch(v):
        def fn(i):
            runs.append((v, i))
            qs[v][i].copy_(torch.arange(6.).view(2, 3) + i)
            for c in caches[v]:
                c[1 + 2 * i: 3 + 2 * i] = float(i)
            if v == "q_nan" and i == 1:
                qs[v][i][1, 2] = nan
            if v == "slot_nan" and i == 1:
                caches[v][1][4, 1] = nan
            if v == "off" and i == 1:
                qs[v][i][0, 0] = torch.nextafter(qs[v][i][0, 0], torch.tensor(1e9))
        return fn
    fns = {v: launch(v) for v in qs}
    written, same = _common.run_checked(fns, qs, caches, 2, "base")
    assert sorted(runs) == sorted((v, i) for v in qs for i in range(2))
    assert written == {"base": True, "same": True, "q_nan": False, "slot_nan": False, "off": True}
    assert same == {"base": True, "same": True, "q_nan": False, "slot_nan": False, "off": False}
    assert _common.run_checked(fns, qs, caches, 2)[1] is None


def test_stamp_chain_zeroes_the_records_and_reports_an_unwritten_one(explore, monkeypatch):
    """`_common.stamp_chain`: the records are zeroed before the measured replay (a stale record from the warm replays
    does not count as written), the summary gets the records, and a program that wrote no record in the measured
    replay makes it "incomplete trace"."""
    import _common
    import lowlat.benchmarking as bm

    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    replays = []

    class Graph:
        def __init__(self, launch, n):
            self.launch, self.n = launch, n

        def replay(self):
            replays.append(1)
            for i in range(self.n):
                self.launch(i)
    monkeypatch.setattr(bm, "capture_graph", Graph)
    tr = torch.zeros(3, 4, 8, dtype=torch.int64)

    def launch(skip_last_replay):
        def fn(i):
            if skip_last_replay and len(replays) == 4 and i == 2:
                return                              # launch 2 writes nothing in the measured (4th) replay
            tr[i, :, 4] = 100 * i + len(replays)
            tr[i, :, 6] = 1
        return fn
    got = _common.stamp_chain(launch(False), 3, tr, lambda t: {"end": int(t[:, :, 4].max())}, "x")
    assert got == {"end": 204} and len(replays) == 4
    replays.clear()
    assert _common.stamp_chain(launch(True), 3, tr, lambda t: {"end": 0}, "x") == "incomplete trace"


# ----------------------------------------------------------------------------- session 39: explore56 / explore57
@pytest.mark.parametrize("variant,chunks,win,whole_x,loads", [("c8w2_early_x2", 8, 2, True, 32),
                                                               ("c16w4_early", 16, 4, False, 64),
                                                               ("c8w8_early", 8, 8, False, 32)])
def test_explore56_paced_source_requests_a_window_of_chunks(explore, tmp_path, monkeypatch, variant, chunks, win,
                                                            whole_x, loads):
    """explore56's paced forms (what calls 1-4 timed) at Llama-3.2-1B's shapes, 1 row, maxnreg 168: no spills; the
    weights' 16-byte loads before the wait (32 a thread: 64 KB a program; 64 with 32-column chunks, whose mma operand
    layout holds each piece twice, as narrow slices do: the held prologue's MIN_HIDDEN), every chunk past the window
    offset by an `and` with the chunk `win` back (none where win = chunks: chunked, not paced); after the wait x's
    chunks (16 loads; 32 in 32-column chunks), 16 more with x also loaded whole, and 32 mma.sync."""
    from explore56 import CAP, paced_source, parse_variant
    from llama_prologue_sm90 import launch_spec
    from sampling_stats import compile_sm90

    from lowlat.config import preset
    from lowlat.kernels import attn_prologue_held as aph

    ch, w, early, wx, fold_g, capped = parse_variant(variant)
    assert (ch, w, wx, fold_g, capped) == (chunks, win, whole_x, False, True)
    (tmp_path / "e56_test.py").write_text(paced_source(open(aph.__file__).read(), ch, w, wx, False, CAP))
    monkeypatch.setenv("PYTHONPATH", f"{tmp_path}:{EXPLORE}")
    spec = launch_spec(preset("Llama-3.2-1B"), 1, aph.SLICES, False, "timed")
    spec["constexprs"]["EARLY_RELEASE"] = early
    spec.update(maxnreg=CAP, ptx=True)
    info, = compile_sm90("e56_test:_held_prologue_kernel", [spec])
    before, after = _ptx_before_wait(info["ptx"])
    assert info["spill_bytes"] == 0 and info["registers"] <= CAP
    assert before.count("ld.global.v4") == loads and before.count("cvt.u32.u16") == loads // chunks * (chunks - win)
    assert after.count("ld.global.v4") == loads // 2 + (16 if whole_x else 0) and after.count("mma.sync") == 32


def test_explore57_paced_cluster_source_builds_on_explore44(explore, tmp_path, monkeypatch):
    """explore57's paced Qwen3 form (explore44's QK-norm edits, then explore56's) at Qwen3-30B-A3B's shapes, 1 row
    block, maxnreg 168: no spills, the window's `and`s before the wait (64 weight loads a thread in 32-column chunks,
    see the test above), the cluster barrier after it."""
    from explore46 import sm90_spec
    from explore57 import source
    from sampling_stats import compile_sm90

    src, early = source("cluster_c16w4_late")
    assert not early and "_cluster_sync" in src and "_zero_after(wr" in src
    (tmp_path / "e57_test.py").write_text(src)
    monkeypatch.setenv("PYTHONPATH", f"{tmp_path}:{EXPLORE}")
    spec = sm90_spec(1, True)
    spec["divisible"].append("zero")
    info, = compile_sm90("e57_test:_held_prologue_kernel", [dict(spec, ptx=True)])
    before, after = _ptx_before_wait(info["ptx"])
    assert info["spill_bytes"] == 0
    assert before.count("cvt.u32.u16") == 64 // 16 * (16 - 4) and "barrier.cluster" in after



# ----------------------------------------------------------------------------- session 40: explore58
@pytest.mark.parametrize("model,rows,maxnreg,order", [("qwen3", 1, 168, "sx9|lx24s|lx8sx4"),
                                                      ("qwen3", 16, None, "sx18|lx24slx24s|lx8sx4lx8sx4"),
                                                      ("llama", 1, None, "sx5|lx12sx4")])
def test_explore58_ksplit_orders_scratch_stores_barriers_and_loads(explore, model, rows, maxnreg, order):
    """explore58's K-split cluster prologue compiled for sm_90 (CPU), its PTX's scratch / output stores (s), cluster
    barriers (|) and .cg loads (l) in order: a row block's x partial sum of squares and D partial outputs (8 a thread
    at D 128, 4 at 64) stored before the first barrier, then a row block's CL ranks' partials and sums loaded (3 CL),
    with QK-norm the head's sum-of-squares store a row block, a second barrier, CL loads and the four output stores a
    row block; without QK-norm (Llama) one barrier. No spills where explore58 runs uncapped."""
    from explore58 import scratch_order, sm90_spec
    from sampling_stats import compile_sm90

    info, = compile_sm90("explore58:_ksplit_prologue_kernel", [sm90_spec(rows, model, maxnreg)])
    assert scratch_order(info["ptx"]) == order
    if maxnreg is None:
        assert info["spill_bytes"] == 0
