"""echorl_envs: text environments with one protocol, registered for ``gym.make`` on import.

Gymnasium 1.x has no entry-point plugins, so importing this package registers every id in :data:`ENVS`.
"""

from __future__ import annotations

import difflib
from typing import Any, NamedTuple

import gymnasium as gym

__version__ = "0.1.0"


class EnvEntry(NamedTuple):
    """One row of the registration table."""

    id: str
    entry_point: str
    max_episode_steps: int
    kwargs: dict[str, Any]
    family: str
    #: "choice" (admissible actions listed) or "free-text" (answers, grids, expressions)
    action_type: str
    #: where the tasks come from ("generated", "bundled", "file", "engine")
    data: str
    #: positional action slots that hold every admissible set the env lists (choice envs; None for free text): the
    #: default ``max_actions`` of ``wrap_text_env``/``make_sb3_env``, the SB3 bench agents and the LLM policy's env.
    #: Largest sets seen in expert and random episodes (10-40 seeds each): MiniGrid 7 (all actions, always),
    #: ALFWorld 21, TextWorld 35 (Simple) / 5 / 7 / 73 (Cooking), WebShop 17, MiniWoB 38 (email-inbox).
    max_actions: int | None = None


# fmt: off
#: The one registration table (id, entry point, max steps, kwargs, family, action type, data source, action slots).
ENVS: list[EnvEntry] = [
    # --- MiniGrid / BabyAI (echorl_envs.minigrid) ---
    EnvEntry("EchoRL/MiniGrid-Empty-5x5-v0", "echorl_envs.minigrid:MiniGridTextEnv", 100, {"env_id": "MiniGrid-Empty-5x5-v0"}, "minigrid", "choice", "engine", 7),
    EnvEntry("EchoRL/MiniGrid-Empty-Random-5x5-v0", "echorl_envs.minigrid:MiniGridTextEnv", 100, {"env_id": "MiniGrid-Empty-Random-5x5-v0"}, "minigrid", "choice", "engine", 7),
    EnvEntry("EchoRL/MiniGrid-DoorKey-5x5-v0", "echorl_envs.minigrid:MiniGridTextEnv", 250, {"env_id": "MiniGrid-DoorKey-5x5-v0"}, "minigrid", "choice", "engine", 7),
    EnvEntry("EchoRL/MiniGrid-FourRooms-v0", "echorl_envs.minigrid:MiniGridTextEnv", 100, {"env_id": "MiniGrid-FourRooms-v0"}, "minigrid", "choice", "engine", 7),
    EnvEntry("EchoRL/MiniGrid-MultiRoom-N2-S4-v0", "echorl_envs.minigrid:MiniGridTextEnv", 40, {"env_id": "MiniGrid-MultiRoom-N2-S4-v0"}, "minigrid", "choice", "engine", 7),
    EnvEntry("EchoRL/BabyAI-GoToLocal-v0", "echorl_envs.minigrid:MiniGridTextEnv", 64, {"env_id": "BabyAI-GoToLocal-v0"}, "minigrid", "choice", "engine", 7),
    EnvEntry("EchoRL/BabyAI-PickupLoc-v0", "echorl_envs.minigrid:MiniGridTextEnv", 64, {"env_id": "BabyAI-PickupLoc-v0"}, "minigrid", "choice", "engine", 7),
    EnvEntry("EchoRL/BabyAI-OpenDoor-v0", "echorl_envs.minigrid:MiniGridTextEnv", 576, {"env_id": "BabyAI-OpenDoor-v0"}, "minigrid", "choice", "engine", 7),
    EnvEntry("EchoRL/BabyAI-BossLevel-v0", "echorl_envs.minigrid:MiniGridTextEnv", 2880, {"env_id": "BabyAI-BossLevel-v0"}, "minigrid", "choice", "engine", 7),
    # --- math (echorl_envs.math) ---
    EnvEntry("EchoRL/GSM8K-v0", "echorl_envs.math.gsm8k:GSM8KEnv", 10, {}, "math", "free-text", "file"),
    EnvEntry("EchoRL/GSMSymbolic-v0", "echorl_envs.math.generated:GSMSymbolicEnv", 10, {}, "math", "free-text", "generated"),
    EnvEntry("EchoRL/Arithmetic-v0", "echorl_envs.math.generated:ArithmeticEnv", 10, {}, "math", "free-text", "generated"),
    EnvEntry("EchoRL/Game24-v0", "echorl_envs.math.game24:Game24Env", 10, {}, "math", "free-text", "generated"),
    # --- ALFWorld / TextWorld (echorl_envs.alfworld, echorl_envs.textworld) ---
    EnvEntry("EchoRL/ALFWorld-v0", "echorl_envs.alfworld:ALFWorldEnv", 50, {"task_types": "all"}, "alfworld", "choice", "generated", 64),
    EnvEntry("EchoRL/ALFWorld-PickAndPlace-v0", "echorl_envs.alfworld:ALFWorldEnv", 50, {"task_types": "PickAndPlace"}, "alfworld", "choice", "generated", 64),
    EnvEntry("EchoRL/ALFWorld-PickTwoAndPlace-v0", "echorl_envs.alfworld:ALFWorldEnv", 50, {"task_types": "PickTwoAndPlace"}, "alfworld", "choice", "generated", 64),
    EnvEntry("EchoRL/ALFWorld-LookAtInLight-v0", "echorl_envs.alfworld:ALFWorldEnv", 50, {"task_types": "LookAtInLight"}, "alfworld", "choice", "generated", 64),
    EnvEntry("EchoRL/ALFWorld-PickCleanAndPlace-v0", "echorl_envs.alfworld:ALFWorldEnv", 50, {"task_types": "PickCleanAndPlace"}, "alfworld", "choice", "generated", 64),
    EnvEntry("EchoRL/ALFWorld-PickHeatAndPlace-v0", "echorl_envs.alfworld:ALFWorldEnv", 50, {"task_types": "PickHeatAndPlace"}, "alfworld", "choice", "generated", 64),
    EnvEntry("EchoRL/ALFWorld-PickCoolAndPlace-v0", "echorl_envs.alfworld:ALFWorldEnv", 50, {"task_types": "PickCoolAndPlace"}, "alfworld", "choice", "generated", 64),
    EnvEntry("EchoRL/TextWorld-Simple-v0", "echorl_envs.textworld:TextWorldEnv", 100, {"challenge": "tw-simple", "difficulty": "medium"}, "textworld", "choice", "generated", 64),
    EnvEntry("EchoRL/TextWorld-CoinCollector-v0", "echorl_envs.textworld:TextWorldEnv", 100, {"challenge": "tw-coin_collector", "difficulty": "medium"}, "textworld", "choice", "generated", 64),
    EnvEntry("EchoRL/TextWorld-TreasureHunter-v0", "echorl_envs.textworld:TextWorldEnv", 100, {"challenge": "tw-treasure_hunter", "difficulty": "medium"}, "textworld", "choice", "generated", 64),
    EnvEntry("EchoRL/TextWorld-Cooking-v0", "echorl_envs.textworld:TextWorldEnv", 100, {"challenge": "tw-cooking", "difficulty": "medium"}, "textworld", "choice", "generated", 128),
    # --- WebShop (echorl_envs.webshop) ---
    EnvEntry("EchoRL/WebShop-v0", "echorl_envs.webshop:WebShopEnv", 15, {}, "webshop", "choice", "generated", 32),
    # --- CRUXEval / ARC (echorl_envs.cruxeval, echorl_envs.arc) ---
    EnvEntry("EchoRL/CRUXEval-O-v0", "echorl_envs.cruxeval:CRUXEvalEnv", 8, {"mode": "output"}, "cruxeval", "free-text", "generated"),
    EnvEntry("EchoRL/CRUXEval-I-v0", "echorl_envs.cruxeval:CRUXEvalEnv", 8, {"mode": "input"}, "cruxeval", "free-text", "generated"),
    EnvEntry("EchoRL/CRUXEval-Repair-v0", "echorl_envs.cruxeval:CRUXEvalRepairEnv", 6, {}, "cruxeval-repair", "free-text", "generated"),
    EnvEntry("EchoRL/ARC-v0", "echorl_envs.arc:ARCEnv", 8, {"split": "training"}, "arc", "free-text", "bundled"),
    EnvEntry("EchoRL/ARC-Eval-v0", "echorl_envs.arc:ARCEnv", 8, {"split": "evaluation"}, "arc", "free-text", "bundled"),
    EnvEntry("EchoRL/ARC-ReARC-v0", "echorl_envs.arc:ARCEnv", 8, {"split": "rearc"}, "arc", "free-text", "generated"),
    # --- MiniWoB++ in headless Chromium (echorl_envs.miniwob; rows built from echorl_envs.miniwob.TASKS below) ---
]
# fmt: on

