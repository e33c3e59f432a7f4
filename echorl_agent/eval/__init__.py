"""Evaluation: agent registry, side-by-side runner, summaries and plots."""

from echorl_agent.eval.agents import AGENTS, Agent, ExpertAgent, RandomAgent, availability, make_agent
from echorl_agent.eval.report import markdown_table, summarize, wilson_interval, write_summary
from echorl_agent.eval.runner import BenchConfig, run_bench

__all__ = [
    "AGENTS", "Agent", "BenchConfig", "ExpertAgent", "RandomAgent", "availability", "make_agent",
    "markdown_table", "run_bench", "summarize", "wilson_interval", "write_summary",
]
