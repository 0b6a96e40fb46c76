"""Split-KV decode attention (lowlat/kernels/decode_attention.py) vs `paged_attention`
(lowlat/reference/attention.py): accuracy under the numerics policy, GQA ratios, verify rows,
split edges, shuffled slots, NaN / garbage in unused page-table entries and slots, padding rows,
typed errors; on the GPU also full shapes (contexts to 4096), bitwise determinism, row invariance,
PDL and CUDA graphs.

CPU: the kernel runs under the Triton interpreter at tiny shapes (<= 6 hypothesis examples each),
with BLOCK_N = 16 and few splits so short contexts still cross block and split edges.
"""

import re

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from lowlat.errors import StepContractError
from lowlat.kernels._attn_common import interpreting
from lowlat.kernels.decode_attention import decode_attention, make_decode_workspace
from lowlat.numerics import check_accuracy, check_bitwise, oracle_cast, poison
from lowlat.reference.attention import paged_attention
from lowlat.step import StepBatch
from lowlat.testing import random_step, split_rows

FEW = settings(max_examples=6) if interpreting() else settings()


def _case(*, ctxs, rows, hq, hkv, d, pad, seed, device, garbage_page_table=True):
    """A step whose own rows' K/V are already in the cache (as the prologue leaves it), q, and the
    page table's unused columns filled with garbage slot ids (never to be read)."""
    g = torch.Generator().manual_seed(seed)
    case = random_step(ctx_lens=ctxs, new_rows=rows, num_kv_heads=hkv, head_dim=d, pad_to=sum(rows) + pad,
                       generator=g)
    step, kc, vc = case.step, case.k_cache, case.v_cache
    n = step.num_valid_rows
    loc = step.out_cache_loc[:n].long()
    kc[loc] = torch.randn(n, hkv, d, generator=g).bfloat16()
    vc[loc] = torch.randn(n, hkv, d, generator=g).bfloat16()
    if garbage_page_table:
        cols = torch.arange(step.page_table.shape[1])[None, :]
        unused = cols >= step.seq_lens[:, None]
        junk = torch.randint(-2**30, 2**30, step.page_table.shape, generator=g, dtype=torch.int32)
        step.page_table[unused] = junk[unused]
    q = (torch.randn(step.num_rows, hq, d, generator=g) * 2).bfloat16()
    return step.to(device), q.to(device), kc.to(device), vc.to(device)


def _reference(q, kc, vc, step, *, per_row=False):
    """(oracle float64, baseline bf16) of paged_attention; per_row bounds memory at long contexts."""
    def run(qq, kk, vv):
        if not per_row:
            return paged_attention(qq, kk, vv, step.page_table, step.req_indices, step.positions,
                                   step.num_valid_rows)
        out = torch.zeros_like(qq)
        for i in range(step.num_valid_rows):
            s = slice(i, i + 1)
            out[s] = paged_attention(qq[s], kk, vv, step.page_table, step.req_indices[s], step.positions[s], 1)
        return out
    return run(*oracle_cast((q, kc, vc))), run(q, kc, vc)


def _kernel(q, kc, vc, step, **kw):
    out = poison(torch.empty_like(q))
    got = decode_attention(q, kc, vc, step.page_table, step.req_indices, step.positions, step.num_valid_rows,
                           out=out, **kw)
    assert got is out
    return out


def _check(q, kc, vc, step, per_row=False, **kw):
    out = _kernel(q, kc, vc, step, **kw)
    oracle, baseline = _reference(q, kc, vc, step, per_row=per_row)
    check_accuracy("decode_attention", out, oracle, baseline)
    n = step.num_valid_rows
    assert torch.equal(out[n:], torch.zeros_like(out[n:])), "padding rows must output 0"
    return out



# ----------------------------------------------------------------------------- CPU (interpreter)
@FEW
@given(m=st.integers(1, 48), pad=st.integers(0, 3), group=st.sampled_from([1, 3, 4, 8]),
       hkv=st.sampled_from([1, 2]), d=st.sampled_from([16, 32]), num_splits=st.sampled_from([4, 2, 1]),
       max_ctx=st.sampled_from([64, 100, 33, 1]), pre_kv=st.booleans(), seed=st.integers(0, 2**16))
def test_decode_attention_within_2x_baseline_error(device, m, pad, group, hkv, d, num_splits, max_ctx, pre_kv,
                                                   seed):
    """Decode and verify rows, GQA ratios 1/3/4/8, shuffled slots, NaN slots, garbage page-table tails; with and
    without out_cache_loc (the first block's K / V loaded before the PDL wait)."""
    rows = split_rows(m)
    ctxs = [(seed >> (i % 16)) % (max_ctx + 1) for i in range(len(rows))]
    step, q, kc, vc = _case(ctxs=ctxs, rows=rows, hq=group * hkv, hkv=hkv, d=d, pad=pad, seed=seed, device=device)
    _check(q, kc, vc, step, num_splits=num_splits, block_n=16, out_cache_loc=step.out_cache_loc if pre_kv else None,
           pre_kv=pre_kv)


@pytest.mark.parametrize("length", [1, 2, 15, 16, 17, 31, 32, 33, 63, 64, 65, 128])
def test_decode_attention_split_and_block_edges(device, length):
    """Visible lengths L = pos + 1 on and around BLOCK_N = 16 blocks and split boundaries (4 splits);
    L = 1 is a row with no cached tokens that sees only itself. With out_cache_loc too: bitwise the same."""
    step, q, kc, vc = _case(ctxs=[length - 1, 3], rows=[1, 1], hq=4, hkv=2, d=16, pad=1, seed=length,
                            device=device)
    out = _check(q, kc, vc, step, num_splits=4, block_n=16)
    check_bitwise("decode_attention", _kernel(q, kc, vc, step, num_splits=4, block_n=16,
                                              out_cache_loc=step.out_cache_loc, pre_kv=True), out, output="pre_kv")


