"""Any echorl id as a TRL ``GRPOTrainer(environment_factory=...)`` environment.

TRL 1.16's experimental environment support builds one environment per rollout by calling
``environment_factory()``, calls ``reset(**row)`` with the dataset row (its string is appended to the last user
message), exposes every *public* method except ``reset`` / ``get_reward`` as a tool the model calls (the
Google docstring with an ``Args:`` section becomes the tool schema), and, when the environment defines
``get_reward()``, uses it as a reward source. :func:`make_trl_environment` returns such a class for an echorl id:
the only tool is ``act(action)``, which steps the gymnasium env; the reward is the episode's return (or its
success, ``reward="success"``).

GRPO compares the completions of one prompt, so the ``num_generations`` environments of a group must play the
same task: pass a dataset whose rows carry ``seed`` (and ``index`` for dataset-backed envs) --
:func:`make_trl_dataset` builds one. Without a seed every rollout draws its own task (a warning says so).

Example:
    >>> Env = make_trl_environment("EchoRL/Arithmetic-v0")
    >>> env = Env()
    >>> "act" in env.reset(seed=0)
    True
    >>> feedback = env.act(env.info["expert_action"])
    >>> feedback.startswith("Correct!"), env.get_reward(), env.done
    (True, 1.0, True)
"""

from __future__ import annotations

import warnings
from typing import Any

__all__ = ["TRLTextEnvironment", "make_trl_environment", "make_trl_dataset", "prepare_tokenizer"]

_ACT_DOC = """Take one action in the {env_id} environment and return what happens next.

{how}

Args:
    action: {arg}

Returns:
    The environment's feedback (the next observation), with the reward and the actions allowed next.
"""


class TRLTextEnvironment:
    """One echorl episode per rollout, in the shape TRL's ``environment_factory`` expects.

    Subclasses made by :func:`make_trl_environment` fix ``env_id``; instances are pooled and reset by TRL.
    Public methods other than ``reset`` and ``get_reward`` become tools, so state is kept in attributes.

    Attributes:
        env_id: the echorl id played.
        info: the env's last ``info`` dict (admissible actions, expert action, ``won``...).
        total_reward: sum of the rewards of the current episode.
        won: whether the current episode was won.
        done: whether the current episode is over (terminated or truncated).
        num_steps: ``act`` calls that reached the env in the current episode.
        num_invalid: those of them the env judged invalid (``info["invalid_action"]``: not an admissible action).
    """

    env_id: str = ""
    env_kwargs: dict[str, Any] = {}
    reward_mode: str = "return"

    def __init__(self) -> None:
        if not self.env_id:
            raise TypeError("use make_trl_environment(env_id) to build an environment class for a given id")
        import echorl_envs

        self._env = echorl_envs.make(self.env_id, **self.env_kwargs)
        self._warned_seed = False
        self.info: dict[str, Any] = {}
        self.total_reward = 0.0
        self.won = False
        self.done = False
        self.num_steps = 0
        self.num_invalid = 0

    def reset(self, **row: Any) -> str:
        """Start an episode for one dataset row; returns the text TRL appends to the user message.

        ``row["seed"]`` seeds the env and ``row["index"]`` picks a dataset item (dataset-backed envs); every other
        column (``prompt``...) is ignored.
        """
        seed = row.get("seed")
        options = {"index": int(row["index"])} if row.get("index") is not None else None
        if seed is None and options is None and not self._warned_seed:
            warnings.warn(
                f"{type(self).__name__}.reset got a row without 'seed' or 'index': each rollout of a GRPO group "
                "plays a different task; build the dataset with make_trl_dataset()",
                stacklevel=2,
            )
            self._warned_seed = True
        obs, self.info = self._env.reset(seed=None if seed is None else int(seed), options=options)
        self.total_reward = 0.0
        self.won = bool(self.info.get("won", False))
        self.done = False
        self.num_steps = 0
        self.num_invalid = 0
        return f"{obs}{self._choices()}\n\nCall the `act` tool with your action."

    def act(self, action: str) -> str:  # docstring set per environment by make_trl_environment
        if self.done:
            return "The episode is over; no further actions are taken."
        obs, reward, terminated, truncated, self.info = self._env.step(str(action))
        self.num_steps += 1
        self.num_invalid += bool(self.info.get("invalid_action", False))
        self.total_reward += float(reward)
        self.won = bool(self.info.get("won", False))
        self.done = bool(terminated or truncated)
        status = " The episode is over." if self.done else ""
        return f"{obs}\n[reward {float(reward):g}]{status}{self._choices()}"

    def get_reward(self) -> float:
        """The episode's return (``reward_mode="return"``) or 1.0 if it was won (``"success"``)."""
        if self.reward_mode == "success":
            return 1.0 if self.won else 0.0
        return self.total_reward

    def _choices(self) -> str:
        adm = [] if self.done else self.info.get("admissible_actions") or []
        return "\nAdmissible actions: " + ", ".join(adm) if adm else ""


