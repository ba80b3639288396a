"""The `quantization_config` a rollout checkpoint carries, in the form SGLang's loaders read.

One rollout format per checkpoint (SGLang picks one quantization method per model);
the KV cache is separate. Loaders matched (sgl-project/sglang, python/sglang/srt/layers/quantization/):
  fp8 / mxfp8  -> fp8.py `Fp8Config.from_config` (quant_method "fp8" or "mxfp8";
                  activation_scheme required; `modules_to_not_convert`)
  mxfp4        -> mxfp4.py `Mxfp4Config` (gpt-oss layout, routed experts only)
  nvfp4        -> modelopt_quant.py `ModelOptFp4Config.from_config` (flat form reads `ignore`)
  int4 W4A16   -> compressed_tensors/compressed_tensors.py (format "pack-quantized")
What each layout's config holds is its class's (pcc.plan.layouts); this module picks the one
layout of the checkpoint and its exclusions. A rollout of several schemes for an engine that serves
ModelOpt MIXED_PRECISION (pcc.plan.mixed) is the "mixed" checkpoint: its config is per module
(`mixed_config`, in the form of NVIDIA's exports). Torch-free: `pcc compile` imports this.
"""

from __future__ import annotations

from pcc.contract.model import Scheme
from pcc.lower import Unsupported, once
from pcc.plan import Plan
from pcc.plan.layouts import Layout, named
from pcc.plan.mixed import is_mixed

# Families whose wide tensors are not linear modules any loader would quantize.
_NOT_MODULES = ("norm", "kv_cache")


class LayoutError(Unsupported):
    """The plan's rollout side has no single SGLang checkpoint layout (PCC608)."""

    code = "PCC608"


def rollout_layout(plan: Plan) -> str:
    """The name of the one quantized layout of the plan's rollout weights, or "wide"."""
    return checkpoint_layout(plan).name


def checkpoint_layout(plan: Plan) -> Layout:
    """The one quantized layout of the plan's rollout weights (the Plan's `layouts`), or the wide one;
    PCC608 on the rule whose scheme no layout stores, or when they have several (one SGLang checkpoint
    holds one format)."""
    if is_mixed(plan):
        return named("mixed")
    ops = plan.catalog.operators
    found: dict[Layout, str | None] = {}
    for d, idx in plan.used("rollout"):
        weights = [i for i in idx if ops[i].family != "kv_cache"]
        if d.scheme.wide or not weights:
            continue
        layout = plan.layouts[weights[0]]
        if layout is None:
            w = d.scheme.weights
            raise LayoutError(f"no SGLang checkpoint layout for rollout weights '{d.scheme.format}' grouped "
                              f"'{w.text() if w else None}' (supported: fp8 block/tensor, mxfp8, mxfp4, nvfp4, "
                              "int4 group)", path=d.path, hint="use fp8_block, fp8_tensor, mxfp8, mxfp4, nvfp4 or "
                              "int4 group N for rollout weights")
        found.setdefault(layout, d.path)
    if len(found) > 1:
        raise LayoutError(f"rollout mixes {', '.join(sorted(x.name for x in found))}: one SGLang checkpoint holds "
                          "one format", path=list(found.values())[-1])
    return next(iter(found)) if found else named("wide")


def wide_mask(plan: Plan) -> list[bool]:
    """Per operator: does rollout keep it wide?"""
    wide = {rid: plan.scheme("rollout", idx[0]).wide for rid, idx in plan.groups["rollout"]}
    return [wide[rid] for rid in plan.owner["rollout"]]


@once
def skip_list(plan: Plan) -> tuple[str, ...]:
    """Module names (tensor name without '.weight') of the linear operators rollout keeps wide,
    plus SGLang's fused-MoE prefix `model.layers.N.mlp.experts` for layers whose routed experts
    are all wide (the loader asks about that prefix, not about each expert). Once per Plan (every
    rollout target asks): a tuple, which each config that holds it copies into a list of its own."""
    ops, layout = plan.catalog.operators, checkpoint_layout(plan)
    names, expert_layers = [], {}
    for op, wide in zip(ops, wide_mask(plan)):
        if op.family.startswith("experts."):
            expert_layers.setdefault(op.layer, set()).add(wide)
        if wide and op.family not in _NOT_MODULES and op.tensor.endswith(".weight"):
            names.append(op.tensor[: -len(".weight")])
    for layer, kinds in sorted(expert_layers.items()):
        if kinds == {True, False}:
            raise LayoutError(f"layer {layer} keeps some routed experts wide and quantizes others: "
                              "SGLang's fused MoE layer takes one format for all its experts",
                              path=_expert_rule(plan, layer), hint="give all routed experts of a layer one scheme")
        if kinds == {True} and layout.every_moe_layer:
            raise LayoutError(f"layer {layer} keeps its routed experts wide, but SGLang's {layout.name} method "
                              "quantizes every fused MoE layer", path=_expert_rule(plan, layer),
                              hint="quantize the routed experts of every layer")
        if kinds == {True} and layout.quantized:
            names.append(_experts_prefix(plan, layer))
    return tuple(names)


