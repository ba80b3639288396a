"""Quantized source checkpoints: which tensors store a weight as codes + scales, and their exact values.

A published checkpoint may already be quantized: DeepSeek-V3/R1 and Kimi-K2 in block FP8, gpt-oss in
MXFP4, ModelOpt exports in NVFP4, compressed-tensors exports in packed INT4. The converter reads such a
source through a *logical view*: every quantized weight is one logical tensor `P.weight` of its real
shape [N, K], stored as an `Encoding` (the source tensors holding its codes and scales, and how to
combine them), and the tensors that belong to an encoding are not copied as extras. Recognition
(`recognize`) is torch-free: config.json's `quantization_config` (or `hf_quant_config.json`) names
the method, the shard headers' names, dtypes and shapes name the tensors. `Encoded.dequantize()` is
one function per layout: the exact product code x scale(s), rounded once to float32.

| kind | source tensors of weight `P.weight` [N, K] | value |
|---|---|---|
| fp8_block | `P.weight` F8_E4M3 [N, K], `P.weight_scale_inv` F32 [ceil(N/R), ceil(K/C)] | code x scale of its RxC block |
| fp8_tensor | `P.weight` F8_E4M3 [N, K], `P.weight_scale` F32 [] or [1] | code x scale |
| nvfp4 | `P.weight` U8 [N, K/2] (element 2i low nibble), `P.weight_scale` F8_E4M3 [N, K/16], `P.weight_scale_2` F32 [] | (e2m1 x e4m3 scale of its 16) x scale_2 |
| int4 | `P.weight_packed` I32 [N, K/8], `P.weight_scale` [N, K/G], `P.weight_shape` I64 [2], opt. `P.weight_zero_point` I32 [ceil(N/8), K/G] | (q - zp) x scale of its G |
| mxfp4 | `L.mlp.experts.{gate_up,down}_proj_blocks` U8 [E, rows, K/32, 16], `..._scales` U8 E8M0 [E, rows, K/32] | e2m1 x 2^(e-127); expert j's gate = rows 2r, up = rows 2r+1 |

The mxfp4 logical tensors are per expert (`L.mlp.experts.j.{gate,up,down}_proj.weight`), read one
expert's slice of the fused tensor at a time. docs/convert.md "Quantized sources".
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path

from pcc.convert import ConvertError

# Logical dtype of a weight stored by each kind (the catalog's `Operator.dtype`; pcc.plan.tensors maps them
# to their wide form, BF16).
DTYPES = {"fp8_block": "fp8_e4m3", "fp8_tensor": "fp8_e4m3", "nvfp4": "nvfp4", "int4": "int4", "mxfp4": "mxfp4"}
SUPPORTED = ("fp8 (weight_block_size or per-tensor), modelopt NVFP4/FP8, compressed-tensors pack-quantized "
             "INT4, mxfp4 (gpt-oss)")
_ST_ITEM = {"BF16": 2, "F16": 2, "F32": 4, "F64": 8, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1,
            "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1}
_FLOAT_SCALE = ("F32", "BF16", "F16")


@dataclass(frozen=True)
class Encoding:
    """How one logical weight is stored in a quantized source."""

    kind: str  # a key of DTYPES
    name: str  # the logical tensor, `P.weight` (mxfp4: one expert's `...experts.j.gate_proj.weight`)
    shape: tuple[int, int]  # its real [N, K]
    parts: tuple[tuple[str, str], ...]  # (role, source tensor name): weight, scale, scale_2, input_scale, zero_point
    block: tuple[int, int] = (1, 1)  # rows x columns sharing one scale
    pow2: bool = False  # fp8_block: scales are powers of two (`scale_fmt ue8m0`)
    symmetric: bool = True  # int4: no zero point
    expert: int | None = None  # mxfp4: the expert's index into the fused tensors
    rows: str = "all"  # mxfp4: "even" (gate), "odd" (up) or "all" (down) rows of that expert

    @property
    def dtype(self) -> str:
        return DTYPES[self.kind]

    def part(self, role: str) -> str | None:
        return dict(self.parts).get(role)


@dataclass
class View:
    """A source's logical view: encoded weights by logical name, and every source tensor they consume."""

    method: str | None = None  # what the config names, for messages
    encodings: dict[str, Encoding] = field(default_factory=dict)
    consumed: set[str] = field(default_factory=set)


