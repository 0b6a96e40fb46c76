"""Speculative (rejection) sampling: the output distribution equals the target's (exactly, by
enumeration, and statistically over seeded draws), planted bugs are caught, and the Triton kernel
emits the reference's tokens for the same counters (CPU interpreter at tiny shapes; H200 at V=49152).

Statistical tests use the G-test of `sampling_stats` with false-failure rate ALPHA = 1e-4 per test over
fresh seeds; the seeds are fixed, so every verdict is reproducible.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from lowlat.errors import StepContractError
from lowlat.kernels import rejection_sampling as kernel
from lowlat.numerics import check_accuracy, check_bitwise
from lowlat.reference import rejection_sampling as ref
from lowlat.reference.sampling import filtered_probs
from sampling_stats import ALPHA, fits, g_test, token_counts

SENTINEL = -(2 ** 40)      # poison for int outputs (-1 is a legitimate emitted value)


pytestmark = pytest.mark.usefixtures("one_torch_thread")     # Philox int64 ops: one thread is faster


# ---------------------------------------------------------------------------------------------- cases
def pq_pair(case: str, v: int, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """(p [V], q [V]) float32 of a named kind."""
    def soft(scale=2.0):
        return torch.softmax(torch.randn(v, generator=g, dtype=torch.float64) * scale, -1).float()

    if case == "random":
        return soft(), soft()
    if case == "q_one_hot":
        q = torch.zeros(v)
        q[int(torch.randint(v, (1,), generator=g))] = 1.0
        return soft(), q
    if case == "disjoint":
        p, q = soft(), soft()
        p[v // 2:] = 0
        q[: v // 2] = 0
        return p / p.sum(), q / q.sum()
    if case == "p_equals_q":
        p = soft()
        return p, p.clone()
    if case == "filtered":
        lp = torch.randn(1, v, generator=g) * 2
        lq = lp + torch.randn(1, v, generator=g)
        return (filtered_probs(lp, 0.8, top_k=v // 2, top_p=0.9)[0],
                filtered_probs(lq, 1.2, top_k=v // 3, top_p=0.8)[0])
    raise ValueError(case)


CASES = ["random", "q_one_hot", "disjoint", "p_equals_q", "filtered"]


def make_batch(case: str, n_req: int, k: int, v: int, seed: int, *, ragged: bool = True):
    """n_req requests sharing p_i / q_i per position (i = 0..k); drafts sampled from q_i; ragged counts."""
    g = torch.Generator().manual_seed(seed)
    pairs = [pq_pair(case, v, g) for _ in range(k + 1)]
    p = torch.stack([a for a, _ in pairs])                       # [k+1, V]
    q = torch.stack([b for _, b in pairs[:k]])                   # [k, V]
    x = torch.stack([torch.multinomial(q[i], n_req, replacement=True, generator=g) for i in range(k)], 1)
    n = (torch.randint(0, k + 1, (n_req,), generator=g) if ragged else torch.full((n_req,), k)).to(torch.int32)
    seeds = torch.randint(0, 2 ** 62, (n_req,), generator=g)
    offsets = torch.randint(0, 2 ** 40, (n_req,), generator=g)
    return (x, q.expand(n_req, k, v).contiguous(), p.expand(n_req, k + 1, v).contiguous(), n, seeds, offsets, p, q)


# ----------------------------------------------------------------------- exact distribution (enumeration)
def exact_first_token(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """P(first emitted token = t), from the algorithm's branches with the reference's own residual rule:
    draft x ~ q; accepted with probability P(u q(x) < p(x)) = min(1, p(x)/q(x)) (u ~ U(0,1)); else the
    token is drawn from normalise(ref.residual_weights(p, q)) (p if that is all zero)."""
    p64, q64 = p.double(), q.double()
    w = ref.residual_weights(p, q)
    r = w / w.sum() if w.sum() > 0 else p64
    dist = torch.zeros_like(p64)
    for x in range(p.numel()):
        if q64[x] == 0:
            continue
        accept = torch.clamp(p64[x] / q64[x], max=1.0)
        dist[x] += q64[x] * accept
        dist += q64[x] * (1 - accept) * r
    return dist


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("v", [2, 3, 5, 8])
def test_speculative_sampling_first_token_distribution_is_exactly_p(case, v):
    g = torch.Generator().manual_seed(100 + v)
    p, q = (t.double() / t.double().sum() for t in pq_pair(case, v, g))    # sums exactly 1 in float64
    check_accuracy("rejection_sampling", exact_first_token(p, q), p.double(), None, output="exact_distribution")


def test_exact_enumeration_rejects_planted_residual_bug(monkeypatch):
    """max(0, q - p) in place of max(0, p - q): the enumerated distribution is no longer p."""
    monkeypatch.setattr(ref, "residual_weights", lambda p, q: torch.clamp(q.double() - p.double(), min=0.0))
    g = torch.Generator().manual_seed(105)
    p, q = (t.double() / t.double().sum() for t in pq_pair("random", 5, g))
    with pytest.raises(AssertionError, match="max error"):
        check_accuracy("rejection_sampling", exact_first_token(p, q), p.double(), None, output="exact_distribution")


# --------------------------------------------------------------------- statistical tests over seeded draws
def acceptance_count_probs(p: torch.Tensor, q: torch.Tensor, n: torch.Tensor) -> torch.Tensor:
    """Expected count of each accepted value 0..k summed over requests with draft counts n:
    P(accept at i) = beta_i = sum_t min(p_i(t), q_i(t)) (Leviathan et al. 2023, Definition 3.1)."""
    k = q.shape[0]
    beta = torch.minimum(p[:k].double(), q.double()).sum(-1)
    out = torch.zeros(k + 1, dtype=torch.float64)
    for nb in range(k + 1):
        count = int((n == nb).sum())
        reach = 1.0
        for a in range(nb + 1):
            stop = (1 - beta[a]) if a < nb else 1.0
            out[a] += count * reach * stop
            if a < nb:
                reach = reach * beta[a]
    return out


def speculative_fit(emitted: torch.Tensor, accepted: torch.Tensor, n: torch.Tensor, p: torch.Tensor,
                    q: torch.Tensor) -> list[tuple[str, object]]:
    """G-tests: the token at each position i, over requests that reached it, ~ p_i; accepted counts
    follow the acceptance rates; every request emits accepted + 1 tokens."""
    k, v = q.shape[0], p.shape[1]
    results = []
    for i in range(k + 1):
        reached = accepted >= i
        if int(reached.sum()) < 200:
            continue
        results.append((f"position {i}", fits(token_counts(emitted[reached, i], v), p[i], 0)))
    results.append(("accepted counts", g_test(torch.bincount(accepted.long(), minlength=k + 1),
                                              acceptance_count_probs(p, q, n))))
    emitted_count = (emitted >= 0).sum(1)
    wrong = int((emitted_count != accepted.long() + 1).sum())
    results.append(("emitted = accepted + 1", wrong))
    return results


def assert_fit(results, alpha: float = ALPHA) -> None:
    per = alpha / max(1, len(results))
    bad = [(name, r) for name, r in results if (r != 0 if isinstance(r, int) else r.pvalue < per)]
    assert not bad, f"rejected at alpha {alpha} (Bonferroni {per:.1e} each): " + "; ".join(f"{n}: {r}" for n, r in bad)


def rejects(results, alpha: float = ALPHA) -> bool:
    try:
        assert_fit(results, alpha)
    except AssertionError:
        return True
    return False


N_DRAWS = 20000


@pytest.mark.parametrize("case", CASES)
def test_speculative_sampling_output_matches_target_distribution(case):
    x, qb, pb, n, seeds, offsets, p, q = make_batch(case, N_DRAWS, k=3, v=8, seed=7)
    emitted, accepted = ref.rejection_sample(x, qb, pb, n, seeds, offsets)
    assert_fit(speculative_fit(emitted, accepted, n, p, q))


def _bug_residual_q_minus_p(monkeypatch):
    monkeypatch.setattr(ref, "residual_weights", lambda p, q: torch.clamp(q.double() - p.double(), min=0.0))
    return ref.rejection_sample


def _bug_bonus_skipped(monkeypatch):
    def run(*args, **kw):
        emitted, accepted = ref.rejection_sample(*args, **kw)
        n = args[3]
        all_in = accepted.long() == n.long()
        emitted[all_in, n.long()[all_in]] = -1                 # no bonus token when every draft is accepted
        return emitted, accepted
    return run


def _bug_accept_ratio_inverted(monkeypatch):
    def run(x, qb, pb, n, seeds, offsets, **kw):                # accept with min(1, q/p): swap p and q at drafts
        k = x.shape[1]
        return ref.rejection_sample(x, pb[:, :k].contiguous(), torch.cat([qb, pb[:, k:]], 1), n, seeds, offsets, **kw)
    return run


def _bug_bonus_from_last_draft_position(monkeypatch):
    def run(x, qb, pb, n, seeds, offsets, **kw):
        pb2 = pb.clone()
        pb2[:, -1] = pb[:, -2]
        return ref.rejection_sample(x, qb, pb2, n, seeds, offsets, **kw)
    return run


@pytest.mark.parametrize("bug", [_bug_residual_q_minus_p, _bug_bonus_skipped, _bug_accept_ratio_inverted,
                                 _bug_bonus_from_last_draft_position])
def test_distribution_test_rejects_planted_bug(bug, monkeypatch):
    """The statistic of test_speculative_sampling_output_matches_target_distribution must reject each bug."""
    x, qb, pb, n, seeds, offsets, p, q = make_batch("random", N_DRAWS, k=3, v=8, seed=7)
    emitted, accepted = bug(monkeypatch)(x, qb, pb, n, seeds, offsets)
    results = speculative_fit(emitted, accepted, n, p, q)
    assert rejects(results), f"planted bug {bug.__name__} went undetected: {results}"


def test_race_picks_tokens_with_probability_proportional_to_weight():
    """The exponential race used for the residual / bonus token: argmax w/E ~ w / sum(w)."""
    v, draws = 7, 20000
    g = torch.Generator().manual_seed(3)
    w = torch.rand(v, generator=g, dtype=torch.float64)
    w[2] = 0
    seeds = torch.randint(0, 2 ** 62, (draws, 1), generator=g)
    from lowlat.reference import philox
    expo = philox.exponentials(seeds, torch.zeros_like(seeds), torch.arange(v)[None, :], philox.STREAM_FINAL)
    picks = ref.race(w.expand(draws, v), expo)
    assert_fit([("race", fits(token_counts(picks, v), w / w.sum(), 0))])


def test_greedy_is_the_temperature_zero_limit():
    """Greedy accepts exactly the drafts equal to argmax p_i and then emits argmax p_j; it equals sampling
    mode with p and q one-hot at their argmaxes (the T -> 0 limit of both distributions)."""
    g = torch.Generator().manual_seed(11)
    b, k, v = 64, 4, 10
    p = torch.softmax(torch.randn(b, k + 1, v, generator=g) * 3, -1)
    q = torch.softmax(torch.randn(b, k, v, generator=g) * 3, -1)
    x = torch.where(torch.rand(b, k, generator=g) < 0.7, p[:, :k].argmax(-1), q.argmax(-1))
    n = torch.randint(0, k + 1, (b,), generator=g).to(torch.int32)
    seeds = torch.arange(b, dtype=torch.int64)
    e_greedy, a_greedy = ref.rejection_sample(x, None, p, n, greedy=True)
    p1 = torch.nn.functional.one_hot(p.argmax(-1), v).float()
    q1 = torch.nn.functional.one_hot(x, v).float()
    e_lim, a_lim = ref.rejection_sample(x, q1, p1, n, seeds, seeds)
    check_bitwise("rejection_sampling", e_greedy, e_lim, output="emitted")
    check_bitwise("rejection_sampling", a_greedy, a_lim, output="accepted")
    # and directly: accepted = length of the prefix of drafts equal to argmax p_i (within n)
    am = p.argmax(-1)
    for i in range(b):
        j = 0
        while j < int(n[i]) and int(x[i, j]) == int(am[i, j]):
            j += 1
        assert int(a_greedy[i]) == j and int(e_greedy[i, j]) == int(am[i, j])
        assert e_greedy[i, :j].tolist() == x[i, :j].tolist() and (e_greedy[i, j + 1:] == -1).all()


def test_padded_draft_slots_are_never_read_accepted_or_emitted():
    x, qb, pb, n, seeds, offsets, _, _ = make_batch("random", 256, k=4, v=8, seed=5)
    e1, a1 = ref.rejection_sample(x, qb, pb, n, seeds, offsets)
    pad = torch.arange(4)[None, :] >= n[:, None]
    x2 = torch.where(pad, 12345, x)                     # garbage (out of range) in padded slots
    q2 = torch.where(pad[..., None], float("nan"), qb)   # NaN in padded q rows
    e2, a2 = ref.rejection_sample(x2, q2, pb, n, seeds, offsets)
    check_bitwise("rejection_sampling", e1, e2, output="emitted")
    check_bitwise("rejection_sampling", a1, a2, output="accepted")
    assert (a1 <= n).all()
    assert ((e1 >= 0).sum(1) == a1.long() + 1).all()


@pytest.mark.parametrize("bad, match", [
    (dict(num_drafts=torch.tensor([5, 0], dtype=torch.int32)), r"num_drafts\[0\]=5"),
    (dict(num_drafts=torch.tensor([1, -1], dtype=torch.int32)), r"num_drafts\[1\]=-1"),
    (dict(draft_tokens=torch.tensor([[3, 0, 0, 0], [9, 0, 0, 0]])), r"draft_tokens\[1, 0\]=9"),
    (dict(target_probs=torch.rand(2, 4, 8)), r"target_probs must be \[B, k\+1, V\]"),
    (dict(draft_tokens=torch.zeros(2, 4, dtype=torch.int32)), "int64"),
])
@pytest.mark.parametrize("impl", ["reference", "kernel"])
def test_bad_input_raises_typed_error_naming_the_value(bad, match, impl, device):
    args = dict(draft_tokens=torch.zeros(2, 4, dtype=torch.int64), draft_probs=torch.full((2, 4, 8), 0.125),
                target_probs=torch.full((2, 5, 8), 0.125), num_drafts=torch.tensor([1, 2], dtype=torch.int32),
                seeds=torch.zeros(2, dtype=torch.int64), offsets=torch.zeros(2, dtype=torch.int64))
    args.update(bad)
    args = {name: t.to(device) for name, t in args.items()}      # the GPU's launcher where there is one
    fn = ref.rejection_sample if impl == "reference" else kernel.rejection_sample
    with pytest.raises(StepContractError, match=match):
        fn(**args)


# ------------------------------------------------------------------------------ kernel vs reference
def run_kernel_poisoned(x, qb, pb, n, seeds, offsets, *, greedy=False, **launch):
    b, k = x.shape
    emitted = torch.full((b, k + 1), SENTINEL, dtype=torch.int64, device=pb.device)
    accepted = torch.full((b,), -7, dtype=torch.int32, device=pb.device)
    kernel.rejection_sample_into(x, qb, pb, n, seeds, offsets, emitted, accepted, greedy=greedy, **launch)
    assert not (emitted == SENTINEL).any(), "emitted has unwritten elements"
    assert not (accepted == -7).any(), "accepted has unwritten elements"
    return emitted, accepted


@pytest.mark.parametrize("case", ["random", "filtered", "disjoint", "p_equals_q"])
@pytest.mark.parametrize("greedy", [False, True])
def test_kernel_emits_reference_tokens(case, greedy, device):
    x, qb, pb, n, seeds, offsets, _, _ = make_batch(case, 12, k=4, v=200, seed=21)
    if device.type == "cuda":
        x, qb, pb, n, seeds, offsets = (t.to(device) for t in (x, qb, pb, n, seeds, offsets))
    x = torch.where(torch.arange(4, device=x.device)[None, :] < n[:, None], x, -3)   # padded slots hold garbage
    e_ref, a_ref = ref.rejection_sample(x, qb, pb, n, seeds, offsets, greedy=greedy)
    e, a = run_kernel_poisoned(x, qb, pb, n, seeds, offsets, greedy=greedy, nsplit=3)
    check_bitwise("rejection_sampling", e, e_ref, output="emitted")
    check_bitwise("rejection_sampling", a, a_ref, output="accepted")


def test_kernel_zero_residual_falls_back_to_p(device):
    """p_j - q_j rounds to <= 0 everywhere although the draft was rejected: the token comes from p_j."""
    v = 64
    p = torch.full((1, 2, v), 1.0 / v, device=device)
    q = torch.full((1, 1, v), 1.0 / v, device=device)
    q[0, 0, 5] = 1.0                               # q(x=5) > p(5): rejection possible; residual all <= 0
    x = torch.tensor([[5]], device=device)
    n = torch.tensor([1], dtype=torch.int32, device=device)
    for s in range(8):
        seeds = torch.tensor([s], device=device)
        offs = torch.tensor([0], device=device)
        e_ref, a_ref = ref.rejection_sample(x, q, p, n, seeds, offs)
        e, a = run_kernel_poisoned(x, q, p, n, seeds, offs, nsplit=2)
        check_bitwise("rejection_sampling", e, e_ref, output="emitted")
        check_bitwise("rejection_sampling", a, a_ref, output="accepted")


@settings(max_examples=8)
@given(b=st.integers(1, 5), k=st.integers(0, 5), v=st.integers(2, 300), nsplit=st.integers(1, 4),
       greedy=st.booleans(), seed=st.integers(0, 2 ** 31))
def test_kernel_matches_reference_property(b, k, v, nsplit, greedy, seed, device):
    g = torch.Generator().manual_seed(seed)
    p = torch.softmax(torch.randn(b, k + 1, v, generator=g) * 2, -1)
    q = torch.softmax(torch.randn(b, k, v, generator=g) * 2, -1)
    x = torch.randint(0, v, (b, k), generator=g)
    n = torch.randint(0, k + 1, (b,), generator=g).to(torch.int32)
    seeds = torch.randint(0, 2 ** 62, (b,), generator=g)
    offsets = torch.randint(0, 2 ** 62, (b,), generator=g)
    p, q, x, n, seeds, offsets = (t.to(device) for t in (p, q, x, n, seeds, offsets))
    e_ref, a_ref = ref.rejection_sample(x, q, p, n, seeds, offsets, greedy=greedy)
    e, a = run_kernel_poisoned(x, q, p, n, seeds, offsets, greedy=greedy, nsplit=nsplit)
    check_bitwise("rejection_sampling", e, e_ref, output="emitted")
    check_bitwise("rejection_sampling", a, a_ref, output="accepted")


def test_kernel_workspace_counters_reset_between_launches(device):
    """A second launch on the same cached workspace gives the same result (counters left at 0)."""
    x, qb, pb, n, seeds, offsets, _, _ = make_batch("random", 3, k=2, v=40, seed=2)
    x, qb, pb, n, seeds, offsets = (t.to(device) for t in (x, qb, pb, n, seeds, offsets))
    first = run_kernel_poisoned(x, qb, pb, n, seeds, offsets, nsplit=2)
    second = run_kernel_poisoned(x, qb, pb, n, seeds, offsets, nsplit=2)
    check_bitwise("rejection_sampling", first[0], second[0], output="emitted")
    ws = next(w for key, w in kernel._WORKSPACES.items() if key[1:3] == (3, 2))
    assert int(ws.counters.abs().sum()) == 0


# ------------------------------------------------------------------------------------------ GPU (H200)
@pytest.mark.gpu
@pytest.mark.parametrize("greedy", [False, True])
def test_kernel_emits_reference_tokens_full_vocab_gpu(greedy, device):
    b, k, v = 8, 5, 49152
    g = torch.Generator(device=device).manual_seed(1)
    p = torch.softmax(torch.randn(b, k + 1, v, generator=g, device=device) * 3, -1)
    q = torch.softmax((torch.log(p[:, :k]) + torch.randn(b, k, v, generator=g, device=device)), -1)
    x = torch.multinomial(q.reshape(-1, v), 1, generator=g).reshape(b, k)
    for trial in range(20):
        n = torch.randint(0, k + 1, (b,), generator=g, device=device).to(torch.int32)
        seeds = torch.randint(0, 2 ** 62, (b,), generator=g, device=device)
        offsets = torch.full((b,), trial, dtype=torch.int64, device=device)
        e_ref, a_ref = ref.rejection_sample(x, q, p, n, seeds, offsets, greedy=greedy)
        e, a = run_kernel_poisoned(x, q, p, n, seeds, offsets, greedy=greedy)
        check_bitwise("rejection_sampling", e, e_ref, output="emitted")
        check_bitwise("rejection_sampling", a, a_ref, output="accepted")


@pytest.mark.gpu
@pytest.mark.parametrize("case", CASES)
def test_kernel_output_matches_target_distribution_gpu(case, device):
    x, qb, pb, n, seeds, offsets, p, q = make_batch(case, 50000, k=3, v=8, seed=9)
    e, a = run_kernel_poisoned(*(t.to(device) for t in (x, qb, pb, n, seeds, offsets)))
    assert_fit(speculative_fit(e.cpu(), a.cpu(), n, p, q))


@pytest.mark.gpu
def test_kernel_deterministic_pdl_and_cuda_graph_gpu(device):
    b, k, v = 8, 5, 49152
    g = torch.Generator(device=device).manual_seed(4)
    p = torch.softmax(torch.randn(b, k + 1, v, generator=g, device=device) * 3, -1)
    q = torch.softmax(torch.randn(b, k, v, generator=g, device=device) * 3, -1)
    x = torch.randint(0, v, (b, k), generator=g, device=device)
    n = torch.full((b,), k, dtype=torch.int32, device=device)
    seeds = torch.arange(b, dtype=torch.int64, device=device)
    offsets = torch.zeros(b, dtype=torch.int64, device=device)
    e0, a0 = run_kernel_poisoned(x, q, p, n, seeds, offsets)
    e1, a1 = run_kernel_poisoned(x, q, p, n, seeds, offsets, use_pdl=True)
    check_bitwise("rejection_sampling", e0, e1, output="emitted_pdl")
    emitted = torch.full((b, k + 1), SENTINEL, dtype=torch.int64, device=device)
    accepted = torch.full((b,), -7, dtype=torch.int32, device=device)
    kernel.rejection_sample_into(x, q, p, n, seeds, offsets, emitted, accepted)      # warm-up / compile
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        kernel.rejection_sample_into(x, q, p, n, seeds, offsets, emitted, accepted)
    for _ in range(3):
        emitted.fill_(SENTINEL)
        graph.replay()
        torch.cuda.synchronize()
        check_bitwise("rejection_sampling", emitted, e0, output="emitted_graph")
        check_bitwise("rejection_sampling", accepted, a0, output="accepted_graph")


# --------------------------------------------------------------------------- sm_90 compile (no GPU needed)
def test_kernel_compiles_for_sm90_without_spills():
    """Sampling and greedy variants compile for the H200 (fp64 race, acq_rel atomics, PDL); no spills."""
    from sampling_stats import compile_sm90

    pointers = dict(tok_ptr="*i64", q_ptr="*fp32", p_ptr="*fp32", nd_ptr="*i32", seed_ptr="*i64", off_ptr="*i64",
                    emit_ptr="*i64", accn_ptr="*i32", ws_score="*fp64", ws_id="*i32", ws_any="*i32",
                    ws_gval="*fp32", ws_gid="*i32", cnt_ptr="*i32")
    specs = [{"pointers": pointers,
              "constexprs": dict(K=5, K1_PAD=8, BLOCK_V=1024, TILES=2, S_PAD=32, GREEDY=greedy, USE_PDL=True)}
             for greedy in (False, True)]
    res = compile_sm90("lowlat.kernels.rejection_sampling:_rejection_kernel", specs)
    assert all(r["spill_bytes"] == 0 for r in res), res


# ------------------------------------------------------------------------- non-finite probabilities
def nan_batch(where: str, seed: int):
    """6 requests, k = 3, V = 300 (three vocabulary splits of 128 under the interpreter), ragged counts; q close
    to p and the drafts q's argmax (request 5: random drafts), so that requests accept some drafts, in greedy
    mode too, and reach later positions and the bonus row. Then NaN / inf planted: at the draft tokens of
    position 1 in p or q, in later splits of every p / q row, in the bonus row only, or +inf in p at 150 and
    210 with q +inf at 210 (inf - inf: a NaN residual)."""
    b, k, v = 6, 3, 300
    g = torch.Generator().manual_seed(seed)
    lp = torch.randn(b, k + 1, v, generator=g, dtype=torch.float64) * 2
    p = torch.softmax(lp, -1).float()
    q = torch.softmax(lp[:, :k] + torch.randn(b, k, v, generator=g, dtype=torch.float64) * 0.05, -1).float()
    x = torch.argmax(q, -1)
    x[5] = torch.randint(0, v, (k,), generator=g)
    n = torch.tensor([3, 3, 2, 1, 3, 0], dtype=torch.int32)
    seeds = torch.randint(0, 2 ** 62, (b,), generator=g)
    offsets = torch.randint(0, 2 ** 40, (b,), generator=g)
    nan, rows = float("nan"), torch.arange(b)
    if where == "p_at_draft":            # position 1 of every request: rejected, then the race meets the NaN
        p[rows, 1, x[:, 1]] = nan
    elif where == "q_at_draft":          # rejected at 1; the residual's NaN sends the race to p_1
        q[rows, 1, x[:, 1]] = nan
    elif where == "p_rows":              # NaN in every target row at 277 (third split) and 140 (second)
        p[:, :, 277] = nan
        p[:, :, 140] = nan
    elif where == "q_rows":              # NaN in every draft row at 290: a residual always holds a NaN
        q[:, :, 290] = nan
    elif where == "p_bonus":             # only the bonus row: requests that accept everything meet it
        p[:, k, 260] = nan
        p[:, k, 201] = nan
    elif where == "inf":                 # +inf in p at 150 and 210; q +inf at 210 too (residual NaN there)
        p[:, :, 150] = float("inf")
        p[:, :, 210] = float("inf")
        q[:, :, 210] = float("inf")
    else:
        raise ValueError(where)
    return x, q, p, n, seeds, offsets


@pytest.mark.filterwarnings("ignore::RuntimeWarning")   # numpy (interpreter) warns on the NaN / inf it is fed
@pytest.mark.parametrize("where", ["p_at_draft", "q_at_draft", "p_rows", "q_rows", "p_bonus", "inf"])
@pytest.mark.parametrize("greedy", [False, True])
def test_kernel_non_finite_probabilities_match_reference(where, greedy, device):
    """NaN / inf probabilities are not refused (the launch is capturable) but must mean what they mean in the
    reference: a NaN p(x) or q(x) rejects x, a NaN residual sends the draw to p_j, and every race / argmax
    takes the lowest-id NaN (torch.argmax), across vocabulary splits. Emitted tokens and counts bitwise the
    reference's, every element written, for the default split and for one split."""
    x, q, p, n, seeds, offsets = (t.to(device) for t in nan_batch(where, seed=31))
    e_ref, a_ref = ref.rejection_sample(x, q, p, n, seeds, offsets, greedy=greedy)
    for nsplit in (3, 1):
        e, a = run_kernel_poisoned(x, q, p, n, seeds, offsets, greedy=greedy, nsplit=nsplit)
        check_bitwise("rejection_sampling", e, e_ref, output=f"emitted[{where}, nsplit={nsplit}]")
        check_bitwise("rejection_sampling", a, a_ref, output=f"accepted[{where}, nsplit={nsplit}]")
    e, a = kernel.rejection_sample(x, None if greedy else q, p, n, seeds, offsets, greedy=greedy)
    check_bitwise("rejection_sampling", e, e_ref, output=f"emitted[{where}, rejection_sample]")
    check_bitwise("rejection_sampling", a, a_ref, output=f"accepted[{where}, rejection_sample]")
