"""One module per ladder level. Each `run(ctx)` returns an Outcome: the figures the
expectations are compared with, its own derived checks, and what a failure points at."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Outcome:
    figures: dict = field(default_factory=dict)
    checks: list[dict] = field(default_factory=list)  # derived by pcc validate, beyond the expectations
    findings: list[str] = field(default_factory=list)  # what this run's figures point at
    look: list[str] = field(default_factory=list)  # what to look at next if the level fails
    data: dict = field(default_factory=dict)  # series for the plots and report.json

    def check(self, metric: str, op: str, value, observed, why: str = "") -> bool:
        from ..expect import OPS

        ok = None if observed is None else bool(OPS[op](observed, value))
        self.checks.append({"metric": metric, "op": op, "value": value, "observed": observed, "ok": ok,
                            "source": "pcc validate", "why": why})
        return bool(ok)


def rel_err(a, b) -> float:
    """||a - b|| / ||b||, in float64."""
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm().clamp(min=1e-30))
