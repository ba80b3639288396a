"""`pcc explain`: the seed's component trace (Table 4), operator coverage, and every
representation of one weight version with its bytes at the model's shapes."""

from __future__ import annotations

import math
from collections import Counter

from pcc.contract.scheme import ROLES
from pcc.plan.resolve import COMPONENTS, DEFAULT, DEFAULT_SCHEME, Plan

ELEMENT_BITS = {"bf16": 16, "fp16": 16, "fp32": 32, "fp8": 8, "fp8_e4m3": 8, "fp8_e5m2": 8, "mxfp8": 8,
                "int8": 8, "mxfp4": 4, "nvfp4": 4, "int4": 4}
LABEL = {"rollout": "Rollout", "fprop": "FProp", "dgrad": "DGrad", "wgrad": "WGrad"}


def explain(plan: Plan) -> dict:
    c, cat = plan.contract, plan.catalog
    ops = cat.operators
    trace = {}
    for comp in COMPONENTS:
        parts = []
        for rid, idx in plan.groups[comp]:
            idx = [i for i in idx if ops[i].family != "kv_cache"]
            if not idx:
                continue
            d = plan.decisions[comp][rid]
            if comp == "wgrad" and c.trainable.kind != "all":
                continue
            parts.append({"scheme": d.scheme_name, "gemm": d.gemm, "operators": len(idx), "rule": d.path})
        trace[comp] = parts
    trainable = c.trainable
    adapter = trainable.kind == "lora"
    if adapter:
        trace["wgrad"] = [{"scheme": "bf16", "gemm": "wide", "operators": len(plan.trainable),
                           "rule": "trainable", "note": "adapter tensors only"}]
    if trainable.kind == "none":
        trace["wgrad"] = []
    trace["optimizer"] = {"master": c.trainer.master, "moments": c.trainer.moments, "params": c.trainer.params,
                          "state_for": "adapter" if adapter else trainable.kind}
    trace["sync"] = {"moves": c.sync.moves, "schedule": c.sync.schedule, "max_staleness": c.sync.max_staleness,
                     "bridge": c.sync.bridge, "activation": c.sync.activation,
                     "rebuild": "adapter only; rollout base unchanged" if c.sync.moves == "adapter"
                     else "quantize, pack and install every rollout tensor" if plan.quantized("rollout")
                     else "transfer weights as they are"}
    coverage = _coverage(plan)
    return {"contract": c.name, "model": cat.name, "operators": len(ops), "fp8_recipe": plan.fp8_recipe,
            "trace": trace, "coverage": coverage, "schemes": _schemes(plan),
            "representations": _representations(plan)}


def _schemes(plan: Plan) -> list[dict]:
    """The legend: every scheme some component uses, with its format, scale grouping per role and
    bytes per parameter at the model's shapes (over the weights it decides in any component; its
    element bytes when it decides only the KV cache)."""
    ops = plan.catalog.operators
    shapes: dict[str, Counter] = {}
    for comp in COMPONENTS:
        for rid, idx in plan.groups[comp]:
            if comp == "wgrad" and plan.contract.trainable.kind != "all":
                continue
            weights = [ops[i].shape for i in idx if ops[i].family != "kv_cache"]
            if weights or (comp == "rollout" and len(weights) < len(idx)):  # the KV cache is rollout's only
                shapes.setdefault(plan.decisions[comp][rid].scheme_name, Counter()).update(weights)
    if plan.contract.trainable.kind == "lora":
        shapes.setdefault(DEFAULT_SCHEME, Counter())  # the BF16 adapter's WGrad
    out = []
    for name in sorted(shapes, key=lambda n: (n != DEFAULT_SCHEME, n)):
        spec = plan.schemes[name]
        params = sum(math.prod(s) * n for s, n in shapes[name].items())
        stored = sum(spec.weight_bytes(s) * n for s, n in shapes[name].items())
        out.append({"name": name, "format": spec.format, "text": spec.text(),
                    **{role: str(g) if (g := spec.grouping_of(role)) is not None else None for role in ROLES},
                    "scale": None if spec.wide else spec.scale, "bits": spec.bits,
                    "bytes_per_param": round(stored / params, 4) if params else spec.bits / 8})
    return out


def _coverage(plan: Plan) -> list[dict]:
    """One row per (family, rule per component): tensors count, schemes, the rules that chose them."""
    ops = plan.catalog.operators
    owners = [plan.owner[comp] for comp in COMPONENTS]
    counts: dict[tuple, list] = {}
    for i, key in enumerate(zip((op.family for op in ops), *owners)):
        hit = counts.get(key)
        if hit is None:
            counts[key] = [1, ops[i].tensor]
        else:
            hit[0] += 1
    rows = []
    for (family, *rids), (n, example) in counts.items():
        schemes, rules = {}, {}
        for comp, rid in zip(COMPONENTS, rids):
            if family == "kv_cache" and comp != "rollout":
                schemes[comp] = "-"
                continue
            schemes[comp] = plan.rules[rid].rule.scheme if rid != DEFAULT else "bf16"
            rules[comp] = plan.rules[rid].path if rid != DEFAULT else "default"
        rows.append({"family": family, "tensors": n, "schemes": schemes, "rules": rules, "example": example})
    return rows


