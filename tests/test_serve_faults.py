"""``echorl serve-env`` under bad input and faults: error replies in OpenEnv's shape, isolated sessions, freed
engines on disconnect, idle timeout, the capacity error, SIGTERM."""

from __future__ import annotations

import gc
import json
import signal
import time

import gymnasium as gym
import pytest

from tests.openenv_server import running_server, server_process

serve = pytest.importorskip("echorl_envs.service.server", reason="the openenv extra is not installed")

MINIGRID = "EchoRL/MiniGrid-DoorKey-5x5-v0"


def ws_url(url: str) -> str:
    return url.replace("http://", "ws://") + "/ws"


def ask(ws, message) -> dict:
    ws.send(message if isinstance(message, str) else json.dumps(message))
    return json.loads(ws.recv(timeout=60))


def wait_for(cond, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def test_malformed_messages_get_openenv_errors_and_the_session_goes_on():
    from websockets.sync.client import connect

    local = gym.make(MINIGRID)
    obs0, _ = local.reset(seed=5)
    obs1, *_ = local.step("turn left")
    with running_server([MINIGRID]) as url, connect(ws_url(url)) as ws:
        err = ask(ws, {"type": "step", "data": {"action": "turn left"}})  # before any reset
        assert err["type"] == "error" and err["data"]["code"] == "EXECUTION_ERROR"
        assert "call reset() before step()" in err["data"]["message"]
        assert ask(ws, {"type": "reset", "data": {"seed": 5}})["data"]["observation"]["text"] == obs0
        cases = {
            "{not json": "INVALID_JSON",
            json.dumps({"type": "jump"}): "UNKNOWN_TYPE",
            # a bad action payload is explained by serve-env (OpenEnv's own VALIDATION_ERROR names no field)
            json.dumps({"type": "step", "data": {"action": 7}}): "EXECUTION_ERROR",
            json.dumps({"type": "step", "data": {"actoin": "turn left"}}): "EXECUTION_ERROR",
            json.dumps({"type": "step"}): "VALIDATION_ERROR",
            json.dumps({"type": "reset", "data": {"sed": 1}}): "EXECUTION_ERROR",
        }
        for raw, code in cases.items():
            reply = ask(ws, raw)
            assert reply["type"] == "error" and reply["data"]["code"] == code, (raw, reply)
        assert "did you mean 'seed'" in ask(ws, {"type": "reset", "data": {"sed": 1}})["data"]["message"]
        assert "got action=7" in ask(ws, {"type": "step", "data": {"action": 7}})["data"]["message"]
        assert "unknown field 'actoin' (did you mean 'action'?)" in ask(
            ws, {"type": "step", "data": {"actoin": "turn left"}})["data"]["message"]
        # the episode started by the reset above is untouched: its next step is the local one
        ok = ask(ws, {"type": "step", "data": {"action": "turn left"}})
        assert ok["type"] == "observation" and ok["data"]["observation"]["text"] == obs1
        bad = ask(ws, {"type": "step", "data": {"action": "dance \x00 wildly"}})  # an invalid text action
        assert bad["type"] == "observation" and bad["data"]["observation"]["invalid_action"] is True
    local.close()


def test_one_sessions_engine_crash_leaves_the_other_session_alone():
    from openenv.core.generic_client import GenericEnvClient

    local = gym.make(MINIGRID)
    with running_server([MINIGRID]) as url, GenericEnvClient(base_url=url).sync() as a, \
            GenericEnvClient(base_url=url).sync() as b:
        a.reset(seed=1)
        obs, info = local.reset(seed=2)
        assert b.reset(seed=2).observation["text"] == obs
        crashed = next(e for e in list(serve._OPEN) if e.is_open and e.state.seed == 1)

        def boom(action):
            raise RuntimeError("engine crashed")

        crashed._env.step = boom
        with pytest.raises(RuntimeError, match="engine crashed.*EXECUTION_ERROR"):
            a.step({"action": "turn left"})
        for _ in range(6):
            action = info["expert_action"]
            obs, r, term, trunc, info = local.step(action)
            res = b.step({"action": action})
            assert (res.observation["text"], res.reward, res.done) == (obs, r, term or trunc)
        assert a.reset(seed=1).observation["text"]  # the crashed session itself can start over
    local.close()


def live(cls: type) -> int:
    """Instances of ``cls`` alive in this process; for ALFWorld engines, only the open ones (``close`` drops the
    game state; textworld's grammar caches keep a few closed engines of a process reachable)."""
    gc.collect()
    from echorl_envs.alfworld.engine import AlfredEngine

    return sum(1 for o in gc.get_objects() if type(o) is cls and (cls is not AlfredEngine or o.state is not None))


@pytest.mark.slow
def test_disconnecting_clients_free_their_alfworld_and_textworld_engines():
    from websockets.sync.client import connect

    from echorl_envs.alfworld.engine import AlfredEngine

    alf, tw = "EchoRL/ALFWorld-PickAndPlace-v0", "EchoRL/TextWorld-CoinCollector-v0"
    probe = gym.make(tw)
    probe.reset(seed=0)
    tw_cls = type(probe.unwrapped._host._engine.env)  # textworld's env, inside the env's engine host
    probe.close()
    with running_server([alf, tw], max_sessions=4) as url:
        # warm-up: the first games of a process fill textworld's caches; leaks are counted from after it
        for i, task in enumerate([alf, alf, tw, tw]):
            with connect(ws_url(url)) as ws:
                ask(ws, {"type": "reset", "data": {"seed": 10 + i, "task": task}})
        wait_for(lambda: serve.open_envs() == 0, 30, "the warm-up sessions to close")
        base = (live(AlfredEngine), live(tw_cls), serve.open_envs())
        sockets = []
        for i, task in enumerate([alf, alf, tw, tw]):
            ws = connect(ws_url(url))
            assert ask(ws, {"type": "reset", "data": {"seed": i, "task": task}})["type"] == "observation"
            sockets.append(ws)
        assert (live(AlfredEngine), live(tw_cls), serve.open_envs()) == (base[0] + 2, base[1] + 2, base[2] + 4)
        for ws in sockets:  # drop the connections without a "close" message
            ws.socket.close()
        wait_for(lambda: serve.open_envs() == base[2], 30, "the server to close the envs")
        assert (live(AlfredEngine), live(tw_cls)) == base[:2]
        # the four slots are free again
        ws = connect(ws_url(url))
        assert ask(ws, {"type": "reset", "data": {"seed": 9, "task": alf}})["type"] == "observation"
        ws.close()


def test_capacity_error_then_the_slot_is_reused():
    from openenv.core.generic_client import GenericEnvClient

    with running_server([MINIGRID], max_sessions=2) as url:
        a, b = GenericEnvClient(base_url=url).sync(), GenericEnvClient(base_url=url).sync()
        a.reset(seed=0)
        b.reset(seed=0)
        with pytest.raises(RuntimeError, match=r"(?i)capacity.*CAPACITY_REACHED"):
            gym.make("EchoRL/Remote-v0", base_url=url, task=MINIGRID).reset(seed=0)
        a.close()
        wait_for(lambda: serve.open_envs() <= 1, 10, "the closed session to be freed")
        c = gym.make("EchoRL/Remote-v0", base_url=url, task=MINIGRID)
        assert c.reset(seed=0)[1]["task"]
        c.close()
        b.close()


def test_idle_session_times_out():
    from openenv.core.generic_client import GenericEnvClient

    with running_server([MINIGRID], max_sessions=1, session_timeout=1.0) as url:
        idle = GenericEnvClient(base_url=url).sync()
        idle.reset(seed=0)
        assert serve.open_envs() == 1
        # OpenEnv's reaper checks every max(timeout / 4, 5) s
        wait_for(lambda: serve.open_envs() == 0, 15, "the idle session to be reaped")
        with pytest.raises(RuntimeError, match="session was closed"):
            idle.step({"action": "turn left"})
        fresh = GenericEnvClient(base_url=url).sync()  # its slot is free: max_sessions=1
        assert fresh.reset(seed=0).observation["text"]
        fresh.close()
        idle.close()


@pytest.mark.slow
def test_sigterm_closes_every_env_and_exits_promptly():
    from openenv.core.generic_client import GenericEnvClient

    with server_process([MINIGRID, "EchoRL/WebShop-v0"], max_sessions=4) as (proc, url):
        clients = [GenericEnvClient(base_url=url).sync() for _ in range(3)]
        for i, c in enumerate(clients):
            c.reset(seed=i, task=[MINIGRID, "EchoRL/WebShop-v0"][i % 2])
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
        took = time.monotonic() - t0
        # uvicorn shuts down gracefully, then re-raises the captured signal (exit status -SIGTERM)
        assert proc.returncode in (0, -signal.SIGTERM), out
        assert "Application shutdown complete" in out, out
        assert took < 15, f"shutdown took {took:.1f} s"
        assert out.count("closed session env") == 3, out
        assert "shutting down: closing" in out, out
        for c in clients:
            c.close()


@pytest.mark.slow
def test_remote_env_keeps_its_session_while_the_learner_is_busy():
    """45 s without a call (past websockets' 20 s ping + 20 s pong defaults) must not cost the episode."""
    with server_process([MINIGRID]) as (proc, url):
        remote, local = gym.make("EchoRL/Remote-v0", base_url=url, task=MINIGRID), gym.make(MINIGRID)
        assert remote.reset(seed=3)[0] == local.reset(seed=3)[0]
        time.sleep(45)
        assert remote.step("turn right")[:4] == local.step("turn right")[:4]
        remote.close()
        local.close()
