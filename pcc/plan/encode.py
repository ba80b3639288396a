"""One operator's rollout tensors: the bytes `pcc convert` writes and the embedded runtime loads.

`rollout_tensors` is pure (no I/O), so a converter run and a live runtime that both call it
hold byte-identical rollout weights.
"""

from __future__ import annotations

import math

import torch

from pcc.lower.converter import tensor_targets
from pcc.numerics import quantize, tensor_amax
from pcc.numerics.packing import pack_e2m1x2, pack_int32x8
from pcc.plan import Plan

# ModelOpt NVFP4 needs a static activation scale, which weights alone do not give: this 1.0 is a
# placeholder that `pcc convert` replaces with the source's or a calibrated scale (pcc.convert.calibration)
# and otherwise counts as uncalibrated; the runtime's sync replaces it with its calibration.
NVFP4_INPUT_SCALE = 1.0


def piece_rows(plan: Plan, op_index: int) -> int | None:
    """Rows per piece in which operator `op_index`'s rollout tensors can be computed a piece at a
    time (`rollout_tensors(..., rows=)`), or None where a piece cannot be computed alone (MXFP4's
    fused experts, wide operators). A piece is whole scale blocks and whole groups of 8 rows (INT4
    zero points are packed 8 rows to a word); tensor scaling and NVFP4's global scale take the
    whole weight's amax (`amax=`), computed over the pieces first."""
    layout = tensor_targets(plan, op_index)["layout"]
    grouping = plan.scheme("rollout", op_index).grouping_of("weight")
    if layout == "fp8_tensor":
        return 1
    if layout not in ("fp8_block", "mxfp8", "int4", "nvfp4") or grouping.kind not in ("block", "group", "row"):
        return None
    return math.lcm(grouping.rows if grouping.kind == "block" else 1, 8)


def group_amax(plan: Plan, op_index: int, weight_of) -> torch.Tensor | None:
    """max |w| over operator `op_index`'s NVFP4 scale group (the fused projections that share one
    `weight_scale_2`, pcc.plan.tensors.scale_group), the amax its global scale is computed from;
    `weight_of(name)` is the tensor each member is quantized from. None without a group."""
    group = tensor_targets(plan, op_index).get("scale_group")
    if group is None:
        return None
    return torch.stack([tensor_amax(weight_of(m), m) for m in group]).amax()


def rollout_tensors(plan: Plan, op_index: int, tensor: torch.Tensor, rows: slice | None = None,
                    amax: torch.Tensor | None = None, out: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    """Checkpoint name -> tensor for operator `op_index` with source weight `tensor`.

    Wide operators come back unchanged (bit for bit). For MXFP4 routed experts (fused gpt-oss
    layout) the values are this expert's rows of the fused tensors: place them with `place_fused`.
    `rows` (a multiple of `piece_rows` long, unless it ends the weight): `tensor` is those rows of
    the weight, and every result but INT4's `weight_shape` is the matching rows of the whole
    result's, so the concatenated pieces are the same bytes.
    `amax` (FP8 tensor scaling, NVFP4): the amax the global scale is computed from, required for
    `rows` (the whole weight's, `pcc.numerics.tensor_amax`) and for an NVFP4 scale group member
    (`group_amax`): fused members then carry the same `weight_scale_2`.
    `out`: storage for the codes, as `pcc.numerics.quantize` takes it (the converter's recycled buffers).
    Raises ValueError naming the tensor for NaN/inf.
    """
    entry = tensor_targets(plan, op_index)
    layout, names = entry["layout"], list(entry["targets"])
    op = plan.catalog.operators[op_index]
    want = tuple(op.shape) if rows is None else (rows.stop - rows.start,) + tuple(op.shape[1:])
    if tuple(tensor.shape) != want:
        raise ValueError(f"{op.tensor}: shape {list(tensor.shape)}, the plan expects {list(want)}")
    if rows is not None:
        step = piece_rows(plan, op_index)
        if step is None or rows.start % step or (rows.stop % step and rows.stop != op.shape[0]):
            raise ValueError(f"{op.tensor}: rows {rows.start}..{rows.stop} are not whole pieces of its {layout} layout")
    if amax is None and layout in ("fp8_tensor", "nvfp4") and (rows is not None or "scale_group" in entry):
        raise ValueError(f"{op.tensor}: its global scale needs the amax of "
                         + ("the whole weight" if "scale_group" not in entry else
                            "its fused group " + ", ".join(entry["scale_group"])))
    if layout == "wide":
        return {names[0]: tensor}
    q = quantize(tensor, plan.scheme("rollout", op_index), role="weight", name=op.tensor,
                 amax=amax if layout in ("fp8_tensor", "nvfp4") else None, out=out)
    if layout in ("fp8_block", "fp8_tensor", "mxfp8"):
        shape = entry["targets"][names[1]]["shape"]
        return {names[0]: q.codes, names[1]: q.scales.reshape(shape if rows is None or not shape else (-1, *shape[1:]))}
    if layout == "nvfp4":
        codes = q.codes if q.scheme.packing else pack_e2m1x2(q.codes)
        return {names[0]: codes, names[1]: q.scales,
                names[2]: (torch.ones((), dtype=torch.float32) / q.outer_scale.float()).reshape(()),
                names[3]: torch.full((), NVFP4_INPUT_SCALE, dtype=torch.float32)}
    if layout == "mxfp4":
        codes = q.codes if q.scheme.packing else pack_e2m1x2(q.codes)
        n, k = op.shape
        return {names[0]: codes.reshape(n, k // 32, 16), names[1]: q.scales.reshape(n, k // 32)}
    codes = q.codes if q.scheme.packing else pack_int32x8(q.codes)  # int4, compressed-tensors
    out = {names[0]: codes, names[1]: q.scales.float(), names[2]: torch.tensor(list(op.shape), dtype=torch.int64)}
    if q.zero_point is not None:
        out[names[3]] = pack_int32x8(q.zero_point, dim=0)
    return out


def place_fused(dst: torch.Tensor, piece: torch.Tensor, fuse: dict) -> None:
    """Write one expert's rows into a fused [E, rows, ...] tensor (gate rows even, up rows odd); with
    `fuse["transposed"]` (gpt-oss BF16, [E, K, N]) its weight's transpose into the columns. `take_fused`
    reads it back."""
    e, rows = fuse["expert"], fuse["rows"]
    if fuse.get("transposed"):  # gpt-oss BF16 [E, K, N]: this expert's weight [N, K] as columns
        cols = {"even": slice(0, None, 2), "odd": slice(1, None, 2)}.get(rows, slice(None))
        dst[e][:, cols] = piece.T
    elif rows == "even":
        dst[e, 0::2] = piece
    elif rows == "odd":
        dst[e, 1::2] = piece
    else:
        dst[e] = piece


def take_fused(t: torch.Tensor, fuse: dict) -> torch.Tensor:
    """One expert's piece of a fused tensor, as `place_fused` wrote it: its rows (gate even, up odd) of
    [E, rows, ...], or, `fuse["transposed"]`, its columns of [E, K, N] transposed back to [N, K]."""
    e, rows = t[fuse["expert"]], fuse["rows"]
    if fuse.get("transposed"):
        return {"even": e[:, 0::2], "odd": e[:, 1::2]}.get(rows, e).T
    return {"even": e[0::2], "odd": e[1::2]}.get(rows, e)
