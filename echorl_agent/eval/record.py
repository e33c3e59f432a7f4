"""Record trajectories of any agent (the expert by default) as datasets other tools read.

Two formats:

* ``"jsonl"`` -- one JSON object per episode in ``episodes.jsonl``, loadable with Hugging Face ``datasets``
  (``datasets.load_dataset("json", data_files=...)``) and shaped for SFT: ``messages`` is the chat (system: the
  task; user: each observation with its admissible actions; assistant: each action), and ``steps`` holds, per step,
  the observation, action, reward, ``invalid_action``, ``won``, the admissible actions offered and the expert action.
* ``"minari"`` -- a Minari dataset (Farama's offline-RL format, arrow storage). Minari serialises gymnasium
  ``Text`` spaces, so observations and actions are stored as strings. Minari's arrow infos hold flat columns
  only, so the per-step admissible actions are stored as a JSON-encoded list (``infos["admissible_actions"]``,
  decode with ``json.loads``); ``won`` / ``invalid_action`` are booleans and ``expert_action`` is ``""`` where
  the env has none. The dataset lives in ``out/<dataset_id>`` (Minari's layout); load it with
  :func:`load_minari`.

Episode ``e`` of a recording with seed ``s`` is played with env seed ``s * 100_003 + e``, as ``echorl bench``.

Example:
    >>> import tempfile
    >>> path = record_episodes("EchoRL/Game24-v0", episodes=2, out=tempfile.mkdtemp())
    >>> rows = load_jsonl(path)
    >>> [r["success"] for r in rows], rows[0]["messages"][-1]["role"]
    ([True, True], 'assistant')
"""

from __future__ import annotations

import json
import os
from contextlib import contextmanager
from pathlib import Path
from typing import Any

__all__ = ["record_episodes", "load_jsonl", "load_minari", "FORMATS"]

#: Output formats of :func:`record_episodes`.
FORMATS = ("jsonl", "minari")


def _user_text(obs: str, info: dict[str, Any]) -> str:
    adm = info.get("admissible_actions") or []
    return obs + ("\n\nAdmissible actions: " + ", ".join(adm) if adm else "")


def _play(env_id: str, agent_name: str, episodes: int, seed: int, max_steps: int | None,
          agent_options: dict[str, Any]) -> list[dict[str, Any]]:
    import gymnasium as gym

    import echorl_envs  # noqa: F401 - registers the ids
    from echorl_agent.eval import agents as registry
    from echorl_agent.eval.runner import episode_seed

    agent = registry.make_agent(agent_name, env_id, **agent_options)
    env = gym.make(env_id, max_episode_steps=max_steps) if max_steps else gym.make(env_id)
    out = []
    try:
        for ep in range(episodes):
            es = episode_seed(seed, ep)
            obs, info = env.reset(seed=es)
            agent.reset(env_id, obs, info, es)
            task = info["task"]
            messages = [{"role": "system", "content": f"Task: {task}"}, {"role": "user", "content": _user_text(obs, info)}]
            steps, infos = [], [info]
            observations, actions, rewards, terms, truncs = [obs], [], [], [], []
            done = False
            while not done:
                action = agent.act(obs, info)
                adm, expert = list(info.get("admissible_actions") or []), info.get("expert_action")
                prev_obs = obs
                obs, r, term, trunc, info = env.step(action)
                done = bool(term or trunc)
                agent.observe(action, obs, r, done, info)
                steps.append({"observation": prev_obs, "action": action, "reward": float(r),
                              "invalid_action": bool(info["invalid_action"]), "won": bool(info["won"]),
                              "admissible_actions": adm, "expert_action": expert, "next_observation": obs,
                              "terminated": bool(term), "truncated": bool(trunc)})
                messages.append({"role": "assistant", "content": action})
                if not done:
                    messages.append({"role": "user", "content": _user_text(obs, info)})
                observations.append(obs)
                actions.append(action)
                rewards.append(float(r))
                terms.append(bool(term))
                truncs.append(bool(trunc))
                infos.append(info)
            out.append({
                "env_id": env_id, "agent": agent_name, "episode": ep, "env_seed": es, "task": task,
                "task_id": info.get("task_id"), "success": bool(info["won"]), "return": float(sum(rewards)),
                "num_steps": len(steps), "messages": messages, "steps": steps,
                "_minari": (observations, actions, rewards, terms, truncs, infos),
            })
    finally:
        env.close()
        agent.close()
    return out