@pytest.mark.interpreter
def test_decode_attention_chooses_the_early_kv_path_by_the_grid(monkeypatch):
    """out_cache_loc with pre_kv None loads early only under PDL and while num_splits x Hkv x M programs fit on
    the GPU at once (PRE_KV_PROGRAMS_PER_SM by head_dim, at most 16 query heads per KV head); pre_kv True / False
    force it (the kernel launch recorded by a stand-in)."""
    from types import SimpleNamespace

    from lowlat.kernels import decode_attention as da

    seen = []

    class Recorder:
        def __getitem__(self, grid):
            return lambda *args, **kw: seen.append((grid, kw["PRE_KV"], args[8] is args[4]))

    base, _ = _error_cases()                      # M=3, Hq=4, Hkv=2, D=16: 32 x 2 x 3 = 192 programs
    loc = base["req_indices"].clone()
    monkeypatch.setattr(da, "_decode_attention_kernel", Recorder())
    monkeypatch.setattr(da, "pdl_supported", lambda device: True)
    sms = SimpleNamespace(multi_processor_count=132)
    monkeypatch.setattr(da, "cuda_props", lambda device: sms)
    calls = [dict(use_pdl=True, out_cache_loc=loc), dict(use_pdl=True), dict(use_pdl=False, out_cache_loc=loc),
             dict(use_pdl=False, out_cache_loc=loc, pre_kv=True), dict(use_pdl=True, out_cache_loc=loc, pre_kv=False)]
    for kw in calls:
        da.decode_attention(**base, **kw)
    sms.multi_processor_count = 31                # 31 x 6 = 186 < 192: no longer fits
    da.decode_attention(**base, use_pdl=True, out_cache_loc=loc)
    sms.multi_processor_count = 32
    da.decode_attention(**base, use_pdl=True, out_cache_loc=loc)
    assert [pre for _, pre, _ in seen] == [True, False, False, True, False, False, True]
    assert [same for _, _, same in seen] == [False, True, True, False, True, True, False]   # loc_ptr = loc if PRE_KV
    sms.multi_processor_count = 132
    assert da.pre_kv_fits(3 * 132, 128, 8, 16, torch.device("cpu"))
    assert not da.pre_kv_fits(3 * 132 + 1, 128, 8, 1, None)
    assert not da.pre_kv_fits(1, 64, 17, 1, None) and not da.pre_kv_fits(1, 256, 4, 1, None)
    assert not da.pre_kv_fits(1, 64, 4, 17, None)             # LOC_PAD 32: the table's registers do not hold


def test_decode_attention_pre_kv_programs_per_sm_table_holds_for_the_sm90_compile():
    """PRE_KV_PROGRAMS_PER_SM is what the early-KV kernel compiled for sm_90 actually fits on an SM (model heads:
    SmolLM2 G 3 / Llama-3.2-1B G 4 at D 64, Qwen3-30B-A3B G 8 at D 128), so `pre_kv_fits` never admits a grid
    that needs a second wave."""
    from sampling_stats import compile_sm90

    from lowlat.kernels.decode_attention import COMBINE_CHUNK, PRE_KV_PROGRAMS_PER_SM
    from lowlat.kernels.sm90_check import programs_per_sm

    shapes = [(3, 64), (4, 64), (8, 128)]
    specs = []
    for g, d in shapes:
        spec = _sm90_spec(pre_kv=True)
        spec["constexprs"] = dict(spec["constexprs"], G=g, D=d, CHUNK=COMBINE_CHUNK)
        spec.pop("ptx")
        specs.append(spec)
    for (g, d), info in zip(shapes, compile_sm90("lowlat.kernels.decode_attention:_decode_attention_kernel", specs)):
        assert info["spill_bytes"] == 0, (g, d, info)
        assert programs_per_sm(info["registers"], info["shared"], 4) >= PRE_KV_PROGRAMS_PER_SM[d], (g, d, info)


def test_decode_attention_grouped_kv_stages_pipeline_deeper_in_the_sm90_compile():
    """The grouped kernel (1 / 2 programs per (row, KV head), Llama's heads) compiled for sm_90 at GROUPED_KV_STAGES
    keeps K / V two blocks ahead (`cp.async.wait_group 3` in its loop; at KV_STAGES every wait is `wait_group 0`:
    each block pays its round trip, session 19), without spills and with at least 4 programs an SM (39 KB of shared
    memory, 115-116 registers when measured)."""
    from sampling_stats import compile_sm90

    from lowlat.kernels.decode_attention import GROUPED_KV_STAGES, KV_STAGES
    from lowlat.kernels.sm90_check import programs_per_sm

    cases = [(1, GROUPED_KV_STAGES), (2, GROUPED_KV_STAGES), (1, KV_STAGES)]
    specs = []
    for groups, stages in cases:
        spec = _sm90_spec()
        spec["constexprs"] = dict(spec["constexprs"], G=4, GROUPS=groups)
        spec["num_stages"] = stages
        specs.append(spec)
    infos = compile_sm90("lowlat.kernels.decode_attention:_decode_attention_kernel", specs)
    for (groups, stages), info in zip(cases, infos):
        waits = set(re.findall(r"cp\.async\.wait_group\s+(\d+)", info["ptx"]))
        if stages == GROUPED_KV_STAGES:
            assert "3" in waits, (groups, stages, waits)
            assert info["spill_bytes"] == 0, (groups, info["spill_bytes"])
            assert programs_per_sm(info["registers"], info["shared"], 4) >= 4, (groups, info["registers"],
                                                                                 info["shared"])
        else:
            assert waits == {"0"}, (groups, stages, waits)


