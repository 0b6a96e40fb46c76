"""explore49's decode attention with the QK-norm and RoPE inside (bench/explore/explore49.py) against the reference
chain: raw q / K / V (bf16) -> per-head RMSNorm with q_norm / k_norm (`reference.rms_norm`) -> RoPE
(`reference.rope`) -> `write_kv` -> `paged_attention`. The variant gets the raw q and a cache whose new slots (this
step's out_cache_loc) hold the raw K; its output must be within the numerics policy (lowlat/numerics.py, the bf16
default: 2x the bf16 reference chain's error against the same chain in float64, plus half a bf16 ulp; nothing
loosened: the variant rounds less than the bf16 chain, once to bf16 after the fp32 transform as the production
prologue does). Then the write-back launch (`k_writeback`) must leave the new slots within the same policy of the
float64 K, and every other K slot and all of V bitwise as they were (the attention launch writes no cache slot).
Outputs are NaN-poisoned before each launch (check_accuracy fails on NaN); unowned slots hold NaN (random_step).

Cases (CPU interpreter, tiny shapes, BLOCK_N 16, 4 splits so contexts up to ~200 cross block and split edges): GQA
1 and 4, D 64 and 128, verify rows of one request (consecutive positions, several new slots, read by its later rows)
beside decode requests, contexts 0..~200, padding rows, rows of a request out of position order and interleaved
with other requests' (num_valid_rows a device tensor there), with and without the early-KV path (pre_kv). The
edited module without qk_norm is bitwise production.

Mutation-checked (session 36, each an edit to explore49.py's source text, then this file run; 12 passed unmutated,
about 10 s on a 2-core CPU): q used without its transform (the "q" edit's `if QK_NORM:` -> `if False:`), the new
positions' K used raw (`cut = end` and the `_attend_fresh` tail loops off), one old position transformed as new
(`cut` from new_start - 1): each fails all 10 attention cases (a one-row case at ctx 100 let the last two pass, so
it runs at ctx 20). Added in review (14 passed unmutated): new_start taken from the request's first row in row order
instead of its least position, or the write-back reading num_valid_rows from the int argument when given a tensor
(`nvr = nvr_int`): each fails only the two out-of-order cases; new_start over padding rows too (`lok = li < M`)
fails the four padded cases and those two.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import pytest
import torch

from lowlat.config import preset
from lowlat.kernels import decode_attention as production
from lowlat.kernels.attn_prologue import rope_table
from lowlat.numerics import check_accuracy, check_bitwise, poison
from lowlat.reference.attention import paged_attention, write_kv
from lowlat.reference.rms_norm import rms_norm
from lowlat.reference.rope import apply_rope, rope_cos_sin, rope_inv_freq
from lowlat.testing import random_step

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench" / "explore"))
import explore49  # noqa: E402

EPS = 1e-6
THETA = 10000.0          # more rotation at short positions than Qwen3's 1e6
MAX_POS = 512


@pytest.fixture(scope="module")
def variant():
    return explore49.load_variant()


def _case(*, ctxs, rows, group, hkv, d, pad, seed, device, order=None):
    """(step, raw q [M, Hq, D], raw k / v [M, Hkv, D], q_norm, k_norm [D], cache K / V [S, Hkv, D]) bf16: random,
    never zero (raw K with an offset and scale, norm weights around 1). order: the valid rows in this order (a
    permutation of 0..n-1: a request's rows out of position order, requests interleaved)."""
    g = torch.Generator().manual_seed(seed)
    case = random_step(ctx_lens=ctxs, new_rows=rows, num_kv_heads=hkv, head_dim=d, pad_to=sum(rows) + pad,
                       generator=g)
    m = case.step.num_rows
    q = (torch.randn(m, group * hkv, d, generator=g) * 2 + 0.3).bfloat16()
    k = (torch.randn(m, hkv, d, generator=g) * 3 - 0.5).bfloat16()
    v = torch.randn(m, hkv, d, generator=g).bfloat16()
    qn = (1 + 0.3 * torch.randn(d, generator=g)).bfloat16()
    kn = (1 + 0.3 * torch.randn(d, generator=g)).bfloat16()
    step = case.step
    if order is not None:
        idx = torch.tensor(list(order) + list(range(len(order), m)))
        step = dataclasses.replace(step, input_ids=step.input_ids[idx], positions=step.positions[idx],
                                   out_cache_loc=step.out_cache_loc[idx], req_indices=step.req_indices[idx])
        q, k, v = q[idx], k[idx], v[idx]
    return step, q, k, v, qn, kn, case.k_cache, case.v_cache


def _reference(step, q, k, v, qn, kn, kc, vc, dtype):
    """(attention output, final K [n, Hkv, D]) of the reference chain in `dtype` (bf16: the baseline; float64: the
    oracle, on the same bf16 values)."""
    n = step.num_valid_rows
    inv = rope_inv_freq(q.shape[-1], THETA, None, torch.float64 if dtype == torch.float64 else torch.float32)
    cos, sin = rope_cos_sin(step.positions, inv, dtype)
    qf = apply_rope(rms_norm(q.to(dtype), qn.to(dtype), EPS), cos, sin)
    kf = apply_rope(rms_norm(k.to(dtype), kn.to(dtype), EPS), cos, sin)
    kcr, vcr = kc.to(dtype), vc.to(dtype)
    write_kv(kcr, vcr, kf, v.to(dtype), step.out_cache_loc, n)
    out = paged_attention(qf, kcr, vcr, step.page_table, step.req_indices, step.positions, n)
    return out, kf[:n]


def _run(variant, device, *, pre_kv, nvr_tensor=False, **kw):
    step, q, k, v, qn, kn, kc, vc = _case(device=device, **kw)
    n, d = step.num_valid_rows, q.shape[-1]
    nvr = torch.tensor([n], dtype=torch.int32, device=device) if nvr_tensor else n
    oracle, k64 = _reference(step, q, k, v, qn, kn, kc, vc, torch.float64)
    baseline, k16 = _reference(step, q, k, v, qn, kn, kc, vc, torch.bfloat16)
    kcv, vcv = kc.clone(), vc.clone()
    write_kv(kcv, vcv, k, v, step.out_cache_loc, n)                 # the prologue's writes: raw K, final V
    step = step.to(device)
    kcv, vcv = kcv.to(device), vcv.to(device)
    kc_before, vc_before = kcv.clone(), vcv.clone()
    table = rope_table(preset("Qwen3-30B-A3B").replace(head_dim=d, rope_theta=THETA), MAX_POS, device)
    qk = (qn.to(device), kn.to(device), table, EPS)
    out = poison(torch.empty(q.shape, dtype=torch.bfloat16, device=device))
    got = variant.decode_attention(q.to(device), kcv, vcv, step.page_table, step.req_indices, step.positions, nvr,
                                   out=out, num_splits=4, block_n=16, qk_norm=qk,
                                   out_cache_loc=step.out_cache_loc if pre_kv else None, pre_kv=pre_kv)
    assert got is out
    check_accuracy("explore49_attention", out, oracle, baseline)
    assert torch.equal(out[n:], torch.zeros_like(out[n:])), "padding rows must output 0"
    # the attention launch writes no cache slot (bits, NaN slots included)
    assert torch.equal(kcv.view(torch.int16), kc_before.view(torch.int16))
    assert torch.equal(vcv.view(torch.int16), vc_before.view(torch.int16))
    variant.k_writeback(kcv, step.out_cache_loc, step.positions, nvr, qk[1], table, EPS)
    loc = step.out_cache_loc[:n].long()
    check_accuracy("explore49_writeback", kcv[loc], k64, k16, output="k_cache")
    keep = torch.ones(kcv.shape[0], dtype=torch.bool, device=device)
    keep[loc] = False
    assert torch.equal(kcv[keep].view(torch.int16), kc_before[keep].view(torch.int16)), "write-back touched old K"
    assert torch.equal(vcv.view(torch.int16), vc_before.view(torch.int16))
    return step, q, kcv, vcv


CASES = {
    # verify rows of one request (4 rows, ctx 37) beside a decode request with no cached token; a padding row
    "gqa1_d64_verify": dict(ctxs=[37, 0], rows=[4, 1], group=1, hkv=2, d=64, pad=1, seed=1),
    # GQA 4, D 128: verify rows across a split edge (ctx 190: 12-13 blocks of 16, splits of 4 blocks) + decode
    "gqa4_d128_long": dict(ctxs=[190, 15], rows=[3, 1], group=4, hkv=1, d=128, pad=2, seed=2),
    # six decode / verify rows over three requests, new slots on block edges (ctx 16, 63)
    "gqa4_d64_six_rows": dict(ctxs=[16, 63, 5], rows=[2, 1, 3], group=4, hkv=1, d=64, pad=0, seed=3),
    # five verify rows whose new positions cross a block edge (14..18), a decode row at ctx 200 (4 splits of 4 blocks)
    "gqa4_d64_verify_block_edge": dict(ctxs=[14, 200], rows=[5, 1], group=4, hkv=2, d=64, pad=0, seed=5),
    # one decode row (the fused model's 1-row step)
    "gqa1_d128_one_row": dict(ctxs=[20], rows=[1], group=1, hkv=1, d=128, pad=0, seed=4),
    # the rows of two verify requests out of position order and interleaved (the new positions of a request start
    # at its least position, not at its first row's), a decode request between them; num_valid_rows a device tensor
    # (the fused model's) for the attention and the write-back; two padding rows
    "gqa4_d64_rows_out_of_order": dict(ctxs=[30, 9, 45], rows=[3, 1, 2], group=4, hkv=1, d=64, pad=2, seed=6,
                                       order=[2, 4, 0, 5, 3, 1], nvr_tensor=True),
}


@pytest.mark.parametrize("pre_kv", [False, True])
@pytest.mark.parametrize("name", list(CASES))
def test_qknorm_attention_and_writeback_within_policy(variant, device, name, pre_kv):
    _run(variant, device, pre_kv=pre_kv, **CASES[name])


def test_variant_without_qk_norm_is_production_bitwise(variant, device):
    step, q, k, v, _, _, kc, vc = _case(device=device, **CASES["gqa1_d64_verify"])
    n = step.num_valid_rows
    write_kv(kc, vc, k, v, step.out_cache_loc, n)
    step, q, kc, vc = step.to(device), q.to(device), kc.to(device), vc.to(device)
    outs = []
    for mod in (production, variant):
        outs.append(mod.decode_attention(q, kc, vc, step.page_table, step.req_indices, step.positions, n,
                                         out=poison(torch.empty_like(q)), num_splits=4, block_n=16))
    check_bitwise("explore49_attention", outs[1], outs[0], output="no_qk_norm")


def test_edits_apply_once():
    src = explore49.PRODUCTION.read_text()
    edited = explore49.qknorm_source(src)
    assert edited != src and "_attend_fresh" in edited
    with pytest.raises(ValueError, match="occurs 0 times"):
        explore49.qknorm_source(edited)