def record_episodes(
    env_id: str,
    agent: str = "expert",
    episodes: int = 10,
    out: str | os.PathLike = "runs/record",
    format: str = "jsonl",
    seed: int = 0,
    max_steps: int | None = None,
    agent_options: dict[str, Any] | None = None,
    dataset_id: str | None = None,
) -> Path:
    """Play ``episodes`` episodes of ``env_id`` with ``agent`` and write them to ``out``.

    Args:
        env_id: a registered echorl id.
        agent: an ``echorl bench`` agent name (``expert``, ``random``, ``react``, ``llm-score``...).
        episodes: number of episodes (>= 1).
        out: output folder (created).
        format: ``"jsonl"`` or ``"minari"`` (see the module docstring).
        seed: recording seed (episode ``e`` uses env seed ``seed * 100_003 + e``).
        max_steps: optional cap on steps per episode.
        agent_options: keyword arguments for the agent factory.
        dataset_id: Minari dataset id (default ``echorl/<env name>/<agent>-v0``).

    Returns:
        The ``episodes.jsonl`` file, or the Minari dataset folder.
    """
    import echorl_envs

    echorl_envs.entry(env_id)
    if format not in FORMATS:
        raise ValueError(f"format must be one of {FORMATS}, got format={format!r}")
    if isinstance(episodes, bool) or not isinstance(episodes, int) or episodes < 1:
        raise ValueError(f"episodes must be an int >= 1, got episodes={episodes!r}")
    rows = _play(env_id, agent, episodes, seed, max_steps, dict(agent_options or {}))
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    if format == "jsonl":
        path = out / "episodes.jsonl"
        with path.open("w", encoding="utf-8") as f:
            for row in rows:
                row = {k: v for k, v in row.items() if k != "_minari"}
                f.write(json.dumps(row) + "\n")
        return path
    name = env_id.split("/")[-1].rsplit("-v", 1)[0]
    dataset_id = dataset_id or f"echorl/{name}/{agent}-v0"
    return _write_minari(rows, env_id, agent, out, dataset_id)


@contextmanager
def _minari_root(out: Path):
    # Minari locates datasets through MINARI_DATASETS_PATH only; set it for the call and restore it after.
    old = os.environ.get("MINARI_DATASETS_PATH")
    os.environ["MINARI_DATASETS_PATH"] = str(out.resolve())
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("MINARI_DATASETS_PATH", None)
        else:
            os.environ["MINARI_DATASETS_PATH"] = old


def _write_minari(rows: list[dict], env_id: str, agent: str, out: Path, dataset_id: str) -> Path:
    import warnings

    import gymnasium as gym
    import minari
    from minari.data_collector import EpisodeBuffer

    buffers = []
    for i, row in enumerate(rows):
        observations, actions, rewards, terms, truncs, infos = row["_minari"]
        buffers.append(EpisodeBuffer(
            id=i, seed=row["env_seed"], observations=observations, actions=actions, rewards=rewards,
            terminations=terms, truncations=truncs,
            infos={
                "admissible_actions": [json.dumps(list(x.get("admissible_actions") or [])) for x in infos],
                "expert_action": [x.get("expert_action") or "" for x in infos],
                "won": [bool(x["won"]) for x in infos],
                "invalid_action": [bool(x["invalid_action"]) for x in infos],
                "step": [int(x["step"]) for x in infos],
            },
        ))
    env = gym.make(env_id)
    with _minari_root(out), warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # Minari nags about missing author/permalink metadata
        if dataset_id in minari.list_local_datasets():
            minari.delete_dataset(dataset_id)
        minari.create_dataset_from_buffers(
            dataset_id, buffers, env=env, algorithm_name=agent, data_format="arrow", author="echorl",
            description=f"{len(rows)} episodes of {env_id} played by the echorl '{agent}' agent. Per-step infos: "
            "admissible_actions (JSON list), expert_action ('' if none), won, invalid_action, step.",
        )
    env.close()
    return out / dataset_id


def load_jsonl(path: str | os.PathLike) -> list[dict[str, Any]]:
    """The episodes of an ``episodes.jsonl`` file written by :func:`record_episodes`."""
    with Path(path).open(encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def load_minari(out: str | os.PathLike, dataset_id: str):
    """``minari.load_dataset(dataset_id)`` from the folder ``out`` given to :func:`record_episodes`."""
    import minari

    with _minari_root(Path(out)):
        return minari.load_dataset(dataset_id)
