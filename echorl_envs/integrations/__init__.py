"""Adapters that let other trainers consume echorl environments (TRL's ``GRPOTrainer``, rl-baselines3-zoo).

Each adapter lives in its own module and imports its third-party library lazily, so importing
``echorl_envs.integrations`` costs nothing.
"""
