"""One class per rollout checkpoint layout, registered by name as compressed-tensors registers its
compressors (`@register("nvfp4")`, `named("nvfp4")`), so what a layout is lives in one place and no
stage branches on its name.

A layout owns: which rollout schemes it stores (`accepts`); its tensors, names and shapes, for one
operator (`targets`, SGLang's loader names); how a quantized weight becomes them and comes back
(`encode`, `decode`: torch only inside them, so `pcc check` imports none); which quantized
source encodings it copies bit for bit, and how (`copies`, `stored`; pcc.models.quantized
recognizes them); the error bound `pcc verify-checkpoint` allows (`slack`); and the
`quantization_config` (and ModelOpt's `hf_quant_config`) the checkpoint carries. The Plan decides each operator's layout once
(`Plan.layouts`); convert, the runtime, validate and the targets read it there.
"""

from __future__ import annotations

import math
from functools import lru_cache

from pcc.contract.scheme import Scheme

# Source dtype (the catalog's) -> the dtype of that tensor kept wide, and of its BF16 bridge. A weight a
# quantized source stores as codes + scales (block FP8 `fp8_e4m3`; `nvfp4`, `mxfp4`, `int4` from the
# converter's reading of such sources, pcc.convert.quantized) has no wide dtype of its own: kept wide it is
# written as the BF16 rounding of its dequantized value, and a BF16 bridge moves it as BF16.
SOURCE_DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32", "fp8_e4m3": "bfloat16",
                 "nvfp4": "bfloat16", "mxfp4": "bfloat16", "int4": "bfloat16"}

# ModelOpt NVFP4 needs a static activation scale, which weights alone do not give: this 1.0 is a
# placeholder that `pcc convert` replaces with the source's or a calibrated scale (pcc.convert.calibration)
# and otherwise counts as uncalibrated; the runtime's sync replaces it with its calibration.
NVFP4_INPUT_SCALE = 1.0

LAYOUTS: dict[str, Layout] = {}


def register(name: str):
    """Class decorator: one instance of the layout, found by `named(name)` and by `layout_of`."""
    def add(cls):
        cls.name = name
        LAYOUTS[name] = cls()
        return cls
    return add


def named(name: str) -> Layout:
    return LAYOUTS[name]


def layout_of(spec: Scheme) -> Layout | None:
    """The checkpoint layout of one rollout weight scheme; None when SGLang reads none."""
    return next((x for x in LAYOUTS.values() if x.accepts(spec)), None)


@lru_cache(maxsize=4096)
def _t(dtype: str, shape: tuple) -> dict:
    """A target's {dtype, shape}; shared between tensors of the same shape, so read-only."""
    return {"dtype": dtype, "shape": list(shape)}


@lru_cache(maxsize=None)
def _fuse(expert: int, rows: str, parts: int) -> dict:
    return {"expert": expert, "rows": rows, "parts": parts}


def _parity(kind: str) -> str:
    """Where a routed expert's projection sits in a fused gate_up tensor: gate even rows, up odd."""
    return {"gate_proj": "even", "w1": "even", "up_proj": "odd", "w3": "odd"}.get(kind, "all")


