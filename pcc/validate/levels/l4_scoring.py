"""Level 4, fixed-prefix scoring: the trainer and the rollout engine score the same prefixes
and the same sampled tokens at the same version; |dlogp| distribution, tails, and position.

With routing replay the trainer runs on the experts the rollout reported, as in training.
Where the two bases differ on purpose (the baseline regime), the first run records the
step-0 gap into the run directory and later runs check the drift from it.
"""

from __future__ import annotations

import hashlib

import torch

from pcc.runtime import diagnostics as D

from . import Outcome
from .common import by_position, readback, score_both, unless_not_served

STATS = ("p50", "p90", "p99", "p999", "mean", "max")
LOOK = ["token alignment: both sides score tokens[:, P:] from the same prefixes (shift by one?)",
        "operator coverage: an operator quantized on one side and not the other (pcc explain)",
        "the first MoE layer whose expert ids differ (level 5) rather than the final log-prob",
        "the |dlogp| tail by position: growth with position points at the KV cache or request state"]


def summary(d: torch.Tensor, mask: torch.Tensor) -> dict:
    st = D.abs_stats(d, mask, "x")
    return {f"same_version abs_dlogp {k}": st[f"x_{k}"] for k in STATS}


def run(ctx) -> Outcome:
    from ..expect import thresholds

    o = Outcome(look=list(LOOK))
    tokens, p = ctx.fixed()
    mask = ctx.task.response_mask(tokens)
    t, s, own = score_both(ctx, tokens, p)
    d = t - s.logp
    o.figures.update(summary(d, mask))
    o.figures["scored tokens"] = int(mask.sum())
    o.figures["served version"] = s.version
    o.check("served version", "==", 0, s.version, "both sides score version 0")
    pos = by_position(d, mask)
    o.data.update({"abs_dlogp": d.abs()[mask > 0].tolist(), "by_position": pos})
    worst = int(torch.tensor(pos["p99"]).argmax())
    o.figures["worst position"] = worst
    if s.routes is not None:
        ra = D.route_agreement(own, s.routes, p, mask)
        o.figures["route_agreement_by_layer"] = ra["route_agreement_by_layer"]
        if ra["route_first_differing_layer"] is not None:
            o.findings.append(f"expert ids first differ at layer {ra['route_first_differing_layer']} "
                              f"(agreement by layer {ra['route_agreement_by_layer']})")
    p99 = o.figures["same_version abs_dlogp p99"]
    ctx.shared["same_version_p99"] = p99
    bound = next((x["value"] for x in thresholds(ctx.expectations, 4) if x["op"] == "<="), None)
    if bound is not None and p99 > bound:
        _localize(ctx, o)
    if ctx.expectations.get("regime") == "baseline":
        _baseline(ctx, o, tokens, p99, thresholds(ctx.expectations, 6))
    return o


def _localize(ctx, o: Outcome) -> None:
    """Which layer's installed weights differ from the checkpoint, if any (the level-5 readback). An engine
    whose API returns no parameter values (vLLM over HTTP: NotServed) leaves the layer unnamed: a finding
    with the engine's reason (PCC704), not an error that ends the level."""
    wrong = unless_not_served(o, lambda: readback(ctx, ctx.checkpoint_tensors()),
                              "the layer whose installed weights differ cannot be named")
    if wrong:
        o.findings.append(f"installed weights first differ at layer {wrong[0].split('.layers.')[1].split('.')[0]}: "
                          + ", ".join(wrong[:6]))


def _baseline(ctx, o: Outcome, tokens, p99: float, level6) -> None:
    """Record the step-0 gap, or check the drift from a recorded one with the same plan and tokens."""
    from pcc.plan.dump import lock_hash, plan_dict

    key = {"plan_lock": lock_hash(plan_dict(ctx.plan)), "engine": ctx.engine_spec,
           "tokens": hashlib.sha256(tokens.numpy().tobytes()).hexdigest()[:16]}
    rec = ctx.read_json("baseline.json")
    ctx.shared["baseline_p99"] = p99
    if rec is not None and {k: rec.get(k) for k in key} == key:
        ctx.shared["baseline_p99"] = rec["p99"]
        drift = abs(p99 - rec["p99"])
        o.figures["step-0 baseline"] = rec["p99"]
        o.figures["baseline_drift abs_dlogp p99"] = drift
        bound = next((t["value"] for t in level6 if t["metric"].startswith("baseline_drift")), None)
        if bound is not None:
            o.check("baseline_drift abs_dlogp p99", "<=", bound, drift,
                    f"the recorded step-0 gap ({rec['p99']:.4g}) must hold on later runs")
        return
    ctx.write_json("baseline.json", {**key, "p99": p99, "stats": {k: v for k, v in o.figures.items()
                                                                   if k.startswith("same_version")}})
    o.figures["step-0 baseline"] = p99
    o.findings.append(f"step-0 baseline recorded: same-version |dlogp| p99 {p99:.4g} (baseline.json)")