def quantization_config(root: Path, config: dict) -> dict | None:
    """config.json's `quantization_config` (top level or text_config), else hf_quant_config.json's
    `quantization` (ModelOpt's nested form) as {"quant_method": "modelopt", ...}."""
    for c in (config, config.get("text_config") or {}):
        qc = c.get("quantization_config")
        if isinstance(qc, dict):
            return qc
    path = root / "hf_quant_config.json"
    if path.is_file():
        try:
            q = json.loads(path.read_text(encoding="utf-8")).get("quantization")
        except (OSError, ValueError, AttributeError) as err:
            raise ConvertError(f"{path}: unreadable ({err})") from None
        if isinstance(q, dict):
            return {"quant_method": "modelopt", **q}
    return None


def recognize(root: Path, config: dict, entries: dict[str, dict], read_small) -> View:
    """The logical view of a source with these header entries (name -> {dtype, shape, ...}).
    `read_small(name) -> list[int]` reads a tiny integer tensor (int4's `weight_shape`).
    A source with no quantized weights gives an empty view. Errors name config.json or the tensor."""
    qc = quantization_config(root, config)
    method = str(qc.get("quant_method", "")).lower() if qc else None
    view = View(method)
    where = root / "config.json"
    if qc is not None and method not in ("fp8", "modelopt", "compressed-tensors", "mxfp4"):
        raise ConvertError(f"{where}: quantization_config quant_method {qc.get('quant_method')!r}; the converter "
                           f"reads {SUPPORTED} sources")
    if method == "modelopt":
        algo = str(qc.get("quant_algo") or (qc.get("quantization") or {}).get("quant_algo") or "").upper()
        if algo not in ("NVFP4", "FP8"):
            raise ConvertError(f"{where}: modelopt quant_algo {algo or None!r}; the converter reads NVFP4 and FP8")
    for name, e in entries.items():
        dt, shape = e["dtype"], e["shape"]
        if name.endswith(".weight") and dt == "F8_E4M3":
            _see_fp8(view, name, e, entries, qc, method, where)
        elif name.endswith(".weight") and dt == "U8" and f"{name}_scale" in entries:
            _see_nvfp4(view, name, e, entries, qc, method, where)
        elif name.endswith(".weight_packed"):
            _see_int4(view, name, e, entries, qc, method, where, read_small)
        elif name.endswith("_proj_blocks") and ".experts." in name:
            _see_mxfp4(view, name, e, entries, method, where)
        elif method == "fp8" and name.endswith(".weight") and dt not in _FLOAT_SCALE and len(shape) == 2:
            raise ConvertError(f"{root}: {name} is {dt}; a quant_method fp8 source stores weights as F8_E4M3")
    return view


def _need(entries: dict, name: str, owner: str, what: str) -> dict:
    e = entries.get(name)
    if e is None:
        raise ConvertError(f"{owner}: quantized, but the checkpoint lacks its {what} {name}")
    return e


def _check(cond: bool, message: str) -> None:
    if not cond:
        raise ConvertError(message)