class Layout:
    name = ""
    quantized = True  # False: the source's own values
    packs = False  # codes below a byte, packed (the converter plan's "pack" step)
    global_scale = False  # its scale needs the whole weight's amax (`amax=`), or its NVFP4 scale group's
    shares_fused_scale = False  # fused projections share one global scale (pcc.plan.tensors.scale_group)
    every_moe_layer = False  # the engine's method quantizes every fused MoE layer: none may stay wide
    e8m0_scales = False  # scales are E8M0 bytes (255 is NaN)
    piece_kinds = ()  # weight groupings whose tensors can be computed a piece of rows at a time
    element = (0.0, 0.0, 0.0)  # rounding bound of the element format: relative, in scale units, top value

    def accepts(self, spec: Scheme) -> bool:
        raise NotImplementedError

    def targets(self, plan, i: int) -> dict | None:
        """{"layout", "targets": {name: {dtype, shape}}, "scale_group"?, "fuse"?} for operator i; None
        when this layout cannot hold a tensor of its shape."""
        op = plan.catalog.operators[i]
        return self._own(plan, i) if len(op.shape) == 2 else None

    def _own(self, plan, i: int) -> dict:
        """Targets under the operator's own module name, from `tensors`."""
        op, spec = plan.catalog.operators[i], plan.scheme("rollout", i)
        prefix = op.tensor[: -len(".weight")] if op.tensor.endswith(".weight") else op.tensor
        targets = {(op.tensor if suffix is None else prefix + suffix): t
                   for suffix, t in _template(self.name, spec.weights, spec.symmetric, tuple(op.shape), op.dtype)}
        return {"layout": self.name, "targets": targets}

    def tensors(self, w, symmetric: bool, shape: tuple, dtype: str) -> tuple:
        """(suffix after the module name, or None for the tensor's own name; dtype; shape) per tensor."""
        raise NotImplementedError

    def piece_rows(self, w) -> int | None:
        """Rows per piece (whole scale blocks, whole groups of 8 rows for INT4's packed zero points), or
        None where a piece cannot be computed alone."""
        if w is None or w.kind not in self.piece_kinds:
            return None
        return math.lcm(w.rows if w.kind == "block" else 1, 8)

    def encode(self, q, targets: dict, shape: tuple, rows: slice | None) -> list:
        """The target tensors, in `targets` order, of a Quantized weight (`rows` of it, when given)."""
        raise NotImplementedError

    def decode(self, t: list, shape: tuple, scheme: Scheme):
        """Back from the target tensors (one expert's piece where fused) to a Quantized weight."""
        raise NotImplementedError

    def slack(self, x, s):
        """The |dequantized - source| each element may be off by, x the source and s its scale."""
        rel, small, top = self.element
        return x.abs() * rel + s * small + (x.abs() - top * s).clamp(min=0) + 1e-30

    def copies(self, enc, spec: Scheme) -> bool:
        """Is a quantized source's encoding (pcc.models.quantized.Encoding) a member of `spec` in this
        layout, so `pcc convert` copies its codes and scales bit for bit rather than quantizing again?"""
        return enc.kind == self.name and spec.weights is not None and self._copies(enc, spec)

    def _copies(self, enc, spec: Scheme) -> bool:
        return False

    def stored(self, enc, parts: dict) -> list:
        """The target tensors, in order, of a copied source encoding, from its parts by role (None for
        codes the converter streams as stored)."""
        raise NotImplementedError

    def quantization_config(self, spec: Scheme, skip: list[str], kv: str | None) -> dict | None:
        """config.json's `quantization_config`, as SGLang's loader for this layout reads it."""
        raise NotImplementedError

    def hf_quant_config(self, skip: list[str], kv: str | None) -> dict | None:
        """ModelOpt's separate hf_quant_config.json, for the layouts that have one."""
        return None


@lru_cache(maxsize=None)
def _template(name: str, w, symmetric: bool, shape: tuple, dtype: str) -> tuple:
    """`tensors` with shared {dtype, shape} dicts: read-only."""
    return tuple((suffix, _t(dt, sh)) for suffix, dt, sh in LAYOUTS[name].tensors(w, symmetric, shape, dtype))


def _codes(q, pack):
    """q's codes, packed as the checkpoint stores them unless the scheme already packed them."""
    return q.codes if q.scheme.packing else pack(q.codes)


@register("wide")
class Wide(Layout):
    """The source's values in its wide dtype; gpt-oss's routed experts fused as transformers saves them."""

    quantized = False

    def accepts(self, spec):
        return spec.wide

    def targets(self, plan, i):
        op = plan.catalog.operators[i]
        return self._fused(plan, i) if _fused_wide_experts(plan.catalog, op) else self._own(plan, i)

    def tensors(self, w, symmetric, shape, dtype):
        return ((None, SOURCE_DTYPES.get(dtype, dtype), shape),)

    def _fused(self, plan, i: int) -> dict:
        """gpt-oss BF16 layout: input-major (x @ W) fused tensors, expert j's gate the even columns of
        `gate_up_proj[j]`, up the odd, down `down_proj[j]`, each its weight transposed (`fuse["transposed"]`,
        placed by pcc.plan.encode.place_fused)."""
        cat = plan.catalog
        op = cat.operators[i]
        n, k = op.shape
        base = op.tensor.split(".experts.")[0] + ".experts."
        kind = op.tensor.rsplit(".", 2)[-2]
        gate_up = kind in ("gate_proj", "up_proj", "w1", "w3")
        e = cat.num_experts
        shape = (e, k, 2 * n) if gate_up else (e, k, n)
        fuse = dict(_fuse(op.expert, _parity(kind), e * (2 if gate_up else 1)), transposed=True)
        name = base + ("gate_up_proj" if gate_up else "down_proj")
        return {"layout": self.name, "targets": {name: _t(SOURCE_DTYPES.get(op.dtype, op.dtype), shape)}, "fuse": fuse}

    def decode(self, t, shape, scheme):
        return t[0].float()

    def quantization_config(self, spec, skip, kv):
        return None


