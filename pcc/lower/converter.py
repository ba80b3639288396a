"""The converter plan: how every tensor of the model becomes the rollout checkpoint, and what a
live sync moves per version.

`tensor_targets(plan, i)` is the one definition of a rollout tensor's checkpoint names, dtypes
and shapes: `pcc convert` writes it, `pcc verify-checkpoint` checks against it, and the plan
JSON lists it for every tensor. Torch-free (`pcc compile` imports this).
"""

from __future__ import annotations

import json
import math
from functools import lru_cache

from pcc.lower import Lowered, target, unsupported
from pcc.lower.checkpoint_config import (
    hf_quant_config, kv_cache_algo, layout_of, quantization_config, rollout_layout, skip_list,
)
from pcc.plan import Plan

BUCKET_BYTES = 512 << 20  # Miles' --update-weight-buffer-size default
DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4, "float8_e4m3fn": 1, "uint8": 1, "int8": 1,
               "int32": 4, "int64": 8}
SOURCE_DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}
_COLUMN = ("attn.q", "attn.kv", "mlp.gate_up", "shared_experts.gate_up", "embed", "lm_head")
_ROW = ("attn.o", "mlp.down", "shared_experts.down")


@lru_cache(maxsize=4096)
def _t(dtype: str, shape: tuple) -> dict:
    """A target's {dtype, shape}; shared between tensors of the same shape, so read-only."""
    return {"dtype": dtype, "shape": list(shape)}


def nbytes(t: dict) -> int:
    return DTYPE_BYTES[t["dtype"]] * math.prod(t["shape"])


def tensor_targets(plan: Plan, i: int) -> dict:
    """{"targets": {name: {dtype, shape}}, "layout": ..., "fuse": ...?} for operator i."""
    op = plan.catalog.operators[i]
    spec = plan.scheme("rollout", i)
    layout = layout_of(spec)
    if layout == "mxfp4":
        return _mxfp4_targets(plan, i)
    if layout != "wide" and len(op.shape) != 2:
        unsupported("PCC206", f"{op.tensor}: rollout quantizes 2-D linear weights, got shape {list(op.shape)}",
                    plan.decision("rollout", i).path, hint="keep this tensor wide")
    prefix = op.tensor[: -len(".weight")] if op.tensor.endswith(".weight") else op.tensor
    g = spec.weights
    key = (layout, g.rows, g.cols, g.size, spec.symmetric) if g is not None else (layout, None, None, None, True)
    targets = {(op.tensor if suffix is None else prefix + suffix): t
               for suffix, t in _template(*key, tuple(op.shape), op.dtype)}
    return {"layout": layout, "targets": targets}


@lru_cache(maxsize=None)
def _template(layout: str, rows, cols, size, symmetric: bool, shape: tuple, dtype: str) -> tuple:
    """(suffix after the module name or None for the tensor's own name, {dtype, shape}) per target.
    The dicts are shared by every tensor of the same layout and shape: read-only."""
    return tuple((suffix, _t(dt, sh)) for suffix, dt, sh in _layout(layout, rows, cols, size, symmetric, shape, dtype))


