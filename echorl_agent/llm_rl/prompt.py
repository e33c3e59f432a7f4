"""Chat prompts of the LLM policy from the state of :class:`~echorl_envs.wrappers.llm.LLMObservationWrapper`.

One user turn per observation (with its admissible actions), one assistant turn per action taken, so the prompt of
step t+1 extends the prompt of step t (inside a history chunk) and the prefix cache serves it. A candidate action is
scored as the complete assistant reply ``action<end-of-turn>`` (a prefix of a longer action is not favoured).
"""

from __future__ import annotations

from typing import Any

__all__ = ["render_prompt", "candidate_ids", "user_turn"]


def user_turn(obs: str, admissible: list[str] | None) -> str:
    return f"{obs.strip()}\nAdmissible actions: {', '.join(admissible)}" if admissible else obs.strip()


def render_prompt(llm: Any, state: dict[str, Any], system: str, show_admissible: bool = True) -> tuple[list[int], int]:
    """Token ids of the prompt, and where the current observation's turn starts (for the plan feature).

    Args:
        llm: a :class:`~echorl_agent.llm.models.loading.LoadedModel` (tokenizer + chat template).
        state: the decoded observation (``task``, ``history``, ``obs``, ``admissible``).
        system: the system message (the task is appended to it).
        show_admissible: list the admissible actions in every observation turn.
    """
    sys_text = f"{system}\nYour task: {state['task']}" if state.get("task") else system
    messages = [{"role": "system", "content": sys_text}]
    for obs, adm, action in state.get("history", []):
        messages.append({"role": "user", "content": user_turn(obs, adm if show_admissible else None)})
        messages.append({"role": "assistant", "content": action})
    before = llm.chat_ids(messages, add_generation_prompt=False)
    messages.append({"role": "user", "content": user_turn(state["obs"], state["admissible"] if show_admissible else None)})
    ids = llm.chat_ids(messages, add_generation_prompt=True)
    return ids, min(len(before), len(ids) - 1)


def candidate_ids(llm: Any, admissible: list[str]) -> list[list[int]]:
    """Each action as the assistant's full reply: its tokens and the end-of-turn token."""
    eos = llm.eos_token_ids[:1]
    return [llm.encode(a) + eos for a in admissible]
