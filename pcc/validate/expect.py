"""The thresholds each level is held to: the bundle's `validate/expectations.yaml`.

They come from `pcc.lower.lower(plan, "expectations")` (the contract's `expect` block where it
states one, else a default derived from the regime), or from a bundle's own file when
validating a bundle, so what is checked is what was shipped.
"""

from __future__ import annotations

from pathlib import Path

import yaml

OPS = {"<=": lambda a, b: a <= b, ">=": lambda a, b: a >= b, "<": lambda a, b: a < b,
       ">": lambda a, b: a > b, "==": lambda a, b: a == b}


def load(plan, target: str) -> dict:
    """The ladder document. A bundle directory's file wins over a fresh lowering."""
    shipped = Path(target) / "validate" / "expectations.yaml"
    if Path(target).is_dir() and shipped.is_file():
        return yaml.safe_load(shipped.read_text(encoding="utf-8"))
    from pcc.lower import lower

    return yaml.safe_load(lower(plan, "expectations").files["validate/expectations.yaml"])


def thresholds(doc: dict, level: int) -> list[dict]:
    for entry in doc.get("levels", []):
        if entry["level"] == level:
            return [t for t in entry.get("thresholds", []) if t]
    return []


def level_info(doc: dict, level: int) -> dict:
    return next((e for e in doc.get("levels", []) if e["level"] == level), {})


def compare(threshold: dict, figures: dict) -> dict:
    """One threshold against the level's figures: ok True/False, or None when not measured.
    `op: record` thresholds pass when the figure was recorded."""
    metric, op, value = threshold["metric"], threshold["op"], threshold.get("value")
    observed = figures.get(metric)
    out = {"metric": metric, "op": op, "value": value, "source": threshold.get("source", "derived"),
           "observed": observed}
    if observed is None:
        out["ok"] = None
    elif op == "record":
        out["ok"] = True
    else:
        out["ok"] = bool(OPS[op](observed, value))
    return out
