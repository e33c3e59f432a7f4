"""One-call construction of SB3 vectorised envs from echorl text env ids."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import gymnasium as gym

from echorl_envs.wrappers.actions import AdmissibleActionWrapper
from echorl_envs.wrappers.encoders import TextEncoder, make_encoder
from echorl_envs.wrappers.observations import EncodedTextObservation, HistoryWindow

__all__ = ["wrap_text_env", "make_sb3_env", "probe_max_actions", "default_max_actions"]


def _registered_max_actions(env_id: str | None) -> int | None:
    """The action slots of a registered echorl id (``EnvEntry.max_actions``), or None for other ids.

    That number covers every admissible set the family lists, so no admissible action is cut from the action space.
    """
    import echorl_envs

    if env_id is None or env_id not in echorl_envs.env_ids():
        return None
    return echorl_envs.entry(env_id).max_actions


def probe_max_actions(env: gym.Env, seed: int = 0) -> int:
    """Number of admissible actions after ``reset(seed=seed)`` (the default ``max_actions`` of unregistered ids,
    which may be too few for an env whose action set grows; registered ids use ``EnvEntry.max_actions``, see :func:`default_max_actions`)."""
    _, info = env.reset(seed=seed)
    n = len(info.get("admissible_actions", []))
    if n == 0:
        raise ValueError(
            "the env lists no admissible actions (a free-text env?); pass max_actions= and vocabulary= explicitly"
        )
    return n


def default_max_actions(env_id: str, env_kwargs: dict[str, Any] | None = None, seed: int = 0) -> int:
    """``max_actions`` for ``env_id`` when none is given: the registered ``EnvEntry.max_actions``, else the
    admissible count after one probing ``reset(seed=seed)`` of ``gym.make(env_id, **env_kwargs)``."""
    registered = _registered_max_actions(env_id)
    if registered is not None:
        return registered
    probe = gym.make(env_id, **(env_kwargs or {}))
    try:
        return probe_max_actions(probe, seed=seed)
    finally:
        probe.close()


def wrap_text_env(
    env: gym.Env,
    *,
    encoder: str | TextEncoder = "hash",
    encoder_kwargs: dict[str, Any] | None = None,
    max_actions: int | None = None,
    vocabulary: Sequence[str] | None = None,
    include_task: bool = True,
    include_actions: bool = False,
    history: int | None = None,
) -> gym.Env:
    """Wrap one text env for SB3: actions → ``Discrete`` (+ mask), observations → ``Box``/``Dict`` (+ window).

    The chain is ``HistoryWindow(EncodedTextObservation(AdmissibleActionWrapper(env)))`` (the history
    window only when ``history`` is not None). See those classes for each argument.

    Args:
        env: a text env.
        encoder: ``"hash"`` (default), ``"minilm"`` or an encoder instance (shared, so its cache is shared).
        encoder_kwargs: keyword arguments of the named encoder.
        max_actions: discrete action count; default ``len(vocabulary)``, else the registered id's
            ``EnvEntry.max_actions`` (enough slots for the family's largest admissible set; 64 on ALFWorld), else
            the number of admissible actions after a probing ``reset(seed=0)`` (ids outside ``echorl_envs.ENVS``).
        vocabulary: fixed action texts (index ``i`` always means ``vocabulary[i]``), or None for positional slots.
        include_task: prepend the instruction to each observation before encoding.
        include_actions: the DRRN-style ``Dict`` observation carrying the encoded action slots and their mask.
        history: ``k`` for a :class:`HistoryWindow` of ``k + 2`` frames (needed by ``EchoPolicy``), or None.

    Example:
        >>> import echorl_envs
        >>> from stable_baselines3.common.env_checker import check_env
        >>> env = wrap_text_env(echorl_envs.make("EchoRL/MiniGrid-Empty-5x5-v0"), history=2)
        >>> env.observation_space.shape, env.action_space
        ((4, 256), Discrete(7))
        >>> check_env(env)  # SB3's checker passes (it only warns that a 2-D window needs a custom policy)
    """
    if max_actions is None and vocabulary is None:
        max_actions = _registered_max_actions(env.spec.id if env.spec is not None else None) or probe_max_actions(env)
    env = AdmissibleActionWrapper(env, max_actions=max_actions, vocabulary=vocabulary)
    env = EncodedTextObservation(
        env, encoder=encoder, encoder_kwargs=encoder_kwargs, include_task=include_task,
        include_actions=include_actions,
    )
    if history is not None:
        env = HistoryWindow(env, k=history)
    return env


def make_sb3_env(
    env_id: str,
    n_envs: int = 1,
    seed: int = 0,
    *,
    env_kwargs: dict[str, Any] | None = None,
    vec_env_cls: type | None = None,
    vec_env_kwargs: dict[str, Any] | None = None,
    monitor_dir: str | None = None,
    **wrapper_kwargs: Any,
) -> Any:
    """An SB3 ``VecEnv`` of ``n_envs`` wrapped copies of ``env_id``, ready for ``PPO("MlpPolicy", ...)``,
    ``MaskablePPO``, ``DQN`` and ``EchoPPO("EchoPolicy", ...)``.

    Built with SB3's ``make_vec_env`` (so each copy is wrapped in ``Monitor`` and seeded ``seed + i``); the
    wrapping is :func:`wrap_text_env` with ``wrapper_kwargs``. One encoder instance is shared by all copies
    of a ``DummyVecEnv`` (so its embedding cache is shared); ``SubprocVecEnv`` workers get a pickled copy.

    Args:
        env_id: an echorl id (see ``echorl_envs.env_ids()``) or any registered text-env id.
        n_envs: number of env copies.
        seed: seed of the first copy.
        env_kwargs: keyword arguments of ``gym.make(env_id, ...)``.
        vec_env_cls: ``DummyVecEnv`` (default) or ``SubprocVecEnv``.
        vec_env_kwargs: keyword arguments of ``vec_env_cls``.
        monitor_dir: where ``Monitor`` writes its CSV logs (None: not written).
        **wrapper_kwargs: :func:`wrap_text_env` arguments (``encoder``, ``history``, ``include_actions``, ...).

    Example:
        >>> vec = make_sb3_env("EchoRL/MiniGrid-Empty-5x5-v0", n_envs=2, history=2)
        >>> vec.num_envs, vec.observation_space.shape, vec.reset().shape
        (2, (4, 256), (2, 4, 256))
        >>> [m.tolist() for m in vec.env_method("action_masks")][0] == [True] * 7
        True
    """
    from stable_baselines3.common.env_util import make_vec_env

    import echorl_envs

    if isinstance(n_envs, bool) or not isinstance(n_envs, int) or n_envs < 1:
        raise ValueError(f"n_envs must be a positive int, got n_envs={n_envs!r}")
    known = {"encoder", "encoder_kwargs", "max_actions", "vocabulary", "include_task", "include_actions", "history"}
    unknown = sorted(set(wrapper_kwargs) - known)
    if unknown:
        import difflib

        hint = difflib.get_close_matches(unknown[0], sorted(known), n=1)
        raise ValueError(
            f"unknown wrapper option {unknown[0]!r}" + (f"; did you mean {hint[0]!r}?" if hint else "")
            + f" (accepted: {sorted(known)})"
        )
    if env_id.startswith("EchoRL/") and env_id != echorl_envs.REMOTE_ID:
        echorl_envs.entry(env_id)  # unknown ids: ValueError with the close match
    kwargs = dict(env_kwargs or {})
    enc = wrapper_kwargs.pop("encoder", "hash")
    enc = make_encoder(enc, **(wrapper_kwargs.pop("encoder_kwargs", None) or {}))
    if wrapper_kwargs.get("max_actions") is None and wrapper_kwargs.get("vocabulary") is None:
        wrapper_kwargs["max_actions"] = default_max_actions(env_id, kwargs, seed)

    def env_fn() -> gym.Env:
        return wrap_text_env(gym.make(env_id, **kwargs), encoder=enc, **wrapper_kwargs)

    maker: Callable[[], gym.Env] = env_fn
    return make_vec_env(
        maker, n_envs=n_envs, seed=seed, vec_env_cls=vec_env_cls, vec_env_kwargs=vec_env_kwargs,
        monitor_dir=monitor_dir,
    )
