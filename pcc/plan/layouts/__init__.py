"""One class per rollout checkpoint layout, registered by name as compressed-tensors registers its
compressors (`@register("nvfp4")`, `named("nvfp4")`), so what a layout is lives in one place and no
stage branches on its name.

A layout owns: which rollout schemes it stores (`accepts`); its tensors, names and shapes, for one
operator (`targets`, SGLang's loader names); how a quantized weight becomes them and comes back
(`encode`, `decode`: torch only inside them, so `pcc check` imports none); which quantized
source encodings it copies bit for bit, and how (`copies`, `stored`; pcc.models.quantized
recognizes them); the error bound `pcc verify-checkpoint` allows (`slack`); and the
`quantization_config` (and ModelOpt's `hf_quant_config`) the checkpoint carries. The Plan decides
each operator's layout once (`Plan.layouts`); convert, the runtime, validate and the targets read
it there. One module per family: wide, fp8 (block, tensor, MXFP8, ModelOpt static FP8), fp4 (MXFP4, NVFP4, W4A16
NVFP4), int4, int8 (W8A8); mixed names a ModelOpt MIXED_PRECISION checkpoint of several.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from functools import lru_cache

from pcc.contract.scheme import Scheme

# Source dtype (the catalog's) -> the dtype of that tensor kept wide, and of its BF16 bridge. A weight a
# quantized source stores as codes + scales (block FP8 `fp8_e4m3`; `nvfp4`, `mxfp4`, `int4` from the
# converter's reading of such sources, pcc.convert.quantized) has no wide dtype of its own: kept wide it is
# written as the BF16 rounding of its dequantized value, and a BF16 bridge moves it as BF16.
SOURCE_DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32", "fp8_e4m3": "bfloat16",
                 "nvfp4": "bfloat16", "mxfp4": "bfloat16", "int4": "bfloat16"}

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
def entry(dtype: str, shape: tuple) -> dict:
    """A target's {dtype, shape}; shared between tensors of the same shape, so read-only."""
    return {"dtype": dtype, "shape": list(shape)}


@lru_cache(maxsize=None)
def fuse_of(expert: int, rows: str, parts: int) -> dict:
    return {"expert": expert, "rows": rows, "parts": parts}


def parity(kind: str) -> str:
    """Where a routed expert's projection sits in a fused gate_up tensor: gate even rows, up odd."""
    return {"gate_proj": "even", "w1": "even", "up_proj": "odd", "w3": "odd"}.get(kind, "all")


class Layout(ABC):
    """A checkpoint layout, one instance per registered subclass. The class attributes are the facts
    convert, verify-checkpoint and the converter plan used to branch on the layout's name for."""

    name = ""
    quantized = True  # False: the source's own values
    members = False  # True: a checkpoint of per-module layouts (ModelOpt MIXED_PRECISION), no weight's own
    packs = False  # codes below a byte, packed (the converter plan's "pack" step)
    global_scale = False  # its scale needs the whole weight's amax (`amax=`), or its NVFP4 scale group's
    shares_fused_scale = False  # fused projections share one global scale (pcc.plan.tensors.scale_group)
    every_moe_layer = False  # the engine's method quantizes every fused MoE layer: none may stay wide
    e8m0_scales = False  # scales are E8M0 bytes (255 is NaN)
    piece_kinds = ()  # weight groupings whose tensors can be computed a piece of rows at a time
    element = (0.0, 0.0, 0.0)  # rounding bound of the element format: relative, in scale units, top value
    input_range = None  # a static `input_scale` is calibrated as amax / input_range (None: the layout has none)
    modelopt_algo = None  # its ModelOpt MIXED_PRECISION `quant_algo`, for a layout that is a member form

    def mixed_member(self, spec: Scheme) -> str | None:
        """The layout a weight of scheme `spec` takes inside a ModelOpt MIXED_PRECISION checkpoint
        (pcc.plan.mixed); None where this layout has no member form pcc writes."""
        return None

    @abstractmethod
    def accepts(self, spec: Scheme) -> bool:
        """Does this layout store rollout weights of scheme `spec`?"""

    def targets(self, plan, i: int) -> dict | None:
        """{"layout", "targets": {name: {dtype, shape}}, "fuse"?} for operator i (pcc.plan.tensors adds
        its NVFP4 "scale_group"); None when this layout cannot hold a tensor of its shape."""
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
        """(suffix after the module name, or None for the tensor's own name; dtype; shape) per tensor. Only
        for layouts whose `targets` are per module (MXFP4 names fused expert tensors itself)."""
        raise TypeError(f"the {self.name} layout names its tensors in targets(), not per module")

    def piece_rows(self, w) -> int | None:
        """Rows per piece (whole scale blocks, whole groups of 8 rows for INT4's packed zero points), or
        None where a piece cannot be computed alone."""
        if w is None or w.kind not in self.piece_kinds:
            return None
        return math.lcm(w.rows if w.kind == "block" else 1, 8)

    def encode(self, q, targets: dict, shape: tuple, rows: slice | None) -> list:
        """The target tensors, in `targets` order, of a Quantized weight (`rows` of it, when given); only
        for quantized layouts (the wide one writes the source's values)."""
        raise TypeError(f"the {self.name} layout stores no quantized weight")

    @abstractmethod
    def decode(self, t: list, shape: tuple, scheme: Scheme):
        """Back from the target tensors (one expert's piece where fused) to a Quantized weight."""

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
        codes the converter streams as stored); only for layouts whose `copies` can hold."""
        raise TypeError(f"the {self.name} layout copies no source encoding")

    @abstractmethod
    def quantization_config(self, spec: Scheme, skip: list[str], kv: str | None) -> dict | None:
        """config.json's `quantization_config`, as SGLang's loader for this layout reads it."""

    def hf_quant_config(self, skip: list[str], kv: str | None) -> dict | None:
        """ModelOpt's separate hf_quant_config.json, for the layouts that have one."""
        return None


@lru_cache(maxsize=None)
def _template(name: str, w, symmetric: bool, shape: tuple, dtype: str) -> tuple:
    """`tensors` with shared {dtype, shape} dicts: read-only."""
    return tuple((suffix, entry(dt, sh)) for suffix, dt, sh in LAYOUTS[name].tensors(w, symmetric, shape, dtype))


def packed_codes(q, pack):
    """q's codes, packed as the checkpoint stores them unless the scheme already packed them."""
    return q.codes if q.scheme.packing else pack(q.codes)


from pcc.plan.layouts import fp4, fp8, int4, int8, mixed, wide  # noqa: E402,F401 - each module registers its layouts
