"""Chat prompts of the LLM policy from the state of :class:`~echorl_envs.wrappers.llm.LLMObservationWrapper`.

One user turn per observation (with its admissible actions), one assistant turn per action taken, so the prompt of
step t+1 extends the prompt of step t (inside a history chunk) and the prefix cache serves it. A candidate action is
scored as the complete assistant reply ``action<end-of-turn>`` (a prefix of a longer action is not favoured).

Two opt-in layouts cut the tokens the rollout engine prefills per env step (issue 89, item 4):

* ``end_token=False`` (:attr:`LLMPolicyConfig.candidate_end_token`): a candidate is the action's own tokens. The
  engine never runs a candidate's last token (its output would predict past the candidate), so with the end-of-turn
  token every action token is run; without it the action's last token is not, and candidates that then share their
  whole input ("turn left", "turn right" -> "turn") run it once. On BabyAI's seven actions this runs 4 candidate
  tokens per state instead of 12. The score no longer includes ``log P(end | action)``, so an action that is a token
  prefix of another admissible action is favoured over it (none of BabyAI's is), and the pretrained LM's start
  policy moves (GoToLocal: "pick up" gains; :attr:`LLMPolicyConfig.candidate_end_token`).
* ``admissible_in_system=True``: the admissible actions listed once, in the system message, instead of in every
  observation turn. The prompt's leading blocks stay in the prefix cache only while the set stays the same (BabyAI's
  never changes); an env whose set changes re-prefills the whole prompt whenever it does.
* ``drop_task_lines=True``: an observation's lines that repeat the task (BabyAI's ``Mission: go to the red key.``)
  are left out of its turn; the system message names the task once.
"""

from __future__ import annotations

from typing import Any

__all__ = ["render_prompt", "candidate_ids", "user_turn"]


def _without_task(obs: str, task: str | None) -> str:
    """``obs`` without the lines that contain ``task`` (kept whole when every line does)."""
    if not task:
        return obs
    kept = [line for line in obs.splitlines() if task.strip().rstrip(".") not in line]
    return "\n".join(kept) if kept else obs


def user_turn(obs: str, admissible: list[str] | None) -> str:
    return f"{obs.strip()}\nAdmissible actions: {', '.join(admissible)}" if admissible else obs.strip()


def render_prompt(llm: Any, state: dict[str, Any], system: str, show_admissible: bool = True,
                  admissible_in_system: bool = False, drop_task_lines: bool = False) -> tuple[list[int], int]:
    """Token ids of the prompt, and where the current observation's turn starts (for the plan feature).

    Args:
        llm: a :class:`~echorl_agent.llm.models.loading.LoadedModel` (tokenizer + chat template).
        state: the decoded observation (``task``, ``history``, ``obs``, ``admissible``).
        system: the system message (the task is appended to it).
        show_admissible: list the admissible actions in every observation turn.
        admissible_in_system: list the current state's admissible actions once, at the end of the system message,
            and in no observation turn (``show_admissible`` is then ignored).
        drop_task_lines: leave the observations' lines that repeat the task out of their turns.
    """
    task = state.get("task") if drop_task_lines else None
    sys_text = f"{system}\nYour task: {state['task']}" if state.get("task") else system
    if admissible_in_system:
        sys_text = user_turn(sys_text, state.get("admissible"))
        show_admissible = False
    messages = [{"role": "system", "content": sys_text}]
    for obs, adm, action in state.get("history", []):
        turn = user_turn(_without_task(obs, task), adm if show_admissible else None)
        messages.append({"role": "user", "content": turn})
        messages.append({"role": "assistant", "content": action})
    before = llm.chat_ids(messages, add_generation_prompt=False)
    messages.append({"role": "user", "content": user_turn(_without_task(state["obs"], task),
                                                          state["admissible"] if show_admissible else None)})
    ids = llm.chat_ids(messages, add_generation_prompt=True)
    return ids, min(len(before), len(ids) - 1)


def candidate_ids(llm: Any, admissible: list[str], end_token: bool = True) -> list[list[int]]:
    """Each action as the assistant's full reply: its tokens and the end-of-turn token (``end_token=False``: its
    tokens only, see the module docstring)."""
    eos = llm.eos_token_ids[:1] if end_token else []
    return [llm.encode(a) + eos for a in admissible]
