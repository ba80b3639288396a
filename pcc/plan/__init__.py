"""Contract + model catalog -> Plan, with every check run. The one entry point below lang/contract."""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from pathlib import Path

from pcc.contract.io import Loaded, load
from pcc.lang.diagnostics import Diagnostic, DiagnosticError, Reporter
from pcc.models import Catalog, CatalogError, catalog_from_checkpoint, load_catalog
from pcc.plan.checks import run_checks
from pcc.plan.resolve import COMPONENTS, DEFAULT, Plan, RuleRef, resolve

__all__ = ["COMPONENTS", "DEFAULT", "Compiled", "Plan", "RuleRef", "compile_file", "load_model"]


@dataclass
class Compiled:
    loaded: Loaded | None
    plan: Plan | None
    diagnostics: list[Diagnostic] = field(default_factory=list)
    sources: dict[str, str] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.plan is not None and not any(d.is_error for d in self.diagnostics)


def load_model(loaded: Loaded, rep: Reporter) -> Catalog | None:
    ref = loaded.contract.model
    where = loaded.smap.find("model")
    if ref is None:
        rep.error("PCC204", "no model declared", loaded.smap.find("name"),
                  hint="add 'model NAME' (a catalog) or 'model from \"checkpoint/dir\"'")
        return None
    try:
        if ref.catalog is not None:
            return load_catalog(ref.catalog)
        # absolute, as a bundle writes it: the plan (and its lock) never depend on the folder pcc ran in
        return catalog_from_checkpoint(os.path.abspath(Path(loaded.path).parent / ref.path))
    except CatalogError as exc:
        rep.error(exc.code or "PCC204", str(exc), where, path="model")
        return None


def compile_file(path: str, catalog: Catalog | None = None, text: str | None = None) -> Compiled:
    """Load, resolve and check one contract file (`text`: its unsaved contents). Never raises for bad input."""
    try:
        loaded = load(path, text)
    except DiagnosticError as exc:
        return Compiled(None, None, exc.diagnostics, exc.sources)
    rep = Reporter(list(loaded.diagnostics))
    catalog = catalog or load_model(loaded, rep)
    if catalog is None:
        return Compiled(loaded, None, rep.diagnostics, loaded.sources)
    plan = resolve(loaded.contract, catalog, loaded.smap, rep)
    run_checks(plan, loaded.smap, rep)
    return Compiled(loaded, plan, _own(rep.diagnostics, loaded.path), loaded.sources)


def _own(diagnostics: list[Diagnostic], path: str) -> list[Diagnostic]:
    """Name the file on diagnostics that only have a contract path, and drop PCC203 for
    parent rules: a child that extends a contract overrides its rules on purpose."""
    out = []
    for d in diagnostics:
        if d.code == "PCC203" and d.span is not None and d.span.file != path:
            continue
        out.append(d if d.span is not None or d.file else replace(d, file=path))
    return out

