"""Rollout weights in the converter's checkpoint layouts: build them from trainer tensors, and read them back.

`convert_full` calls `pcc.layout.tensors.rollout_tensors`, the function `pcc convert`
writes checkpoints with, on the BF16 bridge of the trainer's parameters, so a live
sync and an offline conversion of the same weights produce the same bytes.
The same converter step calibrates each NVFP4 operator's static `input_scale`
(`calibrate.input_scales`), so every converted version carries its own.
`decode_operator` is the rollout engine's loader: from those tensors back to codes +
scales (`Quantized`, for real low-precision GEMMs) or reconstructed values.
"""

from __future__ import annotations

import torch

from pcc.layout.tensors import group_amax, place_fused, rollout_tensors, take_fused
from pcc.lower.converter import tensor_targets
from pcc.numerics import Quantized
from pcc.numerics.packing import unpack_int32x8

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
        entry = tensor_targets(plan, i)
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
    """Operator i from its rollout tensors: a Quantized (codes + scales) or, for wide operators, float32 values."""
    op = plan.catalog.operators[i]
    entry = tensor_targets(plan, i)
    layout, names = entry["layout"], list(entry["targets"])
    t = [received[n] for n in names]
    if layout == "wide":  # a fused wide operator (gpt-oss BF16 experts): its expert's piece, as the Plan lays it out
        return (take_fused(t[0], entry["fuse"]) if "fuse" in entry else t[0]).float()
    scheme, shape = plan.scheme("rollout", i), torch.Size(op.shape)
    n, k = op.shape
    if layout in ("fp8_block", "fp8_tensor", "mxfp8"):
        return Quantized(t[0], t[1], shape, scheme, "weight")
    if layout == "nvfp4":  # weight_scale_2 = 1 / S_enc, the engine's per-tensor multiplier
        codes = t[0] if scheme.packing else _unpack_e2m1(t[0], k)
        return Quantized(codes, t[1], shape, scheme, "weight", outer_scale=(1.0 / t[2].float()).reshape(()))
    if layout == "mxfp4":
        blocks, scales = take_fused(t[0], entry["fuse"]), take_fused(t[1], entry["fuse"])
        codes = blocks.reshape(n, k // 2)
        return Quantized(codes if scheme.packing else _unpack_e2m1(codes, k), scales, shape, scheme, "weight")
    codes = t[0] if scheme.packing else unpack_int32x8(t[0], k)  # int4 compressed-tensors
    zp = unpack_int32x8(t[3], n, dim=0).to(torch.int8) if len(t) > 3 else None
    return Quantized(codes, t[1], shape, scheme, "weight", zero_point=zp)


def _unpack_e2m1(packed: torch.Tensor, k: int) -> torch.Tensor:
    from pcc.numerics.packing import unpack_e2m1x2

    return unpack_e2m1x2(packed, k)
