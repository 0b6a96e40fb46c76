"""Bad input to a step gets a typed error naming the offending value, and nothing is written."""

import dataclasses

import pytest
import torch

from lowlat.errors import StepContractError
from lowlat.reference.model import ReferenceModel
from lowlat.step import MAX_ROWS
from lowlat.testing import random_step, split_rows, tiny_config
from lowlat.weights import random_model_weights

CFG = tiny_config(vocab_size=128)
MODEL = ReferenceModel(CFG, random_model_weights(CFG, seed=0))


def _case(**kw):
    return random_step(ctx_lens=[4, 2], new_rows=[1, 3], num_kv_heads=CFG.num_kv_heads, head_dim=CFG.head_dim,
                       vocab_size=CFG.vocab_size, pad_to=6, max_ctx=8, generator=torch.Generator().manual_seed(0), **kw)


def _bad(field, value):
    case = _case()
    return case, dataclasses.replace(case.step, **{field: value})


ERROR_CASES = [
    ("input_ids", lambda s: s.input_ids.int(), "input_ids must be torch.int64"),
    ("positions", lambda s: s.positions[:3], "positions has 3 rows"),
    ("page_table", lambda s: s.page_table[0], "page_table must be 2-D"),
    ("input_ids", lambda s: s.input_ids.clone().index_fill_(0, torch.tensor([1]), 128), r"input_ids\[1\]=128"),
    ("input_ids", lambda s: s.input_ids.clone().index_fill_(0, torch.tensor([0]), -3), r"input_ids\[0\]=-3"),
    ("positions", lambda s: s.positions.clone().index_fill_(0, torch.tensor([0]), 5), r"positions\[0\]=5 is beyond"),
    ("seq_lens", lambda s: s.seq_lens.clone().index_fill_(0, torch.tensor([0]), 9), r"seq_lens\[0\]=9"),
    ("out_cache_loc", lambda s: s.out_cache_loc.clone().index_fill_(0, torch.tensor([3]), 0), r"out_cache_loc\[3\]=0"),
    ("out_cache_loc", lambda s: s.out_cache_loc.clone().index_fill_(0, torch.tensor([5]), 3), "padding row 5"),
    ("out_cache_loc", lambda s: s.out_cache_loc.clone().index_fill_(0, torch.tensor([2]), int(s.out_cache_loc[1])),
     r"out_cache_loc rows \[1, 2\] all write KV slot"),
    ("req_indices", lambda s: s.req_indices.clone().index_fill_(0, torch.tensor([2]), 2), r"req_indices\[2\]=2"),
    ("num_valid_rows", lambda s: 0, "num_valid_rows=0"),
    ("num_valid_rows", lambda s: 2.5, "num_valid_rows must be an int, got float 2.5"),
    ("num_valid_rows", lambda s: True, "num_valid_rows must be an int, got bool True"),
    ("num_valid_rows", lambda s: "4", "num_valid_rows must be an int, got str '4'"),
    # a valid request's context holding the dummy slot 0 (which padding rows write) reads garbage
    ("page_table", lambda s: s.page_table.clone().index_put_((torch.tensor([0]), torch.tensor([1])),
                                                              torch.tensor([0], dtype=torch.int32)),
     r"page_table\[0, 1\]=0 is the dummy slot"),
    # a slot this step writes, read elsewhere: by another request, or by its own request at another position
    ("page_table", lambda s: s.page_table.clone().index_put_((torch.tensor([0]), torch.tensor([1])),
                                                              s.out_cache_loc[2:3].clone()),
     r"page_table\[0, 1\]=\d+ is the KV slot valid row 2 writes \(request 1, position 3\): request 0 would read"),
    ("page_table", lambda s: s.page_table.clone().index_put_((torch.tensor([1]), torch.tensor([0])),
                                                              s.out_cache_loc[3:4].clone()),
     r"page_table\[1, 0\]=\d+ is the KV slot valid row 3 writes \(request 1, position 4\)"),
]


@pytest.mark.parametrize("field,make,message", ERROR_CASES, ids=[c[2][:30] for c in ERROR_CASES])
def test_bad_step_raises_typed_error_and_writes_nothing(field, make, message):
    case = _case()
    bad = dataclasses.replace(case.step, **{field: make(case.step)})
    kc = [case.k_cache.clone() for _ in range(CFG.num_layers)]
    vc = [case.v_cache.clone() for _ in range(CFG.num_layers)]
    with pytest.raises(StepContractError, match=message):
        MODEL.forward(bad, kc, vc)
    for k in kc:
        assert torch.equal(k.nan_to_num(7.0), case.k_cache.nan_to_num(7.0)), "a refused step wrote the KV cache"


def test_rows_beyond_max_rows_are_refused():
    case = random_step(ctx_lens=[1], new_rows=[MAX_ROWS + 1], num_kv_heads=2, head_dim=16, vocab_size=128)
    with pytest.raises(StepContractError, match=f"M={MAX_ROWS + 1} rows exceeds max_rows={MAX_ROWS}"):
        case.step.validate(vocab_size=128, num_slots=case.k_cache.shape[0], max_rows=MAX_ROWS)


def test_valid_step_passes_validation():
    case = _case()
    case.step.validate(vocab_size=CFG.vocab_size, num_slots=case.k_cache.shape[0], max_rows=MAX_ROWS)


def test_split_rows_covers_exactly_m_rows_in_requests_of_one_to_three():
    """`lowlat.testing.split_rows` (the kernel tests' mixed decode / verify requests): requests of 1, 2, 3, 1, ... rows
    summing to exactly m, only the last one cut, for every width 1..48."""
    assert split_rows(1) == [1] and split_rows(7) == [1, 2, 3, 1] and split_rows(8) == [1, 2, 3, 1, 1]
    for m in range(1, 49):
        rows = split_rows(m)
        assert sum(rows) == m, (m, rows)
        assert rows[:-1] == [1 + i % 3 for i in range(len(rows) - 1)] and 1 <= rows[-1] <= 1 + (len(rows) - 1) % 3