#: A served env (``echorl serve-env``) as a local text env: ``gym.make(REMOTE_ID, base_url=..., task=ID)``.
#: Not a row of :data:`ENVS` (it has no family or data of its own, and it needs a server), so the
#: registry-driven suites and :func:`env_ids` leave it out. See :mod:`echorl_envs.service.remote`.
REMOTE_ID = "EchoRL/Remote-v0"


def _miniwob_rows() -> list[EnvEntry]:
    from echorl_envs.miniwob import TASKS  # imports neither miniwob nor selenium

    return [EnvEntry(f"EchoRL/MiniWoB-{task}-v0", "echorl_envs.miniwob:MiniWoBEnv", steps, {"task": task},
                     "miniwob", "choice", "engine", 64) for task, (_, steps) in TASKS.items()]


ENVS.extend(_miniwob_rows())


def _register_all() -> None:
    if REMOTE_ID not in gym.registry:
        gym.register(id=REMOTE_ID, entry_point="echorl_envs.service.remote:RemoteTextEnv", disable_env_checker=True)
    for e in ENVS:
        if e.id not in gym.registry:
            gym.register(
                id=e.id,
                entry_point=e.entry_point,
                max_episode_steps=e.max_episode_steps,
                kwargs=dict(e.kwargs),
                disable_env_checker=True,
            )