def _fused_wide_experts(cat, op) -> bool:
    """gpt-oss routed experts kept wide: transformers' `GptOssForCausalLM` (and the engines' BF16 gpt-oss
    loaders) read them fused, `experts.gate_up_proj` [E, H, 2I] and `experts.down_proj` [E, I, H]."""
    from pcc.models.base import lm_config

    return (lm_config(cat.config).get("model_type") == "gpt_oss" and op.family.startswith("experts.")
            and op.expert is not None and len(op.shape) == 2)


class _Fp8(Layout):
    """FP8 E4M3 codes under the weight's own name and one scale tensor (SGLang's fp8.py `Fp8Config`)."""

    quant_method = "fp8"
    element = (2**-4, 2**-9, 448.0)

    def encode(self, q, targets, shape, rows):
        scale = list(targets.values())[1]["shape"]
        return [q.codes, q.scales.reshape(scale if rows is None or not scale else (-1, *scale[1:]))]

    def decode(self, t, shape, scheme):
        import torch

        from pcc.numerics import Quantized

        return Quantized(t[0], t[1], torch.Size(shape), scheme, "weight")

    def stored(self, enc, parts):
        return [parts.get("weight"), parts["scale"]]

    def quantization_config(self, spec, skip, kv):
        cfg = {"quant_method": self.quant_method, "activation_scheme": "dynamic", "modules_to_not_convert": skip,
               **self._fields(spec)}
        if kv:
            cfg["kv_cache_quant_algo"] = kv
        return cfg

    def _fields(self, spec) -> dict:
        return {"fmt": "e4m3"}  # the published FP8 configs (Qwen3-*-FP8, DeepSeek-V3) carry it; loaders read e4m3


