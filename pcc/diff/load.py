"""Load each side of a diff: a contract (.prec, .yaml or .json, extends resolved) or a
bundle directory (its contract.prec), optionally against one model for both sides."""

from __future__ import annotations

from pathlib import Path

from pcc.bundle import BundleError, contract_file
from pcc.models import Catalog, CatalogError, catalog_from_checkpoint, catalog_names, close_names, load_catalog
from pcc.lower import compile_file
from pcc.plan import Compiled
from pcc.lang.diagnostics import PccError
from pcc.lang.inputs import InputError, read_json

BUNDLE_PLAN = "plan.json"


class DiffError(PccError):
    """A side cannot be compared; `compiled` holds its diagnostics when it failed to check."""

    code = "PCC705"

    def __init__(self, message: str, compiled: Compiled | None = None, code: str | None = None):
        super().__init__(message, code)
        self.compiled = compiled


def model_catalog(spec: str) -> Catalog:
    """--model: a checkpoint directory (headers only) or a built-in catalog name."""
    if Path(spec).is_dir():
        return catalog_from_checkpoint(spec)
    if spec in catalog_names():
        return load_catalog(spec)
    raise CatalogError(f"--model {spec!r} is neither a checkpoint directory nor a catalog{close_names(spec)} "
                       f"({', '.join(catalog_names())})")


def load_side(path: str, catalog: Catalog | None = None) -> tuple[Compiled, list[str]]:
    """The checked plan of one side, and notes (e.g. a bundle whose plan.json is stale)."""
    bundle = Path(path).is_dir()
    try:
        p = contract_file(path)  # a bundle is checked against its manifest
    except BundleError as exc:
        raise DiffError(str(exc), code=None if exc.missing else exc.code) from None
    c = compile_file(str(p), catalog)
    if not c.ok:
        raise DiffError(f"{path}: the contract has errors", c)
    return c, _stale(Path(path) / BUNDLE_PLAN, c) if bundle else []


def _stale(plan_file: Path, c: Compiled) -> list[str]:
    """A bundle's plan.json should be what its contract resolves to (same lock hash)."""
    from pcc.plan.dump import lock_hash, plan_dict

    if not plan_file.is_file():
        return [f"{plan_file}: missing; the bundle is incomplete"]
    try:
        lock = read_json(plan_file, what="plan").get("lock")
    except InputError as exc:
        return [exc.message]
    except AttributeError:
        return [f"{plan_file}: not a JSON object"]
    now = lock_hash(plan_dict(c.plan))
    return [] if lock == now else [f"{plan_file}: lock {lock} but its contract resolves to {now}: "
                                   "the bundle is stale; the diff uses the contract"]
