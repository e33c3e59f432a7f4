"""No route of ``echorl serve-env`` answers 500 to anything a client sends.

Every HTTP route of the app (OpenEnv's /reset /step /state /schema /metadata /health /mcp, task routes and the
browser page's /web/reset /web/step /web/state; not the Gradio app mounted under /web) gets
malformed JSON, wrong types, huge and deeply nested values, missing and unknown fields; each reply must be a
client error or a success (status < 500), and the reset/step errors name the field. The one exception is
OpenEnv's Task API (``/{env_name}/splits``, ``tasks``, ``num_tasks``, ``task``, ``task_range``), which echorl envs do
not implement: OpenEnv answers 501 Not Implemented there, whatever the body. In process (Starlette's TestClient: no
socket), a bounded number of requests.
"""

from __future__ import annotations

import json

import pytest

pytest.importorskip("openenv", reason="the openenv extra is not installed (pip install 'echorl[openenv]')")

from starlette.routing import Route  # noqa: E402
from starlette.testclient import TestClient  # noqa: E402

from echorl_envs.service.server import build_app  # noqa: E402

TASKS = ["EchoRL/MiniGrid-Empty-5x5-v0", "EchoRL/MiniGrid-DoorKey-5x5-v0"]
HUGE = "x" * 1_000_000
#: OpenEnv's Task API routes (after the env name): 501 Not Implemented for envs without list_splits/get_task/...
TASK_API = ("splits", "tasks", "num_tasks", "task", "task_range")

#: Bodies no route should choke on: not JSON, not objects, huge, deep, and objects with every kind of wrong field.
RAW_BODIES = ["", "notjson", "{", "null", "[]", "123", '"text"', "{" * 5000 + "}" * 5000, "[" * 100_000,
              json.dumps(HUGE), "\x00\xff", '{"seed": 1e999}', '{"seed": NaN}']
OBJECTS = [
    {}, {"seed": -1}, {"seed": 2**70}, {"seed": "x"}, {"seed": 1.5}, {"seed": True}, {"seed": None},
    {"task": 5}, {"task": "nope"}, {"task": ["a"]}, {"task": TASKS[1]}, {"task": HUGE},
    {"options": 5}, {"options": {"zzz": 1}}, {"options": {"task_index": 10**9}}, {"options": {"task_index": -1}},
    {"options": {"index": "a"}}, {"options": {"index": 10**30}}, {"options": [1]},
    {"max_episode_steps": 0}, {"max_episode_steps": "x"}, {"max_episode_steps": 10**12}, {"max_episode_steps": 1.5},
    {"episode_id": 5}, {"episode_id": HUGE}, {"unknown": 1}, {HUGE: 1},
    {"action": "go forward"}, {"action": 5}, {"action": None}, {"action": {}}, {"action": []},
    {"action": {"action": "go forward"}}, {"action": {"action": HUGE}}, {"action": {"action": 1}},
    {"action": {"actoin": "x"}}, {"action": {"action": "x", "metadata": 5}}, {"action": {"action": "x"}, "timeout_s": -1},
    {"action": {"action": "x"}, "timeout_s": "soon"}, {"action": {"action": "\x00" * 10}},
    {"split": "train", "index": 0}, {"split": 5, "index": "a"}, {"split": "x", "start": -1, "end": 10**9},
    {"jsonrpc": "2.0", "method": "tools/list", "id": 1}, {"jsonrpc": "2.0", "method": "tools/call", "params": 5},
    {"jsonrpc": "2.0", "method": "openenv/session/create", "params": {}, "id": 2},
    {"jsonrpc": "2.0", "method": HUGE, "id": [1]},
]


@pytest.fixture(scope="module")
def client():
    with TestClient(build_app(TASKS, max_sessions=2, web=True), raise_server_exceptions=False) as c:
        yield c


def _http_routes(app) -> list[tuple[str, str]]:
    """(method, path) of every plain HTTP route, path parameters filled in with a served name and a bogus one."""
    out = []
    for route in app.routes:
        if not isinstance(route, Route):
            continue
        for method in sorted((route.methods or set()) - {"HEAD"}):
            for path in {route.path.replace("{env_name}", name) for name in ("echorl", "nope")}:
                out.append((method, path))
    return sorted(set(out))


