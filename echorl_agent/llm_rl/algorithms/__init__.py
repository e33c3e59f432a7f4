"""One folder per LLM-RL method (SB3's ``ppo/``, ``dqn/``; TRL's config + trainer pairs), one registry.

* :mod:`~echorl_agent.llm_rl.algorithms.registry` -- every method ``echorl train-llm --method`` runs, its options,
  its checkpoint kind and its ``llm-*`` bench agent (:data:`~echorl_agent.llm_rl.algorithms.registry.METHODS`);
* :mod:`~echorl_agent.llm_rl.algorithms.base` -- :class:`~echorl_agent.llm_rl.algorithms.base.MethodTrainer`, the
  protocol every method's trainer follows, and the parts they share (curves, TensorBoard);
* ``bc/`` (behaviour cloning, the BC warm start), ``ppo/`` (:class:`LLMPPO`, PPO replay), ``gigpo/``
  (:class:`GiGPOTrainer`), ``grpo/`` (:class:`GRPOTrainer`), ``echorl/`` (the plan + replay settings): each a Config
  dataclass, its trainer and its checkpoint files;
* :mod:`~echorl_agent.llm_rl.algorithms.options` -- ``train-llm``'s per-method flags, generated from the Configs.

Adding a method: a folder and a :func:`~echorl_agent.llm_rl.algorithms.registry.register` call (docs/plug-llm-rl.md).
"""
