"""Per-step diagnostics, each computed from the two executions it names (seed Table 1, Section 2).

- same-version |dlogp|: trainer at version t vs rollout at version t, same tokens and prefixes;
- staleness: rollout at t vs rollout at the behaviour version tau (re-scored), reported apart;
- trainer-rollout KL: exact KL(mu || pi) over the vocabulary, per generated token;
- reference KL: exact KL(pi || pi_ref), the BF16 execution of the warm-start weights;
- routes: the trainer's own top-k against the experts the rollout recorded, per layer.
"""

from __future__ import annotations

import torch


def _sel(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return x[mask > 0]


def abs_stats(d: torch.Tensor, mask: torch.Tensor, prefix: str) -> dict[str, float]:
    a = _sel(d.abs(), mask).double()
    if a.numel() == 0:
        return {}
    q = a.quantile(torch.tensor([0.5, 0.9, 0.99, 0.999], dtype=torch.float64))
    return {f"{prefix}_mean": float(a.mean()), f"{prefix}_p50": float(q[0]), f"{prefix}_p90": float(q[1]),
            f"{prefix}_p99": float(q[2]), f"{prefix}_p999": float(q[3]), f"{prefix}_max": float(a.max())}


def by_position(d: torch.Tensor, mask: torch.Tensor) -> list[float]:
    a = (d.abs() * mask).sum(0) / mask.sum(0).clamp(min=1)
    return [round(float(x), 6) for x in a]


def kl_rows(p_log: torch.Tensor, q_log: torch.Tensor, mask: torch.Tensor) -> float:
    """Mean over masked positions of KL(p || q) from log-softmax rows [N, G, V]."""
    kl = (p_log.exp() * (p_log - q_log)).sum(-1)
    return float((kl * mask).sum() / mask.sum().clamp(min=1))


def entropy(lsm: torch.Tensor, mask: torch.Tensor) -> float:
    h = -(lsm.exp() * lsm).sum(-1)
    return float((h * mask).sum() / mask.sum().clamp(min=1))


def route_agreement(trainer: list[torch.Tensor], rollout: list[torch.Tensor], prompt_len: int,
                    mask: torch.Tensor) -> dict:
    """Per MoE layer: fraction of scored tokens whose expert sets agree (order ignored).

    Scored positions are the prompt's last token and the generated ones (the positions
    whose logits give the generated tokens' log-probs), masked like the loss."""
    if not trainer:
        return {}
    per_layer = []
    for t, r in zip(trainer, rollout):
        t, r = t[:, prompt_len - 1:].sort(-1).values, r[:, prompt_len - 1:].sort(-1).values
        same = (t == r).all(-1).float()
        per_layer.append(float((same * mask).sum() / mask.sum().clamp(min=1)))
    first = next((i for i, a in enumerate(per_layer) if a < 1.0), None)
    return {"route_agreement": sum(per_layer) / len(per_layer), "route_agreement_min": min(per_layer),
            "route_agreement_by_layer": [round(a, 6) for a in per_layer], "route_first_differing_layer": first}
