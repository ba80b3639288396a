"""The policy-gradient objective: group-normalized advantages, a clipped ratio, and the contract's correction.

Without a correction the ratio is taken against the behaviour log-probs (what the
rollout recorded). With one, the ratio is against the trainer's own score at the
current version (detached), and the behaviour gap pi_old / mu enters as an
importance weight, as Miles/slime do: `tis` truncates it to [low, clip], `mis` and
`masked` drop tokens outside that range, `rejection` drops whole sequences whose
ratio leaves [1/threshold, threshold]. `level sequence` uses one weight per sequence.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Objective:
    loss: torch.Tensor
    clip_frac: float  # fraction of tokens whose PPO ratio was clipped
    is_clip_frac: float  # fraction whose importance weight hit the correction's bounds
    is_weight_mean: float


def advantages(reward: torch.Tensor, group: int) -> torch.Tensor:
    r = reward.view(-1, group)
    a = (r - r.mean(1, keepdim=True)) / (r.std(1, keepdim=True) + 1e-6)
    return a.reshape(-1)


def _masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (x * mask).sum() / mask.sum().clamp(min=1)


def objective(logp: torch.Tensor, behaviour: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor, correction,
              eps: float = 0.2, ref_logp: torch.Tensor | None = None, ref_coef: float = 0.0) -> Objective:
    kind = correction.kind
    old = behaviour if kind == "none" else logp.detach()
    ratio = torch.exp(logp - old)
    a = adv[:, None]
    surr = torch.min(ratio * a, ratio.clamp(1 - eps, 1 + eps) * a)
    clipped = ((ratio - 1).abs() > eps).float()
    weight = torch.ones_like(logp)
    hit = torch.zeros_like(logp)
    if kind != "none":
        log_w = (logp.detach() - behaviour)
        if correction.level == "sequence":
            log_w = (log_w * mask).sum(1, keepdim=True).expand_as(log_w)
        w = log_w.exp()
        hi = correction.clip if correction.clip is not None else (correction.threshold or 2.0)
        lo = correction.low if correction.low is not None else 0.0
        if kind == "rejection":
            hi = correction.threshold or hi
            lo = 1.0 / hi
        hit = ((w > hi) | (w < lo)).float()
        weight = w.clamp(lo, hi) if kind == "tis" else w * (1 - hit)
    loss = -_masked_mean(weight * surr, mask)
    if ref_logp is not None and ref_coef > 0:
        d = ref_logp - logp
        loss = loss + ref_coef * _masked_mean(d.exp() - d - 1, mask)  # k3 estimator of KL(pi || ref)
    return Objective(loss, float(_masked_mean(clipped, mask)), float(_masked_mean(hit, mask)),
                     float(_masked_mean(weight, mask)))
