"""The ranges of a run's settings, shared by the `pcc run` flags (argparse types) and RunConfig.check,
in a module without torch so that building the command line stays fast (docs/runtime.md)."""

from __future__ import annotations

import math

from pcc.lang.diagnostics import PccError


class SettingError(PccError, ValueError):
    """A run setting outside its range (PCC708); on the command line argparse says the same per flag."""

    code = "PCC708"


MAX_ROWS = 16384  # prompts x group: the batch the embedded runtime holds in memory at once
# name -> (low, high, low excluded): the ranges `pcc run` flags and RunConfig share (docs/runtime.md).
RANGES = {"steps": (1, 1_000_000, False), "seed": (0, 2**32 - 1, False), "prompts": (1, 4096, False),
          "group": (2, 256, False), "lr": (0.0, 1.0, True), "temperature": (0.01, 100.0, False),
          "crash_at": (0, 1_000_000, False)}  # fault injection: crash in this step (None: never)


def in_range(name: str, value) -> str | None:
    """Why `value` is not a valid `name`, or None."""
    lo, hi, open_lo = RANGES[name]
    kind = int if isinstance(lo, int) else float
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (kind is int and not isinstance(value, int)):
        return f"expected {'a whole number' if kind is int else 'a number'}, got {value!r}"
    if not math.isfinite(value) or value < lo or value > hi or (open_lo and value == lo):
        return f"{value} is out of range: expected {lo} {'<' if open_lo else '<='} {name} <= {hi}"
    return None
