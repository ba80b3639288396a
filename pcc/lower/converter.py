"""The converter plan: how every tensor of the model becomes the rollout checkpoint, and what a
live sync moves per version.

The rollout tensors themselves are a fact of the Plan (`pcc.plan.tensors`, `Plan.rollout_tensors`);
this target lists them per tensor with how each is built and moved, and reports a tensor it
cannot write. Torch-free (`pcc compile` imports this).
"""

from __future__ import annotations

import json

from pcc.lower import Lowered, once, target, unsupported
from pcc.lower.checkpoint_config import hf_quant_config, kv_cache_algo, quantization_config, rollout_layout, skip_list
from pcc.plan import Plan
from pcc.plan.encode import piece_rows
from pcc.plan.layouts import Layout
from pcc.plan.layouts.fp8 import Fp8Block
from pcc.plan.tensors import sync_size

BUCKET_BYTES = 512 << 20  # Miles' --update-weight-buffer-size default
_COLUMN = ("attn.q", "attn.kv", "mlp.gate_up", "shared_experts.gate_up", "embed", "lm_head")
_ROW = ("attn.o", "mlp.down", "shared_experts.down")


def tensor_targets(plan: Plan, i: int) -> dict:
    """Operator i's rollout tensors (the Plan's fact), or why this target cannot write them."""
    t = plan.rollout_tensors[i]
    if t is None:
        op, path = plan.catalog.operators[i], plan.decision("rollout", i).path
        if plan.scheme("rollout", i).format == "mxfp4" and not op.family.startswith("experts."):
            unsupported("PCC307", f"{op.tensor}: SGLang's mxfp4 checkpoint layout holds routed experts only",
                        path, hint="restrict the rule to 'experts.*'")
        if plan.layouts[i] is None:
            rollout_layout(plan)  # raises PCC608 on the rule whose scheme has no layout
        unsupported("PCC206", f"{op.tensor}: no rollout checkpoint layout quantizes a tensor of shape "
                    f"{list(op.shape)} this way", path, hint="keep this tensor wide")
    return t


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


def _steps(layout: Layout, fused: bool, moves: str, trainable: bool) -> list[str]:
    steps = ["gather", "rename"]
    if fused:
        steps.append("fuse")
    if layout.quantized:
        steps.append("quantize")
        if layout.packs:
            steps.append("pack")
    steps.append("shard")
    if moves == "full_weights" or trainable:
        steps.append("bucket")
    return steps + ["install", "activate"]


def _pieces(plan: Plan, i: int) -> dict:
    """How `pcc convert` may stream operator i's weight (its recipe's, the same for every operator of it):
    `piece_rows`, the rows per piece it can be quantized in (None: whole); `global_scale`, its scale needs the
    whole weight's amax first; `fp8_block`, [rows, cols] where the layout is plain block FP8 (E4M3 codes
    rounded to nearest even, one FP32 scale per block), which pcc.convert.fast's kernel writes."""
    layout, scheme = plan.layouts[i], plan.scheme("rollout", i)
    w = scheme.grouping_of("weight")
    plain = (type(layout) is Fp8Block and scheme.format == "fp8_e4m3" and scheme.scale == "fp32"
             and scheme.rounding == "nearest_even" and scheme.packing is None and w is not None and w.kind == "block")
    return {"piece_rows": piece_rows(plan, i), "global_scale": bool(layout.quantized and layout.global_scale),
            "fp8_block": [w.rows, w.cols] if plain else None}


@once
def converter_plan(plan: Plan) -> dict:
    """The converter plan (see module doc), computed once per Plan (`pcc convert CONTRACT` runs the one its
    compile lowered); read-only."""
    cat, c = plan.catalog, plan.contract
    moves = c.sync.moves
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
                            "steps": _steps(plan.layouts[i], "fuse" in t, moves, i in trainable), **_pieces(plan, i)}
        entry = {"source": op.tensor, "recipe": rid, "targets": t["targets"]}
        for key in ("fuse", "scale_group"):
            if key in t:
                entry[key] = t[key]
        if not plan.layouts[i].quantized:
            skip.append(op.tensor)
        if moves == "full_weights":
            entry["bucket"] = place(sync_size(plan, i))
        tensors.append(entry)
    extras = [{"source": name, "recipe": "copy", "targets": {name: "as source"}} for name in cat.extra_tensors]
    return {
        "contract": c.name, "model": cat.name, "source_fingerprint": cat.fingerprint, "layout": rollout_layout(plan),
        "quantization_config": quantization_config(plan), "hf_quant_config": hf_quant_config(plan),
        "kv_cache_quant_algo": kv_cache_algo(plan),
        "recipes": recipes, "tensors": tensors, "copied": extras, "skip": skip,
        "modules_to_not_convert": list(skip_list(plan)),
        "sync": _sync(plan, moved, bucket + 1 if tensors and moves == "full_weights" else 0),
    }


def _sync(plan: Plan, moved: int, buckets: int) -> dict:
    c = plan.contract
    out = {"moves": c.sync.moves, "bridge": c.sync.bridge, "schedule": c.sync.schedule,
           "interval": c.sync.interval, "bucket_bytes": BUCKET_BYTES}
    if c.sync.moves == "full_weights":
        return out | {"bytes_per_version": moved, "buckets": buckets}  # == plan.sync_bytes
    rank, ops = c.trainable.rank or 0, plan.catalog.operators
    adapter = []
    for i in plan.trainable:
        n, k = ops[i].shape
        module = ops[i].tensor[: -len(".weight")]
        adapter.append({"module": module, "lora_A": [rank, k], "lora_B": [n, rank]})
    size = plan.sync_bytes
    return out | {"bytes_per_version": size, "buckets": -(-size // BUCKET_BYTES), "adapter_dtype": "bfloat16",
                  "adapter": adapter}


@target("converter", honours=("rollout.rules", "sync"))
def lower_converter(plan: Plan) -> Lowered:
    doc = converter_plan(plan)
    # in its order: `pcc convert BUNDLE` writes config.json's quantization_config from it
    text = json.dumps(doc, separators=(",", ":")) + "\n"
    s = doc["sync"]
    notes = [f"rollout layout {doc['layout']}; {len(doc['skip'])} tensors kept wide",
             f"a sync moves {s['moves']}: {s['bytes_per_version']} bytes per version"]
    return Lowered(target="converter", files={"convert/plan.json": text}, notes=notes)
