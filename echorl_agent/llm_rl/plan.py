"""EchoRL's latent plan for an LLM policy: tau_t = F_phi(s_{t-k:t}) as m soft tokens (EchoRL Eq. 1-3).

Each step's feature ``s_i`` is the mean of the LM's frozen activations (entering the first trained layer) over the
tokens of step i's observation turn -- the rollout engine computes them anyway. ``F_phi`` is
:class:`~echorl_agent.policies.TrajectoryEncoder` (the same encoder ``EchoPolicy`` uses) over the window of the last
``k + 1`` features, giving a Gaussian ``N(mu, sigma^2)``; ``mu`` is projected to ``m`` soft-token vectors that are
*added* to the residual stream of ``m`` placeholder tokens placed after the prompt and before the action, at the
first trained layer. The layers below never see the plan, so the prompt's cached KV and captured activations stay
valid, and with a zero-initialised projection the policy starts exactly as the plain LLM (plus placeholders).
The KL term ``KL[p(tau_t | s_{t-k:t}) || p(tau_{t-1} | s_{t-k-1:t-1})]`` uses the closed-form Gaussian KL.
"""

from __future__ import annotations

import torch
from torch import nn

from echorl_agent.config import PlanningConfig
from echorl_agent.policies import TrajectoryEncoder, gaussian_kl

__all__ = ["PlanHead", "gaussian_kl"]


class PlanHead(nn.Module):
    """``F_phi`` plus the projection of ``mu`` to ``num_tokens`` soft tokens of width ``hidden``.

    Args:
        hidden: the LM's hidden size (feature and soft-token width).
        cfg: planning config (``window`` k, ``latent_dim``, ``encoder``...).
        num_tokens: m, the number of soft tokens.
    """

    def __init__(self, hidden: int, cfg: PlanningConfig, num_tokens: int) -> None:
        super().__init__()
        self.cfg, self.hidden, self.num_tokens = cfg, hidden, num_tokens
        self.window = int(cfg.window)
        self.encoder = TrajectoryEncoder(hidden, self.window + 1, cfg)
        self.proj = nn.Linear(cfg.latent_dim, num_tokens * hidden)
        nn.init.zeros_(self.proj.weight)
        nn.init.zeros_(self.proj.bias)

    def plans(self, windows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """``windows [B, k + 2, hidden]`` (oldest first) -> ``(mu_t, log_std_t, mu_{t-1}, log_std_{t-1})``."""
        both = torch.cat([windows[:, 1:], windows[:, :-1]], dim=0)
        mu, log_std = self.encoder(both)
        b = windows.shape[0]
        return mu[:b], log_std[:b], mu[b:], log_std[b:]

    def soft(self, mu: torch.Tensor) -> torch.Tensor:
        """``mu [B, d]`` -> soft tokens ``[B, m, hidden]``."""
        return self.proj(mu).view(mu.shape[0], self.num_tokens, self.hidden)
