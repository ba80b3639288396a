"""Compile a contract (or a bundle's contract.prec) into a Plan the embedded runtime can execute.

`model` re-resolves the same contract against another catalog, on `hardware cpu`
with one-device parallelism: the shipped contracts name 30B-1T models, and this
is how their precision rules run on a tiny model of the same family here.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pcc.contract.io import load
from pcc.contract.model import ModelRef, Parallel
from pcc.lang.diagnostics import Diagnostic, DiagnosticError, Reporter
from pcc.models import CatalogError, load_catalog
from pcc.plan import load_model
from pcc.plan.checks import run_checks
from pcc.plan.resolve import resolve

MAX_PARAMS = 50_000_000  # what a 2-core CPU can train in minutes


class ContractError(RuntimeError):
    def __init__(self, message: str, diagnostics: list[Diagnostic] | None = None, sources: dict | None = None):
        super().__init__(message)
        self.diagnostics, self.sources = diagnostics or [], sources or {}


@dataclass
class Compiled:
    plan: object
    path: str
    diagnostics: list[Diagnostic]
    model_override: str | None


def contract_path(target: str) -> str:
    p = Path(target)
    if p.is_dir():
        if not (p / "contract.prec").is_file():
            raise ContractError(f"{target}: a bundle directory must contain contract.prec")
        return str(p / "contract.prec")
    if not p.is_file():
        raise ContractError(f"{target}: no such contract file or bundle directory")
    return str(p)


def compile_for_runtime(target: str, model: str | None = None, catalog=None) -> Compiled:
    """`model` (a catalog name) or `catalog` (a Catalog) replaces the contract's model for this machine."""
    path = contract_path(target)
    try:
        loaded = load(path)
    except DiagnosticError as exc:
        raise ContractError(f"{path}: the contract does not load", exc.diagnostics) from None
    rep = Reporter(list(loaded.diagnostics))
    contract, override = loaded.contract, None
    if model is not None or catalog is not None:
        try:
            catalog = catalog or load_catalog(model)
        except CatalogError as exc:
            raise ContractError(f"--model {model}: {exc}") from None
        override = catalog.name
        contract = contract.model_copy(update={
            "model": ModelRef(catalog=catalog.name), "hardware": "cpu",
            "rollout": contract.rollout.model_copy(update={"hardware": None, "parallel": Parallel()}),
            "trainer": contract.trainer.model_copy(update={"hardware": None, "parallel": Parallel()})})
    else:
        catalog = load_model(loaded, rep)
    if catalog is None:
        raise ContractError(f"{path}: no model", rep.diagnostics, loaded.sources)
    plan = resolve(contract, catalog, loaded.smap, rep)
    run_checks(plan, loaded.smap, rep)
    errors = [d for d in rep.diagnostics if d.is_error]
    if errors:
        raise ContractError(f"{path}: {len(errors)} error(s) against model '{catalog.name}'", rep.diagnostics,
                            loaded.sources)
    n = sum(_numel(op.shape) for op in catalog.operators if op.family != "kv_cache")
    if n > MAX_PARAMS:
        raise ContractError(f"{path}: model '{catalog.name}' has {n / 1e9:.1f}B parameters, too many for the embedded "
                            f"runtime; run it on a small model of the same family with --model tiny_moe "
                            f"(or tiny_dense), or on a cluster with the miles target")
    return Compiled(plan, path, rep.diagnostics, override)


def _numel(shape) -> int:
    n = 1
    for s in shape:
        n *= s
    return n