@pytest.mark.parametrize("chunk", [2, 4, 8])
def test_decode_attention_combine_folds_every_chunk_of_splits(device, monkeypatch, chunk):
    """The combining program loads COMBINE_CHUNK splits' partials per round trip and folds them one at a time in
    split order: with chunks of 2, 4, 8 over 5-8 splits (several chunks, a ragged last one) the output is
    bitwise that of one split per round trip, and within the policy."""
    from lowlat.kernels import decode_attention as da

    step, q, kc, vc = _case(ctxs=[120, 70, 33, 5], rows=[1, 2, 1, 1], hq=4, hkv=2, d=16, pad=1, seed=chunk,
                            device=device)
    monkeypatch.setattr(da, "COMBINE_CHUNK", 1)
    one = _check(q, kc, vc, step, num_splits=8, block_n=16)
    monkeypatch.setattr(da, "COMBINE_CHUNK", chunk)
    check_bitwise("decode_attention", _kernel(q, kc, vc, step, num_splits=8, block_n=16), one, output="chunk")


@pytest.mark.parametrize("pre_kv", [False, True])
def test_decode_attention_combine_folds_in_split_order_and_skips_masked_chunk_slots(device, pre_kv):
    """An adversarial case (review of session 14): one row of L = 48 over 3 splits of one 16-token block (num_splits 4:
    one chunk of 4 with a masked 4th slot). Equal scores far below 0 (m ~ -369 in log2 units: a masked slot's
    weight 2^(0 - m_max) would be inf, inf * 0 NaN) and V = +2^26 / -2^26 / N(0, 1) by block: only the split order
    0, 1, 2 keeps block 2's sum ((A - A) + c = c, but (c - A) + A = 0 in fp32). Tolerance: the bf16 output (2^-8
    relative) with room; the failures aimed at give NaN or 0 instead of the mean. Constant K / q on purpose: they
    set the scores; V's last block is random."""
    step, q, kc, vc = _case(ctxs=[47], rows=[1], hq=4, hkv=2, d=16, pad=1, seed=21, device=device)
    slots = step.page_table[int(step.req_indices[0]), :48].long()
    kc[slots] = -8.0
    vc[slots[:16]] = 2.0 ** 26
    vc[slots[16:32]] = -(2.0 ** 26)
    g = torch.Generator().manual_seed(1)
    vc[slots[32:48]] = torch.randn(16, 2, 16, generator=g).bfloat16().to(device)
    q.fill_(8.0)
    out = _kernel(q, kc, vc, step, num_splits=4, block_n=16,
                  out_cache_loc=step.out_cache_loc if pre_kv else None, pre_kv=pre_kv)
    want = vc[slots[32:48]].double().sum(0) / 48          # [Hkv, D]: the mean over the 48 tokens
    got = out[0].double().view(2, 2, 16)                   # [Hkv, G, D]
    assert torch.isfinite(got).all(), "a masked chunk slot was folded in"
    assert torch.allclose(got, want[:, None, :].expand_as(got), rtol=2e-2, atol=1e-3), (got, want)


@pytest.mark.parametrize("ctxs, rows", [([5, 40, 0, 17], [2, 3, 1, 2]),
                                         ([5, 40, 0, 17, 30, 9, 3], [2, 3, 1, 2, 4, 3, 4])])   # 20 rows: LOC_PAD 32
def test_decode_attention_pre_kv_reads_the_previous_launchs_slots_after_the_wait(monkeypatch, ctxs, rows):
    """With out_cache_loc, a program loads its first block's K / V BEFORE `gdc_wait` and, after it, again for
    the slots the previous launch writes (out_cache_loc); q is read after it. Simulated under the interpreter,
    which runs programs one at a time: before each program the step's own KV slots and q hold stale values,
    and the wait (a stand-in for `gdc_wait`) writes the fresh ones, as the attention prologue finishing would.
    The output must be the attention over the fresh values; with an out_cache_loc that names none of the
    written slots it must not be (the simulation bites)."""
    if not interpreting():
        pytest.skip("simulates the PDL race under the Triton interpreter")
    import triton.runtime.interpreter as interp

    from lowlat.kernels import decode_attention as da

    step, q, kc, vc = _case(ctxs=ctxs, rows=rows, hq=6, hkv=2, d=16, pad=1, seed=11, device="cpu")
    loc = step.out_cache_loc[:step.num_valid_rows].long()
    fresh = (q.clone(), kc[loc].clone(), vc[loc].clone())
    g = torch.Generator().manual_seed(3)
    stale = tuple(torch.randn(t.shape, generator=g).bfloat16() * 4 for t in fresh)
    calls = {"programs": 0, "waits": 0}

    def put(vals):
        q.copy_(vals[0])
        kc[loc], vc[loc] = vals[1], vals[2]

    real_set = interp.interpreter_builder.set_grid_idx

    def program_start(x, y, z):
        calls["programs"] += 1
        put(stale)
        real_set(x, y, z)

    def wait():
        calls["waits"] += 1
        put(fresh)

    monkeypatch.setattr(interp.interpreter_builder, "set_grid_idx", program_start)
    monkeypatch.setattr(da, "gdc_wait", wait)
    monkeypatch.setattr(da, "gdc_launch_dependents", lambda: None)
    monkeypatch.setattr(da, "pdl_supported", lambda device: True)
    kw = dict(num_splits=4, block_n=16, use_pdl=True, pre_kv=True)
    outs = {}
    for name, where in (("pre_kv", step.out_cache_loc), ("after_wait", None),
                        ("wrong_loc", torch.zeros_like(step.out_cache_loc))):
        outs[name] = _kernel(q, kc, vc, step, out_cache_loc=where, **kw)
        grid = 4 * 2 * step.num_rows
        assert calls == {"programs": grid, "waits": grid}, calls
        calls.update(programs=0, waits=0)
    put(fresh)
    oracle, baseline = _reference(q, kc, vc, step)
    check_accuracy("decode_attention", outs["pre_kv"], oracle, baseline)
    check_bitwise("decode_attention", outs["pre_kv"], outs["after_wait"], output="pre_kv")
    with pytest.raises(AssertionError):
        check_accuracy("decode_attention", outs["wrong_loc"], oracle, baseline)


