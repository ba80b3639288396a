"""The plan's per-operator precision, read into what each execution runs.

Rollout: one Gemm per operator (and a KV-cache scheme per layer). Trainer: an
(fprop, dgrad, wgrad) triple per operator, from the plan, or, for the Table 5
trainer variants, from the rollout's scheme with a chosen execution.
"""

from __future__ import annotations

from .linear import Gemm, gemm_for

VARIANTS = {  # Table 5: (fprop, dgrad/wgrad) execution against the rollout's scheme
    "bf16": ("wide", "wide"),
    "fwd_qdq": ("qdq", "wide"),
    "fwd_bwd_qdq": ("qdq", "qdq"),
    "real": ("real", "real"),
}


def _gemm(plan, component: str, op: int, output: str | None = None) -> Gemm:
    d = plan.decision(component, op)
    return gemm_for(d.scheme, d.gemm, output or d.output)


def rollout_gemms(plan) -> dict[str, Gemm]:
    return {op.tensor: _gemm(plan, "rollout", i) for i, op in enumerate(plan.catalog.operators)
            if op.family != "kv_cache"}


def kv_gemms(plan) -> dict[int, Gemm]:
    """Per layer: the KV-cache representation (its activation role), where the plan quantizes it."""
    out = {}
    for i, op in enumerate(plan.catalog.operators):
        if op.family == "kv_cache":
            g = _gemm(plan, "rollout", i)
            if g.scheme is not None:
                out[op.layer] = Gemm(g.scheme, "qdq", frozenset({"activation"}), "fp32")
    return out


def trainer_gemms(plan, variant: str | None = None) -> dict[str, tuple[Gemm, Gemm, Gemm]]:
    """name -> (fprop, dgrad, wgrad). WGrad keeps the plan's gradient dtype (fp32 main grads)."""
    grads = "fp32" if plan.contract.trainer.grads == "fp32" else "bf16"
    out = {}
    for i, op in enumerate(plan.catalog.operators):
        if op.family == "kv_cache":
            continue
        if variant is None:
            out[op.tensor] = (_gemm(plan, "fprop", i), _gemm(plan, "dgrad", i), _gemm(plan, "wgrad", i, grads))
            continue
        fwd, bwd = VARIANTS[variant]
        spec = plan.scheme("rollout", i)
        out[op.tensor] = (gemm_for(spec, fwd), gemm_for(spec, bwd), gemm_for(spec, bwd, grads))
    return out
