"""Quantized checkpoints, recognized from names, dtypes and shapes alone: which stored tensors encode one
logical weight, and its real shape. Part of the models stage so that `pcc check`, `explain` and `compile`
(`model from DIR`) see a published pre-quantized checkpoint as the model it is, and the converter
(pcc.convert.quantized, which dequantizes) reads the same view.

A published checkpoint may already be quantized: DeepSeek-V3/R1 and Kimi-K2 in block FP8, gpt-oss in
MXFP4, ModelOpt exports in NVFP4, compressed-tensors exports in packed INT4. Such a source is read through
a *logical view*: every quantized weight is one logical tensor `P.weight` of its real shape [N, K], stored
as an `Encoding` (the source tensors holding its codes and scales, and how to combine them); the tensors
an encoding consumes are neither operators nor extras. config.json's `quantization_config` (or
`hf_quant_config.json`) names the method, the shard headers' names, dtypes and shapes name the tensors;
with only the index, the names alone (`recognize_names`).

| kind | source tensors of weight `P.weight` [N, K] | value |
|---|---|---|
| fp8_block | `P.weight` F8_E4M3 [N, K], `P.weight_scale_inv` F32 [ceil(N/R), ceil(K/C)] | code x scale of its RxC block |
| fp8_tensor | `P.weight` F8_E4M3 [N, K], `P.weight_scale` F32 [] or [1] | code x scale |
| (compressed-tensors FP8) | `P.weight` F8_E4M3 [N, K], `P.weight_scale` [1], [N, 1] or [ceil(N/R), ceil(K/C)] | fp8_tensor, or fp8_block of 1xK or RxC |
| nvfp4 | `P.weight` U8 [N, K/2] (element 2i low nibble), `P.weight_scale` F8_E4M3 [N, K/16], `P.weight_scale_2` F32 [] | (e2m1 x e4m3 scale of its 16) x scale_2 |
| int4 | `P.weight_packed` I32 [N, K/8], `P.weight_scale` [N, K/G], `P.weight_shape` I64 [2], opt. `P.weight_zero_point` I32 [ceil(N/8), K/G] | (q - zp) x scale of its G |
| mxfp4 | `L.mlp.experts.{gate_up,down}_proj_blocks` U8 [E, rows, K/32, 16], `..._scales` U8 E8M0 [E, rows, K/32] | e2m1 x 2^(e-127); expert j's gate = rows 2r, up = rows 2r+1 |
| fused (wide) | `L.mlp.experts.gate_up_proj` [E, K=hidden, 2N] and `L.mlp.experts.down_proj` [E, K=inter, N=hidden], BF16/F16/F32, no `.weight` (gpt-oss as transformers' `GptOssForCausalLM.save_pretrained` writes it) | as stored; expert j's gate = `gate_up_proj[j][:, 0::2].T`, up = `[:, 1::2].T`, down = `down_proj[j].T` |
| fused (wide, output-major) | `L.mlp.experts.gate_up_proj` [E, 2N, K=hidden] and `L.mlp.experts.down_proj` [E, N=hidden, K=inter], BF16/F16/F32, no `.weight` (transformers 5's own MoE layout; Qwen3.5/3.6 MoE publishes its experts so) | as stored; expert j's gate = `gate_up_proj[j][:N]`, up = `[N:]`, down = `down_proj[j]` |

The mxfp4 logical tensors are per expert (`L.mlp.experts.j.{gate,up,down}_proj.weight`): gpt-oss's fused
experts become expert operators, so `experts : mxfp4` and per-expert byte and parameter counts work as
for any MoE. A static activation scale (`P.input_scale`) of an FP8 or NVFP4 weight is consumed too.
Errors are CatalogError PCC208, naming config.json or the tensor. docs/models.md, docs/convert.md.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from pcc.lang.inputs import InputError, read_json
from pcc.models.base import CatalogError, inside

# Logical dtype of a weight stored by each kind (the catalog's `Operator.dtype`; pcc.plan.tensors maps them
# to their wide form, BF16).
DTYPES = {"fp8_block": "fp8_e4m3", "fp8_tensor": "fp8_e4m3", "nvfp4": "nvfp4", "int4": "int4", "mxfp4": "mxfp4"}
# A wide source stored fused (gpt-oss BF16): not quantized, its logical dtype is the stored one (`Encoding.wide`).
_WIDE_DTYPES = {"BF16": "bf16", "F16": "fp16", "F32": "fp32"}
SUPPORTED = ("fp8 (weight_block_size or per-tensor), modelopt NVFP4/FP8, compressed-tensors pack-quantized "
             "INT4, mxfp4 (gpt-oss)")
ST_ITEM = {"BF16": 2, "F16": 2, "F32": 4, "F64": 8, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1,
           "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1}
_FLOAT_SCALE = ("F32", "BF16", "F16")
# Source tensors that only ever belong to an encoding (the index-only view drops them by name).
_PART_SUFFIXES = (".weight_scale_inv", ".weight_scale", ".weight_scale_2", ".input_scale", ".weight_shape",
                  ".weight_zero_point", ".weight_g_idx")
_FUSED = re.compile(r"(.+\.experts)\.(gate_up_proj|down_proj)_(blocks|scales)")
_FUSED_WIDE = re.compile(r"(.+\.experts)\.(gate_up_proj|down_proj)")


class QuantizedError(CatalogError):
    """A quantized checkpoint pcc cannot read as its logical weights; names config.json or the tensor."""

    code = "PCC208"


@dataclass(frozen=True)
class Encoding:
    """How one logical weight is stored in a quantized source."""

    kind: str  # a key of DTYPES, or "fused": a wide fused experts tensor (dtype `wide`)
    name: str  # the logical tensor, `P.weight` (mxfp4: one expert's `...experts.j.gate_proj.weight`)
    shape: tuple[int, int]  # its real [N, K]
    parts: tuple[tuple[str, str], ...]  # (role, source tensor name): weight, scale, scale_2, input_scale, zero_point
    block: tuple[int, int] = (1, 1)  # rows x columns sharing one scale
    pow2: bool = False  # fp8_block: scales are powers of two (`scale_fmt ue8m0`)
    symmetric: bool = True  # int4: no zero point
    expert: int | None = None  # mxfp4: the expert's index into the fused tensors
    rows: str = "all"  # mxfp4: "even" (gate), "odd" (up) or "all" (down) rows of that expert; fused: columns
    # (output-major fused: "first" half of the rows (gate), "second" (up) or "all" (down))
    wide: str | None = None  # fused: the stored dtype (bf16, fp16, fp32)
    output_major: bool = False  # fused: [E, N, K] (transformers 5's layout), not gpt-oss's input-major [E, K, N]

    @property
    def dtype(self) -> str:
        return self.wide or DTYPES[self.kind]

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
    if path.exists() and inside(root, path.name).is_file():
        try:
            q = read_json(path, what=path.name).get("quantization")
        except InputError as err:
            raise QuantizedError(err.message) from None
        except AttributeError:
            raise QuantizedError(f"{path}: not a JSON object") from None
        if isinstance(q, dict):
            return {"quant_method": "modelopt", **q}
    return None


def recognize(root: Path, config: dict, entries: dict[str, dict], read_small) -> View:
    """The logical view of a source with these header entries (name -> {dtype, shape, ...}).
    `read_small(name) -> list[int]` reads a tiny integer tensor (int4's `weight_shape`).
    A source with no quantized weights gives an empty view. Errors name config.json or the tensor."""
    try:
        return _recognize(root, config, entries, read_small)
    except (TypeError, AttributeError) as err:  # a quantization_config field of the wrong JSON type
        raise QuantizedError(f"{root / 'config.json'}: malformed quantization_config ({err})") from None


def _recognize(root: Path, config: dict, entries: dict[str, dict], read_small) -> View:
    qc = quantization_config(root, config)
    method = str(qc.get("quant_method", "")).lower() if qc else None
    view = View(method)
    where = root / "config.json"
    if qc is not None and method not in ("fp8", "modelopt", "compressed-tensors", "mxfp4"):
        raise QuantizedError(f"{where}: quantization_config quant_method {qc.get('quant_method')!r}; pcc "
                             f"reads {SUPPORTED} checkpoints")
    if method == "modelopt":
        algo = str(qc.get("quant_algo") or (qc.get("quantization") or {}).get("quant_algo") or "").upper()
        if algo not in ("NVFP4", "FP8"):
            raise QuantizedError(f"{where}: modelopt quant_algo {algo or None!r}; pcc reads NVFP4 and FP8")
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
        elif _FUSED_WIDE.fullmatch(name) and dt in _WIDE_DTYPES:
            _see_fused_wide(view, name, e, entries, config)
        elif method == "fp8" and name.endswith(".weight") and dt not in _FLOAT_SCALE and len(shape) == 2:
            raise QuantizedError(f"{root}: {name} is {dt}; a quant_method fp8 source stores weights as F8_E4M3")
    return view


def _positive(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v > 0


def _need(entries: dict, name: str, owner: str, what: str) -> dict:
    e = entries.get(name)
    if e is None:
        raise QuantizedError(f"{owner}: quantized, but the checkpoint lacks its {what} {name}")
    return e


def _check(cond: bool, message: str) -> None:
    if not cond:
        raise QuantizedError(message)


def _see_fp8(view: View, name: str, e: dict, entries: dict, qc: dict | None, method, where) -> None:
    prefix = name[: -len(".weight")]
    shape = e["shape"]
    _check(len(shape) == 2, f"{name}: F8_E4M3 {shape}; a quantized weight is 2-D [N, K]")
    n, k = shape
    inv, per = prefix + ".weight_scale_inv", prefix + ".weight_scale"
    parts = [("weight", name)]
    if inv in entries:
        block = (qc or {}).get("weight_block_size")
        _check(method == "fp8" and isinstance(block, list) and len(block) == 2 and all(_positive(v) for v in block),
               f"{name}: F8_E4M3 with {inv}, but {where} has no quantization_config quant_method fp8 with "
               f"weight_block_size [R, C] of positive integers (it has {block!r}), so its scale blocks are unknown")
        r, c = block
        s = entries[inv]
        want = [math.ceil(n / r), math.ceil(k / c)]
        _check(s["dtype"] in _FLOAT_SCALE and s["shape"] == want,
               f"{inv}: {s['dtype']} {s['shape']}; block {r}x{c} scales of {name} {shape} are F32 {want}")
        enc = Encoding("fp8_block", name, (n, k), (*parts, ("scale", inv)), (r, c),
                       pow2=str((qc or {}).get("scale_fmt", "")).lower() == "ue8m0")
    elif per in entries and method == "compressed-tensors":
        enc = _compressed_fp8(name, (n, k), entries[per], per, qc or {}, where)
    elif per in entries:
        s = entries[per]
        _check(s["dtype"] in _FLOAT_SCALE and math.prod(s["shape"]) == 1,
               f"{per}: {s['dtype']} {s['shape']}; pcc reads one per-tensor scale per FP8 weight "
               "(per-channel FP8 sources are not read)")
        _check(method in ("fp8", "modelopt"), f"{name}: F8_E4M3 with {per}, but {where} names no fp8 quantization")
        enc = Encoding("fp8_tensor", name, (n, k), (*parts, ("scale", per)), (n, k))
    elif qc is None:
        return  # no quantization anywhere: an FP8 tensor whose value is its code, read as stored
    else:
        raise QuantizedError(f"{name}: F8_E4M3 without {inv} or {per}; pcc cannot dequantize it")
    view.encodings[name] = enc
    view.consumed.update(t for _, t in enc.parts)
    if prefix + ".input_scale" in entries:  # a static activation scale: the rollout's FP8 is dynamic
        view.consumed.add(prefix + ".input_scale")


def _compressed_fp8(name: str, shape: tuple[int, int], s: dict, per: str, qc: dict, where) -> Encoding:
    """compressed-tensors float-quantized FP8 (llm-compressor FP8_DYNAMIC / FP8_BLOCK): `weight_scale` per
    tensor [1], per channel [N, 1] (a block of one row by K) or per block [ceil(N/R), ceil(K/C)]."""
    n, k = shape
    fmt = str(qc.get("format", ""))
    _check(fmt in ("float-quantized", "naive-quantized", "mixed-precision"),
           f"{where}: compressed-tensors format {fmt!r} with F8_E4M3 weights; pcc reads float-quantized FP8")
    groups = [g.get("weights") for g in (qc.get("config_groups") or {}).values() if isinstance(g, dict)]
    groups = [w for w in groups if isinstance(w, dict) and w.get("type") == "float" and w.get("num_bits") == 8]
    _check(bool(groups), f"{where}: F8_E4M3 {name}, but no compressed-tensors config group of 8-bit float weights")
    _check(all(w.get("symmetric", True) for w in groups), f"{where}: asymmetric FP8 weights are not read")
    _check(s["dtype"] in _FLOAT_SCALE, f"{per}: {s['dtype']}; FP8 weight scales are F32, BF16 or F16")
    if math.prod(s["shape"]) == 1:
        return Encoding("fp8_tensor", name, shape, (("weight", name), ("scale", per)), shape)
    if s["shape"] == [n, 1]:
        return Encoding("fp8_block", name, shape, (("weight", name), ("scale", per)), (1, k))
    for w in groups:
        block = w.get("block_structure")
        if (w.get("strategy") == "block" and isinstance(block, list) and len(block) == 2
                and all(_positive(v) for v in block) and s["shape"] == [math.ceil(n / block[0]), math.ceil(k / block[1])]):
            return Encoding("fp8_block", name, shape, (("weight", name), ("scale", per)), tuple(block))
    raise QuantizedError(f"{per}: {s['shape']}; FP8 scales of {name} [{n}, {k}] are per tensor [1], per channel "
                         f"[{n}, 1] or per block of the config's block_structure")


def _see_nvfp4(view: View, name: str, e: dict, entries: dict, qc: dict | None, method, where) -> None:
    prefix = name[: -len(".weight")]
    s = entries[name + "_scale"]
    if s["dtype"] != "F8_E4M3":
        return  # a U8 weight with some other scale: not a layout pcc knows; left as it is
    _check(method == "modelopt", f"{name}: NVFP4 tensors, but {where} names no modelopt NVFP4 quantization")
    shape = e["shape"]
    _check(len(shape) == 2, f"{name}: U8 {shape}; a packed NVFP4 weight is [N, K/2]")
    n, k = shape[0], 2 * shape[1]
    group = (qc or {}).get("group_size") or 16
    _check(group == 16, f"{where}: NVFP4 group_size {group!r}; NVFP4 scales groups of 16")
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
           f"{where}: compressed-tensors format {fmt!r}; pcc reads pack-quantized INT4")
    groups = [g.get("weights") or {} for g in ((qc or {}).get("config_groups") or {}).values() if isinstance(g, dict)]
    for w in groups:
        _check(w.get("num_bits", 4) == 4 and w.get("type", "int") == "int",
               f"{where}: compressed-tensors weights {w.get('type')} {w.get('num_bits')} bits; pcc "
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
    sizes = {w.get("group_size") for w in groups if w.get("strategy", "group") == "group" and _positive(w.get("group_size"))}
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


def _see_fused_wide(view: View, name: str, e: dict, entries: dict, config: dict) -> None:
    """Routed experts stored fused and wide, read as the per-expert logical weights
    `L.mlp.experts.j.{gate,up,down}_proj.weight` [N, K] (the MXFP4 layout's), each expert's gate and up their own
    operator, as the engines load them. Two layouts, told apart by the model type:
    gpt-oss as transformers saves it stores them input-major (x @ W), `gate_up_proj` [E, H, 2I] (gate columns
    even, up odd) and `down_proj` [E, I, H]: the logical weights are the transposes. Every other model stores
    them output-major, transformers 5's own MoE layout (Qwen3.5/3.6 MoE publishes its experts so):
    `gate_up_proj` [E, 2I, H], gate rows first, and `down_proj` [E, H, I], checked against config.json's
    hidden_size and expert width. An MTP module's fused experts (`mtp.*`, which the engines load as their own
    draft model) are no decoder layer's: they stay stored tensors, copied as they are."""
    base, fused = _FUSED_WIDE.fullmatch(name).groups()
    lm = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    shape = e["shape"]
    _check(len(shape) == 3, f"{name}: {e['dtype']} {shape}; fused experts are 3-D [E, rows, columns]")
    if lm.get("model_type") == "gpt_oss":
        ne, k, rows = shape
        if fused == "gate_up_proj":
            _check(rows % 2 == 0, f"{name}: {rows} columns; gate and up columns interleave, so they are even")
            outs = (("gate_proj", "even", rows // 2), ("up_proj", "odd", rows // 2))
        else:
            outs = (("down_proj", "all", rows),)
        output_major = False
    elif name.startswith("mtp."):
        return
    else:
        ne, rows, k = shape
        hidden = lm.get("hidden_size") if _positive(lm.get("hidden_size")) else None
        inter = next((lm[f] for f in ("moe_intermediate_size", "intermediate_size") if _positive(lm.get(f))), None)
        if fused == "gate_up_proj":
            want = [ne, 2 * inter if inter else rows, hidden or k]
            outs = (("gate_proj", "first", rows // 2), ("up_proj", "second", rows // 2))
            what = "[E, 2 x moe_intermediate_size, hidden_size], gate rows first"
        else:
            want = [ne, hidden or rows, inter or k]
            outs = (("down_proj", "all", rows),)
            what = "[E, hidden_size, moe_intermediate_size]"
        _check(shape == want and (fused == "down_proj" or rows % 2 == 0),
               f"{name}: {e['dtype']} {shape}; {lm.get('model_type')} stores fused routed experts output-major, "
               f"{what}: {want} by config.json")
        output_major = True
    for j in range(ne):
        for proj, part, n in outs:
            logical = f"{base}.{j}.{proj}.weight"
            view.encodings[logical] = Encoding("fused", logical, (n, k), (("weight", name),), expert=j, rows=part,
                                               wide=_WIDE_DTYPES[e["dtype"]], output_major=output_major)
    view.consumed.add(name)


def recognize_names(config: dict, names) -> tuple[dict[str, str], set[str]]:
    """The logical view of an index without shards: ({logical weight: dtype}, the names an encoding
    consumes). Only the names are known, so shapes come from config.json; a fused mxfp4 experts tensor
    becomes one logical weight per expert (the count from the config)."""
    names = set(names)
    weights: dict[str, str] = {}
    consumed: set[str] = set()
    for name in names:
        m = _FUSED.fullmatch(name) or _FUSED_WIDE.fullmatch(name)
        if m and name.startswith("mtp.") and not _FUSED.fullmatch(name) and _lm(config).get("model_type") != "gpt_oss":
            continue  # an MTP module's fused experts: stored tensors, as from shards (`_see_fused_wide`)
        if m:
            consumed.add(name)
            base, fused = m[1], m[2]
            count = _expert_count(config)
            projs = ("gate_proj", "up_proj") if fused == "gate_up_proj" else ("down_proj",)
            dtype = "mxfp4" if name.endswith(("_blocks", "_scales")) else _config_dtype(config)
            weights.update({f"{base}.{j}.{p}.weight": dtype for j in range(count) for p in projs})
        elif name.endswith(".weight_packed"):
            consumed.add(name)
            weights[name[: -len("_packed")]] = "int4"
        elif name.endswith(_PART_SUFFIXES):
            consumed.add(name)
            owner = name.rsplit(".", 1)[0] + ".weight"
            if owner in names and name.endswith((".weight_scale_inv", ".weight_scale")):
                kind = "nvfp4" if owner + "_scale_2" in names else "fp8_block"
                weights.setdefault(owner, DTYPES[kind])
    for name in weights:
        consumed.discard(name)
    return weights, consumed


def _lm(config: dict) -> dict:
    return config.get("text_config") if isinstance(config.get("text_config"), dict) else config


def _config_dtype(config: dict) -> str:
    from pcc.models.base import config_dtype

    return config_dtype(config)


def _expert_count(config: dict) -> int:
    c = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    count = c.get("num_local_experts") or c.get("num_experts") or c.get("n_routed_experts")
    if not isinstance(count, int) or isinstance(count, bool) or count <= 0:
        raise QuantizedError("config.json: fused experts in the index, but no expert count "
                             "(num_local_experts) to split them by")
    return count


def logical_records(root: Path, entries: dict[str, dict], where: dict[str, str], view: View
                    ) -> tuple[list[tuple], list[str]]:
    """The catalog's records of a checkpoint whose headers are `entries` (tensor -> header entry) in
    files `where` (tensor -> shard file name): (`*.weight` records (name, shape, dtype, file), other tensor
    names), every encoded weight as its logical tensor and the tensors its encoding consumes left out."""
    from pcc.models.base import SAFETENSORS_DTYPES

    weights, extras = [], []
    files = {file: str(root / file) for file in set(where.values())}  # (a path joined per shard, not per tensor)
    for name, entry in entries.items():
        if name in view.encodings or name in view.consumed:
            continue
        if name.endswith(".weight"):
            weights.append((name, tuple(entry["shape"]), SAFETENSORS_DTYPES[entry["dtype"]], files[where[name]]))
        else:
            extras.append(name)
    for name, enc in view.encodings.items():
        weights.append((name, enc.shape, enc.dtype, files[where[enc.parts[0][1]]]))
    return weights, extras


def read_small_int(path: Path, data_start: int, entry: dict) -> list[int]:
    """A tiny little-endian integer tensor's values, read without torch (int4's `weight_shape`)."""
    item = ST_ITEM[entry["dtype"]]
    a, b = entry["data_offsets"]
    fd = os.open(path, os.O_RDONLY)
    try:
        raw = os.pread(fd, b - a, data_start + a)
    finally:
        os.close(fd)
    if len(raw) != b - a:
        raise QuantizedError(f"{path}: truncated while reading a {entry['dtype']} {entry['shape']} tensor")
    return [int.from_bytes(raw[j:j + item], "little", signed=True) for j in range(0, len(raw), item)]