@pytest.mark.slow
@pytest.mark.parametrize("pre_kv", [False, True])
def test_decode_attention_split_groups_give_the_same_bits(device, pre_kv):
    """A program may run several splits of its (row, KV head) in one loop over their blocks (`split_groups` programs
    each; with one it combines its own partials, with more the last of min(n_s, split_groups) to arrive does):
    every grouping gives bitwise the output of one program per split (with or without the early first block),
    within the policy, padding rows 0, counters reset. With num_splits 8 and 16-token blocks the rows have 1, 3, 5,
    7 and 8 splits of one block, and 5 splits of 2 blocks (L = 160) or 2 blocks but a one-block last split (L = 141):
    fewer splits than groups, as many, more. The split partials are set to NaN before every grouped launch, so a
    partial the launch should store and does not cannot pass on a value an earlier launch left (review of
    session 18)."""
    step, q, kc, vc = _case(ctxs=[159, 70, 0, 33, 15, 100, 140, 127], rows=[1, 2, 1, 3, 1, 2, 1, 1], hq=6, hkv=2,
                            d=16, pad=2, seed=31, device=device)
    ws = make_decode_workspace(step.num_rows, 6, 2, 16, device, num_splits=8, block_n=16)
    loc = step.out_cache_loc if pre_kv else None
    one = _check(q, kc, vc, step, workspace=ws, split_groups=8, out_cache_loc=loc, pre_kv=pre_kv)
    for groups in (4, 2, 1):
        ws.partial_o.fill_(float("nan"))
        ws.partial_ml.fill_(float("nan"))
        got = _check(q, kc, vc, step, workspace=ws, split_groups=groups, out_cache_loc=loc)
        check_bitwise("decode_attention", got, one, output=f"split_groups_{groups}")
        assert int(ws.counters.abs().sum()) == 0, f"split_groups={groups} left a counter set"
    if pre_kv:
        with pytest.raises(StepContractError, match="pre_kv=True needs one program per split"):
            decode_attention(q, kc, vc, step.page_table, step.req_indices, step.positions, step.num_valid_rows,
                             workspace=ws, split_groups=4, out_cache_loc=loc, pre_kv=True)
    # without out_cache_loc pre_kv has no effect (as before split groups): no error at any grouping
    check_bitwise("decode_attention", _kernel(q, kc, vc, step, workspace=ws, split_groups=2, pre_kv=True), one,
                  output="pre_kv_without_out_cache_loc")


@pytest.mark.interpreter
def test_default_split_groups_groups_only_wide_grids(monkeypatch):
    """One program per split unless num_splits x Hkv x M exceeds WIDE_GRID at head_dim <= WIDE_MAX_HEAD_DIM, then
    num_splits halved while the grid exceeds WIDE_TARGET (at least 1); the launch uses it when split_groups is None
    (grid dim 0, recorded by a stand-in)."""
    from lowlat.kernels import decode_attention as da

    assert (da.WIDE_GRID, da.WIDE_TARGET, da.WIDE_MAX_HEAD_DIM) == (4608, 512, 64)
    assert ([da.default_split_groups(m, 8, head_dim=64) for m in (1, 6, 16, 18, 19, 24, 32, 33, 48)]
            == [32, 32, 32, 32, 2, 2, 2, 1, 1])                                     # Llama-3.2-1B
    assert [da.default_split_groups(m, 3, head_dim=64) for m in (1, 6, 48)] == [32, 32, 32]  # SmolLM2: never past
    assert [da.default_split_groups(m, 4, head_dim=128) for m in (37, 48)] == [32, 32]       # Qwen3-30B-A3B: D 128
    assert [da.default_split_groups(m, 4, head_dim=64) for m in (36, 37)] == [32, 2]
    assert da.default_split_groups(48, 64, 2, head_dim=16) == 1
    assert da.default_split_groups(4, 64, 8, head_dim=16) == 8
    seen = []

    class Recorder:
        def __getitem__(self, grid):
            return lambda *args, **kw: seen.append((grid, kw["GROUPS"]))

    base, _ = _error_cases()                                      # M=3, Hkv=2
    monkeypatch.setattr(da, "_decode_attention_kernel", Recorder())
    da.decode_attention(**base)
    monkeypatch.setattr(da, "WIDE_GRID", 191)                   # M=3, Hkv=2: 32 x 2 x 3 = 192 programs
    monkeypatch.setattr(da, "WIDE_TARGET", 30)                  # 4 x 2 x 3 = 24 programs
    da.decode_attention(**base)
    da.decode_attention(**base, split_groups=16)
    da.decode_attention(**base, out_cache_loc=base["req_indices"].clone(), pre_kv=True)   # the early path's grid
    da.decode_attention(**base, num_splits=8)                   # the workspace's splits: 8 x 2 x 3 = 48 programs
    assert seen == [((32, 2, 3), 32), ((4, 2, 3), 4), ((16, 2, 3), 16), ((32, 2, 3), 32), ((8, 2, 3), 8)]


