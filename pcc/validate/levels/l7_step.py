"""Level 7, one deterministic training step: the fixed trajectories (level 4's tokens and
behaviour log-probs), one optimizer step from the same weights, with the trainer's precision
changed: the contract's trainer, a BF16 trainer, and (when the rollout quantizes) a
forward-only QDQ trainer, which separates the forward's share of a difference from the backward's.
Compared per tensor family: gradients and the update the optimizer makes.
"""

from __future__ import annotations

import torch

from pcc.runtime.objective import advantages, objective

from . import Outcome

LOOK = ["the family with the lowest gradient cosine: its DGrad/WGrad schemes and sensitive-operation exceptions",
        "if the forward-only variant agrees and the contract's does not: the backward (DGrad, WGrad)",
        "the update differing more than the gradient: optimizer state precision (master, moments)"]


def _family(plan) -> dict[str, str]:
    out = {}
    for op in plan.catalog.operators:
        mod = op.tensor.removesuffix(".weight")
        out[op.tensor] = op.family
        out[mod + ".lora_A.weight"] = out[mod + ".lora_B.weight"] = op.family + " (LoRA)"
    return out


def step(ctx, variant: str | None) -> tuple[dict, dict]:
    """(gradient, update) per trained tensor after one step of `variant` on the fixed batch."""
    tr = ctx.new_trainer(variant)
    tokens, p = ctx.fixed()
    behaviour = ctx.shared["behaviour"]
    reward, _ = ctx.task.reward(tokens)
    mask = ctx.task.response_mask(tokens)
    before = {k: v.clone() for k, v in tr.master.items()}
    logp, _, _ = tr.logprobs(tokens, p, 1.0)
    obj = objective(logp, behaviour.float(), advantages(reward, ctx.cfg.group), mask, ctx.plan.contract.correction)
    tr.step(obj.loss)
    grads = {k: (t.grad.detach().clone() if t.grad is not None else torch.zeros_like(t)) for k, t in tr.trained.items()}
    return grads, {k: tr.master[k] - before[k] for k in before}


def _compare(a: dict, b: dict, fam: dict) -> dict:
    """Per family: cosine and norm ratio of a against the reference b."""
    acc: dict[str, list[float]] = {}
    for k in b:
        f = fam.get(k, "other")
        x, y = a[k].double().reshape(-1), b[k].double().reshape(-1)
        s = acc.setdefault(f, [0.0, 0.0, 0.0])
        s[0] += float(x @ y)
        s[1] += float(x @ x)
        s[2] += float(y @ y)
    return {f: {"cosine": dot / max((xx * yy) ** 0.5, 1e-300), "norm_ratio": (xx / max(yy, 1e-300)) ** 0.5}
            for f, (dot, xx, yy) in sorted(acc.items())}


FOUR_BIT = ("int4", "mxfp4", "nvfp4")


def cosine_bound(plan) -> float:
    """How far a precision change may turn a family's gradient: a 4-bit forward (QAT, NVFP4)
    moves activations, and so every gradient downstream, much more than an 8-bit one."""
    fwd = {plan.scheme("fprop", i).format for i, op in enumerate(plan.catalog.operators) if op.family != "kv_cache"}
    return 0.6 if fwd & set(FOUR_BIT) else 0.9


def run(ctx) -> Outcome:
    o = Outcome(look=list(LOOK))
    fam = _family(ctx.plan)
    g_plan, u_plan = step(ctx, None)
    g_again, _ = step(ctx, None)
    nondet = [k for k in g_plan if not torch.equal(g_plan[k], g_again[k])]
    o.check("tensors whose gradient differs between two identical steps", "==", 0, len(nondet),
            "the step is deterministic, so differences below are precision, not noise")
    nonfinite = [k for k in g_plan if not bool(torch.isfinite(g_plan[k]).all())]
    o.check("tensors with non-finite gradients", "==", 0, len(nonfinite))
    g_ref, u_ref = step(ctx, "bf16")
    rows = {"contract vs bf16": {"grad": _compare(g_plan, g_ref, fam), "update": _compare(u_plan, u_ref, fam)}}
    if ctx.plan.quantized("rollout"):
        g_fwd, u_fwd = step(ctx, "fwd_qdq")
        rows["forward-only qdq vs bf16"] = {"grad": _compare(g_fwd, g_ref, fam), "update": _compare(u_fwd, u_ref, fam)}
    o.figures["families"] = rows
    grad = rows["contract vs bf16"]["grad"]
    worst = min(grad, key=lambda f: grad[f]["cosine"])
    o.figures["lowest gradient cosine"] = grad[worst]["cosine"]
    o.figures["lowest-cosine family"] = worst
    ratio = max(max(r["norm_ratio"], 1 / max(r["norm_ratio"], 1e-300)) for r in grad.values())
    o.figures["largest gradient norm ratio"] = ratio
    o.data["grad_cosine"] = {name: {f: r["cosine"] for f, r in v["grad"].items()} for name, v in rows.items()}
    bound = cosine_bound(ctx.plan)
    if not o.check("lowest gradient cosine", ">=", bound, grad[worst]["cosine"],
                   "a precision change bends the gradient, it does not turn it"):
        fwd = rows.get("forward-only qdq vs bf16", {}).get("grad", {}).get(worst)
        side = "backward (DGrad/WGrad)" if fwd and fwd["cosine"] >= bound else "forward"
        o.findings.append(f"{worst}: gradient cosine {grad[worst]['cosine']:.3f} against BF16; the {side} "
                          "precision is where it turns")
    o.check("largest gradient norm ratio", "<=", 2.0, ratio, "no family's gradient spikes against BF16")
    return o
