"""Moved: tree-of-thought search lives in :mod:`echorl_agent.agents.tot` (the engine package never imports the envs)."""

raise ImportError("echorl_agent.llm.tot moved to echorl_agent.agents.tot: "
                  "from echorl_agent.agents.tot import game24_bfs, propose_and_vote, ToTConfig")