@pytest.mark.interpreter
def test_decode_attention_launches_kv_stages_as_num_stages(monkeypatch):
    """kv_stages reaches the launch as Triton's num_stages: by default KV_STAGES, GROUPED_KV_STAGES where a program
    runs at least 16 splits' share of its row, PRE_KV_STAGES on the early path (its PRE_KV_PROGRAMS_PER_SM table was
    measured there); an explicit value either way."""
    from lowlat.kernels import decode_attention as da

    seen = []

    class Recorder:
        def __getitem__(self, grid):
            return lambda *args, **kw: seen.append((kw["PRE_KV"], kw["num_stages"]))

    base, _ = _error_cases()
    monkeypatch.setattr(da, "_decode_attention_kernel", Recorder())
    monkeypatch.setattr(da, "KV_STAGES", 6)
    monkeypatch.setattr(da, "GROUPED_KV_STAGES", 7)
    monkeypatch.setattr(da, "PRE_KV_STAGES", 2)
    loc = base["req_indices"].clone()
    da.decode_attention(**base)
    da.decode_attention(**base, kv_stages=4)
    da.decode_attention(**base, out_cache_loc=loc, pre_kv=True)
    da.decode_attention(**base, out_cache_loc=loc, pre_kv=True, kv_stages=5)
    for groups in (4, 2, 1):                                    # of 32 splits: 2 and 1 run >= 16 splits' share
        da.decode_attention(**base, split_groups=groups)
    da.decode_attention(**base, split_groups=1, num_splits=8)   # the workspace's splits count, not MAX_SPLITS
    assert seen == [(False, 6), (False, 4), (True, 2), (True, 5), (False, 6), (False, 7), (False, 7), (False, 6)]
    # 8 splits: never 16 splits' share; 5 stages measured at D <= 64 only
    assert [da.default_kv_stages(g, 8, head_dim=64, pre_kv=False) for g in (8, 1)] == [6, 6]
    assert [da.default_kv_stages(1, 32, head_dim=d, pre_kv=False) for d in (64, 128)] == [7, 6]


@pytest.mark.parametrize("name, bad", [("split_groups", v) for v in (0, 3, 64, -2, True, 2.0)]
                         + [("kv_stages", v) for v in (0, 9, -1, True, 3.0, "3")])
@pytest.mark.interpreter
def test_decode_attention_bad_split_groups_or_kv_stages_raises_before_writing(name, bad):
    base, _ = _error_cases()
    out = poison(torch.empty_like(base["q"]))
    before = out.clone()
    with pytest.raises(StepContractError, match=name):
        decode_attention(**base, out=out, **{name: bad})
    assert torch.equal(out.view(torch.int16), before.view(torch.int16))


def test_decode_attention_rows_bitwise_invariant_small(device):
    """Each row's output is identical alone and among others (tiny shapes, several splits)."""
    step, q, kc, vc = _case(ctxs=[40, 3, 0], rows=[2, 1, 3], hq=6, hkv=2, d=16, pad=2, seed=5, device=device)
    ws = make_decode_workspace(8, 6, 2, 16, device, num_splits=4, block_n=16)
    full = _kernel(q, kc, vc, step, workspace=ws)
    for i in (0, 1, 3, 5):
        idx = torch.tensor([i], device=device)
        one = StepBatch(step.input_ids[idx], step.positions[idx], step.out_cache_loc[idx], step.req_indices[idx],
                        step.seq_lens, step.page_table, 1)
        check_bitwise("decode_attention", _kernel(q[idx], kc, vc, one, workspace=ws)[0], full[i],
                      output="row_invariance")
    assert int(ws.counters.abs().sum()) == 0


def test_decode_attention_num_valid_rows_tensor_equals_int(device):
    step, q, kc, vc = _case(ctxs=[20, 7], rows=[1, 2], hq=4, hkv=1, d=16, pad=3, seed=9, device=device)
    a = _kernel(q, kc, vc, step, num_splits=2, block_n=16)
    nvr = torch.tensor([step.num_valid_rows], dtype=torch.int32, device=device)
    b = poison(torch.empty_like(q))
    decode_attention(q, kc, vc, step.page_table, step.req_indices, step.positions, nvr, out=b, num_splits=2,
                     block_n=16)
    check_bitwise("decode_attention", b, a, output="nvr_tensor")


def _error_cases():
    step, q, kc, vc = _case(ctxs=[5, 2], rows=[1, 1], hq=4, hkv=2, d=16, pad=1, seed=2, device="cpu")
    base = dict(q=q, k_cache=kc, v_cache=vc, page_table=step.page_table, req_indices=step.req_indices,
                positions=step.positions, num_valid_rows=step.num_valid_rows)
    far = step.positions.clone()
    far[1] = 1000
    badreq = step.req_indices.clone()
    badreq[0] = 7
    pt = step.page_table.clone()
    pt[0, 2] = kc.shape[0] + 5
    return base, [
        (dict(q=q.float()), "q must be torch.bfloat16"),
        (dict(q=q[:, :3].contiguous()), "Hq=3 query heads must be a multiple of Hkv=2"),
        (dict(k_cache=kc[..., :8].contiguous()), "k_cache has shape"),
        (dict(v_cache=vc[:, :1].contiguous()), "v_cache has shape"),
        (dict(page_table=step.page_table.long()), "page_table must be torch.int32"),
        (dict(req_indices=step.req_indices[:2]), "req_indices has shape (2,): dim 0 must be M=3"),
        (dict(positions=step.positions.int()), "positions must be torch.int64"),
        (dict(num_valid_rows=-1), "num_valid_rows=-1 must be in 0..M=3"),
        (dict(out=torch.empty(3, 4, 8, dtype=torch.bfloat16)), "out has shape (3, 4, 8)"),
        (dict(num_splits=3), "num_splits=3 must be an int (not a bool), a power of two in 1..256"),
        (dict(out_cache_loc=step.out_cache_loc.long()), "out_cache_loc must be torch.int32"),
        (dict(out_cache_loc=step.out_cache_loc[:2]), "out_cache_loc has shape (2,): dim 0 must be M=3"),
        (dict(positions=far, check_values=True), "positions[1]=1000 outside"),
        (dict(req_indices=badreq, check_values=True), "req_indices[0]=7 outside [0, 2)"),
        (dict(page_table=pt, check_values=True), f"page_table[0, 2]={kc.shape[0] + 5} outside"),
        (dict(num_splits=0), "num_splits=0 must be an int (not a bool), a power of two in 1..256"),
        (dict(num_splits=True), "num_splits=True must be an int (not a bool)"),
        (dict(num_splits=4.0), "num_splits=4.0 must be an int (not a bool)"),
        (dict(block_n=0), "block_n=0 must be an int (not a bool), a power of two >= 16"),
        (dict(block_n=16.0), "block_n=16.0 must be an int (not a bool)"),
        (dict(sm_scale="0.5"), "sm_scale='0.5' must be a finite float > 0"),
        (dict(sm_scale=float("nan")), "sm_scale=nan must be a finite float > 0"),
        (dict(sm_scale=0.0), "sm_scale=0.0 must be a finite float > 0"),
    ]


