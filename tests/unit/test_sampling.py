"""Sampling reference: temperature / top-k / top-p semantics."""

import pytest
import torch

from lowlat.reference.sampling import filtered_probs, greedy, sample


def test_top_k_keeps_the_k_largest():
    logits = torch.tensor([[1.0, 4.0, 3.0, 2.0]])
    p = filtered_probs(logits, 1.0, top_k=2)
    assert (p[0] > 0).tolist() == [False, True, True, False]
    torch.testing.assert_close(p.sum(), torch.tensor(1.0))


def test_top_p_keeps_the_token_crossing_the_threshold():
    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05]])
    p = filtered_probs(probs.log(), 1.0, top_p=0.6)
    assert (p[0] > 0).tolist() == [True, True, False, False]
    p = filtered_probs(probs.log(), 1.0, top_p=0.5)
    assert (p[0] > 0).tolist() == [True, False, False, False]


def test_greedy_ties_go_to_lowest_id_and_temperature_zero_is_greedy():
    logits = torch.tensor([[0.0, 2.0, 2.0, 1.0]])
    assert greedy(logits).tolist() == [1]
    assert sample(logits, temperature=0).tolist() == [1]


def test_sample_frequencies_follow_the_filtered_distribution():
    logits = torch.tensor([[0.0, 1.0, 2.0, -1.0]])
    g = torch.Generator().manual_seed(0)
    draws = torch.stack([sample(logits, 0.7, top_k=3, generator=g) for _ in range(4000)]).flatten()
    freq = torch.bincount(draws, minlength=4).float() / 4000
    want = filtered_probs(logits, 0.7, top_k=3)[0]
    assert freq[3] == 0
    assert (freq - want).abs().max() < 0.035     # > 4.5 sigma for n = 4000


@pytest.mark.parametrize("kw", [dict(temperature=0.0), dict(temperature=1.0, top_p=0.0)])
def test_invalid_parameters_raise(kw):
    with pytest.raises(ValueError):
        filtered_probs(torch.zeros(1, 3), **kw)