def _expert_rule(plan: Plan, layer: int) -> str | None:
    """The contract path of a rollout rule that decides routed experts in `layer`."""
    paths = [plan.decision("rollout", i).path for i, op in enumerate(plan.catalog.operators)
             if op.layer == layer and op.family.startswith("experts.")]
    return next((p for p in reversed(paths) if p), None)


def _experts_prefix(plan: Plan, layer: int) -> str:
    for op in plan.catalog.operators:
        if op.layer == layer and op.family.startswith("experts."):
            return op.tensor.split(".experts.")[0] + ".experts"
    raise LayoutError(f"layer {layer} has no routed experts", path="rollout")


def kv_cache_algo(plan: Plan) -> str | None:
    """"FP8" when rollout stores the KV cache in FP8 E4M3, else None (ModelOpt's names)."""
    fmts = set(plan.kv_cache_formats())
    if fmts == {"fp8_e4m3"}:
        return "FP8"
    if fmts == {"nvfp4"}:
        return "NVFP4"
    return None


def rollout_scheme(plan: Plan) -> Scheme | None:
    """The quantized weight scheme of rollout (the one `rollout_layout` names)."""
    ops = plan.catalog.operators
    for rid, idx in plan.groups["rollout"]:
        spec = plan.scheme("rollout", idx[0])
        if not spec.wide and any(ops[i].family != "kv_cache" for i in idx):
            return spec
    return None


def quantization_config(plan: Plan) -> dict | None:
    """config.json's `quantization_config` for the rollout checkpoint; None when rollout is wide."""
    layout = checkpoint_layout(plan)
    if layout.members:
        return mixed_config(plan)
    return layout.quantization_config(rollout_scheme(plan), list(skip_list(plan)), kv_cache_algo(plan))


def hf_quant_config(plan: Plan) -> dict | None:
    """ModelOpt's separate hf_quant_config.json (nested form), written beside NVFP4 and mixed checkpoints."""
    layout = checkpoint_layout(plan)
    if layout.members:
        flat = mixed_config(plan)
        return {"producer": flat["producer"], "quantization": {
            "quant_algo": "MIXED_PRECISION", "kv_cache_quant_algo": kv_cache_algo(plan),
            "quantized_layers": flat["quantized_layers"], "exclude_modules": flat["ignore"]}}
    return layout.hf_quant_config(list(skip_list(plan)), kv_cache_algo(plan))


# A member's config_groups entry (ModelOpt's export writes one group per algorithm beside quantized_layers;
# vLLM reads quantized_layers only): its weights and, where the GEMM quantizes them, its input activations.
_GROUP = {"FP8": ({"dynamic": False, "num_bits": 8, "type": "float"}, True),
          "NVFP4": ({"dynamic": False, "num_bits": 4, "type": "float", "group_size": 16}, True),
          "W4A16_NVFP4": ({"dynamic": False, "num_bits": 4, "type": "float", "group_size": 16}, False)}


def mixed_config(plan: Plan) -> dict:
    """config.json's ModelOpt MIXED_PRECISION `quantization_config`, as NVIDIA's exports write it
    (tests/models/published): `quantized_layers` keyed by checkpoint module names (a fused projection by
    each shard, as vLLM's `_resolve_quant_algo` resolves them; a layer's routed experts by `...mlp.experts`),
    one `config_groups` entry per algorithm, `ignore` the layers whose routed experts stay wide (vLLM would
    otherwise resolve them from a quantized sibling under the same `mlp.`, its RoutedExperts fallback), and
    the KV cache in `kv_cache_scheme` (the flat form's only KV field vLLM reads)."""
    ops, layers, wide_experts = plan.catalog.operators, {}, []
    for i, op in enumerate(ops):
        x = plan.layouts[i]
        if op.family == "kv_cache" or not op.tensor.endswith(".weight"):
            continue
        experts = op.tensor.split(".experts.")[0] + ".experts" if op.family.startswith("experts.") else None
        if x is None or not x.quantized:
            if experts and experts not in wide_experts:
                wide_experts.append(experts)
            continue
        entry = {"quant_algo": x.modelopt_algo}
        if x.modelopt_algo != "FP8":
            entry["group_size"] = 16
        layers.setdefault(experts or op.tensor[: -len(".weight")], entry)
    groups: dict[str, dict] = {}
    for name, entry in layers.items():
        spec, acts = _GROUP[entry["quant_algo"]]
        g = groups.setdefault(entry["quant_algo"], {"input_activations": spec if acts else None, "weights": spec,
                                                    "targets": []})
        g["targets"].append(name)
    cfg = {"config_groups": {f"group_{k}": {**g, "targets": sorted(g["targets"])}
                             for k, g in enumerate(groups.values())},
           "quantized_layers": layers, "ignore": wide_experts, "quant_algo": "MIXED_PRECISION",
           "producer": {"name": "pcc"}, "quant_method": "modelopt"}
    kv = kv_cache_algo(plan)
    if kv:
        cfg["kv_cache_scheme"] = {"type": "float", "num_bits": 8 if kv == "FP8" else 4, "dynamic": False}
    return cfg