@register("fp8_block")
class Fp8Block(_Fp8):
    piece_kinds = ("block", "group", "row")

    def accepts(self, spec):
        return spec.format == "fp8_e4m3" and spec.weights is not None and spec.weights.kind == "block"

    def tensors(self, w, symmetric, shape, dtype):
        n, k = shape
        return ((None, "float8_e4m3fn", shape), (".weight_scale_inv", "float32", (-(-n // w.rows), -(-k // w.cols))))

    def _copies(self, enc, spec):
        w = spec.weights
        return (w.rows, w.cols) == enc.block and (spec.scale == "fp32" or spec.scale == "pow2" and enc.pow2)

    def _fields(self, spec):
        out = {**super()._fields(spec), "weight_block_size": [spec.weights.rows, spec.weights.cols]}
        if spec.scale == "pow2":
            out["scale_fmt"] = "ue8m0"
        return out


@register("fp8_tensor")
class Fp8Tensor(_Fp8):
    global_scale = True

    def accepts(self, spec):
        return spec.format == "fp8_e4m3" and spec.weights is not None and spec.weights.kind == "tensor"

    def tensors(self, w, symmetric, shape, dtype):
        return ((None, "float8_e4m3fn", shape), (".weight_scale", "float32", ()))

    def piece_rows(self, w):
        return 1  # one scale: any rows, given the whole weight's amax

    def _copies(self, enc, spec):
        return spec.scale == "fp32"


@register("mxfp8")
class Mxfp8(_Fp8):
    quant_method = "mxfp8"
    e8m0_scales = True
    piece_kinds = ("block", "group", "row")

    def accepts(self, spec):
        return spec.format == "mxfp8"

    def tensors(self, w, symmetric, shape, dtype):
        n, k = shape
        return ((None, "float8_e4m3fn", shape), (".weight_scale_inv", "uint8", (n, -(-k // 32))))

    def _fields(self, spec):
        return {"weight_block_size": [1, 32]}


@register("mxfp4")
class Mxfp4(Layout):
    """gpt-oss layout (SGLang's mxfp4.py `Mxfp4Config`, routed experts only): each MoE layer's experts
    fused into `experts.{gate_up,down}_proj_{blocks,scales}`, [E, rows, K/32, 16] uint8 (two E2M1 per
    byte) and [E, rows, K/32] E8M0; gate and up rows interleaved (gate row r at 2r, up row r at 2r+1),
    as gpt-oss's SwiGLU reads them."""

    packs = True
    every_moe_layer = True
    e8m0_scales = True
    element = (2**-2, 0.5, 6.0)

    def accepts(self, spec):
        return spec.format == "mxfp4"

    def targets(self, plan, i):
        cat = plan.catalog
        op = cat.operators[i]
        if not op.family.startswith("experts.") or len(op.shape) != 2 or op.shape[1] % 32:
            return None  # SGLang's mxfp4 layout holds routed experts whose K divides into blocks of 32
        n, k = op.shape
        base = op.tensor.split(".experts.")[0] + ".experts."
        kind = op.tensor.rsplit(".", 2)[-2]  # gate_proj | up_proj | down_proj | w1 | w3 | w2
        fused = "gate_up_proj" if kind in ("gate_proj", "up_proj", "w1", "w3") else "down_proj"
        rows = 2 * n if fused == "gate_up_proj" else n
        e = cat.num_experts
        return {"layout": self.name, "targets": _fused_targets(base + fused, e, rows, k),
                "fuse": _fuse(op.expert, _parity(kind), e * (2 if fused == "gate_up_proj" else 1))}

    def encode(self, q, targets, shape, rows):
        from pcc.numerics.packing import pack_e2m1x2

        n, k = shape
        return [_codes(q, pack_e2m1x2).reshape(n, k // 32, 16), q.scales.reshape(n, k // 32)]

    def decode(self, t, shape, scheme):
        import torch

        from pcc.numerics import Quantized
        from pcc.numerics.packing import unpack_e2m1x2

        n, k = shape
        codes = t[0].reshape(n, k // 2)
        return Quantized(codes if scheme.packing else unpack_e2m1x2(codes, k), t[1], torch.Size(shape), scheme, "weight")

    def _copies(self, enc, spec):
        return spec.weights.size == enc.block[1]

    def stored(self, enc, parts):
        import torch

        n, k = enc.shape
        return [parts["weight"].reshape(n, k // 32, 16), parts["scale"].view(torch.uint8).reshape(n, k // 32)]

    def quantization_config(self, spec, skip, kv):
        return {"quant_method": "mxfp4", "modules_to_not_convert": skip}


@lru_cache(maxsize=None)
def _fused_targets(prefix: str, e: int, rows: int, k: int) -> dict:
    """One MoE layer's fused mxfp4 tensors; shared by all its experts' entries, so read-only."""
    return {prefix + "_blocks": _t("uint8", (e, rows, k // 32, 16)), prefix + "_scales": _t("uint8", (e, rows, k // 32))}


@register("nvfp4")
class Nvfp4(Layout):
    """ModelOpt NVFP4 (SGLang's modelopt_quant.py `ModelOptFp4Config`): packed E2M1 `weight`, E4M3
    `weight_scale` per 16, `weight_scale_2` = 1 / the global encode scale, static `input_scale`."""

    packs = True
    global_scale = True
    shares_fused_scale = True
    piece_kinds = ("block", "group", "row")
    element = (2**-2, 0.5, 6.0)

    def accepts(self, spec):
        return spec.format == "nvfp4"

    def tensors(self, w, symmetric, shape, dtype):
        n, k = shape
        return ((None, "uint8", (n, -(-k // 2))), (".weight_scale", "float8_e4m3fn", (n, -(-k // 16))),
                (".weight_scale_2", "float32", ()), (".input_scale", "float32", ()))

    def encode(self, q, targets, shape, rows):
        import torch

        from pcc.numerics.packing import pack_e2m1x2

        return [_codes(q, pack_e2m1x2), q.scales, (torch.ones((), dtype=torch.float32) / q.outer_scale.float()).reshape(()),
                torch.full((), NVFP4_INPUT_SCALE, dtype=torch.float32)]

    def decode(self, t, shape, scheme):
        import torch

        from pcc.numerics import Quantized
        from pcc.numerics.packing import unpack_e2m1x2

        codes = t[0] if scheme.packing else unpack_e2m1x2(t[0], shape[1])
        return Quantized(codes, t[1], torch.Size(shape), scheme, "weight", outer_scale=(1.0 / t[2].float()).reshape(()))

    def _copies(self, enc, spec):
        return spec.weights.size == enc.block[1]

    def stored(self, enc, parts):
        import torch

        one = torch.ones((), dtype=torch.float32)  # the placeholder; the carried or calibrated scale replaces it
        return [parts.get("weight"), parts["scale"], parts["scale_2"], parts.get("input_scale", one)]

    def quantization_config(self, spec, skip, kv):
        # The flat config.json form: SGLang reads exclusions from `ignore`; `exclude_modules` is the same
        # list under the name of ModelOpt's hf_quant_config.json. vLLM's ModelOptQuantConfigBase.from_config
        # reads the flat form's KV cache only from `kv_cache_scheme` (SGLang from it, else `kv_cache_quant_algo`).
        cfg = {"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16,
               "kv_cache_quant_algo": kv, "ignore": skip, "exclude_modules": skip}
        if kv:
            cfg["kv_cache_scheme"] = {"type": "float", "num_bits": 8 if kv == "FP8" else 4, "dynamic": False}
        return cfg

    def hf_quant_config(self, skip, kv):
        return {"producer": {"name": "pcc"},
                "quantization": {"quant_algo": "NVFP4", "group_size": 16, "kv_cache_quant_algo": kv,
                                 "exclude_modules": skip}}


@register("int4")
class Int4(Layout):
    """compressed-tensors pack-quantized W4A16: eight codes per int32 `weight_packed`, a float32 scale per
    group, `weight_shape`, and (asymmetric) zero points packed eight rows to a word."""

    packs = True
    piece_kinds = ("block", "group", "row")

    def accepts(self, spec):
        return spec.format == "int4" and spec.weights is not None and spec.weights.kind == "group"

    def tensors(self, w, symmetric, shape, dtype):
        n, k = shape
        g = w.size
        out = ((".weight_packed", "int32", (n, -(-k // 8))), (".weight_scale", "float32", (n, -(-k // g))),
               (".weight_shape", "int64", (2,)))
        if not symmetric:
            out += ((".weight_zero_point", "int32", (-(-n // 8), -(-k // g))),)
        return out

    def encode(self, q, targets, shape, rows):
        import torch

        from pcc.numerics.packing import pack_int32x8

        out = [_codes(q, pack_int32x8), q.scales.float(), torch.tensor(list(shape), dtype=torch.int64)]
        if q.zero_point is not None:
            out.append(pack_int32x8(q.zero_point, dim=0))
        return out

    def decode(self, t, shape, scheme):
        import torch

        from pcc.numerics import Quantized
        from pcc.numerics.packing import unpack_int32x8

        n, k = shape
        codes = t[0] if scheme.packing else unpack_int32x8(t[0], k)
        zp = unpack_int32x8(t[3], n, dim=0).to(torch.int8) if len(t) > 3 else None
        return Quantized(codes, t[1], torch.Size(shape), scheme, "weight", zero_point=zp)

    def _copies(self, enc, spec):
        return spec.weights.size == enc.block[1] and spec.symmetric == enc.symmetric and spec.scale == "fp32"

    def stored(self, enc, parts):
        import torch

        out = [parts.get("weight"), parts["scale"], torch.tensor(list(enc.shape), dtype=torch.int64)]
        return out + [parts["zero_point"]] if "zero_point" in parts else out

    def slack(self, x, s):
        # half a step, plus float32 rounding of x/s and of q*s: a round-half tie (common when the source is
        # itself on a coarse grid, e.g. dequantized FP8) lands exactly on half a step before rounding
        return s * 0.5 * (1 + 2**-20) + x.abs() * 2**-22

    def quantization_config(self, spec, skip, kv):
        """compressed-tensors' QuantizationConfig, as its own model_dump() writes it."""
        weights = {"num_bits": 4, "type": "int", "symmetric": spec.symmetric, "group_size": spec.weights.size,
                   "strategy": "group", "dynamic": False}
        group = {"targets": ["Linear"], "weights": weights, "input_activations": None, "output_activations": None,
                 "format": None}
        return {"quant_method": "compressed-tensors", "format": "pack-quantized", "quantization_status": "compressed",
                "config_groups": {"group_0": group}, "kv_cache_scheme": None, "global_compression_ratio": None,
                "ignore": skip, "moe_sparsity_config": None}