def make_trl_environment(
    env_id: str, reward: str = "return", **env_kwargs: Any
) -> type[TRLTextEnvironment]:
    """A :class:`TRLTextEnvironment` subclass that plays ``env_id`` (pass it as ``environment_factory``).

    Args:
        env_id: a registered echorl id (unknown ids raise ``ValueError`` with the closest match).
        reward: ``"return"`` (sum of env rewards) or ``"success"`` (1.0 if the episode was won).
        **env_kwargs: keyword arguments for ``echorl_envs.make`` (e.g. ``max_attempts=1``).

    Returns:
        A class whose instances TRL resets per rollout; its ``act`` tool docstring names the env and its action
        type (TRL renders it as the tool schema).
    """
    import echorl_envs

    e = echorl_envs.entry(env_id)
    if reward not in ("return", "success"):
        raise ValueError(f"reward must be 'return' or 'success', got reward={reward!r}")
    if e.action_type == "choice":
        how = "Pick exactly one of the admissible actions listed in the last observation."
        arg = "one admissible action, spelled as listed (e.g. the text after 'Admissible actions:')."
    else:
        how = "The action is free text: your answer to the task (a number, expression or grid as asked)."
        arg = "your answer as plain text."

    def act(self, action: str) -> str:  # self unannotated: transformers' get_json_schema reads every hint
        return TRLTextEnvironment.act(self, action)

    act.__doc__ = _ACT_DOC.format(env_id=env_id, how=how, arg=arg)
    name = "".join(ch for ch in env_id.split("/")[-1].title() if ch.isalnum()) + "TRLEnv"
    return type(name, (TRLTextEnvironment,), {
        "env_id": env_id, "env_kwargs": dict(env_kwargs), "reward_mode": reward, "act": act,
        "__module__": __name__, "__doc__": f"TRL environment for {env_id} (see TRLTextEnvironment).",
    })


def make_trl_dataset(env_id: str, num_tasks: int, seed: int = 0, system_prompt: str | None = None):
    """A ``datasets.Dataset`` of ``num_tasks`` rows for ``GRPOTrainer``: a chat prompt and the task's ``seed``.

    The env's observation is appended to the (empty) user message by TRL at reset, so the prompt only holds an
    optional system message. Rows differ by seed, so GRPO groups (repeats of one row) share a task.

    Args:
        env_id: the echorl id (checked).
        num_tasks: number of rows (distinct seeds ``seed .. seed + num_tasks - 1``).
        seed: first seed.
        system_prompt: an optional system message.
    """
    from datasets import Dataset

    import echorl_envs

    echorl_envs.entry(env_id)
    if isinstance(num_tasks, bool) or not isinstance(num_tasks, int) or num_tasks < 1:
        raise ValueError(f"num_tasks must be an int >= 1, got num_tasks={num_tasks!r}")
    head = [{"role": "system", "content": system_prompt}] if system_prompt else []
    prompt = head + [{"role": "user", "content": ""}]
    return Dataset.from_dict({"prompt": [prompt] * num_tasks, "seed": list(range(seed, seed + num_tasks))})


def prepare_tokenizer(tokenizer: Any) -> Any:
    """Give a ChatML tokenizer without tool support (SmolLM2) TRL's Qwen2.5 template, which renders tool calls.

    TRL refuses templates that cannot render ``assistant(tool_calls) -> tool`` turns and parses tool calls only for
    templates it knows. SmolLM2 uses ChatML (``<|im_start|>``) like Qwen2.5, so Qwen2.5's template fits its special
    tokens; tokenizers that already support tool calling are returned unchanged.

    Raises:
        ValueError: the template lacks tool support and the tokenizer is not ChatML.
    """
    from trl.chat_template_utils import qwen2_5_chat_template, supports_tool_calling

    if supports_tool_calling(tokenizer):
        return tokenizer
    if "<|im_start|>" not in tokenizer.get_vocab():
        raise ValueError(
            "the tokenizer's chat template cannot render tool calls and it is not a ChatML tokenizer; "
            "set tokenizer.chat_template to a template with tool support"
        )
    tokenizer.chat_template = qwen2_5_chat_template
    return tokenizer
