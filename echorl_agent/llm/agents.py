"""Moved: the LLM agents live in :mod:`echorl_agent.agents.chat` (the engine package never imports the envs)."""

raise ImportError("echorl_agent.llm.agents moved to echorl_agent.agents.chat: "
                  "from echorl_agent.agents import ReActAgent, ScoringAgent, ChatReActAgent")
