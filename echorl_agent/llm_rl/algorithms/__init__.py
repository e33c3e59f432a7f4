"""One folder per LLM-RL method (SB3's ``ppo/``, ``dqn/``; TRL's config + trainer pairs), one registry.

Filled in by the next commits."""
