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


def _brute_force_filter(probs: list[float], top_k: int, top_p: float) -> set[int]:
    """The module docstring's rule, written out: order by p descending (equal p -> lower id), keep the first
    top_k, then each token whose mass before it (of p itself) is < top_p."""
    order = sorted(range(len(probs)), key=lambda t: (-probs[t], t))
    if 0 < top_k < len(probs):
        order = order[:top_k]
    kept, mass = set(), 0.0
    for t in order:
        if top_p >= 1 or mass < top_p:
            kept.add(t)
        mass += probs[t]
    return kept


def test_filtered_probs_follows_the_documented_rule_with_ties():
    """Random logits drawn from 5 values (ties everywhere, at the top-k cut and the top-p cut) against the
    brute-force rule: the kept set, and the kept probabilities renormalised."""
    g = torch.Generator().manual_seed(0)
    levels = torch.tensor([-1.0, 0.0, 0.5, 1.0, 2.0])
    for _ in range(400):
        v = int(torch.randint(2, 13, (1,), generator=g))
        logits = levels[torch.randint(0, 5, (1, v), generator=g)]
        t = [0.5, 1.0, 1.7][int(torch.randint(0, 3, (1,), generator=g))]
        k = [0, 1, 2, 3, v, v + 3][int(torch.randint(0, 6, (1,), generator=g))]
        top_p = [0.1, 0.3, 0.5, 0.8, 0.95, 1.0][int(torch.randint(0, 6, (1,), generator=g))]
        probs = torch.softmax(logits / t, -1)[0]
        kept = _brute_force_filter(probs.tolist(), k, top_p)
        got = filtered_probs(logits, t, k, top_p)[0]
        assert set(got.nonzero().flatten().tolist()) == kept, (logits, t, k, top_p)
        want = torch.zeros(v, dtype=torch.float64)
        want[list(kept)] = probs.double()[list(kept)]
        torch.testing.assert_close(got.double(), want / want.sum(), rtol=0, atol=1e-6)


def test_top_p_mass_is_of_p_not_renormalised_after_top_k():
    """As SGLang's torch sampler: p = [.4, .3, .2, .1], top_k 2, top_p 0.5 keeps tokens 0 and 1 (mass before
    token 1 is 0.4 < 0.5). Renormalising after top-k first (HF's warpers, vLLM) would keep token 0 alone."""
    p = filtered_probs(torch.tensor([[0.4, 0.3, 0.2, 0.1]]).log(), 1.0, top_k=2, top_p=0.5)
    torch.testing.assert_close(p, torch.tensor([[4 / 7, 3 / 7, 0.0, 0.0]]))