def env_ids(family: str | None = None) -> list[str]:
    """Registered echorl ids, optionally for one family."""
    return [e.id for e in ENVS if family is None or e.family == family]


def entry(env_id: str) -> EnvEntry:
    """The table row of ``env_id``; unknown ids raise ``ValueError`` with the closest registered id."""
    for e in ENVS:
        if e.id == env_id:
            return e
    hint = difflib.get_close_matches(env_id, env_ids(), n=3, cutoff=0.4)
    raise ValueError(
        f"unknown environment id {env_id!r}"
        + (f"; did you mean {' or '.join(map(repr, hint))}?" if hint else "")
        + " (see echorl_envs.env_ids())"
    )


def make(env_id: str, **kwargs: Any) -> gym.Env:
    """``gym.make`` for echorl ids, with a close-match suggestion on an unknown id or keyword."""
    if env_id == REMOTE_ID:
        return gym.make(env_id, **kwargs)
    entry(env_id)
    try:
        return gym.make(env_id, **kwargs)
    except TypeError as e:
        spec = gym.spec(env_id)
        import inspect

        cls = spec.entry_point if callable(spec.entry_point) else gym.envs.registration.load_env_creator(spec.entry_point)
        params = [p for p in inspect.signature(cls).parameters if p not in ("self", "kwargs")]
        params = sorted(set(params) | {"render_mode", "max_episode_steps", "disable_env_checker"})
        bad = [k for k in kwargs if k not in params]
        if not bad:
            raise
        hint = difflib.get_close_matches(bad[0], params, n=1)
        raise ValueError(
            f"unknown option {bad[0]!r} for {env_id}" + (f"; did you mean {hint[0]!r}?" if hint else "")
            + f" (accepted: {sorted(params)})"
        ) from e


_register_all()

__all__ = ["ENVS", "REMOTE_ID", "EnvEntry", "__version__", "entry", "env_ids", "make"]
