"""One operator's rollout tensors from its source weight: the bytes `pcc convert` writes and the
embedded runtime's sync builds live, in the layout the Plan holds for it (`Plan.layouts`).

`rollout_tensors` is pure (no I/O), so a converter run and a live runtime that both call it hold
byte-identical rollout weights; it sits in the plan stage, below both, so neither imports the
other for it. Its functions import torch when called: `piece_rows` and `static_targets` do not, so a
conversion that needs no torch (pcc.convert.fast) never loads it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pcc.plan import Plan

if TYPE_CHECKING:
    import torch


def piece_rows(plan: Plan, op_index: int) -> int | None:
    """Rows per piece in which operator `op_index`'s rollout tensors can be computed a piece at a
    time (`rollout_tensors(..., rows=)`), or None where a piece cannot be computed alone (MXFP4's
    fused experts, wide operators): its layout's `piece_rows`. Tensor scaling and NVFP4's global
    scale take the whole weight's amax (`amax=`), computed over the pieces first."""
    return plan.layouts[op_index].piece_rows(plan.scheme("rollout", op_index).grouping_of("weight"))


def static_targets(plan: Plan) -> dict[str, str]:
    """Operator tensor -> its checkpoint `input_scale` name, for operators whose layout stores one."""
    out = {}
    for i, op in enumerate(plan.catalog.operators):
        if op.family == "kv_cache":
            continue
        name = next((n for n in plan.rollout_tensors[i]["targets"] if n.endswith(".input_scale")), None)
        if name is not None:
            out[op.tensor] = name
    return out


def group_amax(plan: Plan, op_index: int, weight_of) -> torch.Tensor | None:
    """max |w| over operator `op_index`'s NVFP4 scale group (the fused projections that share one
    `weight_scale_2`, pcc.plan.tensors.scale_group), the amax its global scale is computed from;
    `weight_of(name)` is the tensor each member is quantized from. None without a group."""
    import torch

    from pcc.numerics import tensor_amax

    group = plan.rollout_tensors[op_index].get("scale_group")
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
    from pcc.numerics import quantize

    entry, layout = plan.rollout_tensors[op_index], plan.layouts[op_index]
    names = list(entry["targets"])
    op = plan.catalog.operators[op_index]
    want = tuple(op.shape) if rows is None else (rows.stop - rows.start,) + tuple(op.shape[1:])
    if tuple(tensor.shape) != want:
        raise ValueError(f"{op.tensor}: shape {list(tensor.shape)}, the plan expects {list(want)}")
    if rows is not None:
        step = piece_rows(plan, op_index)
        if step is None or rows.start % step or (rows.stop % step and rows.stop != op.shape[0]):
            raise ValueError(f"{op.tensor}: rows {rows.start}..{rows.stop} are not whole pieces of its "
                             f"{layout.name} layout")
    if amax is None and layout.global_scale and (rows is not None or "scale_group" in entry):
        raise ValueError(f"{op.tensor}: its global scale needs the amax of "
                         + ("the whole weight" if "scale_group" not in entry else
                            "its fused group " + ", ".join(entry["scale_group"])))
    if not layout.quantized:
        return {names[0]: tensor}
    q = quantize(tensor, plan.scheme("rollout", op_index), role="weight", name=op.tensor,
                 amax=amax if layout.global_scale else None, out=out)
    return dict(zip(names, layout.encode(q, entry["targets"], tuple(op.shape), rows)))


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