def _see_fp8(view: View, name: str, e: dict, entries: dict, qc: dict | None, method, where) -> None:
    prefix = name[: -len(".weight")]
    shape = e["shape"]
    _check(len(shape) == 2, f"{name}: F8_E4M3 {shape}; a quantized weight is 2-D [N, K]")
    n, k = shape
    inv, per = prefix + ".weight_scale_inv", prefix + ".weight_scale"
    parts = [("weight", name)]
    if inv in entries:
        block = (qc or {}).get("weight_block_size")
        _check(method == "fp8" and isinstance(block, list) and len(block) == 2,
               f"{name}: F8_E4M3 with {inv}, but {where} has no quantization_config quant_method fp8 with "
               "weight_block_size [R, C], so its scale blocks are unknown")
        r, c = (int(v) for v in block)
        s = entries[inv]
        want = [math.ceil(n / r), math.ceil(k / c)]
        _check(s["dtype"] in _FLOAT_SCALE and s["shape"] == want,
               f"{inv}: {s['dtype']} {s['shape']}; block {r}x{c} scales of {name} {shape} are F32 {want}")
        enc = Encoding("fp8_block", name, (n, k), (*parts, ("scale", inv)), (r, c),
                       pow2=str((qc or {}).get("scale_fmt", "")).lower() == "ue8m0")
    elif per in entries:
        s = entries[per]
        _check(s["dtype"] in _FLOAT_SCALE and math.prod(s["shape"]) == 1,
               f"{per}: {s['dtype']} {s['shape']}; the converter reads one per-tensor scale per FP8 weight "
               "(per-channel FP8 sources are not read)")
        _check(method in ("fp8", "modelopt"), f"{name}: F8_E4M3 with {per}, but {where} names no fp8 quantization")
        enc = Encoding("fp8_tensor", name, (n, k), (*parts, ("scale", per)), (n, k))
    else:
        raise ConvertError(f"{name}: F8_E4M3 without {inv} or {per}; the converter cannot dequantize it")
    view.encodings[name] = enc
    view.consumed.update(t for _, t in enc.parts)
    if prefix + ".input_scale" in entries:  # a static activation scale: the rollout's FP8 is dynamic
        view.consumed.add(prefix + ".input_scale")


def _see_nvfp4(view: View, name: str, e: dict, entries: dict, qc: dict | None, method, where) -> None:
    prefix = name[: -len(".weight")]
    s = entries[name + "_scale"]
    if s["dtype"] != "F8_E4M3":
        return  # a U8 weight with some other scale: not a layout the converter knows; left as it is
    _check(method == "modelopt", f"{name}: NVFP4 tensors, but {where} names no modelopt NVFP4 quantization")
    shape = e["shape"]
    _check(len(shape) == 2, f"{name}: U8 {shape}; a packed NVFP4 weight is [N, K/2]")
    n, k = shape[0], 2 * shape[1]
    group = int((qc or {}).get("group_size") or 16)
    _check(group == 16, f"{where}: NVFP4 group_size {group}; NVFP4 scales groups of 16")
    _check(s["shape"] == [n, math.ceil(k / 16)],
           f"{name}_scale: {s['shape']}; NVFP4 scales of {name} [N={n}, K={k}] are [{n}, {math.ceil(k / 16)}]")
    s2 = _need(entries, name + "_scale_2", name, "global scale")
    _check(s2["dtype"] in _FLOAT_SCALE and math.prod(s2["shape"]) == 1,
           f"{name}_scale_2: {s2['dtype']} {s2['shape']}; the NVFP4 global scale is one float")
    parts = [("weight", name), ("scale", name + "_scale"), ("scale_2", name + "_scale_2")]
    if prefix + ".input_scale" in entries:
        parts.append(("input_scale", prefix + ".input_scale"))
    enc = Encoding("nvfp4", name, (n, k), tuple(parts), (1, 16))
    view.encodings[name] = enc
    view.consumed.update(t for _, t in enc.parts)


