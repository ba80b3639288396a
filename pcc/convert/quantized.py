"""Quantized source checkpoints as the converter reads them: exact dequantization, bit-for-bit copies.

Which tensors store a weight as codes + scales, and the logical weight's shape, is recognized in the models
stage (pcc.models.quantized: `Encoding`, `View`, `recognize`), so `pcc check`/`explain`/`compile` and the
converter see the same model. Here: reading one encoding's source tensors (`read`), `Encoded.dequantize()`
(one function per layout: the exact product code x scale(s), rounded once to float32) and the rollout
tensors of an encoded weight (`rollout_of`: copied when the source's encoding is the rollout scheme's, else
dequantized and quantized again). docs/convert.md "Quantized sources".
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from pcc.convert import ConvertError
from pcc.models.quantized import Encoding, View
from pcc.plan.layouts import named

__all__ = ["Encoded", "Encoding", "View", "check_codes", "copied", "copied_tensors", "read",
           "read_rows", "rollout_of", "row_unit", "streams_codes"]


# ---- reading and dequantizing (torch) ----

@dataclass
class Encoded:
    """One encoded weight as read: its source tensors by role (an expert's slice for mxfp4)."""

    enc: Encoding
    parts: dict  # role -> torch tensor

    def dequantize(self, dtype=None):
        """[N, K] in `dtype` (float32 by default): each code times its scale(s), the exact product rounded
        once to float32 (then, for another dtype, to it). Computed in row chunks of about a million
        elements, so the only full-size tensor is the result. NaN or inf (from the source's codes or
        scales) is a ConvertError naming the tensor."""
        import torch

        from pcc.numerics import all_finite

        n, k = self.enc.shape
        out = torch.empty(n, k, dtype=dtype or torch.float32)
        for r0, r1, v in _DECODE[self.enc.kind](self.enc, self.parts):
            if not all_finite(v):
                bad = (~torch.isfinite(v)).nonzero()[0].tolist()
                raise ConvertError(f"{self.enc.name}: NaN or inf in its dequantized value at [{r0 + bad[0]}, {bad[1]}] "
                                   f"(the source's {self.enc.kind} codes or scales)")
            out[r0:r1] = v
        return out


def read(src, enc: Encoding, codes: bool = True) -> Encoded:
    """The source tensors of `enc` (for mxfp4 only its expert's rows), via src's checked reads, scales checked
    (`_check_scales`); without `codes`, all but its codes (a copied encoding's codes stream as stored)."""
    parts = {}
    for role, t in enc.parts:
        if role == "weight" and not codes:
            continue
        if enc.kind == "mxfp4":
            x = src.load_index(t, enc.expert)
            x = {"even": x[0::2], "odd": x[1::2]}.get(enc.rows, x)
        elif enc.kind == "fused" and enc.output_major:  # [E, 2N, K] or [E, N, K]: expert j's rows (gate first)
            n = enc.shape[0]
            x = src.load_index(t, enc.expert)
            x = {"first": x[:n], "second": x[n:]}.get(enc.rows, x)
        elif enc.kind == "fused":  # gpt-oss BF16 [E, K, N] (x @ W): expert j's columns, transposed to [N, K]
            x = src.load_index(t, enc.expert)
            x = {"even": x[:, 0::2], "odd": x[:, 1::2]}.get(enc.rows, x).T.contiguous()
        else:
            x = src.load(t)
            _check_scales(src, enc, role, t, x)
        parts[role] = x
    return Encoded(enc, parts)


def _check_scales(src, enc: Encoding, role: str, tensor: str, x, first_row: int = 0) -> None:
    """A scale multiplies its block's codes: a NaN or inf one poisons the block, a negative one flips its sign, a
    zero one erases it, and neither the dequantized value nor a bit-for-bit copy would show it. So every float
    scale must be finite and positive, checked as read (`x`: `tensor`'s rows from `first_row`), refused (PCC702)
    naming the file, the tensor and the first bad index. NVFP4's E4M3 block scales may be zero (an all-zero
    block's, as the quantizers write it); MXFP4's E8M0 ones are powers of two (byte 255, NaN, is refused where
    decoded)."""
    import torch

    if role not in ("scale", "scale_2") or enc.kind == "mxfp4":
        return
    v = x.float()
    zero = enc.kind == "nvfp4" and role == "scale"
    bad = torch.isinf(v) | ~(v >= 0 if zero else v > 0)
    if not bool(bad.any()):
        return
    at = bad.nonzero()[0].tolist()
    value = v[tuple(at)].item()
    if at:
        at[0] += first_row
    shown = "NaN" if math.isnan(value) else f"{value:g}"
    effect = "poisons" if not math.isfinite(value) else "erases" if value == 0 else "flips the sign of"
    raise ConvertError(f"{src.root / src.where[tensor]}: {tensor} holds {shown} at {at}, a scale that {effect} its "
                       f"block of {enc.name}; scales must be finite and positive{' (or zero)' if zero else ''}")


def row_unit(enc: Encoding) -> int:
    """Rows of `enc` that share a stored row of some part: a row piece (`read_rows`) starts on a multiple
    (block FP8's scale rows, INT4's zero points packed 8 rows to a word)."""
    if enc.kind == "fp8_block":
        return enc.block[0]
    return 8 if enc.kind == "int4" and not enc.symmetric else 1


# Parts stored one row (or one `row_unit` of rows) at a time; the others (global scales, `weight_shape`,
# a tensor scale) are read whole.
_ROW_PARTS = {"fp8_block": ("weight", "scale"), "fp8_tensor": ("weight",), "nvfp4": ("weight", "scale"),
              "int4": ("weight", "scale", "zero_point"), "mxfp4": ("weight", "scale"), "fused": ("weight",)}


def read_rows(src, enc: Encoding, r0: int, r1: int) -> Encoded:
    """Rows [r0, r1) of `enc` as an Encoded of that many rows, reading only their bytes of the row-stored
    parts (r0 a multiple of `row_unit`), so a quantized weight streams like a BF16 one; its dequantized
    values are those rows of the whole weight's."""
    from dataclasses import replace

    n, k = enc.shape
    unit = row_unit(enc)
    parts = {}
    for role, t in enc.parts:
        shape = src.entries[t]["shape"]
        if role not in _ROW_PARTS[enc.kind]:
            parts[role] = src.load(t)
            _check_scales(src, enc, role, t, parts[role])
            continue
        if enc.kind == "fused" and enc.output_major:  # [E, rows, K]: rows [r0, r1) of expert j's gate, up or down
            a = enc.expert * shape[1] + (n if enc.rows == "second" else 0) + r0
            parts[role] = src.load_piece(t, a * k, (r1 - r0) * k).reshape(r1 - r0, k)
            continue
        if enc.kind == "fused":  # gpt-oss [E, K, N]: this expert's columns, transposed; those rows of them
            x = src.load_index(t, enc.expert)
            x = {"even": x[:, 0::2], "odd": x[:, 1::2]}.get(enc.rows, x)
            parts[role] = x[:, r0:r1].T.contiguous()
            continue
        if enc.kind == "mxfp4":  # [E, rows, ...]: this expert's rows, gate at 2r and up at 2r + 1 for gate_up
            width, step = math.prod(shape[2:]), 1 if enc.rows == "all" else 2
            a = enc.expert * shape[1] + r0 * step
            x = src.load_piece(t, a * width, (r1 - r0) * step * width).reshape(-1, *shape[2:])
            parts[role] = x if step == 1 else x[0 if enc.rows == "even" else 1::2]
            continue
        per = unit if role == "zero_point" or (role == "scale" and enc.kind == "fp8_block") else 1
        a, b, width = r0 // per, -(-r1 // per), math.prod(shape[1:])
        parts[role] = src.load_piece(t, a * width, (b - a) * width).reshape(b - a, *shape[1:])
        _check_scales(src, enc, role, t, parts[role], a)
    return Encoded(replace(enc, shape=(r1 - r0, k)), parts)


def _rows_by(n: int, k: int, unit: int):
    """Row ranges of about a million elements, each a multiple of `unit` rows (the scale blocks')."""
    step = max(unit, (1 << 20) // max(k, 1) // unit * unit)
    for r in range(0, n, step):
        yield r, min(n, r + step)


def _times_blocks(v, scales, r0: int, block: tuple[int, int]):
    """v [rows, K] float32 (rows from r0) *= its block's scale, in place; scales [nbr, nbc] float32."""
    br, bc = block
    rows, k = v.shape
    s = scales[r0 // br: -(-(r0 + rows) // br)].repeat_interleave(br, 0)[r0 % br: r0 % br + rows]  # [rows, nbc]
    full = k // bc
    if full:
        v[:, : full * bc].unflatten(1, (full, bc)).mul_(s[:, :full, None])
    if full * bc < k:
        v[:, full * bc:].mul_(s[:, full:full + 1])
    return v


_E4M3_TABLE = []


def _e4m3(codes):
    """float8_e4m3fn codes -> float32 values (a 256-entry table; index_select with int32 indices is about
    twice as fast on CPU as a take with int64 ones)."""
    import torch

    if not _E4M3_TABLE:
        _E4M3_TABLE.append(torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).float())
    idx = codes.contiguous().view(torch.uint8).reshape(-1).int()
    return torch.index_select(_E4M3_TABLE[0], 0, idx).view(codes.shape)


def _fp8_block(enc: Encoding, p: dict):
    codes, scales = p["weight"], p["scale"].float()
    n, k = enc.shape
    for r0, r1 in _rows_by(n, k, enc.block[0]):
        yield r0, r1, _times_blocks(_e4m3(codes[r0:r1]), scales, r0, enc.block)


def _fp8_tensor(enc: Encoding, p: dict):
    scale = p["scale"].float().reshape(())
    n, k = enc.shape
    for r0, r1 in _rows_by(n, k, 1):
        yield r0, r1, _e4m3(p["weight"][r0:r1]).mul_(scale)


def _e2m1_times(enc: Encoding, packed, scales, outer=None):
    """Packed E2M1 rows [N, K/2] x per-group float32 scales [N, K/G] (x `outer`) -> float32 row chunks.
    e2m1 x (e4m3 or a power of two) is exact in float32; x `outer` rounds once."""
    from pcc.numerics.formats import decode_e2m1
    from pcc.numerics.packing import unpack_e2m1x2

    n, k = enc.shape
    for r0, r1 in _rows_by(n, k, 1):
        v = _times_blocks(decode_e2m1(unpack_e2m1x2(packed[r0:r1], k)), scales, r0, enc.block)
        yield r0, r1, v if outer is None else v.mul_(outer)


def _nvfp4(enc: Encoding, p: dict):
    return _e2m1_times(enc, p["weight"], _e4m3(p["scale"]), p["scale_2"].float().reshape(()))


def _mxfp4(enc: Encoding, p: dict):
    import torch

    from pcc.numerics.formats import decode_e8m0

    n, k = enc.shape
    scales = decode_e8m0(p["scale"].view(torch.uint8).reshape(n, k // 32))  # byte 255 -> NaN, caught as such
    return _e2m1_times(enc, p["weight"].reshape(n, k // 2), scales)


def _int4(enc: Encoding, p: dict):
    from pcc.numerics.packing import unpack_int32x8

    n, k = enc.shape
    g = enc.block[1]
    scales = p["scale"].float()
    zp = unpack_int32x8(p["zero_point"], n, dim=0).float() if "zero_point" in p else None
    for r0, r1 in _rows_by(n, k, 1):
        q = unpack_int32x8(p["weight"][r0:r1], k).float()
        if zp is not None:  # q - zp: an integer of at most 5 bits, exact; x scale then rounds once
            q.sub_(zp[r0:r1].repeat_interleave(g, 1)[:, :k])
        yield r0, r1, _times_blocks(q, scales, r0, enc.block)


def _fused(enc: Encoding, p: dict):
    yield 0, enc.shape[0], p["weight"].float()


_DECODE = {"fused": _fused, "fp8_block": _fp8_block, "fp8_tensor": _fp8_tensor, "nvfp4": _nvfp4, "mxfp4": _mxfp4, "int4": _int4}


# ---- the rollout tensors of an encoded weight ----

def copied(src, plan, i: int) -> bool:
    """Is operator i's source weight copied bit for bit? Its encoding must be a member of the rollout
    scheme (its layout's `copies`) and, in an NVFP4 scale group, so must every member's, with one `weight_scale_2`:
    members a source scaled apart (the loaders would apply one of their scales to all) are requantized
    together with the group's amax instead (pcc.plan.tensors.scale_group)."""
    t = plan.rollout_tensors[i]
    enc = src.view.encodings.get(plan.catalog.operators[i].tensor)
    if enc is None or not plan.layouts[i].copies(enc, plan.scheme("rollout", i)):
        return False
    group = t.get("scale_group")
    if not group:
        return True
    encs = [src.view.encodings.get(m) for m in group]
    layout = plan.layouts[i]
    if any(e is None or not layout.copies(e, plan.scheme("rollout", plan.index[m])) for e, m in zip(encs, group)):
        return False
    return len({src.load(e.part("scale_2")).float().reshape(-1).numpy().tobytes() for e in encs}) == 1


def copied_tensors(enc: Encoding, parts: dict, targets: dict) -> dict:
    """The rollout tensors (target name -> tensor) of a copied encoding, in the targets' order; a scale
    stored narrower than the target's float32 (compressed-tensors' BF16) is widened, exactly. Without a
    "weight" part (its codes streamed as stored, `streams_codes`), all the others."""
    import torch

    from pcc.convert.shards import ST_DTYPES

    names, vals = list(targets), named(enc.kind).stored(enc, parts)
    if len(vals) != len(names):
        raise ConvertError(f"{enc.name}: the source's {enc.kind} tensors do not match the rollout layout {names}")
    out = {}
    for name, v in zip(names, vals):
        if v is None:  # the codes, streamed
            continue
        want = targets[name]
        if enc.kind == "mxfp4":  # fused targets: this expert's rows, placed by the caller
            n, k = enc.shape
            want = {"dtype": "uint8", "shape": [n, k // 32, 16] if name.endswith("_blocks") else [n, k // 32]}
        dtype = getattr(torch, want["dtype"])
        if v.dtype != dtype:
            if not (v.is_floating_point() and dtype == torch.float32):
                raise ConvertError(f"{enc.name}: source {name} is {v.dtype}, the rollout layout needs {want['dtype']}")
            v = v.to(dtype)
        if list(v.shape) != list(want["shape"]):
            if v.numel() != math.prod(want["shape"]):
                raise ConvertError(f"{enc.name}: source {name} has shape {list(v.shape)}, the rollout layout needs "
                                   f"{ST_DTYPES[want['dtype']]} {want['shape']}")
            v = v.reshape(want["shape"])
        out[name] = v
    _check_copied(enc, out)
    return out


def streams_codes(src, enc: Encoding, targets: dict) -> bool:
    """Can a copied encoding's codes be written as stored, a piece at a time? Its "weight" part must be
    the first target's dtype and size (else the whole path reports why); MXFP4's are an expert's rows
    of a fused tensor, placed whole."""
    from pcc.convert.shards import ST_DTYPES

    name, want = next(iter(targets.items()))
    entry = src.entries[enc.part("weight")]
    return (enc.kind != "mxfp4" and entry["dtype"] == ST_DTYPES[want["dtype"]]
            and math.prod(entry["shape"]) == math.prod(want["shape"]))


def _check_copied(enc: Encoding, out: dict) -> None:
    """Copied scales finite (and E8M0 byte 255, NaN, absent), FP8 codes not NaN: as the quantizer guarantees."""
    import torch

    from pcc.numerics import all_finite

    for name, t in out.items():
        if t.dtype != torch.float8_e4m3fn and not all_finite(t):
            raise ConvertError(f"{enc.name}: source scale {name} holds NaN or inf")
        check_codes(enc, name, t)
    if named(enc.kind).e8m0_scales and bool((list(out.values())[1] == 255).any()):
        raise ConvertError(f"{enc.name}: E8M0 scale byte 255 (NaN)")


def check_codes(enc: Encoding, name: str, t) -> None:
    """FP8 codes (all of them, or a piece) hold no NaN byte, as the quantizer guarantees."""
    import torch

    if t.dtype == torch.float8_e4m3fn and _has_e4m3_nan(t):
        raise ConvertError(f"{enc.name}: {name} holds NaN codes")


def _has_e4m3_nan(t) -> bool:
    """Any E4M3 NaN byte (0x7F, 0xFF)? In cache-sized chunks: as fast as reading the bytes (a whole-tensor
    mask was most of the time of a bit-for-bit copy)."""
    import numpy as np

    a = t.reshape(-1).view(__import__("torch").uint8).numpy()
    step = 1 << 20
    buf = np.empty(min(a.size, step), np.uint8)
    for i in range(0, a.size, step):
        c = a[i:i + step]
        m = np.bitwise_and(c, 0x7F, out=buf[: c.size])
        if (m == 0x7F).any():
            return True
    return False


def rollout_of(plan, i: int, loaded, amax=None, rows: slice | None = None, copy: bool | None = None,
               out=None) -> dict:
    """Operator i's rollout tensors from what the source holds: a plain tensor goes through
    `rollout_tensors`; an encoded one is copied when its encoding is the rollout scheme's (`copy`:
    the caller's `copied`, which also looks at its scale group), else dequantized (float32) and
    quantized again, or, kept wide, written as its BF16 rounding. The one function `pcc convert`
    writes with and `pcc verify-checkpoint --source` checks against. `amax` and `rows` as for
    `rollout_tensors` (`loaded` is then those rows, `read_rows`; never a copy); `out`, storage for the
    codes, is used where the weight is quantized."""
    from pcc.plan.encode import rollout_tensors

    if not isinstance(loaded, Encoded):
        return rollout_tensors(plan, i, loaded, rows=rows, amax=amax, out=out)
    t = plan.rollout_tensors[i]
    if plan.layouts[i].copies(loaded.enc, plan.scheme("rollout", i)) if copy is None else copy:
        if rows is not None:
            raise ValueError(f"{loaded.enc.name}: a copied encoding is written whole, not in rows")
        return copied_tensors(loaded.enc, loaded.parts, t["targets"])
    if not plan.layouts[i].quantized:
        import torch

        (name, want), = t["targets"].items()
        return {name: loaded.dequantize(getattr(torch, want["dtype"]))}
    return rollout_tensors(plan, i, loaded.dequantize(), rows=rows, amax=amax, out=out)
