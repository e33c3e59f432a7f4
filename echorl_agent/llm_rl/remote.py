"""Rollouts on remote servers: the learner pushes its LoRA adapter, rollouts score actions through the server.

Past one machine the rollout engines are servers (``echorl serve``, vLLM, SGLang) and the learner runs elsewhere.
After every update :meth:`RemoteRollout.push` saves the adapter in peft's format and posts it with vLLM's dynamic
LoRA route (``POST /v1/load_lora_adapter {"lora_name", "lora_path"}``; from the second push on with
``"load_inplace": true``, which vLLM needs to replace the weights under a name it already serves -- ``echorl serve``
always replaces); rollouts then request ``"model": lora_name``, so they always run the newest adapter, and
:meth:`RemoteRollout.close` posts ``/v1/unload_lora_adapter {"lora_name"}``. The server and the learner must see the
same file system path (one machine, or a shared volume). docs/remote-rollouts.md lists every request.

With a remote rollout the learner cannot reuse captured activations (nothing crosses the wire but log-probs): it
recomputes the frozen layers, and the value head runs on the learner. Soft plan tokens have no HTTP form, so
``plan_tokens`` must be 0.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any

__all__ = ["RemoteRollout"]


class RemoteRollout:
    """Score candidate actions on an OpenAI-compatible server that serves the learner's adapter by name.

    Args:
        base_url: the server's ``.../v1`` address.
        adapter_name: the name the adapter is served under (the ``model`` of rollout requests).
        adapter_dir: where adapters are saved for the server to read (default: a private temp dir).
    """

    def __init__(self, base_url: str, adapter_name: str = "echorl-policy", adapter_dir: str | None = None,
                 tokenizer: Any = None) -> None:
        import httpx

        from echorl_agent.llm.serving.openai_backend import OpenAICompatibleBackend

        self.base_url = base_url.rstrip("/")
        self.adapter_name = adapter_name
        self._own_dir = adapter_dir is None
        self.dir = Path(adapter_dir or tempfile.mkdtemp(prefix="echorl-adapters-"))
        self.backend = OpenAICompatibleBackend(self.base_url, model=adapter_name, tokenizer=tokenizer, timeout=600.0)
        self.http = httpx.Client(timeout=300.0)
        self.version = 0

    def push(self, lm: Any) -> int:
        """Save ``lm``'s adapter and (re)load it on the server under :attr:`adapter_name`; returns the version."""
        self.version += 1
        path = lm.save_adapter(self.dir / f"v{self.version}")
        body: dict[str, Any] = {"lora_name": self.adapter_name, "lora_path": str(path.resolve())}
        if self.version > 1:
            body["load_inplace"] = True
        r = self.http.post(f"{self.base_url}/load_lora_adapter", json=body)
        if r.status_code != 200:
            raise RuntimeError(f"{self.base_url}/load_lora_adapter refused the adapter ({r.status_code}): {r.text}; "
                               "a vLLM server needs --enable-lora, --max-lora-rank >= the adapter's rank and "
                               "VLLM_ALLOW_RUNTIME_LORA_UPDATING=True")
        old = self.dir / f"v{self.version - 1}"
        if old.exists():
            shutil.rmtree(old, ignore_errors=True)
        return self.version

    def score(self, prompt: list[int], candidates: list[list[int]]) -> list[float]:
        """Summed log-probability of each candidate after ``prompt`` under the served adapter."""
        return list(self.backend.score(prompt, candidates).logprobs)

    def close(self) -> None:
        """Unload the adapter from the server (best effort: a server already gone is not an error) and clean up."""
        if self.version:
            try:
                self.http.post(f"{self.base_url}/unload_lora_adapter", json={"lora_name": self.adapter_name})
            except Exception:  # noqa: BLE001 - httpx transport errors: the server is gone, nothing to unload
                pass
            self.version = 0
        self.backend.close()
        self.http.close()
        if self._own_dir:
            shutil.rmtree(self.dir, ignore_errors=True)