def _layout(layout: str, rows, cols, size, symmetric: bool, shape: tuple, dtype: str) -> tuple:
    if layout == "wide":
        return ((None, SOURCE_DTYPES.get(dtype, dtype), shape),)
    n, k = shape
    if layout == "fp8_block":
        r, c = rows, cols
        return ((None, "float8_e4m3fn", shape), (".weight_scale_inv", "float32", (-(-n // r), -(-k // c))))
    if layout == "fp8_tensor":
        return ((None, "float8_e4m3fn", shape), (".weight_scale", "float32", ()))
    if layout == "mxfp8":
        return ((None, "float8_e4m3fn", shape), (".weight_scale_inv", "uint8", (n, -(-k // 32))))
    if layout == "nvfp4":
        return ((None, "uint8", (n, -(-k // 2))), (".weight_scale", "float8_e4m3fn", (n, -(-k // 16))),
                (".weight_scale_2", "float32", ()), (".input_scale", "float32", ()))
    g = size  # int4, compressed-tensors pack-quantized
    out = ((".weight_packed", "int32", (n, -(-k // 8))), (".weight_scale", "float32", (n, -(-k // g))),
           (".weight_shape", "int64", (2,)))
    if not symmetric:
        out += ((".weight_zero_point", "int32", (-(-n // 8), -(-k // g))),)
    return out


def _mxfp4_targets(plan: Plan, i: int) -> dict:
    """gpt-oss layout: each MoE layer's routed experts fused into `experts.{gate_up,down}_proj_{blocks,scales}`,
    [E, rows, K/32, 16] uint8 (two E2M1 per byte) and [E, rows, K/32] E8M0; gate and up rows interleaved
    (gate row r at 2r, up row r at 2r+1), as gpt-oss's SwiGLU reads them."""
    cat = plan.catalog
    op = cat.operators[i]
    if not op.family.startswith("experts."):
        unsupported("PCC307", f"{op.tensor}: SGLang's mxfp4 checkpoint layout holds routed experts only",
                    plan.decision("rollout", i).path, hint="restrict the rule to 'experts.*'")
    n, k = op.shape
    if k % 32:
        unsupported("PCC205", f"{op.tensor}: mxfp4 needs the input width divisible by 32, got {k}",
                    plan.decision("rollout", i).path, hint="keep this tensor wide")
    base = op.tensor.split(".experts.")[0] + ".experts."
    kind = op.tensor.rsplit(".", 2)[-2]  # gate_proj | up_proj | down_proj | w1 | w3 | w2
    fused = "gate_up_proj" if kind in ("gate_proj", "up_proj", "w1", "w3") else "down_proj"
    rows = 2 * n if fused == "gate_up_proj" else n
    e = cat.num_experts
    parity = {"gate_proj": "even", "w1": "even", "up_proj": "odd", "w3": "odd"}.get(kind, "all")
    return {"layout": "mxfp4", "targets": _fused_targets(base + fused, e, rows, k),
            "fuse": _fuse(op.expert, parity, e * (2 if fused == "gate_up_proj" else 1))}


@lru_cache(maxsize=None)
def _fused_targets(prefix: str, e: int, rows: int, k: int) -> dict:
    """One MoE layer's fused mxfp4 tensors; shared by all its experts' entries, so read-only."""
    return {prefix + "_blocks": _t("uint8", (e, rows, k // 32, 16)), prefix + "_scales": _t("uint8", (e, rows, k // 32))}


@lru_cache(maxsize=None)
def _fuse(expert: int, rows: str, parts: int) -> dict:
    return {"expert": expert, "rows": rows, "parts": parts}


def _shard(plan: Plan, family: str, spec, shape) -> dict:
    """How SGLang splits the (unsharded) checkpoint tensor across rollout ranks."""
    par = plan.contract.rollout.parallel
    if family.startswith("experts."):
        axis, ways, ep = (0 if family == "experts.gate_up" else 1), max(1, par.tp // par.ep), par.ep
    elif family in _COLUMN:
        axis, ways, ep = 0, par.tp, 1
    elif family in _ROW:
        axis, ways, ep = 1, par.tp, 1
    else:
        return {"replicated": True}
    out = {"tp_axis": axis, "tp": ways, "ep": ep}
    g = spec.weights if not spec.wide else None
    if g is not None and len(shape) == 2:
        block = (g.rows if axis == 0 else g.cols) if g.kind == "block" else (1 if axis == 0 else g.size or g.cols or 1)
        out["aligned"] = shape[axis] % ways == 0 and (shape[axis] // ways) % block == 0
    return out


def _steps(layout: str, fused: bool, moves: str, trainable: bool) -> list[str]:
    steps = ["gather", "rename"]
    if fused:
        steps.append("fuse")
    if layout != "wide":
        steps.append("quantize")
        if layout in ("mxfp4", "nvfp4", "int4"):
            steps.append("pack")
    steps.append("shard")
    if moves == "full_weights" or trainable:
        steps.append("bucket")
    return steps + ["install", "activate"]


def converter_plan(plan: Plan) -> dict:
    """The converter plan (see module doc); deterministic for the same Plan."""
    cat, c = plan.catalog, plan.contract
    moves, bridge = c.sync.moves, c.sync.bridge
    trainable = set(plan.trainable)
    recipes, tensors, skip = {}, [], []
    bucket, fill, moved = 0, 0, 0

    def place(size: int) -> int:
        nonlocal bucket, fill, moved
        moved += size
        if fill and fill + size > BUCKET_BYTES:
            bucket, fill = bucket + 1, 0
        fill += size
        return bucket

    for i, op in enumerate(cat.operators):
        if op.family == "kv_cache":
            continue
        scheme = plan.scheme_name("rollout", i)
        spec = plan.schemes[scheme]
        t = tensor_targets(plan, i)
        rid = f"{op.family}/{scheme}"
        if rid not in recipes:
            recipes[rid] = {"scheme": scheme, "layout": t["layout"], "shard": _shard(plan, op.family, spec, op.shape),
                            "steps": _steps(t["layout"], "fuse" in t, moves, i in trainable)}
        entry = {"source": op.tensor, "recipe": rid, "targets": t["targets"]}
        if "fuse" in t:
            entry["fuse"] = t["fuse"]
        if t["layout"] == "wide":
            skip.append(op.tensor)
        if moves == "full_weights":
            src = _t(SOURCE_DTYPES.get(op.dtype, op.dtype), op.shape)
            size = nbytes(src) if bridge == "bf16" or t["layout"] == "wide" else _own_bytes(t)
            entry["bucket"] = place(size)
        tensors.append(entry)
    extras = [{"source": name, "recipe": "copy", "targets": {name: "as source"}} for name in cat.extra_tensors]
    return {
        "contract": c.name, "model": cat.name, "layout": rollout_layout(plan),
        "quantization_config": quantization_config(plan), "hf_quant_config": hf_quant_config(plan),
        "kv_cache_quant_algo": kv_cache_algo(plan),
        "recipes": recipes, "tensors": tensors, "copied": extras, "skip": skip,
        "modules_to_not_convert": skip_list(plan),
        "sync": _sync(plan, moved, bucket + 1 if tensors and moves == "full_weights" else 0),
    }


def _own_bytes(t: dict) -> int:
    """Bytes one operator contributes to its targets (a fused target counts its share)."""
    parts = t.get("fuse", {}).get("parts", 1)
    return sum(nbytes(x) for x in t["targets"].values()) // parts


def _sync(plan: Plan, moved: int, buckets: int) -> dict:
    c = plan.contract
    out = {"moves": c.sync.moves, "bridge": c.sync.bridge, "schedule": c.sync.schedule,
           "interval": c.sync.interval, "bucket_bytes": BUCKET_BYTES}
    if c.sync.moves == "full_weights":
        return out | {"bytes_per_version": moved, "buckets": buckets}
    rank, ops = c.trainable.rank or 0, plan.catalog.operators
    adapter = []
    for i in plan.trainable:
        n, k = ops[i].shape
        module = ops[i].tensor[: -len(".weight")]
        adapter.append({"module": module, "lora_A": [rank, k], "lora_B": [n, rank]})
    size = sum(2 * (a["lora_A"][0] * a["lora_A"][1] + a["lora_B"][0] * a["lora_B"][1]) for a in adapter)
    return out | {"bytes_per_version": size, "buckets": -(-size // BUCKET_BYTES), "adapter_dtype": "bfloat16",
                  "adapter": adapter}


@target("converter", honours=("rollout.rules", "sync"))
def lower_converter(plan: Plan) -> Lowered:
    doc = converter_plan(plan)
    text = json.dumps(doc, sort_keys=True, separators=(",", ":")) + "\n"
    s = doc["sync"]
    notes = [f"rollout layout {doc['layout']}; {len(doc['skip'])} tensors kept wide",
             f"a sync moves {s['moves']}: {s['bytes_per_version']} bytes per version"]
    return Lowered(target="converter", files={"convert/plan.json": text}, notes=notes)
