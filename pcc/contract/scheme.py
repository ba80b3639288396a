"""The scheme: how one tensor role is encoded. One model, one defaults table, one preset table.

`.prec`, YAML and JSON all meet here: a scheme dict states what its author wrote
(`{format: int4, grouping: {kind: group, size: 32}}` is `int4 group 32`) and the
model fills the rest from FORMATS, so every syntax yields the same object.
numerics, the Plan, the targets and the runtime take this object; validity beyond
structure is `Scheme.problems()`, which the checker reports (PCC302) and numerics
enforces, so the two cannot disagree.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

Format = Literal["bf16", "fp16", "fp32", "fp8_e4m3", "fp8_e5m2", "mxfp8", "mxfp4", "nvfp4", "int4", "int8"]
ScaleDtype = Literal["fp32", "pow2", "e8m0", "e4m3_fp32"]
WIDE_FORMATS = ("bf16", "fp16", "fp32")
ROLES = ("weights", "activations", "gradients")
_ROLE = {"weight": "weights", "activation": "activations", "gradient": "gradients"}
SCALE_BYTES = {"fp32": 4, "pow2": 4, "e8m0": 1, "e4m3_fp32": 1}


class _Model(BaseModel):
    # defer_build: each class's validator is built when first used, not at import (importing the compiler
    # built every one: about 0.03 s of each `pcc` command that compiles a contract)
    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)


class Grouping(_Model):
    """Which values share one scale: tensor (all), row / token (one per row of the last axis),
    block RxC (2-D tiles), tile 1xK and group N (runs of K or N along the last axis)."""

    kind: Literal["tensor", "row", "token", "block", "tile", "group"]
    rows: int | None = Field(default=None, ge=1, le=65536)
    cols: int | None = Field(default=None, ge=1, le=65536)
    size: int | None = Field(default=None, ge=1, le=65536)

    @model_validator(mode="after")
    def _dims(self) -> "Grouping":
        dims = {"block": ("rows", "cols"), "tile": ("rows", "cols"), "group": ("size",)}.get(self.kind, ())
        for f in ("rows", "cols", "size"):
            if (getattr(self, f) is not None) != (f in dims):
                raise ValueError(f"grouping '{self.kind}' {'needs' if f in dims else 'takes no'} '{f}'")
        if self.kind == "tile" and self.rows != 1:
            raise ValueError("a tile is 1xK (one row of K values); use 'block' for 2-D groups")
        return self

    @property
    def run(self) -> int | None:
        """Length of one scale block along the last (reduction) axis; None = the whole axis."""
        return {"block": self.cols, "tile": self.cols, "group": self.size}.get(self.kind)

    def count(self, n: int, k: int) -> int:
        """Scales of an [n, k] tensor."""
        if self.kind == "tensor":
            return 1
        if self.kind in ("row", "token"):
            return n
        if self.kind == "block":
            return -(-n // self.rows) * -(-k // self.cols)
        return n * -(-k // self.run)

    def text(self) -> str:
        if self.kind in ("block", "tile"):
            return f"{self.kind} {self.rows}x{self.cols}"
        return f"group {self.size}" if self.kind == "group" else self.kind

    __str__ = text


@dataclass(frozen=True)
class FormatInfo:
    """What a bare format name means: its element width, the roles it quantizes when a scheme
    names none, their grouping, scale dtype and packing; `fixed` formats define their grouping."""

    bits: int
    roles: tuple[str, ...] = ()
    group: dict | None = None
    scale: str | None = None
    packing: str | None = None
    fixed: bool = False


_WAG = ROLES
FORMATS: dict[str, FormatInfo] = {
    "bf16": FormatInfo(16),
    "fp16": FormatInfo(16),
    "fp32": FormatInfo(32),
    "fp8_e4m3": FormatInfo(8, _WAG, {"kind": "tensor"}, "fp32"),
    "fp8_e5m2": FormatInfo(8, _WAG, {"kind": "tensor"}, "fp32"),
    "int8": FormatInfo(8, ("weights", "activations"), {"kind": "row"}, "fp32"),
    "mxfp8": FormatInfo(8, _WAG, {"kind": "group", "size": 32}, "e8m0", fixed=True),
    "mxfp4": FormatInfo(4, ("weights",), {"kind": "group", "size": 32}, "e8m0", "e2m1x2", fixed=True),
    "nvfp4": FormatInfo(4, _WAG, {"kind": "group", "size": 16}, "e4m3_fp32", "e2m1x2", fixed=True),
    "int4": FormatInfo(4, ("weights",), {"kind": "group", "size": 128}, "fp32", "int32x8"),
}

# Role-named presets (compressed-tensors style): a rule may name one of these, a scheme the
# contract defines (which wins), or a bare format. Each value is a scheme dict as written.
PRESETS: dict[str, dict[str, Any]] = {
    "fp8_tensor": {"format": "fp8_e4m3", "grouping": {"kind": "tensor"}},
    "fp8_row": {"format": "fp8_e4m3", "weights": {"kind": "row"}, "activations": {"kind": "token"}},
    "fp8_block": {"format": "fp8_e4m3", "weights": {"kind": "block", "rows": 128, "cols": 128},
                  "activations": {"kind": "tile", "rows": 1, "cols": 128}},
    "fp8_delayed": {"format": "fp8_e4m3", "grouping": {"kind": "tensor"}, "amax": "delayed"},
    "int4_g32": {"format": "int4", "grouping": {"kind": "group", "size": 32}},
    "int4_g64": {"format": "int4", "grouping": {"kind": "group", "size": 64}},
    "int4_g128": {"format": "int4", "grouping": {"kind": "group", "size": 128}},
    # compressed-tensors' W8A8 (INT8): weights per output channel, activations per token, dynamic, symmetric
    "w8a8_int8": {"format": "int8", "weights": {"kind": "row"}, "activations": {"kind": "token"}},
    **{f: {"format": f} for f in FORMATS},
}


class Scheme(_Model):
    """Format + scale grouping per role + scale dtype + rounding + packing.

    A role whose grouping is None is not quantized (W4A16 keeps activations wide).
    `grouping` is input shorthand: the grouping of every role the format quantizes by
    default; it is expanded on validation and never stored.
    """

    format: Format
    weights: Grouping | None = None
    activations: Grouping | None = None
    gradients: Grouping | None = None
    grouping: Grouping | None = Field(default=None, exclude=True,
                                      description="shorthand: this grouping for every role the format quantizes")
    scale: ScaleDtype | None = None
    amax: Literal["current", "delayed"] = "current"
    scale_rule: Literal["ocp", "ceil"] = "ocp"  # E8M0 exponent: OCP MX v1.0, or the engines' no-clip rule
    rounding: Literal["nearest_even", "stochastic"] = "nearest_even"
    packing: Literal["e2m1x2", "int32x8"] | None = None
    symmetric: bool = True

    @model_validator(mode="before")
    @classmethod
    def _defaults(cls, data: Any) -> Any:
        if not isinstance(data, dict) or not isinstance(data.get("format"), str) or data["format"] not in FORMATS:
            return data
        d = {k: v for k, v in data.items() if v is not None}
        info, bare = FORMATS[d["format"]], d.pop("grouping", None)
        given = [r for r in ROLES if r in d]
        if not info.roles:
            if bare is not None or given:
                raise ValueError(f"'{d['format']}' is a wide format; it has no scale grouping")
            return d
        if bare is not None and given:
            raise ValueError("a bare grouping cannot be mixed with per-role groupings; give every role its own")
        if not given:
            d.update({r: bare if bare is not None else info.group for r in info.roles})
        elif "gradients" in info.roles and "gradients" not in d and "activations" in d:
            d["gradients"] = d["activations"]
        d.setdefault("scale", info.scale)
        if info.packing:
            d.setdefault("packing", info.packing)
        return d

    @property
    def wide(self) -> bool:
        return self.format in WIDE_FORMATS

    passthrough = wide

    @property
    def bits(self) -> int:
        return FORMATS[self.format].bits

    def grouping_of(self, role: str) -> Grouping | None:
        """The grouping of `role` ("weight" or "weights", ...); None when the role stays wide."""
        return getattr(self, _ROLE.get(role, role))

    def weight_bytes(self, shape: tuple[int, ...]) -> int:
        """Bytes of one weight stored in this scheme: codes + scales (+ zero points, + the NVFP4
        outer scale). The one definition every report (explain, converter plan, diff) reads."""
        n, k = (shape[0], math.prod(shape[1:])) if len(shape) >= 2 else (1, shape[0] if shape else 1)
        codes = n * k * self.bits // 8
        g = self.weights
        if self.wide or g is None:
            return codes
        scales = g.count(n, k)
        return codes + scales * SCALE_BYTES[self.scale or "fp32"] + (4 if self.scale == "e4m3_fp32" else 0) \
            + (0 if self.symmetric else scales)

    def problems(self) -> list[tuple[str, str | None]]:
        """(message, hint) for each way this scheme is not a valid encoding. Empty when valid."""
        out: list[tuple[str, str | None]] = []
        f, info = self.format, FORMATS[self.format]
        roles = {r: g for r in ROLES if (g := getattr(self, r)) is not None}
        if self.wide:
            if self.scale not in (None, "fp32") or self.packing or not self.symmetric:
                out.append((f"'{f}' is a pass-through format: it takes no scale, packing or asymmetry", None))
            return out
        if info.fixed:
            want = Grouping.model_validate(info.group)
            if any(g != want for g in roles.values()) or self.scale != info.scale:
                s = info.scale.replace("_", "+")
                out.append((f"{f} scales groups of {want.size} with {s} scales",
                            f"write '{f}' alone, or 'group {want.size} scale {s}'"))
        elif self.scale == "e4m3_fp32":
            out.append((f"e4m3+fp32 scales are NVFP4's; {f} scales are fp32, pow2 or e8m0", None))
        if f == "int4" and any(g.kind not in ("group", "row") for g in roles.values()):
            out.append(("INT4 weights are scaled per group or per row", "e.g. 'int4 group 128'"))
        if "weights" in roles and roles["weights"].kind == "token":
            out.append(("'token' grouping is for activations; weights use row, block or group", None))
        if self.scale_rule != "ocp" and self.scale != "e8m0":
            out.append((f"'scale_rule' chooses how an E8M0 (MX) scale is derived; this scheme has "
                        f"{self.scale} scales", None))
        if not self.symmetric and not f.startswith("int"):
            out.append(("only integer formats can be asymmetric", None))
        if not self.symmetric and self.scale != "fp32":
            out.append(("an asymmetric integer scheme needs fp32 scales", None))
        fp4 = f in ("mxfp4", "nvfp4")
        if self.packing == "e2m1x2" and not fp4 or self.packing == "int32x8" and f != "int4":
            out.append((f"packing '{self.packing}' does not apply to {f}", None))
        return out

    def minimal(self) -> dict[str, Any]:
        """The shortest scheme dict that validates back to this scheme (what a person writes)."""
        info = FORMATS[self.format]
        out: dict[str, Any] = {"format": self.format}
        roles = {r: g.model_dump(exclude_none=True) for r in ROLES if (g := getattr(self, r)) is not None}
        if info.roles and roles != {r: info.group for r in info.roles}:
            groups = list(roles.values())
            if set(roles) == set(info.roles) and all(g == groups[0] for g in groups):
                out["grouping"] = groups[0]
            else:
                for r, g in roles.items():
                    implied = r == "gradients" and "gradients" in info.roles and roles.get("activations") == g
                    if not implied:
                        out[r] = g
        if info.roles and self.scale != info.scale:
            out["scale"] = self.scale
        if self.packing != info.packing:
            out["packing"] = self.packing
        for key, default in (("amax", "current"), ("scale_rule", "ocp"), ("rounding", "nearest_even"),
                             ("symmetric", True)):
            if getattr(self, key) != default:
                out[key] = getattr(self, key)
        return out

    def text(self) -> str:
        """The shortest .prec expression of this scheme."""
        from pcc.contract.fmt import scheme_text  # fmt prints schemes; it imports this module

        return scheme_text(self.minimal())


@lru_cache(maxsize=None)
def preset(name: str) -> Scheme | None:
    """A preset or bare format by name."""
    d = PRESETS.get(name)
    return None if d is None else Scheme.model_validate(d)


def lookup(schemes: dict[str, Scheme], name: str) -> Scheme | None:
    """A rule's scheme by name: the contract's own, else a preset."""
    return schemes.get(name) or preset(name)
