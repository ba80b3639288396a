"""Lowering: Plan -> artifacts for one target. One module per target, registered by name.

A target is a pure function `Plan -> Lowered`. It never imports an engine at
module import time (engine parsers are used only by `pcc.lower.verify`, lazily).
Paths to user data (checkpoints) never appear in `args`: run scripts supply them
from the environment variables in `PATH_VARIABLES`, so a bundle is relocatable
and byte-identical for the same input.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Callable

from pcc.plan import Plan

# Environment variables through which run scripts receive paths (with defaults in run.sh).
PATH_VARIABLES = {
    "PCC_ROLLOUT_CHECKPOINT": "the rollout artifact the converter plan builds (HF layout, quantized)",
    "PCC_REF_LOAD": "the BF16 trainer weights (Megatron checkpoint or HF directory)",
    "PCC_SOURCE_CHECKPOINT": "the BF16/FP32 Hugging Face checkpoint the converter reads",
    "PCC_ADAPTER": "a LoRA adapter directory (PEFT layout), for adapter contracts",
}


@dataclass
class Lowered:
    """What one target needs: its argument list, environment, and files for the bundle."""

    target: str
    args: list[str] = field(default_factory=list)  # argv after the program name
    env: dict[str, str] = field(default_factory=dict)
    files: dict[str, str] = field(default_factory=dict)  # bundle-relative path -> text
    notes: list[str] = field(default_factory=list)  # why each non-obvious value was chosen


def module_leaf(tensor: str) -> str:
    """HF tensor name -> the module's leaf name, as engines match LoRA targets
    ("model.layers.3.self_attn.q_proj.weight" -> "q_proj")."""
    return tensor.removesuffix(".weight").rsplit(".", 1)[-1]


TargetFn = Callable[[Plan], Lowered]
# name -> module; a module registers its function with @target(name) when imported.
TARGET_MODULES = {
    "megatron": "pcc.lower.megatron",
    "sglang": "pcc.lower.sglang",
    "converter": "pcc.lower.converter",
    "expectations": "pcc.lower.expectations",
    "miles": "pcc.lower.miles",
}
_TARGETS: dict[str, TargetFn] = {}


def target(name: str) -> Callable[[TargetFn], TargetFn]:
    def register(fn: TargetFn) -> TargetFn:
        _TARGETS[name] = fn
        return fn

    return register


def lower(plan: Plan, name: str) -> Lowered:
    """Lower `plan` for target `name` (see TARGET_MODULES).

    Lowering is a pure function of the Plan, so each target runs once per Plan (Miles
    composes the megatron and sglang results; a bundle needs all of them). Treat the
    result as read-only.
    """
    cache = plan.__dict__.setdefault("_lowered", {})
    if name not in cache:
        if name not in _TARGETS:
            if name not in TARGET_MODULES:
                raise KeyError(f"unknown target '{name}' (targets: {', '.join(TARGET_MODULES)})")
            importlib.import_module(TARGET_MODULES[name])
        cache[name] = _TARGETS[name](plan)
    return cache[name]
