"""What more than one level uses: scoring the same tokens on both sides, |dlogp| by position,
and reading installed weights back by name.

Level modules import this and `Outcome`, never each other (tests/test_layers.py).
"""

from __future__ import annotations

import re

import torch

from pcc.runtime import diagnostics as D
from pcc.runtime.weights import decode_operator

LAYER = re.compile(r"\.layers\.(\d+)\.")


def score_both(ctx, tokens, prompt_len, engine=None, trainer=None):
    """(trainer log-probs, rollout Scores) for the same tokens; replay where the contract replays."""
    s = (engine or ctx.engine).score(tokens, prompt_len, routes=True)
    replay = s.routes if ctx.plan.contract.routing_replay != "none" and s.routes else None
    t, own = (trainer or ctx.trainer).score(tokens, prompt_len, replay)
    return t, s, own


def by_position(d: torch.Tensor, mask: torch.Tensor) -> dict:
    """|dlogp| mean and p99 at each response position."""
    a = d.abs()
    p99 = []
    for j in range(a.shape[1]):
        v = a[:, j][mask[:, j] > 0]
        p99.append(float(v.quantile(0.99)) if v.numel() else 0.0)
    return {"mean": D.by_position(d, mask), "p99": p99}


def unless_not_served(o, fn, what: str = ""):
    """`fn()`, or None with the engine's reason, coded (PCC704), among the findings where its API cannot do
    it (a check then reads 'not measured'); `what` says what is left undone."""
    from ..engine import NotServed

    try:
        return fn()
    except NotServed as exc:
        o.findings.append(f"{exc.code}: {what + ': ' if what else ''}{exc}")
        return None


def readback(ctx, tensors: dict[str, torch.Tensor]) -> list[str]:
    """Operators whose served values differ from what version `tensors` decodes to, in layer order."""
    wrong = []
    eng = ctx.engine
    for i, op in enumerate(ctx.plan.catalog.operators):
        if op.family == "kv_cache" or ".layers." not in op.tensor:
            continue
        want = decode_operator(ctx.plan, i, tensors)
        want = want if isinstance(want, torch.Tensor) else want.dequantize(torch.float32)
        got = eng.read_tensor(op.tensor).float()
        n = min(got.shape[0], want.shape[0])
        if got.shape[1:] != want.shape[1:] or not torch.equal(got[:n], want[:n].float()):
            wrong.append(op.tensor)
    return sorted(wrong, key=lambda n: int(LAYER.search(n).group(1)))
