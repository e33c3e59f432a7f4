"""Evaluation: agent registry, side-by-side runner, summaries and plots (the agents themselves: :mod:`echorl_agent.agents`)."""

from echorl_agent.eval.agents import AGENTS, availability, make_agent
from echorl_agent.eval.report import markdown_table, summarize, write_summary
from echorl_agent.eval.runner import BenchConfig, run_bench
from echorl_agent.eval.stats import wilson_interval

__all__ = [
    "AGENTS", "BenchConfig", "availability", "make_agent",
    "markdown_table", "run_bench", "summarize", "wilson_interval", "write_summary",
]
