"""The rollout checkpoint's tensors of every operator: names, dtypes and shapes, as SGLang's loaders
read them. A derived fact of the Plan, computed once (`Plan.rollout_tensors`) from each operator's
layout (`Plan.layouts`, pcc.plan.layouts): `pcc convert` writes it, `pcc verify-checkpoint` checks
against it, the runtime installs it, and every byte count (explain, the converter plan, diff) sums
it, so they cannot disagree. An operator whose scheme has no layout gets None; the targets report
that (PCC608, PCC307, PCC205, PCC206).

An NVFP4 operator the engines fuse with others into one GEMM also names its `scale_group`: the
members that must share one `weight_scale_2` and `input_scale` (`FUSED_PROJECTIONS`, from `FUSED_LINEARS`).
"""

from __future__ import annotations

import math

from pcc.plan.layouts import SOURCE_DTYPES

DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4, "float8_e4m3fn": 1, "uint8": 1, "int8": 1,
               "int32": 4, "int64": 8}


# The fused linear modules SGLang and vLLM build, by name, and the checkpoint projections each loads (under a
# common prefix): qkv_proj (QKVParallelLinear), DeepSeek MLA's fused_qkv_a_proj_with_mqa, gate_up_proj
# (MergedColumnParallelLinear, dense and shared experts), Qwen3.5's Gated DeltaNet in_proj_qkvz and in_proj_ba
# (packed_modules_mapping; targets/sglang.yaml `gated_deltanet.merged`, held equal by a test); and the fused-MoE
# loaders' w13 of a routed expert (HF gate/up, Mixtral's w1/w3). A fused NVFP4 linear has ONE global scale: the
# linear loaders take the max of the members' weight_scale_2 and input_scale without requantizing the block
# scales, the MoE loaders keep w13's first (gate's) weight_scale_2 ("w1_weight_scale_2 must match
# w3_weight_scale_2"), so members must share it, as ModelOpt's export makes them (`preprocess_linear_fusion`:
# one amax, the max over linears that read the same input).
FUSED_LINEARS = {"qkv_proj": ("q_proj", "k_proj", "v_proj"),
                 "fused_qkv_a_proj_with_mqa": ("q_a_proj", "kv_a_proj_with_mqa"),
                 "gate_up_proj": ("gate_proj", "up_proj"),
                 "in_proj_qkvz": ("in_proj_qkv", "in_proj_z"), "in_proj_ba": ("in_proj_b", "in_proj_a")}
FUSED_PROJECTIONS = (*FUSED_LINEARS.values(), ("w1", "w3"))
FUSED_WITH = {m: group for group in FUSED_PROJECTIONS for m in group}  # projection leaf -> its group


def scale_group(plan, i: int) -> tuple[str, ...] | None:
    """Source tensors of the NVFP4 operators fused with operator i (itself included, catalog order) that
    share one global scale; None when it is fused with no other NVFP4 operator."""
    name = plan.catalog.operators[i].tensor
    prefix, _, rest = name.rpartition(".")[0].rpartition(".")
    group = FUSED_WITH.get(rest) if name.endswith(".weight") else None
    if group is None:
        return None
    index = plan.index
    members = [m for m in (f"{prefix}.{part}.weight" for part in group)
               if m in index and plan.layouts[index[m]] is plan.layouts[i]]
    return tuple(sorted(members, key=index.__getitem__)) if len(members) > 1 else None


def nbytes(t: dict) -> int:
    return DTYPE_BYTES[t["dtype"]] * math.prod(t["shape"])


def tensor_targets(plan, i: int) -> dict | None:
    """{"targets": {name: {dtype, shape}}, "layout": ..., "fuse": ...?, "scale_group": ...?} for
    operator i; None when its rollout scheme has no checkpoint layout for this tensor."""
    layout = plan.layouts[i]
    out = layout.targets(plan, i) if layout is not None else None
    group = scale_group(plan, i) if out is not None and layout.shares_fused_scale else None
    return out if group is None else {**out, "scale_group": list(group)}


def own_bytes(t: dict) -> int:
    """Bytes one operator contributes to its targets (a fused target counts its share)."""
    parts = t.get("fuse", {}).get("parts", 1)
    return sum(nbytes(x) for x in t["targets"].values()) // parts


def sync_size(plan, i: int) -> int:
    """Bytes operator i moves in a full-weight sync: the source dtype over a BF16 bridge (and for
    wide operators), else its packed rollout tensors."""
    op, t = plan.catalog.operators[i], plan.rollout_tensors[i]
    if plan.contract.sync.bridge == "bf16" or t is None or not plan.layouts[i].quantized:
        return nbytes({"dtype": SOURCE_DTYPES.get(op.dtype, op.dtype), "shape": op.shape})
    return own_bytes(t)