@pytest.mark.parametrize("case", range(len(_error_cases()[1])))
@pytest.mark.interpreter
def test_decode_attention_bad_input_raises_typed_error(case):
    """Each refusal names the value; nothing is written to a given out (NaN-poisoned before the call)."""
    base, cases = _error_cases()
    change, msg = cases[case]
    args = {**base, **change}
    if "out" not in change:
        args["out"] = poison(torch.empty_like(base["q"]))
    with pytest.raises(StepContractError, match=re.escape(msg)):
        decode_attention(**args)
    if "out" not in change:
        assert args["out"].isnan().all(), "nothing may be written on bad input"


@pytest.mark.interpreter
def test_decode_attention_unknown_pdl_trigger_raises_before_writing():
    base, _ = _error_cases()
    out = poison(torch.empty_like(base["q"]))
    with pytest.raises(ValueError, match=re.escape("pdl_trigger='late'; expected one of ('after_kv', 'start')")):
        decode_attention(**base, out=out, pdl_trigger="late")
    assert out.isnan().all(), "nothing may be written on bad input"


@pytest.mark.parametrize("trigger", ["after_kv", "start"])
@pytest.mark.interpreter
def test_decode_attention_passes_pdl_trigger_to_the_kernel(monkeypatch, trigger):
    """The wrapper's pdl_trigger reaches the kernel as TRIGGER_AFTER_KV under PDL (the launch recorded by a
    stand-in kernel: the interpreter runs no PDL, and the arithmetic is the same either way)."""
    from lowlat.kernels import decode_attention as da

    seen = []

    class Recorder:
        def __getitem__(self, grid):
            return lambda *args, **kw: seen.append(kw)

    base, _ = _error_cases()
    monkeypatch.setattr(da, "_decode_attention_kernel", Recorder())
    monkeypatch.setattr(da, "pdl_supported", lambda device: True)
    da.decode_attention(**base, use_pdl=True, pdl_trigger=trigger)
    da.decode_attention(**base, use_pdl=False, pdl_trigger=trigger)
    assert [kw["USE_PDL"] for kw in seen] == [True, False]
    assert seen[0]["TRIGGER_AFTER_KV"] == (trigger == "after_kv") and seen[0]["launch_pdl"] is True
    assert seen[1]["TRIGGER_AFTER_KV"] is True and "launch_pdl" not in seen[1]   # one specialization without PDL


def _sm90_spec(*, after=True, pre_kv=False):
    """decode attention's compile spec as a PDL launch specialises it (SmolLM2's heads, up to 16 rows)."""
    from lowlat.kernels.decode_attention import COMBINE_CHUNK

    return {"constexprs": dict(G=3, G_PAD=16, D=64, BLOCK_N=64, MAX_SPLITS=32, GROUPS=32, CHUNK=COMBINE_CHUNK,
                               NVR_FROM_PTR=True, PRE_KV=pre_kv, LOC_PAD=16, USE_PDL=True, TRIGGER_AFTER_KV=after,
                               INTERP=False),
            "pointers": dict(q_ptr="*bf16", kc_ptr="*bf16", vc_ptr="*bf16", pt_ptr="*i32", req_ptr="*i32",
                             pos_ptr="*i64", nvr_ptr="*i32", loc_ptr="*i32", o_ptr="*bf16", wso_ptr="*fp32",
                             wsml_ptr="*fp32", cnt_ptr="*i32"),
            "scalars": {"qk_scale": "fp32"}, "launch_pdl": True, "ptx": True,
            "divisible": ["stride_qm", "stride_qh", "stride_kcs", "stride_kch", "stride_vcs", "stride_vch",
                          "stride_om", "stride_oh"]}


def test_decode_attention_pdl_trigger_sits_where_asked_in_the_sm90_ptx():
    """Compiled for sm_90 (on the CPU, as the launch specialises it): "after_kv" releases the next launch after
    the KV loop's tensor-core products and before the split-K arrival (the atomic), "start" right after the
    wait, before any product; both fit as many programs on an SM (shared memory equal, registers within what
    rounds to the same residency), so moving the trigger leaves the packing unchanged (session 13: the early
    release let out_proj pack)."""
    from sampling_stats import compile_sm90

    from lowlat.kernels.sm90_check import programs_per_sm

    after, start = compile_sm90("lowlat.kernels.decode_attention:_decode_attention_kernel",
                                [_sm90_spec(after=True), _sm90_spec(after=False)])
    for name, info in (("after_kv", after), ("start", start)):
        ptx = info["ptx"]
        assert ptx.count("griddepcontrol.launch_dependents") == 1 and ptx.count("griddepcontrol.wait") == 1, name
        assert "mma.sync" in ptx or "wgmma" in ptx, name
    pos = {name: {k: info["ptx"].find(k) for k in ("griddepcontrol.wait", "griddepcontrol.launch_dependents",
                                                     "mma", "atom.")}
           for name, info in (("after_kv", after), ("start", start))}
    a, s = pos["after_kv"], pos["start"]
    last_mma = after["ptx"].rfind("mma")            # the loop's last product (its first block may be peeled)
    assert a["griddepcontrol.wait"] < a["mma"] <= last_mma < a["griddepcontrol.launch_dependents"] < a["atom."], a
    assert s["griddepcontrol.wait"] < s["griddepcontrol.launch_dependents"] < s["mma"], s
    assert after["shared"] == start["shared"], (after, start)
    assert programs_per_sm(after["registers"], after["shared"], 4) == programs_per_sm(start["registers"],
                                                                                      start["shared"], 4), (after, start)


