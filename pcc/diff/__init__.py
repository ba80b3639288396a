"""`pcc diff`: the semantic difference of two contracts (or bundles), from their resolved Plans.

    report = diff("a.prec", "b.prec")      # JSON-ready dict; report["changed"] drives the exit code

compare.py finds what differs (per component and family, settings, trainable set,
expectations); engines.py diffs the engine arguments of every target either bundle lowers;
consequences.py derives rebuilds, validation levels, baseline and byte deltas;
render.py prints text, Markdown (a pull-request comment) or JSON; html.py the precision map
of B with the changed cells marked and the consequences. Imports happen
inside the functions, so registering the command (pcc.diff.cli) costs nothing.
"""

from __future__ import annotations

__all__ = ["diff", "diff_plans", "diff_sides"]


def diff_plans(pa, pb, targets=None) -> dict:
    """Diff two resolved Plans; engine arguments only when something semantic changed (`targets`:
    those to compare, by default every engine target either side's bundle holds)."""
    from pcc.diff.compare import compare
    from pcc.diff.consequences import consequences
    from pcc.diff.engines import engine_changes

    report = compare(pa, pb)
    report["engines"] = engine_changes(pa, pb, targets) if report["changed"] else {}
    report["consequences"] = consequences(report, pa, pb, report["engines"])
    return report


def diff(a: str, b: str, model: str | None = None, targets=None) -> dict:
    """Diff two contract files or bundle directories; raises pcc.diff.load.DiffError or CatalogError."""
    return diff_sides(a, b, model, targets)[0]


def diff_sides(a: str, b: str, model: str | None = None, targets=None):
    """`diff`, and the two checked sides (pcc.plan.Compiled) it compared: the precision map
    (`--format html`) draws B's plan with the changed cells marked."""
    from pcc.diff.load import load_side, model_catalog

    catalog = model_catalog(model) if model else None
    ca, notes_a = load_side(a, catalog)
    cb, notes_b = load_side(b, catalog)
    report = diff_plans(ca.plan, cb.plan, targets)
    report["a"]["file"], report["b"]["file"] = a, b
    report["notes"] = notes_a + notes_b
    return report, ca, cb