def _see_int4(view: View, packed: str, e: dict, entries: dict, qc: dict | None, method, where, read_small) -> None:
    prefix = packed[: -len(".weight_packed")]
    name = prefix + ".weight"
    _check(method == "compressed-tensors",
           f"{packed}: a packed weight, but {where} names no compressed-tensors quantization")
    fmt = str((qc or {}).get("format", ""))
    _check(fmt in ("pack-quantized", "mixed-precision"),
           f"{where}: compressed-tensors format {fmt!r}; the converter reads pack-quantized INT4")
    groups = [g.get("weights") or {} for g in ((qc or {}).get("config_groups") or {}).values() if isinstance(g, dict)]
    for w in groups:
        _check(w.get("num_bits", 4) == 4 and w.get("type", "int") == "int",
               f"{where}: compressed-tensors weights {w.get('type')} {w.get('num_bits')} bits; the converter "
               "reads pack-quantized INT4")
        _check(not w.get("actorder"), f"{where}: activation-ordered groups (actorder {w.get('actorder')!r}) "
                                      "are not read; export without actorder")
    _check(e["dtype"] == "I32" and len(e["shape"]) == 2, f"{packed}: {e['dtype']} {e['shape']}; pack-quantized "
                                                         "INT4 packs eight codes per I32 word [N, K/8]")
    _check(prefix + ".weight_g_idx" not in entries, f"{prefix}.weight_g_idx: activation-ordered groups are not read")
    scale = _need(entries, prefix + ".weight_scale", packed, "scales")
    shp = _need(entries, prefix + ".weight_shape", packed, "shape")
    _check(shp["shape"] == [2] and shp["dtype"] in ("I64", "I32"), f"{prefix}.weight_shape: {shp['shape']}; it holds [N, K]")
    n, k = (int(v) for v in read_small(prefix + ".weight_shape"))
    _check(e["shape"] == [n, math.ceil(k / 8)], f"{packed}: {e['shape']}, but weight_shape says [{n}, {k}]: "
                                               f"eight INT4 codes per word is [{n}, {math.ceil(k / 8)}]")
    _check(scale["dtype"] in _FLOAT_SCALE and len(scale["shape"]) == 2 and scale["shape"][0] == n,
           f"{prefix}.weight_scale: {scale['dtype']} {scale['shape']}; INT4 scales of [{n}, {k}] are [{n}, K/G]")
    ng = scale["shape"][1]
    sizes = {w.get("group_size") for w in groups if w.get("strategy", "group") == "group" and w.get("group_size")}
    g = next((s for s in sorted(sizes) if math.ceil(k / s) == ng), None) if ng > 1 else k
    if g is None and k % ng == 0:
        g = k // ng
    _check(g is not None, f"{prefix}.weight_scale: {ng} groups per row of K={k} match no group size")
    parts = [("weight", packed), ("scale", prefix + ".weight_scale"), ("shape", prefix + ".weight_shape")]
    zp = entries.get(prefix + ".weight_zero_point")
    if zp is not None:
        _check(zp["dtype"] == "I32" and zp["shape"] == [math.ceil(n / 8), ng],
               f"{prefix}.weight_zero_point: {zp['dtype']} {zp['shape']}; packed zero points are I32 "
               f"[{math.ceil(n / 8)}, {ng}]")
        parts.append(("zero_point", prefix + ".weight_zero_point"))
    enc = Encoding("int4", name, (n, k), tuple(parts), (1, g), symmetric=zp is None)
    view.encodings[name] = enc
    view.consumed.update(t for _, t in enc.parts)


