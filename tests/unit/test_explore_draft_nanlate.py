"""explore48's nan_late form of the draft sampler (bench/explore/explore48.py) against production: every output bitwise
the same, on finite rows and on rows whose logits hold NaN or +-inf, in every sampling mode of the general launch
(greedy rows among sampled ones, temperature, top-k, top-k + top-p). A difference would make its timing
meaningless. On the CPU under the interpreter; on a GPU runner on the GPU."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from lowlat.kernels import draft_sampling as production
from lowlat.numerics import check_bitwise

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench" / "explore"))
import explore48  # noqa: E402

#: (temperature, top_k, top_p) of 5 rows: a greedy row among sampled ones in each launch mode
MODES = {
    "temperature": ([0.0, 0.8, 1.5, 0.9, 1.0], [0] * 5, [1.0] * 5),
    "top_k": ([0.7, 0.0, 1.2, 1.0, 0.5], [3, 0, 5, 1, 4], [1.0] * 5),
    "top_k_top_p": ([0.8, 1.5, 0.0, 0.9, 1.1], [4, 6, 0, 3, 8], [0.9, 0.5, 1.0, 0.7, 0.95]),
}


@pytest.fixture(scope="module")
def nanlate():
    return explore48.load_nanlate()


def inputs(source: str, device):
    """h [5, 32], W [200, 32] bf16 (multiples of 1/8: exact logits), with NaN / inf planted per `source`."""
    g = torch.Generator().manual_seed(48)
    hh = (torch.randint(-4, 5, (5, 32), generator=g) * 0.125).to(torch.bfloat16)
    ww = (torch.randint(-4, 5, (200, 32), generator=g) * 0.125).to(torch.bfloat16)
    if source == "nan_weight":          # NaN logits in every row (ids 70, 130: two tiles)
        ww[130, 7] = float("nan")
        ww[70, 3] = float("nan")
    elif source == "inf_hidden":        # rows 1 and 3: +-inf logits, NaN where a weight is 0
        hh[1, 4] = float("inf")
        hh[3, 9] = float("inf")
    elif source == "inf_weight":        # every row's largest logit +inf
        hh = hh.abs() + 0.125
        ww[150] = float("inf")
        ww[20] = float("-inf")
    seeds = torch.randint(0, 2 ** 62, (5,), generator=g)
    offsets = torch.randint(0, 2 ** 40, (5,), generator=g)
    return hh.to(device), ww.to(device), seeds.to(device), offsets.to(device)


def test_nanlate_edits_apply_once():
    src = explore48.PRODUCTION.read_text()
    edited = explore48.nanlate_source(src)
    assert edited != src and "nan_row" in edited
    with pytest.raises(ValueError, match="occurs 0 times"):
        explore48.nanlate_source(edited)          # applied twice: the first edit's text is gone


@pytest.mark.filterwarnings("ignore::RuntimeWarning")   # numpy (interpreter) warns on the NaN / inf it is fed
@pytest.mark.parametrize("source", ["finite", "nan_weight", "inf_hidden", "inf_weight"])
@pytest.mark.parametrize("mode", list(MODES))
def test_nanlate_outputs_equal_production_bitwise(nanlate, mode, source, device):
    hh, ww, seeds, offsets = inputs(source, device)
    temp, topk, topp = MODES[mode]
    outs = []
    for mod in (production, nanlate):
        out = mod.draft_sample(hh, ww, temp, topk, topp, seeds=seeds, offsets=offsets, block_v=64)
        outs.append(out)
    a, b = outs
    assert not a.one_hot and not b.one_hot
    for name in ("tokens", "logits", "lse", "cut_value", "cut_id"):
        x, y = getattr(a, name), getattr(b, name)
        if x.is_floating_point():          # NaN where production has NaN, the same bits elsewhere
            assert torch.equal(x.isnan(), y.isnan()), f"{name}: NaN positions differ"
            x, y = x.nan_to_num(7.0), y.nan_to_num(7.0)
        check_bitwise("draft_sampling", y, x, output=f"{name}_{mode}_{source}")
    if source != "finite":
        assert bool(a.lse.isnan().any()) or bool(a.cut_value.isnan().any()), "no non-finite row reached the final"
