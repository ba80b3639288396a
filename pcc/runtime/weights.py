"""Rollout weights in the converter's checkpoint layouts: build them from trainer tensors, and read them back.

`convert_full` calls `pcc.plan.encode.rollout_tensors`, the function `pcc convert`
writes checkpoints with, on the BF16 bridge of the trainer's parameters, so a live
sync and an offline conversion of the same weights produce the same bytes.
The same converter step calibrates each NVFP4 operator's static `input_scale`
(`calibrate.input_scales`), so every converted version carries its own.
`decode_operator` is the rollout engine's loader: from those tensors back to codes +
scales (`Quantized`, for real low-precision GEMMs) or reconstructed values.
"""

from __future__ import annotations

import torch

from pcc.numerics import Quantized
from pcc.plan.encode import group_amax, place_fused, rollout_tensors, take_fused

from .calibrate import input_scales

BRIDGE = {"bf16": torch.bfloat16}


def convert_full(plan, weights: dict[str, torch.Tensor], bridge: str = "bf16") -> dict[str, torch.Tensor]:
    """Every operator's rollout tensors (fused MXFP4 experts assembled) and calibrated NVFP4 input scales,
    from the trainer's weights."""
    out: dict[str, torch.Tensor] = {}
    dtype = BRIDGE.get(bridge, torch.bfloat16)
    for i, op in enumerate(plan.catalog.operators):
        if op.family == "kv_cache":
            continue
        entry = plan.rollout_tensors[i]
        pieces = rollout_tensors(plan, i, weights[op.tensor].detach().to(dtype),  # fused NVFP4: one global scale
                                 amax=group_amax(plan, i, lambda name: weights[name].detach().to(dtype)))
        if "fuse" not in entry:
            out.update({k: v.contiguous() for k, v in pieces.items()})
            continue
        for name, piece in pieces.items():
            if name not in out:
                out[name] = torch.zeros(entry["targets"][name]["shape"], dtype=piece.dtype)
            place_fused(out[name], piece, entry["fuse"])
    out.update(input_scales(plan, {k: v.to(dtype) for k, v in weights.items()}))
    return out


def bridge_tensors(plan, weights: dict[str, torch.Tensor], bridge: str) -> dict[str, torch.Tensor]:
    """What crosses for a full-weight sync: BF16 weights over a BF16 bridge (the rollout rebuilds its
    layout on install), else the rollout checkpoint tensors, converted on the trainer side."""
    if bridge == "bf16":
        return {op.tensor: weights[op.tensor].detach().to(torch.bfloat16).contiguous()
                for op in plan.catalog.operators if op.family != "kv_cache"}
    return convert_full(plan, weights, bridge)


def decode_operator(plan, i: int, received: dict[str, torch.Tensor]) -> Quantized | torch.Tensor:
    """Operator i from its rollout tensors (its expert's piece where fused): a Quantized (codes + scales)
    or, for wide operators, float32 values; its layout's `decode`."""
    entry = plan.rollout_tensors[i]
    t = [received[n] for n in entry["targets"]]
    if "fuse" in entry:
        t = [take_fused(x, entry["fuse"]) for x in t]
    return plan.layouts[i].decode(t, tuple(plan.catalog.operators[i].shape), plan.scheme("rollout", i))