def _see_mxfp4(view: View, blocks: str, e: dict, entries: dict, method, where) -> None:
    base, fused = blocks[: -len("_blocks")].rsplit(".", 1)  # `L.mlp.experts`, `gate_up_proj` | `down_proj`
    _check(method == "mxfp4", f"{blocks}: fused MXFP4 experts, but {where} has no quantization_config "
                              "quant_method mxfp4")
    _check(fused in ("gate_up_proj", "down_proj"), f"{blocks}: unknown fused experts tensor")
    shape = e["shape"]
    _check(e["dtype"] == "U8" and len(shape) == 4 and shape[3] == 16,
           f"{blocks}: {e['dtype']} {shape}; MXFP4 blocks are U8 [E, rows, K/32, 16]")
    scales = blocks[: -len("_blocks")] + "_scales"
    s = _need(entries, scales, blocks, "scales")
    ne, rows, nb = shape[:3]
    _check(s["dtype"] in ("U8", "F8_E8M0") and s["shape"] == [ne, rows, nb],
           f"{scales}: {s['dtype']} {s['shape']}; the E8M0 scales of {blocks} are U8 [{ne}, {rows}, {nb}]")
    k = nb * 32
    if fused == "gate_up_proj":
        _check(rows % 2 == 0, f"{blocks}: {rows} rows; gate and up rows interleave, so they are even")
        outs = (("gate_proj", "even", rows // 2), ("up_proj", "odd", rows // 2))
    else:
        outs = (("down_proj", "all", rows),)
    for j in range(ne):
        for proj, parity, n in outs:
            name = f"{base}.{j}.{proj}.weight"
            view.encodings[name] = Encoding("mxfp4", name, (n, k), (("weight", blocks), ("scale", scales)),
                                            (1, 32), expert=j, rows=parity)
    view.consumed.update((blocks, scales))


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

        n, k = self.enc.shape
        out = torch.empty(n, k, dtype=dtype or torch.float32)
        for r0, r1, v in _DECODE[self.enc.kind](self.enc, self.parts):
            if not finite(v):
                bad = (~torch.isfinite(v)).nonzero()[0].tolist()
                raise ConvertError(f"{self.enc.name}: NaN or inf in its dequantized value at [{r0 + bad[0]}, {bad[1]}] "
                                   f"(the source's {self.enc.kind} codes or scales)")
            out[r0:r1] = v
        return out


def finite(t) -> bool:
    """All finite? Read in cache-sized chunks with numpy (several times faster than torch.isfinite on CPU);
    BF16 and FP16 by their exponent bits."""
    import numpy as np
    import torch

    if not t.is_floating_point():
        return True
    mask = {torch.bfloat16: 0x7F80, torch.float16: 0x7C00}.get(t.dtype)
    if mask is None and t.dtype not in (torch.float32, torch.float64):
        return bool(torch.isfinite(t.float()).all())
    flat = t.reshape(-1)
    a = flat.view(torch.int16).numpy() if mask is not None else flat.numpy()
    step = 1 << 20
    for i in range(0, a.size, step):
        c = a[i:i + step]
        if mask is not None:
            if ((c & mask) == mask).any():
                return False
        elif not np.isfinite(c).all():
            return False
    return True


def read(src, enc: Encoding) -> Encoded:
    """The source tensors of `enc` (for mxfp4 only its expert's rows), via src's checked reads."""
    parts = {}
    for role, t in enc.parts:
        if enc.kind == "mxfp4":
            x = src.load_index(t, enc.expert)
            x = {"even": x[0::2], "odd": x[1::2]}.get(enc.rows, x)
        else:
            x = src.load(t)
        parts[role] = x
    return Encoded(enc, parts)


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


_DECODE = {"fp8_block": _fp8_block, "fp8_tensor": _fp8_tensor, "nvfp4": _nvfp4, "mxfp4": _mxfp4, "int4": _int4}


# ---- the rollout tensors of an encoded weight ----

def copies(enc: Encoding, scheme, layout: str) -> bool:
    """Is the source's encoding a member of the rollout scheme, so its codes and scales are copied bit
    for bit rather than dequantized and quantized again?"""
    w = scheme.weights
    if layout != enc.kind or w is None:
        return False
    if enc.kind == "fp8_block":
        return (w.rows, w.cols) == enc.block and (scheme.scale == "fp32" or scheme.scale == "pow2" and enc.pow2)
    if enc.kind == "fp8_tensor":
        return scheme.scale == "fp32"
    if enc.kind in ("nvfp4", "mxfp4"):
        return w.size == enc.block[1]
    return w.size == enc.block[1] and scheme.symmetric == enc.symmetric and scheme.scale == "fp32"  # int4


def copied_tensors(enc: Encoding, parts: dict, targets: dict) -> dict:
    """The rollout tensors (target name -> tensor) of a copied encoding, in the targets' order; a scale
    stored narrower than the target's float32 (compressed-tensors' BF16) is widened, exactly."""
    import torch

    from pcc.convert.shards import ST_DTYPES

    names = list(targets)
    if enc.kind == "fp8_block" or enc.kind == "fp8_tensor":
        vals = [parts["weight"], parts["scale"]]
    elif enc.kind == "nvfp4":
        one = torch.ones((), dtype=torch.float32)  # the placeholder; the carried or calibrated scale replaces it
        vals = [parts["weight"], parts["scale"], parts["scale_2"], parts.get("input_scale", one)]
    elif enc.kind == "mxfp4":
        n, k = enc.shape
        vals = [parts["weight"].reshape(n, k // 32, 16), parts["scale"].view(torch.uint8).reshape(n, k // 32)]
    else:
        vals = [parts["weight"], parts["scale"], torch.tensor(list(enc.shape), dtype=torch.int64)]
        if "zero_point" in parts:
            vals.append(parts["zero_point"])
    if len(vals) != len(names):
        raise ConvertError(f"{enc.name}: the source's {enc.kind} tensors do not match the rollout layout {names}")
    out = {}
    for name, v in zip(names, vals):
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


def _check_copied(enc: Encoding, out: dict) -> None:
    """Copied scales finite (and E8M0 byte 255, NaN, absent), FP8 codes not NaN: as the quantizer guarantees."""
    import torch

    for name, t in out.items():
        if t.dtype != torch.float8_e4m3fn and not finite(t):
            raise ConvertError(f"{enc.name}: source scale {name} holds NaN or inf")
        if t.dtype == torch.float8_e4m3fn and _has_e4m3_nan(t):
            raise ConvertError(f"{enc.name}: {name} holds NaN codes")
    if enc.kind == "mxfp4" and bool((list(out.values())[1] == 255).any()):
        raise ConvertError(f"{enc.name}: E8M0 scale byte 255 (NaN)")


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


def rollout_of(plan, i: int, loaded) -> dict:
    """Operator i's rollout tensors from what the source holds: a plain tensor goes through
    `rollout_tensors`; an encoded one is copied when its encoding is the rollout scheme's, else
    dequantized (float32) and quantized again, or, kept wide, written as its BF16 rounding. The one
    function `pcc convert` writes with and `pcc verify-checkpoint --source` checks against."""
    from pcc.layout.tensors import rollout_tensors
    from pcc.lower.converter import tensor_targets

    if not isinstance(loaded, Encoded):
        return rollout_tensors(plan, i, loaded)
    t = tensor_targets(plan, i)
    if copies(loaded.enc, plan.scheme("rollout", i), t["layout"]):
        return copied_tensors(loaded.enc, loaded.parts, t["targets"])
    if t["layout"] == "wide":
        import torch

        (name, want), = t["targets"].items()
        return {name: loaded.dequantize(getattr(torch, want["dtype"]))}
    return rollout_tensors(plan, i, loaded.dequantize())


def read_small_int(path: Path, data_start: int, entry: dict) -> list[int]:
    """A tiny little-endian integer tensor's values, read without torch (int4's `weight_shape`)."""
    item = _ST_ITEM[entry["dtype"]]
    a, b = entry["data_offsets"]
    fd = os.open(path, os.O_RDONLY)
    try:
        raw = os.pread(fd, b - a, data_start + a)
    finally:
        os.close(fd)
    if len(raw) != b - a:
        raise ConvertError(f"{path}: truncated while reading a {entry['dtype']} {entry['shape']} tensor")
    return [int.from_bytes(raw[j:j + item], "little", signed=True) for j in range(0, len(raw), item)]