def test_the_fuzz_covers_every_route(client):
    routes = _http_routes(client.app)
    paths = {p for _, p in routes}
    assert {"/reset", "/step", "/state", "/schema", "/metadata", "/health", "/mcp", "/echorl/task", "/web/reset",
            "/web/step", "/web/state"} <= paths


BODIES = RAW_BODIES + [json.dumps(o) for o in OBJECTS]


def _fuzz(client, routes: list[tuple[str, str]], bodies: list[str]) -> list[str]:
    """Send every body to every route; one line per reply of 500 or more (save the Task API's 501)."""
    failures = []
    for raw in bodies:
        failures += _fuzz_one(client, routes, raw)
    return failures


def test_reset_and_step_never_answer_500(client):
    """Every body on the routes that reach echorl's code (fast; the whole app is fuzzed in the slow test)."""
    routes = [("POST", "/reset"), ("POST", "/step"), ("POST", "/web/reset"), ("POST", "/web/step")]
    assert _fuzz(client, routes, BODIES) == []


def test_every_route_survives_the_worst_bodies(client):
    worst = ["notjson", "[" * 100_000, '{"seed": NaN}', json.dumps({"action": {"action": HUGE}}), json.dumps({"a": 1})]
    assert _fuzz(client, _http_routes(client.app), worst) == []


@pytest.mark.slow
def test_no_route_answers_500_to_any_malformed_body(client):
    assert _fuzz(client, _http_routes(client.app), BODIES) == []


def _fuzz_one(client, routes: list[tuple[str, str]], raw: str) -> list[str]:
    failures = []
    for method, path in routes:
        if method == "GET":
            r = client.get(path, params={"q": raw[:1000]})
        else:
            r = client.request(method, path, content=raw.encode("utf-8", "surrogatepass"),
                               headers={"content-type": "application/json"})
        not_implemented = r.status_code == 501 and path.startswith("/echorl/") and path.split("/")[-1] in TASK_API
        if r.status_code >= 500 and not not_implemented:
            failures.append(f"{method} {path} {raw[:80]!r}: {r.status_code} {r.text[:200]}")
    return failures


def test_plain_http_step_says_to_use_the_websocket_session(client):
    assert client.post("/reset", json={"seed": 0}).status_code == 200
    r = client.post("/step", json={"action": {"action": "go forward"}})
    assert r.status_code == 409
    detail = r.json()["detail"]
    assert "no episode" in detail and "/ws" in detail and "GenericEnvClient" in detail and "Remote-v0" in detail
    r = client.post("/step", json={"action": "go forward"})  # the action not wrapped
    assert r.status_code == 422 and '{"action": {"action": "<text>"}}' in r.json()["hint"]


@pytest.mark.parametrize(("body", "words"), [
    ({"task": "EchoRL/MiniGrid-Empty-5x5-v1"}, "task 'EchoRL/MiniGrid-Empty-5x5-v1' is not served here; did you mean "
                                               "'EchoRL/MiniGrid-Empty-5x5-v0'?"),
    ({"tsk": "x"}, "unknown reset field 'tsk'; did you mean 'task'?"),
    ({"max_episode_steps": 0}, "max_episode_steps must be an int >= 1 or null, got max_episode_steps=0"),
    ({"options": 5}, "options must be an object (dict) or null, got options=5"),
])
def test_bad_reset_fields_get_422_naming_the_field(client, body, words):
    r = client.post("/reset", json=body)
    assert r.status_code == 422 and words in r.json()["detail"]


def test_the_web_page_routes_name_a_bad_action_and_a_bad_episode_id(client):
    r = client.post("/web/step", json={"action": "go forward"})
    assert r.status_code == 422 and "action must be an object, got action='go forward'" in r.json()["detail"]
    r = client.post("/web/reset", json={"episode_id": 5})
    assert r.status_code == 422 and "episode_id must be a string" in r.json()["detail"]
    assert client.post("/web/reset", json={"seed": 0}).status_code == 200  # the page's own episode goes on
    assert client.post("/web/step", json={"action": {"action": "turn left"}}).json()["observation"]["text"]
