"""Test helper: a real ``echorl serve-env`` app under uvicorn on a loopback port, in a thread of this process
(so tests can count the server's engines) or as a subprocess (for signals)."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("openenv", reason="the openenv extra is not installed (pip install 'echorl[openenv]')")

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def running_server(tasks: list[str], max_sessions: int = 8, session_timeout: float | None = 300.0,
                   web: bool = False) -> Iterator[str]:
    """Serve ``tasks`` in a uvicorn thread; yields the base URL and stops the server on exit."""
    import uvicorn

    from echorl_envs.service.server import build_app, uvicorn_config

    port = free_port()
    app = build_app(tasks, max_sessions=max_sessions, session_timeout=session_timeout, web=web,
                    url=f"http://127.0.0.1:{port}")
    server = uvicorn.Server(uvicorn_config(app, port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the test server did not start")
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)


@contextlib.contextmanager
def server_process(tasks: list[str], max_sessions: int = 8) -> Iterator[tuple[subprocess.Popen, str]]:
    """``python -m echorl_agent.cli serve-env`` as a subprocess; yields (process, base URL)."""
    import httpx

    port = free_port()
    cmd = [sys.executable, "-m", "echorl_agent.cli", "serve-env", "--host", "127.0.0.1", "--port", str(port),
           "--max-sessions", str(max_sessions), "--no-web"]
    for t in tasks:
        cmd += ["--task", t]
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    try:
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"serve-env exited early:\n{proc.stdout.read()}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            if time.monotonic() > deadline:
                raise RuntimeError("serve-env did not become healthy")
            time.sleep(0.2)
        yield proc, url
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
