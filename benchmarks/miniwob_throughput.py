"""MiniWoB++: echorl text-env steps/s vs the raw ``miniwob`` env on the same tasks, and expert success per task.

Throughput: per task, one browser for each side; episodes alternate A/B (raw ``miniwob`` env with element
actions from the same expert plan, then the text env), so both see the same busy-machine conditions. Both
run MiniWoB's own ``MiniWoBEnvironment`` (screenshots off: the text env does not use them); the ratio is
the cost of the text layer (DOM rendering, admissible list, parsing, expert). Usage::

    python benchmarks/miniwob_throughput.py [--episodes 6] [--expert-episodes 10]
"""

from __future__ import annotations

import argparse
import time

import echorl_envs
from echorl_envs.miniwob import EXPERTS, TASKS
from echorl_envs.miniwob.page import Element, parse_command

THROUGHPUT_TASKS = ("click-button", "click-checkboxes", "enter-text", "login-user")


def text_episode(env, seed):
    """The expert's episode on the text env: steps, seconds, the actions, and MiniWoB's own episode seed."""
    _, info = env.reset(seed=seed)
    episode_seed = info["episode_seed"]
    steps, t = 0, time.perf_counter()
    plan = []
    while "expert_action" in info:
        plan.append(info["expert_action"])
        _, r, term, trunc, info = env.step(info["expert_action"])
        steps += 1
        if term or trunc:
            break
    return steps, time.perf_counter() - t, plan, episode_seed


def raw_episode(env, seed, plan, elements_of):
    """The same actions as MiniWoB action dicts on the raw env (timed from reset's end, like the text env)."""
    env.reset(seed=seed)
    cfg = env.action_space_config
    t = time.perf_counter()
    for a in plan:
        cmd = parse_command(a, elements_of)
        if cmd.kind == "click":
            act = {"action_type": cfg.action_types.index("CLICK_ELEMENT"), "ref": cmd.ref}
        else:
            act = {"action_type": cfg.action_types.index("FOCUS_ELEMENT_AND_TYPE_TEXT"), "ref": cmd.ref,
                   "text": cmd.text}
        env.step(act)
    return len(plan), time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--episodes", type=int, default=6)
    ap.add_argument("--expert-episodes", type=int, default=10)
    args = ap.parse_args()
    print("## throughput (steps/s, alternating A/B)")
    ratios = []
    for task in THROUGHPUT_TASKS:
        env = echorl_envs.make(f"EchoRL/MiniWoB-{task}-v0", episode_seconds=120.0)
        raw = echorl_envs.miniwob.MiniWoBEnv(task=task, episode_seconds=120.0)  # its browser.env is the raw env
        raw.reset(seed=0)
        raw_env = raw.browser.env
        ts, tt, rs, rt = 0, 0.0, 0, 0.0
        for ep in range(args.episodes):
            s, d, plan, episode_seed = text_episode(env, 1000 + ep)
            ts, tt = ts + s, tt + d
            els = [Element(int(a.split()[1]), "input_text", 0) for a in plan]  # lets parse_command read the plan
            s, d = raw_episode(raw_env, episode_seed, plan, els)
            rs, rt = rs + s, rt + d
        ratio = (ts / tt) / (rs / rt)
        ratios.append(ratio)
        print(f"| {task} | {rs / rt:.1f} | {ts / tt:.1f} | {ratio:.2f} |")
        env.close()
        raw.close()
    print(f"mean ratio {sum(ratios) / len(ratios):.2f}")
    print("## expert success")
    for task in TASKS:
        if task not in EXPERTS:
            print(f"| {task} | {TASKS[task][0]} | no expert |")
            continue
        env = echorl_envs.make(f"EchoRL/MiniWoB-{task}-v0", episode_seconds=120.0)
        wins = 0
        for ep in range(args.expert_episodes):
            _, info = env.reset(seed=ep)
            while "expert_action" in info:
                _, r, term, trunc, info = env.step(info["expert_action"])
                if term or trunc:
                    break
            wins += bool(info["won"])
        env.close()
        print(f"| {task} | {TASKS[task][0]} | {wins}/{args.expert_episodes} |")


if __name__ == "__main__":
    main()
