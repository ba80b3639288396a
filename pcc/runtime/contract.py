"""Compile a contract (or a bundle's contract.prec) into a Plan the embedded runtime can execute.

`model` re-resolves the same contract against another catalog, on `hardware cpu`
with one-device parallelism: the shipped contracts name 30B-1T models, and this
is how their precision rules run on a tiny model of the same family here.
`model="auto"` picks that tiny catalog from the contract's own model (`STAND_INS`),
and the 128-wide variant where the contract's groups do not divide the first choice.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from pcc.bundle import BundleError, contract_file
from pcc.contract.io import load
from pcc.contract.model import ModelRef, Parallel
from pcc.lang.diagnostics import Diagnostic, DiagnosticError, PccError, Reporter
from pcc.models import CatalogError, load_catalog
from pcc.plan import load_model
from pcc.plan.checks import run_checks
from pcc.plan.resolve import resolve

MAX_PARAMS = 50_000_000  # what a 2-core CPU can train in minutes
# The CPU-size catalog with the structure of each large catalog (docs/runtime.md has the table).
STAND_INS = {"qwen3_30b_a3b": "tiny_moe", "qwen3_8b": "tiny_dense", "llama3_8b": "tiny_dense",
             "kimi_k2": "tiny_shared_moe", "deepseek_v3": "tiny_shared_moe", "glm5": "tiny_shared_moe"}
WIDER = {"tiny_moe": "tiny_moe_128"}  # every reduction width a multiple of 128 (INT4 groups of 128)


class ContractError(PccError, RuntimeError):
    """The embedded runtime cannot run this contract (or bundle); `diagnostics` say why."""

    code = "PCC703"

    def __init__(self, message: str, diagnostics: list[Diagnostic] | None = None, sources: dict | None = None,
                 code: str | None = None):
        super().__init__(message, code)
        self.diagnostics, self.sources = diagnostics or [], sources or {}


@dataclass
class Compiled:
    plan: object
    path: str
    diagnostics: list[Diagnostic]
    model_override: str | None


def contract_path(target: str) -> str:
    """CONTRACT or BUNDLE -> the contract file (`pcc.bundle.contract_file`: a bundle checked against its
    manifest); ContractError when `target` names neither."""
    try:
        return str(contract_file(target))
    except BundleError as exc:
        raise ContractError(str(exc), code=None if exc.missing else exc.code) from None


def compile_for_runtime(target: str, model: str | None = None, catalog=None) -> Compiled:
    """`model` (a catalog name, or "auto") or `catalog` (a Catalog) replaces the contract's model."""
    if model == "auto":
        return _auto(target)
    path = contract_path(target)
    try:
        loaded = load(path)
    except DiagnosticError as exc:
        raise ContractError(f"{path}: the contract does not load", exc.diagnostics, exc.sources) from None
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
    n = sum(math.prod(op.shape) for op in catalog.operators if op.family != "kv_cache")
    if n > MAX_PARAMS:
        raise ContractError(f"{path}: model '{catalog.name}' has {n / 1e9:.1f}B parameters, too many for the embedded "
                            f"runtime; run it on a small model of the same structure with --model auto "
                            f"(here {STAND_INS.get(catalog.name, 'tiny_moe')}), or on a cluster with the miles target")
    return Compiled(plan, path, rep.diagnostics, override)


def stand_in(target: str) -> str | None:
    """The tiny catalog `--model auto` starts from for this contract (None: run its own model)."""
    path = contract_path(target)
    try:
        ref = load(path).contract.model
    except DiagnosticError as exc:
        raise ContractError(f"{path}: the contract does not load", exc.diagnostics, exc.sources) from None
    if ref.catalog is None or ref.catalog.startswith("tiny_"):
        return None
    if ref.catalog not in STAND_INS:
        raise ContractError(f"{target}: no CPU-size stand-in for model '{ref.catalog}'; "
                            f"pass --model with one of {sorted(set(STAND_INS.values()))}")
    return STAND_INS[ref.catalog]


def _auto(target: str) -> Compiled:
    name = stand_in(target)
    try:
        return compile_for_runtime(target, name)
    except ContractError:
        if name not in WIDER:
            raise
        return compile_for_runtime(target, WIDER[name])


