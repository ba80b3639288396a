"""Operator patterns: family globs and aliases, tensor-name globs, layer ranges.

Canonical text (the same in .prec and JSON): ``experts.*``, ``linear[0,-1]``,
``attn.q[3..60]``, ``name:model.visual.*``, ``mtp``. A glob (and ``all``) never
selects the families that are not GEMMs (norm, embed, kv_cache, other), nor
``mtp`` and ``vision``, which SGLang loads wide unless told; naming one selects it.
``mtp`` selects every GEMM of the MTP (NextN) layers, the layers numbered from
``num_hidden_layers`` on: their attention, experts, shared experts and their own
``eh_proj`` (family ``mtp``). Layer ranges count decoder layers only, so
``linear[-1]`` is the last decoder layer, never an MTP layer. docs/models.md.
"""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass
from functools import lru_cache

from pcc.lang.diagnostics import PccError, did_you_mean
from pcc.models import FAMILIES

LINEAR = ("attn.q", "attn.kv", "attn.o", "attn.indexer", "attn.linear", "mlp.gate_up", "mlp.down", "experts.gate_up",
          "experts.down", "shared_experts.gate_up", "shared_experts.down")
NON_GEMM = ("norm", "embed", "kv_cache", "other")
NAMED_ONLY = NON_GEMM + ("mtp", "vision")  # families a glob or `all` never selects
# What `mtp` selects inside the MTP layers: every GEMM family.
_MTP_FAMILIES = tuple(f for f in FAMILIES if f not in NON_GEMM and f != "vision")
ALIASES: dict[str, tuple[str, ...]] = {
    "linear": LINEAR,
    "attn": ("attn.q", "attn.kv", "attn.o", "attn.indexer", "attn.linear"),
    "mlp": ("mlp.gate_up", "mlp.down"),
    "experts": ("experts.gate_up", "experts.down"),
    "shared_experts": ("shared_experts.gate_up", "shared_experts.down"),
    "all": tuple(f for f in FAMILIES if f not in NAMED_ONLY),
}
VOCABULARY = tuple(FAMILIES) + tuple(ALIASES)
_LAYERS = re.compile(r"^(?P<head>.*?)\[(?P<ranges>-?\d+(?:\.\.-?\d+)?(?:,-?\d+(?:\.\.-?\d+)?)*)\]$")


@dataclass(frozen=True)
class Pattern:
    text: str
    families: tuple[str, ...]  # empty for a name glob
    name_regex: re.Pattern | None
    layers: tuple[tuple[int, int], ...] | None  # inclusive ranges, may be negative
    mtp: bool = False  # `mtp`: only the MTP layers (numbered from num_layers on)

    def layer_set(self, num_layers: int):
        """The layers selected (a container of layer numbers), None for every layer."""
        if self.mtp:
            return _From(num_layers)
        if self.layers is None:
            return None
        out = set()
        for lo, hi in self.layers:
            lo, hi = (lo + num_layers if lo < 0 else lo), (hi + num_layers if hi < 0 else hi)
            out.update(range(max(lo, 0), min(hi, num_layers - 1) + 1))
        return frozenset(out)


class _From:
    """Every layer number from `first` on: the MTP layers, however many a model has."""

    def __init__(self, first: int):
        self.first = first

    def __contains__(self, layer) -> bool:
        return isinstance(layer, int) and layer >= self.first


class PatternError(PccError, ValueError):
    """A pattern that is malformed or names nothing known; resolution reports it at the rule, with the hint."""

    def __init__(self, message: str, hint: str | None = None):
        super().__init__(message, hint=hint)


@lru_cache(maxsize=4096)
def parse_pattern(text: str) -> Pattern:
    layers = None
    head = text
    m = _LAYERS.match(text)
    if m:
        head = m["head"]
        layers = []
        for part in m["ranges"].split(","):
            lo, _, hi = part.partition("..")
            lo_i, hi_i = int(lo), int(hi or lo)
            if (lo_i < 0) == (hi_i < 0) and lo_i > hi_i:
                raise PatternError(f"layer range {part} in '{text}' is empty (it runs backwards)",
                                   f"write [{hi_i}..{lo_i}]")
            layers.append((lo_i, hi_i))
        layers = tuple(layers)
    elif "[" in text:
        raise PatternError(f"malformed layer range in '{text}'", "write e.g. experts.*[3..60] or linear[0,-1]")
    if head.startswith("name:"):
        glob = head[5:]
        if not glob:
            raise PatternError("empty tensor-name glob")
        return Pattern(text, (), re.compile(fnmatch.translate(glob)), layers)
    if head == "mtp":
        if layers is not None:
            raise PatternError(f"'{text}': mtp takes no layer range (layer ranges count decoder layers)",
                               "write mtp, or a name glob such as \"model.layers.61.*\"")
        return Pattern(text, _MTP_FAMILIES, None, None, mtp=True)
    if head in ALIASES:
        return Pattern(text, ALIASES[head], None, layers)
    if any(ch in head for ch in "*?["):
        fams = tuple(f for f in FAMILIES if f not in NAMED_ONLY and fnmatch.fnmatchcase(f, head))
        if not fams:

            globs = sorted({f.split(".")[0] + ".*" for f in FAMILIES if "." in f})
            raise PatternError(f"pattern '{head}' matches no operator family",
                               did_you_mean(head, globs + list(VOCABULARY)) or "families: " + ", ".join(VOCABULARY))
        return Pattern(text, fams, None, layers)
    if head in FAMILIES:
        return Pattern(text, (head,), None, layers)

    raise PatternError(f"unknown operator family '{head}'",
                       did_you_mean(head, VOCABULARY) or "families: " + ", ".join(VOCABULARY))