def test_decode_attention_pre_kv_loads_the_first_block_before_the_wait_in_the_sm90_ptx():
    """Without out_cache_loc nothing is read before `griddepcontrol.wait`; with it (PRE_KV) the positions, page
    table, out_cache_loc and the first block's K / V tiles (vector loads) are, the same vector loads are issued
    again after the wait (the slots the previous launch wrote), and no tensor-core product or store precedes
    the wait. Both compile without spills."""
    from sampling_stats import compile_sm90

    plain, pre = compile_sm90("lowlat.kernels.decode_attention:_decode_attention_kernel",
                              [_sm90_spec(pre_kv=False), _sm90_spec(pre_kv=True)])
    for name, info in (("plain", plain), ("pre_kv", pre)):
        assert info["spill_bytes"] == 0 and info["ptx"].count("griddepcontrol.wait") == 1, (name, info)
    head, _, tail = plain["ptx"].partition("griddepcontrol.wait")
    assert "ld.global" not in head, "without out_cache_loc every load follows the wait"
    head, _, tail = pre["ptx"].partition("griddepcontrol.wait")
    before = head.count("ld.global.v4")
    assert before >= 2 and "mma" not in head and "st.global" not in head and "atom." not in head, before
    reload = tail[:tail.find("mma")]
    assert reload.count("ld.global.v4") >= before, "the K / V tiles of the written slots are loaded again"


# ----------------------------------------------------------------------------- GPU (full shapes)
#: (Hq, Hkv, D): GQA 1 (Llama-2-7B-like heads), 3 (SmolLM2), 4 (Llama-3.2-1B), 2 (Qwen3-0.6B), 8 (Qwen3-30B-A3B)
GPU_SHAPES = [(8, 8, 64), (9, 3, 64), (32, 8, 64), (16, 8, 128), (32, 4, 128)]
EDGES = [0, 1, 62, 63, 64, 127, 128, 2047, 2048, 4094, 4095]


@pytest.mark.gpu
@given(shape=st.sampled_from(GPU_SHAPES),
       ctxs=st.lists(st.one_of(st.sampled_from(EDGES), st.integers(0, 4095)), min_size=1, max_size=16),
       verify=st.integers(1, 3), pad=st.integers(0, 4), seed=st.integers(0, 2**16))
def test_decode_attention_model_shapes_within_2x_baseline_error(device, shape, ctxs, verify, pad, seed):
    hq, hkv, d = shape
    rows = [verify] * len(ctxs)
    while sum(rows) + pad > 48:
        rows.pop()
    ctxs = ctxs[:len(rows)]
    while sum(ctxs) > 24576:            # bound the test's own memory and time
        ctxs[ctxs.index(max(ctxs))] //= 2
    step, q, kc, vc = _case(ctxs=ctxs, rows=rows, hq=hq, hkv=hkv, d=d, pad=pad, seed=seed, device=device)
    _check(q, kc, vc, step, per_row=True)


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(9, 3, 64), (32, 8, 128)])
def test_decode_attention_bitwise_deterministic_row_invariant_pdl_and_graph(device, shape, monkeypatch):
    """Run-to-run bitwise; a row's output identical alone, among 48 rows and with padding; PDL on (either
    pdl_trigger, with and without out_cache_loc) == off; split_groups 32 / 16 / 4 / 2 / 1 == the default; kv_stages
    1 / 2 / 5 / 7 at split_groups 32 / 4 / 1 == the default; a CUDA-graph replay (num_valid_rows as a device tensor,
    out_cache_loc given, as FusedModel launches it) == eager."""
    hq, hkv, d = shape
    ctxs = [(613 * i) % 4096 for i in range(22)] + [4095, 2047, 64]
    rows = [1] * 20 + [3] * 5
    step, q, kc, vc = _case(ctxs=ctxs, rows=rows, hq=hq, hkv=hkv, d=d, pad=48 - sum(rows), seed=1, device=device)
    ws = make_decode_workspace(48, hq, hkv, d, device)
    loc = step.out_cache_loc
    outs = [_kernel(q, kc, vc, step, workspace=ws, use_pdl=pdl, pdl_trigger=trigger, out_cache_loc=where, pre_kv=pre)
            for pdl, trigger, where, pre in ((False, "after_kv", None, None), (False, "after_kv", None, None),
                                             (True, "after_kv", None, None), (True, "start", None, None),
                                             (True, "after_kv", loc, True), (True, "start", loc, True),
                                             (False, "after_kv", loc, True), (True, "after_kv", loc, None))]
    for o in outs[1:]:
        check_bitwise("decode_attention", o, outs[0], output="run_to_run_and_pdl")
    from lowlat.kernels import decode_attention as da

    for chunk in (1, 8):                          # the combine's loads per round trip move no arithmetic
        monkeypatch.setattr(da, "COMBINE_CHUNK", chunk)
        check_bitwise("decode_attention", _kernel(q, kc, vc, step, workspace=ws, use_pdl=True), outs[0],
                      output=f"combine_chunk_{chunk}")
    monkeypatch.undo()
    for groups in (32, 16, 4, 2, 1):              # nor does running several splits in one program (1-32 splits here)
        for pdl, where, pre in ((False, None, None), (True, loc, groups == 32 or None), (True, None, None)):
            got = _kernel(q, kc, vc, step, workspace=ws, use_pdl=pdl, out_cache_loc=where, pre_kv=pre,
                          split_groups=groups)
            check_bitwise("decode_attention", got, outs[0], output=f"split_groups_{groups}_pdl_{pdl}_pre_kv_{pre}")
    for stages in (1, 2, 5, 7):                   # nor does the KV loop's pipeline depth
        for groups in (32, 4, 1):
            got = _kernel(q, kc, vc, step, workspace=ws, use_pdl=True, split_groups=groups, kv_stages=stages,
                          out_cache_loc=loc if groups == 32 else None, pre_kv=groups == 32 or None)
            check_bitwise("decode_attention", got, outs[0], output=f"kv_stages_{stages}_split_groups_{groups}")
    oracle, baseline = _reference(q, kc, vc, step, per_row=True)
    check_accuracy("decode_attention", outs[0], oracle, baseline)
    n = step.num_valid_rows
    for i in (0, 5, 21, n - 1):
        idx = torch.tensor([i], device=device)
        one = StepBatch(step.input_ids[idx], step.positions[idx], step.out_cache_loc[idx], step.req_indices[idx],
                        step.seq_lens, step.page_table, 1)
        check_bitwise("decode_attention", _kernel(q[idx], kc, vc, one, workspace=ws)[0], outs[0][i],
                      output="row_invariance")
    nvr = torch.tensor([n], dtype=torch.int32, device=device)
    out = torch.empty_like(q)

    def call():
        decode_attention(q, kc, vc, step.page_table, step.req_indices, step.positions, nvr, out=out,
                         out_cache_loc=step.out_cache_loc, workspace=ws, use_pdl=True)

    call()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        call()
    poison(out)
    graph.replay()
    torch.cuda.synchronize()
    check_bitwise("decode_attention", out, outs[0], output="cuda_graph")
    assert int(ws.counters.abs().sum()) == 0, "split counters must be reset by the last arriver"