def _representations(plan: Plan) -> list[dict]:
    """Every representation of one weight version; the rollout and sync bytes are the Plan's
    (the converter plan and diff read the same numbers)."""
    c, ops = plan.contract, plan.catalog.operators
    params = plan.params
    lora = c.trainable.kind == "lora"
    train_params = plan.adapter_params if lora else sum(math.prod(ops[i].shape) for i in plan.trainable)
    bits = ELEMENT_BITS
    reps = [
        {"name": "optimizer master", "dtype": c.trainer.master, "bytes": train_params * bits[c.trainer.master] // 8,
         "of": "adapter" if lora else "trainable weights"},
        {"name": "optimizer moments (2)", "dtype": c.trainer.moments,
         "bytes": 2 * train_params * bits[c.trainer.moments] // 8},
        {"name": "trainer parameter", "dtype": c.trainer.params, "bytes": params * bits[c.trainer.params] // 8,
         "of": "all weights" + (" (frozen base)" if lora else "")},
    ]
    gemm_bytes = 0
    real_ops = 0
    for d, idx in plan.used("fprop"):
        if d.gemm == "real":
            for i in idx:
                if ops[i].family != "kv_cache":
                    gemm_bytes += 2 * d.scheme.weight_bytes(ops[i].shape)  # rowwise + columnwise copies
                    real_ops += 1
    if real_ops:
        reps.append({"name": "GEMM weight operands (rowwise + columnwise)", "dtype": "per FProp scheme",
                     "bytes": gemm_bytes, "of": f"{real_ops} operators with real low-precision GEMMs"})
    if lora:
        reps.append({"name": "sync payload per version", "dtype": "bf16", "bytes": plan.sync_bytes,
                     "of": "adapter only"})
    else:
        reps.append({"name": "sync payload per version", "dtype": c.sync.bridge, "bytes": plan.sync_bytes,
                     "of": "all weights"})
    roll = plan.rollout_bytes + (2 * train_params if lora else 0)  # the BF16 adapter beside the packed base
    reps.append({"name": "rollout weights (packed)", "dtype": "per rollout scheme", "bytes": roll,
                 "of": "all weights" + (" + adapter" if lora else "")})
    if c.trainer.param_gather != "bf16":
        reps.append({"name": "parameter all-gather", "dtype": c.trainer.param_gather,
                     "bytes": params * bits[c.trainer.param_gather] // 8})
    return reps


def _gib(n: int) -> str:
    for unit, div in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= div:
            return f"{n / div:.2f} {unit}"
    return f"{n} B"


def render(info: dict) -> str:
    out = [f"contract {info['contract']}  model {info['model']}  ({info['operators']} operators)", "",
           "Component trace (seed Table 4)"]
    for comp in COMPONENTS:
        parts = info["trace"][comp]
        text = "; ".join(f"{p['scheme']} {p['gemm']} x{p['operators']}" + (f" [{p['rule']}]" if p["rule"] else "")
                         for p in parts) or "none (nothing trains)"
        out.append(f"  {LABEL[comp]:<10} {text}")
    o = info["trace"]["optimizer"]
    out.append(f"  {'Optimizer':<10} master {o['master']}, moments {o['moments']}, params {o['params']} "
               f"(state for: {o['state_for']})")
    s = info["trace"]["sync"]
    out.append(f"  {'Sync':<10} {s['moves']}, {s['schedule']}, max staleness {s['max_staleness']}, bridge "
               f"{s['bridge']}, activation {s['activation']}: {s['rebuild']}")
    if info["fp8_recipe"]:
        out.append(f"  (Transformer Engine recipe: {info['fp8_recipe']})")
    out += ["", "Operator coverage",
            f"  {'family':<22} {'tensors':>7}  {'rollout':<12} {'fprop':<12} {'dgrad':<12} {'wgrad':<12} rule(s)"]
    for row in info["coverage"]:
        s = row["schemes"]
        rules = sorted({r for r in row["rules"].values() if r != "default"}) or ["default"]
        out.append(f"  {row['family']:<22} {row['tensors']:>7}  {s['rollout']:<12} {s['fprop']:<12} "
                   f"{s['dgrad']:<12} {s['wgrad']:<12} {', '.join(rules)}")
    out += ["", "One weight version, every representation at once"]
    for r in info["representations"]:
        out.append(f"  {r['name']:<44} {r['dtype']:<18} {_gib(r['bytes']):>12}" + (f"  ({r['of']})" if r.get("of") else ""))
    return "\n".join(out)
