"""Properties of the reference paged attention (lowlat/reference/attention.py)."""

import torch
from hypothesis import given
from hypothesis import strategies as st

from lowlat.numerics import check_accuracy, check_bitwise
from lowlat.reference.attention import paged_attention, write_kv
from lowlat.testing import random_step

HKV, D = 2, 16


def _attend(case, q, k_new, v_new):
    s = case.step
    kc, vc = case.k_cache.clone(), case.v_cache.clone()
    write_kv(kc, vc, k_new, v_new, s.out_cache_loc, s.num_valid_rows)
    return paged_attention(q, kc, vc, s.page_table, s.req_indices, s.positions, s.num_valid_rows), kc, vc


def _qkv(m, group, g, dtype=torch.bfloat16):
    q = torch.randn(m, HKV * group, D, generator=g).to(dtype)
    return q, torch.randn(m, HKV, D, generator=g).to(dtype), torch.randn(m, HKV, D, generator=g).to(dtype)


@given(ctx=st.integers(0, 40), k=st.integers(1, 7), group=st.sampled_from([1, 3, 4]), seed=st.integers(0, 2**16))
def test_verify_rows_equal_successive_decode_steps(ctx, k, group, seed):
    """k+1 verify-causal rows in one step == k+1 single-row decode steps, row by row."""
    g = torch.Generator().manual_seed(seed)
    case = random_step(ctx_lens=[ctx], new_rows=[k], num_kv_heads=HKV, head_dim=D, generator=g)
    q, kn, vn = _qkv(k, group, g, torch.float64)
    case.k_cache, case.v_cache = case.k_cache.double(), case.v_cache.double()
    verify, _, _ = _attend(case, q, kn, vn)
    kc, vc, s = case.k_cache.clone(), case.v_cache.clone(), case.step
    for j in range(k):
        one = slice(j, j + 1)
        write_kv(kc, vc, kn[one], vn[one], s.out_cache_loc[one], 1)
        row = paged_attention(q[one], kc, vc, s.page_table, s.req_indices[one], s.positions[one], 1)
        check_accuracy("paged_attention", verify[one], row, None, output="verify_vs_decode", dtype=torch.float32)


@given(ctxs=st.lists(st.integers(0, 30), min_size=1, max_size=4), seed=st.integers(0, 2**16))
def test_shuffled_kv_slots_equal_contiguous_slots(ctxs, seed):
    """The result depends on the page table's contents, not on where the slots lie."""
    rows = [1 + (c % 3) for c in ctxs]
    outs = []
    for contiguous in (True, False):
        g = torch.Generator().manual_seed(seed)
        case = random_step(ctx_lens=ctxs, new_rows=rows, num_kv_heads=HKV, head_dim=D, generator=g,
                           contiguous=contiguous)
        # same cached values in position order whatever the slots: rewrite them from one stream
        g2 = torch.Generator().manual_seed(seed + 1)
        for r, c in enumerate(ctxs):
            slots = case.step.page_table[r, :c].long()
            case.k_cache[slots] = torch.randn(c, HKV, D, generator=g2).bfloat16()
            case.v_cache[slots] = torch.randn(c, HKV, D, generator=g2).bfloat16()
        q, kn, vn = _qkv(case.step.num_rows, 2, torch.Generator().manual_seed(seed + 2))
        outs.append(_attend(case, q, kn, vn)[0])
    check_bitwise("paged_attention", outs[0], outs[1], output="shuffled_vs_contiguous")


@given(ctxs=st.lists(st.integers(0, 20), min_size=1, max_size=3), pad=st.integers(1, 6), seed=st.integers(0, 2**16))
def test_padding_rows_change_no_valid_output_and_write_no_real_slot(ctxs, pad, seed):
    g = torch.Generator().manual_seed(seed)
    rows = [1] * len(ctxs)
    case = random_step(ctx_lens=ctxs, new_rows=rows, num_kv_heads=HKV, head_dim=D, generator=g,
                       pad_to=len(ctxs) + pad)
    m, n = case.step.num_rows, case.step.num_valid_rows
    q, kn, vn = _qkv(m, 2, g)
    q[n:], kn[n:], vn[n:] = 1e4, 1e4, -1e4          # hostile padding rows: finite, visible if stored
    out, kc, vc = _attend(case, q, kn, vn)
    unpadded = random_step(ctx_lens=ctxs, new_rows=rows, num_kv_heads=HKV, head_dim=D,
                           generator=torch.Generator().manual_seed(seed))
    ref, _, _ = _attend(unpadded, q[:n], kn[:n], vn[:n])
    check_bitwise("paged_attention", out[:n], ref, output="padding_invariance")
    assert torch.equal(out[n:], torch.zeros_like(out[n:])), "padding rows must output 0"
    loc = case.step.out_cache_loc[:n].long()
    check_bitwise("write_kv", kc[loc], kn[:n], output="k_at_out_cache_loc")
    check_bitwise("write_kv", vc[loc], vn[:n], output="v_at_out_cache_loc")
    untouched = torch.ones(kc.shape[0], dtype=torch.bool)
    untouched[loc] = False
    untouched[0] = False                              # the dummy slot: padding rows may write it
    for new, old in ((kc, case.k_cache), (vc, case.v_cache)):
        assert torch.equal(new[untouched].nan_to_num(7.0), old[untouched].nan_to_num(7.0)), \
            "a KV slot other than the valid rows' and the dummy slot was written"


def test_unowned_nan_slots_are_never_read():
    """random_step fills every slot no request owns (and slot 0) with NaN; outputs stay finite."""
    g = torch.Generator().manual_seed(3)
    case = random_step(ctx_lens=[0, 5, 17], new_rows=[1, 6, 1], num_kv_heads=HKV, head_dim=D, generator=g,
                       num_slots=64, max_ctx=40)
    case.step.page_table[:, 30:] = 0          # columns past seq_len point at the NaN dummy slot
    q, kn, vn = _qkv(case.step.num_rows, 4, g)
    out, _, _ = _attend(case, q, kn, vn)
    assert torch.isfinite(out).all()
