"""CRUXEval (Gu et al., 2024) as text envs: predict an output or an input (:mod:`~echorl_envs.cruxeval.env`), or
repair a function with one injected bug (:mod:`~echorl_envs.cruxeval.repair`, bugs from
:mod:`~echorl_envs.cruxeval.mutations`). Items come from the real ``cruxeval.jsonl`` or the offline
:mod:`~echorl_envs.cruxeval.generator`; every answer is model-written code, judged only in :mod:`echorl_envs.sandbox`.
"""

from __future__ import annotations

from echorl_envs.cruxeval.env import (
    CRUXEVAL_URL,
    MAX_ANSWER_CHARS,
    CRUXEvalEnv,
    check_program,
    download_cruxeval,
    gold_answer,
    judge,
    judge_many,
    load_cruxeval,
    parse_answer,
)
from echorl_envs.cruxeval.repair import CRUXEvalRepairEnv, build_repair_items, parse_repair, repair_program

__all__ = [
    "CRUXEvalEnv", "CRUXEvalRepairEnv", "load_cruxeval", "download_cruxeval", "judge", "judge_many", "check_program",
    "parse_answer", "gold_answer", "build_repair_items", "parse_repair", "repair_program", "CRUXEVAL_URL",
    "MAX_ANSWER_CHARS",
]
