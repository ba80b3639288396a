"""ModelOpt MIXED_PRECISION rollout checkpoints: one checkpoint, each module in its own scheme.

A pcc rollout checkpoint normally has one quantization scheme (PCC312). vLLM also serves ModelOpt's
`quant_algo: MIXED_PRECISION` form (vllm/model_executor/layers/quantization/modelopt.py
`ModelOptMixedPrecisionConfig`): `quantized_layers` gives each module its own `quant_algo`, every module
not listed stays unquantized. Where the rollout engine serves it (targets/<engine>.yaml `modelopt_mixed`),
a rollout of several schemes is that form, each weight in its layout's member form (`Layout.mixed_member`:
FP8 per tensor with a static input scale, NVFP4, W4A16 NVFP4); the Plan decides it once (`Plan.layouts`).
Torch-free.
"""

from __future__ import annotations

from functools import lru_cache

from pcc.plan.tensors import FUSED_WITH
from pcc.resources import target_table

# Projections the engines load as one fused module (pcc.plan.tensors.FUSED_WITH, Qwen3.5's Gated DeltaNet pairs
# among them): vLLM resolves a fused module's algo from its shards and refuses shards of two algos ("Mixed
# quant_algo within fused layer").


@lru_cache(maxsize=None)
def engine_mixed(engine: str) -> dict | None:
    """The engine's `modelopt_mixed` table (targets/<engine>.yaml), None where it serves no mixed checkpoint."""
    try:
        return target_table(engine).get("modelopt_mixed")
    except FileNotFoundError:
        return None


def scheme_key(spec) -> tuple:
    """What one single-scheme checkpoint config fixes (PCC312): format, grouping, scale, symmetry, rule."""
    return (spec.format, spec.weights, spec.scale, spec.symmetric, spec.scale_rule)


def quantized_keys(plan) -> dict[tuple, object]:
    """Distinct scheme keys of the quantized rollout weights -> the first decision using each."""
    ops, out = plan.catalog.operators, {}
    for d, idx in plan.used("rollout"):
        if not d.scheme.wide and any(ops[i].family != "kv_cache" for i in idx):
            out.setdefault(scheme_key(d.scheme), d)
    return out


def is_mixed(plan) -> bool:
    """Is the rollout checkpoint ModelOpt MIXED_PRECISION: several quantized schemes, an engine that serves it."""
    return engine_mixed(plan.contract.rollout.engine) is not None and len(quantized_keys(plan)) > 1


def module_of(name: str) -> str:
    """The module an operator's tensor belongs to in the engine: a layer's routed experts are one module
    (`...mlp.experts`), fused projections one module (named by their first shard), others their own."""
    if ".experts." in name:
        return name.split(".experts.")[0] + ".experts"
    module = name.removesuffix(".weight")
    head, _, leaf = module.rpartition(".")
    group = FUSED_WITH.get(leaf)
    return f"{head}.{group[0]}" if group else module
