"""Reference policies for WebShop: the oracle (follows ``info["expert_action"]``) and a random clicker.

Both play one episode of a :class:`~echorl_envs.webshop.env.WebShopEnv` and return its
:class:`EpisodeResult`; tests and ``benchmarks/webshop_scores.py`` use them to bound what agents score.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from echorl_envs.webshop.env import WebShopEnv

__all__ = ["EpisodeResult", "play_oracle", "play_random"]


class EpisodeResult(NamedTuple):
    """Outcome of one episode."""

    reward: float
    success: bool
    steps: int
    bought: bool


def _finish(reward: float, info: dict, steps: int, bought: bool) -> EpisodeResult:
    return EpisodeResult(float(reward), bool(info.get("won", False)), steps, bought)


def play_oracle(env: WebShopEnv, index: int, max_steps: int = 15) -> EpisodeResult:
    """Follow the expert action from reset until the purchase (or ``max_steps``)."""
    _, info = env.reset(options={"index": index})
    for t in range(1, max_steps + 1):
        _, r, term, trunc, info = env.step(info["expert_action"])
        if term or trunc:
            return _finish(r, info, t, term)
    return _finish(0.0, info, max_steps, False)


def play_random(env: WebShopEnv, index: int, rng: np.random.Generator, max_steps: int = 15) -> EpisodeResult:
    """A random clicker: on the search page it searches the instruction's words (as the oracle does first),
    elsewhere it clicks a uniformly random admissible button, until it buys or runs out of steps."""
    _, info = env.reset(options={"index": index})
    for t in range(1, max_steps + 1):
        adm = info["admissible_actions"]
        action = f"search[{env.oracle_query()}]" if not adm else adm[int(rng.integers(len(adm)))]
        _, r, term, trunc, info = env.step(action)
        if term or trunc:
            return _finish(r, info, t, term)
    return _finish(0.0, info, max_steps, False)
