"""Math text environments: GSM8K (file-backed), GSM-Symbolic and arithmetic (reasoning-gym, offline) and
the Game of 24 (our solver and safe checker).

All are :class:`~echorl_envs.core.DatasetTextEnv` with free-text answers, up to ``max_attempts`` tries,
reward 1 on success and ``info["expert_action"]`` = the oracle's answer (gold number / solver expression).
"""

from __future__ import annotations

from echorl_envs.math.answers import ascii_text, extract_answer, format_number, parse_number, same_number
from echorl_envs.math.base import MathAnswerEnv, MathItem, Verdict, read_number
from echorl_envs.math.game24 import (
    ExpressionError,
    Game24Env,
    check_expression,
    evaluate_expression,
    reaches,
    solvable_puzzles,
    solve,
)
from echorl_envs.math.generated import ArithmeticEnv, GSMSymbolicEnv, ReasoningGymMathEnv
from echorl_envs.math.gsm8k import GSM8K_URL, GSM8KEnv, download_gsm8k, find_gsm8k_file, load_gsm8k

__all__ = [
    "GSM8K_URL",
    "ArithmeticEnv",
    "ExpressionError",
    "GSM8KEnv",
    "GSMSymbolicEnv",
    "Game24Env",
    "MathAnswerEnv",
    "MathItem",
    "ReasoningGymMathEnv",
    "Verdict",
    "ascii_text",
    "check_expression",
    "download_gsm8k",
    "evaluate_expression",
    "extract_answer",
    "find_gsm8k_file",
    "format_number",
    "load_gsm8k",
    "parse_number",
    "reaches",
    "read_number",
    "same_number",
    "solvable_puzzles",
    "solve",
]