@pytest.mark.gpu
def test_decode_attention_pre_kv_under_pdl_reads_a_late_writers_slots(device):
    """The race for real: a writer launch (standing in for the attention prologue) releases its dependents at
    once, spins 20 ms (far longer than the host takes to launch the attention, even with every xdist worker busy:
    session 15's 2 ms let the control below fail once under `-n 8`), then writes q and the step's own KV slots
    (out_cache_loc); the attention, launched with PDL and out_cache_loc, loads its first blocks meanwhile. Its output must equal, bitwise, the attention over
    what the writer wrote (contexts 0-2000: one split, several, a first block holding a verify row's own
    slots). With an out_cache_loc that names none of the written slots the output must differ: proof that the
    attention did start before the writer finished, so that the first check could fail."""
    from lowlat.kernels._attn_common import pdl_supported

    if not pdl_supported(torch.device(device)):
        pytest.skip("needs PDL (sm_90)")
    import triton
    import triton.language as tl

    from lowlat.comm.ordered_reduce import _globaltimer

    @triton.jit
    def late_writer(q_src, q_dst, k_src, v_src, kc_ptr, vc_ptr, loc_ptr, n, delay_ns, QE: tl.constexpr,
                    KE: tl.constexpr, QB: tl.constexpr, KB: tl.constexpr):
        i = tl.program_id(0)
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
        lanes = tl.arange(0, 32)
        t0 = _globaltimer(lanes)
        while _globaltimer(lanes) - t0 < delay_ns:
            pass
        qe = tl.arange(0, QB)
        tl.store(q_dst + i * QE + qe, tl.load(q_src + i * QE + qe, mask=qe < QE), mask=qe < QE)
        if i < n:
            ke = tl.arange(0, KB)
            slot = tl.load(loc_ptr + i).to(tl.int64)
            tl.store(kc_ptr + slot * KE + ke, tl.load(k_src + i * KE + ke, mask=ke < KE), mask=ke < KE)
            tl.store(vc_ptr + slot * KE + ke, tl.load(v_src + i * KE + ke, mask=ke < KE), mask=ke < KE)

    hq, hkv, d = 9, 3, 64
    step, q, kc, vc = _case(ctxs=[5, 300, 0, 2000, 64, 61], rows=[2, 3, 1, 6, 1, 4], hq=hq, hkv=hkv, d=d, pad=3,
                            seed=7, device=device)
    n, m = step.num_valid_rows, step.num_rows
    loc = step.out_cache_loc[:n].long()
    fresh_q, fresh_k, fresh_v = q.clone(), kc[loc].clone(), vc[loc].clone()
    ws = make_decode_workspace(m, hq, hkv, d, device)
    expected = _kernel(q, kc, vc, step, workspace=ws)
    gen = torch.Generator(device=device).manual_seed(5)

    def race(where):
        q.copy_(torch.randn(q.shape, generator=gen, device=device).bfloat16() * 4)
        kc[loc] = torch.randn(fresh_k.shape, generator=gen, device=device).bfloat16() * 4
        vc[loc] = torch.randn(fresh_v.shape, generator=gen, device=device).bfloat16() * 4
        out = poison(torch.empty_like(q))
        torch.cuda.synchronize()
        late_writer[(m,)](fresh_q, q, fresh_k, fresh_v, kc, vc, step.out_cache_loc, n, 20_000_000, QE=hq * d,
                          KE=hkv * d, QB=triton.next_power_of_2(hq * d), KB=triton.next_power_of_2(hkv * d))
        decode_attention(q, kc, vc, step.page_table, step.req_indices, step.positions, step.num_valid_rows,
                         out_cache_loc=where, pre_kv=True, out=out, workspace=ws, use_pdl=True)
        torch.cuda.synchronize()
        return out

    for _ in range(3):
        check_bitwise("decode_attention", race(step.out_cache_loc), expected, output="pre_kv_late_writer")
    assert not torch.equal(race(torch.zeros_like(step.out_cache_loc)), expected), \
        "the attention did not start before the writer finished: the race was not exercised"
    assert int(ws.counters.abs().sum()) == 0
