"""Scheme: the quantization recipe of one tensor family, in the contract language's dict form."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

FORMATS = ("bf16", "fp16", "fp32", "fp8_e4m3", "fp8_e5m2", "mxfp8", "mxfp4", "nvfp4", "int4", "int8")
PASSTHROUGH = ("bf16", "fp16", "fp32")
SCALES = ("fp32", "pow2", "e8m0", "e4m3_fp32")
ROUNDINGS = ("nearest_even", "stochastic")
PACKINGS = (None, "e2m1x2", "int32x8")
KINDS = ("tensor", "row", "token", "block", "tile", "group")
ROLES = ("weight", "activation", "gradient")


@dataclass(frozen=True)
class Grouping:
    """Which elements share one scale.

    tensor: all; row/token: one per row of the last axis (row for weights, token
    for activations; the same arithmetic); block RxC: 2-D tiles of the last two
    axes; tile 1xK and group N: runs of K (N) along the last axis.
    """

    kind: str
    rows: int | None = None
    cols: int | None = None
    size: int | None = None

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"grouping kind {self.kind!r} is not one of {KINDS}")
        need = {"block": ("rows", "cols"), "tile": ("rows", "cols"), "group": ("size",)}.get(self.kind, ())
        for attr in ("rows", "cols", "size"):
            value = getattr(self, attr)
            if attr in need:
                if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                    raise ValueError(f"{self.kind} grouping needs a positive integer {attr}, got {value!r}")
            elif value is not None:
                raise ValueError(f"{self.kind} grouping takes no {attr}")
        if self.kind == "tile" and self.rows != 1:
            raise ValueError(f"a tile is one row high (1xK), got {self.rows}x{self.cols}")

    @property
    def run(self) -> int | None:
        """Length of one scale block along the last (reduction) axis; None = whole axis."""
        return {"block": self.cols, "tile": self.cols, "group": self.size}.get(self.kind)

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"kind": self.kind}
        if self.kind in ("block", "tile"):
            d.update(rows=self.rows, cols=self.cols)
        elif self.kind == "group":
            d["size"] = self.size
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None) -> Grouping | None:
        if d is None:
            return None
        if not isinstance(d, dict) or "kind" not in d:
            raise ValueError(f"a grouping is a dict with a 'kind', got {d!r}")
        extra = set(d) - {"kind", "rows", "cols", "size"}
        if extra:
            raise ValueError(f"unknown grouping keys {sorted(extra)}")
        return cls(d["kind"], d.get("rows"), d.get("cols"), d.get("size"))

    def __str__(self) -> str:
        if self.kind in ("block", "tile"):
            return f"{self.kind} {self.rows}x{self.cols}"
        return f"group {self.size}" if self.kind == "group" else self.kind


def _group(n: int) -> Grouping:
    return Grouping("group", size=n)


# Format -> (weights, activations, scale) used where the dict says null.
_DEFAULTS: dict[str, tuple[Grouping | None, Grouping | None, str]] = {
    "bf16": (None, None, "fp32"),
    "fp16": (None, None, "fp32"),
    "fp32": (None, None, "fp32"),
    "fp8_e4m3": (Grouping("tensor"), Grouping("tensor"), "fp32"),
    "fp8_e5m2": (Grouping("tensor"), Grouping("tensor"), "fp32"),
    "mxfp8": (_group(32), _group(32), "e8m0"),
    "mxfp4": (_group(32), _group(32), "e8m0"),
    "nvfp4": (_group(16), _group(16), "e4m3_fp32"),
    "int4": (_group(128), _group(128), "fp32"),
    "int8": (Grouping("row"), Grouping("token"), "fp32"),
}


@dataclass(frozen=True)
class Scheme:
    """A validated quantization scheme; defaults are resolved, so equal schemes compare equal."""

    format: str
    weights: Grouping | None = None
    activations: Grouping | None = None
    gradients: Grouping | None = None
    scale: str | None = None
    rounding: str = "nearest_even"
    packing: str | None = None
    symmetric: bool = True
    scale_rule: str = "ocp"  # E8M0 exponent: "ocp" (MX v1.0) or "ceil" (TE MXFP8 / ModelOpt MXFP4)

    def __post_init__(self) -> None:
        if self.format not in FORMATS:
            raise ValueError(f"format {self.format!r} is not one of {FORMATS}")
        w_def, a_def, s_def = _DEFAULTS[self.format]
        set_ = lambda k, v: object.__setattr__(self, k, v)  # noqa: E731 (frozen dataclass)
        if self.format not in PASSTHROUGH:
            set_("weights", self.weights or w_def)
            set_("activations", self.activations or a_def)
            set_("gradients", self.gradients or self.activations)
        set_("scale", self.scale or s_def)
        self._validate()

    def _validate(self) -> None:
        f, where = self.format, f"scheme {self.format}"
        if self.scale not in SCALES:
            raise ValueError(f"{where}: scale {self.scale!r} is not one of {SCALES}")
        if self.rounding not in ROUNDINGS:
            raise ValueError(f"{where}: rounding {self.rounding!r} is not one of {ROUNDINGS}")
        if self.scale_rule not in ("ocp", "ceil"):
            raise ValueError(f"{where}: scale_rule {self.scale_rule!r} is not ocp or ceil")
        if self.scale_rule == "ceil" and self.scale != "e8m0":
            raise ValueError(f"{where}: scale_rule ceil applies to e8m0 scales")
        if self.packing not in PACKINGS:
            raise ValueError(f"{where}: packing {self.packing!r} is not one of {PACKINGS}")
        if not isinstance(self.symmetric, bool):
            raise ValueError(f"{where}: symmetric must be true or false")
        groups = {"weights": self.weights, "activations": self.activations, "gradients": self.gradients}
        if f in PASSTHROUGH:
            if any(groups.values()) or self.packing or self.scale != "fp32" or not self.symmetric:
                raise ValueError(f"{where} is a pass-through format: it takes no grouping, scale or packing")
            return
        if not self.symmetric and f not in ("int4", "int8"):
            raise ValueError(f"{where}: only integer formats can be asymmetric")
        if f in ("mxfp8", "mxfp4", "nvfp4"):
            size, scale = (16, "e4m3_fp32") if f == "nvfp4" else (32, "e8m0")
            for role, g in groups.items():
                if g != _group(size):
                    raise ValueError(f"{where}: {role} must be 'group {size}' (the format fixes it), got {g}")
            if self.scale != scale:
                raise ValueError(f"{where}: scale must be {scale}, got {self.scale}")
        elif self.scale in ("e8m0", "e4m3_fp32"):
            raise ValueError(f"{where}: scale {self.scale} belongs to mxfp*/nvfp4; use fp32 or pow2")
        if f.startswith("int") and self.scale != "fp32" and not self.symmetric:
            raise ValueError(f"{where}: an asymmetric integer scheme needs fp32 scales")
        if self.packing == "e2m1x2" and f not in ("mxfp4", "nvfp4"):
            raise ValueError(f"{where}: e2m1x2 packing is for 4-bit float formats (mxfp4, nvfp4)")
        if self.packing == "int32x8" and f != "int4":
            raise ValueError(f"{where}: int32x8 packing is for int4")

    @property
    def passthrough(self) -> bool:
        return self.format in PASSTHROUGH

    def grouping(self, role: str) -> Grouping | None:
        if role not in ROLES:
            raise ValueError(f"role {role!r} is not one of {ROLES}")
        return {"weight": self.weights, "activation": self.activations, "gradient": self.gradients}[role]

    def to_dict(self) -> dict[str, Any]:
        g = lambda x: x.to_dict() if x else None  # noqa: E731
        return {"format": self.format, "weights": g(self.weights), "activations": g(self.activations),
                "gradients": g(self.gradients), "scale": self.scale, "rounding": self.rounding,
                "packing": self.packing, "symmetric": self.symmetric, "scale_rule": self.scale_rule}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Scheme:
        if not isinstance(d, dict) or "format" not in d:
            raise ValueError(f"a scheme is a dict with a 'format', got {d!r}")
        # "amax" (current | delayed) is how a trainer tracks amax across steps; one quantize call
        # always uses the tensor's current amax, so it is accepted and has no effect here.
        extra = set(d) - {"format", "weights", "activations", "gradients", "scale", "rounding", "packing", "symmetric",
                          "amax", "scale_rule"}
        if extra:
            raise ValueError(f"unknown scheme keys {sorted(extra)}")
        return cls(d["format"], Grouping.from_dict(d.get("weights")), Grouping.from_dict(d.get("activations")),
                   Grouping.from_dict(d.get("gradients")), d.get("scale"), d.get("rounding") or "nearest_even",
                   d.get("packing"), d.get("symmetric", True), d.get("scale_rule") or "ocp")

    @classmethod
    def preset(cls, name: str) -> Scheme:
        if name not in PRESETS:
            raise ValueError(f"unknown scheme preset {name!r}; presets: {sorted(PRESETS)}")
        return PRESETS[name]

    @classmethod
    def parse(cls, text: str) -> Scheme:
        """A preset name, or the contract language's scheme syntax (parsed by pcc.lang)."""
        name = text.strip()
        if name in PRESETS:
            return PRESETS[name]
        from pcc.lang import parse_scheme

        return cls.from_dict(parse_scheme(name))


PRESETS: dict[str, Scheme] = {
    "bf16": Scheme("bf16"),
    "fp16": Scheme("fp16"),
    "fp32": Scheme("fp32"),
    "fp8_tensor": Scheme("fp8_e4m3", Grouping("tensor"), Grouping("tensor")),
    "fp8_row": Scheme("fp8_e4m3", Grouping("row"), Grouping("token")),
    "fp8_block": Scheme("fp8_e4m3", Grouping("block", 128, 128), Grouping("tile", 1, 128)),
    "mxfp8": Scheme("mxfp8"),
    "mxfp4": Scheme("mxfp4", packing="e2m1x2"),
    "nvfp4": Scheme("nvfp4", packing="e2m1x2"),
    "int4_g32": Scheme("int4", _group(32), _group(32), packing="int32x8"),
    "int4_g128": Scheme("int4", _group(128), _group(128), packing="int32x8"),
}
