"""Isolated execution of untrusted Python code: the host side (:mod:`~echorl_envs.sandbox.host`, with its limits
and results in :mod:`~echorl_envs.sandbox.config`; the public API below), the confined child it starts (:mod:`~echorl_envs.sandbox.child`, standard library only, run as
``python -I -S``), the child's kernel-level confinement (:mod:`~echorl_envs.sandbox.confine`: namespaces, private
root, rlimits, uid drop, seccomp) and its PEP 578 audit hook (:mod:`~echorl_envs.sandbox.guard`).

See :mod:`echorl_envs.sandbox.host` for what a pass means and every layer, and ``docs/sandbox.md``.
"""

from __future__ import annotations

from echorl_envs.sandbox.config import STATUSES, SandboxConfig, SandboxResult
from echorl_envs.sandbox.host import SandboxPool, run_code, shared_pool

__all__ = ["SandboxConfig", "SandboxResult", "SandboxPool", "run_code", "shared_pool", "STATUSES"]
