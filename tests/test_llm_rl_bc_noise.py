"""DART noise in the BC warm start's expert episodes (``bc_noise``): steps off the expert's path, every state still
labelled with the expert's action. The real BabyAI-GoToLocal engine and its bot; no LM needed."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

import echorl_envs  # noqa: F401
from echorl_agent.llm_rl.algorithms.bc.clone import collect_expert_states
from echorl_envs.wrappers.llm import LLMObservationWrapper, decode_llm_obs

ENV = "EchoRL/BabyAI-GoToLocal-v0"
FEEDBACK = (("You turned left", "turn left"), ("You turned right", "turn right"), ("You moved forward", "go forward"),
            ("You cannot move forward", "go forward"), ("declared the mission done", "done"),
            ("pick up", "pick up"), ("You picked up", "pick up"), ("drop", "drop"), ("You dropped", "drop"),
            ("Nothing happened", "toggle"), ("You opened", "toggle"), ("You closed", "toggle"),
            ("You unlocked", "toggle"), ("is locked", "toggle"))


def make_env() -> LLMObservationWrapper:
    return LLMObservationWrapper(gym.make(ENV, goal_line=True, max_episode_steps=24), history=0, max_actions=8)


def executed_action(obs: str) -> str:
    """The action a step executed, read from the first line of the observation it led to."""
    first = obs.split("\n", 1)[0]
    return next(action for cue, action in FEEDBACK if cue in first)


def states(data) -> list[dict]:
    return [{k: v for k, v in decode_llm_obs(r).items() if k != "episode"} for r in data.observations]


def replay(data, seed: int) -> tuple[int, int, int]:
    """Replay the recorded episodes with the actions they executed: (labels equal to the bot's action in their
    state, states checked, steps that executed another action than their label)."""
    rows, env = states(data), make_env()
    i = agree = off = 0
    for ep in range(data.episodes):
        row, info = env.reset(seed=seed + ep)
        while True:
            assert decode_llm_obs(row)["obs"] == rows[i]["obs"]
            adm = env.get_wrapper_attr("slot_texts")()
            label = adm[int(data.actions[i])]
            agree += label == info["expert_action"]
            i += 1
            if i == len(rows) or rows[i]["t"] == 0:  # the episode's last step: the next observation is not kept
                break
            action = executed_action(rows[i]["obs"])
            off += action != label
            row, _, _, _, info = env.step(adm.index(action))
    env.close()
    return agree, i, off


def test_zero_noise_is_the_experts_own_episodes_exactly():
    a = collect_expert_states(make_env, episodes=3, seed=10_000)
    b = collect_expert_states(make_env, episodes=3, seed=10_000, noise=0.0)
    assert states(a) == states(b) and np.array_equal(a.actions, b.actions)
    assert a.deviations == b.deviations == 0 and a.successes == 3
    assert replay(a, 10_000)[2] == 0


def test_noise_leaves_the_path_and_keeps_the_bots_label_on_every_state():
    # seed 11310 (BC's expert episodes of run seed 1310): in episode 13 a random `toggle` opens a box, after which
    # BabyAI's bot has no action: that episode ends there
    data = collect_expert_states(make_env, episodes=14, seed=11_310, noise=0.25)
    again = collect_expert_states(make_env, episodes=14, seed=11_310, noise=0.25)
    assert states(data) == states(again) and data.deviations == again.deviations  # the draws come from the seed
    n = len(data.actions)
    assert abs(data.deviations - 0.25 * n) <= 3 * (0.1875 * n) ** 0.5 + 1, (data.deviations, n)  # ~Binomial
    assert data.unlabelled >= 1 and data.successes <= 14 - data.unlabelled
    agree, checked, off = replay(data, 11_310)
    assert checked == n and agree == n  # every recorded label is the bot's action in that state
    assert 0 < off <= data.deviations  # the last step of an episode is not seen executing
    clean = collect_expert_states(make_env, episodes=14, seed=11_310)
    assert clean.unlabelled == 0 and len(clean.actions) < n  # detours: the noisy episodes are longer


@pytest.mark.parametrize("noise", [-0.1, 1.0, True])
def test_a_bad_noise_is_refused_naming_the_field(noise):
    from echorl_agent.llm_rl.train import LLMTrainConfig

    with pytest.raises(ValueError, match=r"bc_noise must be a number in \[0, 1\)"):
        LLMTrainConfig(env_id=ENV, method="bc", bc_noise=noise)


def test_noise_needs_a_bc_warm_start():
    from echorl_agent.llm_rl.train import LLMTrainConfig

    with pytest.raises(ValueError, match="bc_noise applies to a run with a BC warm start"):
        LLMTrainConfig(env_id=ENV, method="gigpo", bc_noise=0.2)


def test_noise_actions_execute_only_the_named_action_and_reach_the_blocked_states():
    # the noise may only execute `go forward`: every step off the expert's path is a forward, some of them into an
    # obstacle ("You cannot move forward", a state the expert's own episodes never reach), labelled by the bot
    data = collect_expert_states(make_env, episodes=14, seed=11_310, noise=0.25, noise_actions=["go forward"])
    clean = collect_expert_states(make_env, episodes=14, seed=11_310)
    assert not any("You cannot move forward" in s["obs"] for s in states(clean))
    rows = states(data)
    agree, checked, off = replay(data, 11_310)
    assert checked == len(rows) == agree  # every label is the bot's action in its state
    assert 0 < off <= data.deviations and data.unlabelled == 0  # forward never opens a box: the bot always labels
    executed = [executed_action(rows[i + 1]["obs"]) for i in range(len(rows) - 1) if rows[i + 1]["t"] > 0]
    blocked = [i for i, s in enumerate(rows) if s["obs"].startswith("You cannot move forward")]
    assert blocked and len(executed) == len(rows) - data.episodes
    # off the expert's path only forwards happen (BabyAI's slots are the same seven actions in every state)
    env = make_env()
    env.reset(seed=0)
    slots = env.get_wrapper_attr("slot_texts")()
    env.close()
    for i in range(len(rows) - 1):
        if rows[i + 1]["t"] > 0 and executed_action(rows[i + 1]["obs"]) != slots[int(data.actions[i])]:
            assert executed_action(rows[i + 1]["obs"]) == "go forward"
    assert all(slots[int(data.actions[i])] != "go forward" for i in blocked)  # the bot turns where it is blocked


def test_noise_actions_are_checked():
    from echorl_agent.llm_rl.train import LLMTrainConfig

    with pytest.raises(ValueError, match="no expert state had admissible: \\['go forwards'\\]"):
        collect_expert_states(make_env, episodes=1, seed=11_310, noise=0.25, noise_actions=["go forwards"])
    with pytest.raises(ValueError, match="bc_noise_actions must be a non-empty list of action texts"):
        LLMTrainConfig(env_id=ENV, method="bc", bc_noise=0.2, bc_noise_actions="go forward")
    with pytest.raises(ValueError, match="it needs bc_noise > 0"):
        LLMTrainConfig(env_id=ENV, method="bc", bc_noise_actions=["go forward"])


def test_the_cli_flag_sets_the_field_and_the_run_line_names_it():
    from echorl_agent.cli import build_parser, train_overrides
    from echorl_agent.llm_rl.progress import describe
    from echorl_agent.llm_rl.train import LLMTrainConfig

    args = build_parser().parse_args(["train-llm", "--method", "bc", "--bc-noise", "0.25", "--bc-noise-actions",
                                      "go forward", "--bc-lr-scheduler", "linear"])
    over = train_overrides(args)
    assert over["bc_noise_actions"] == ["go forward"] and over["bc_noise"] == 0.25
    assert over["bc_lr_scheduler"] == "linear"
    cfg = LLMTrainConfig(env_id=ENV, **over)
    assert "BC on 8 expert episodes x 3 epochs (noise 0.25 executing go forward), lr linear" in describe(cfg)
