"""Level 1, the precision contract: it compiles on this model, and every level has an expectation.

Records what a result depends on: the resolved plan's lock hash, the regime and formats, the
trainable tensors, the version rules and staleness, and the versions of pcc, Python, torch
and whichever engines are installed.
"""

from __future__ import annotations

import importlib.metadata
import platform

from . import Outcome

PACKAGES = ("pcc", "torch", "numpy", "safetensors", "compressed-tensors", "transformers", "sglang",
            "megatron-core", "transformer-engine", "miles", "slime")
LOOK = ["the contract's diagnostics (pcc check CONTRACT)", "its expect block (pcc explain CONTRACT)",
        "validate/expectations.yaml in the bundle (pcc compile)"]


def versions() -> dict:
    out = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
    return out


def compile_contract(target: str, model: str | None):
    """(Compiled or None, Outcome)."""
    from pcc.runtime.contract import ContractError, compile_for_runtime
    from pcc.runtime.model import Arch, ArchError

    o = Outcome(look=list(LOOK))
    o.figures["versions"] = versions()
    try:
        c = compile_for_runtime(target, model)
        Arch.from_catalog(c.plan.catalog)
    except ContractError as exc:
        errors = [d for d in exc.diagnostics if d.is_error]
        o.findings.append(str(exc))
        o.findings += [d.render(exc.sources).splitlines()[0] for d in errors[:5]]
        o.check("contract compiles", "==", 1, 0, "the plan the ladder validates")
        return None, o
    except ArchError as exc:
        o.findings.append(str(exc))
        o.check("contract compiles", "==", 1, 0, "the embedded runtime builds this model")
        return None, o
    o.check("contract compiles", "==", 1, 1)
    return c, o


def run(ctx, o: Outcome) -> Outcome:
    from pcc.plan.dump import lock_hash, plan_dict

    from ..expect import thresholds

    plan, c = ctx.plan, ctx.plan.contract
    doc = ctx.expectations
    o.figures.update({
        "contract": c.name, "model": plan.catalog.name, "model_override": ctx.compiled.model_override,
        "plan_lock": lock_hash(plan_dict(plan)), "regime": doc.get("regime"),
        "rollout_formats": doc.get("rollout_formats"), "trainable": c.trainable.kind,
        "trainable_tensors": len(plan.trainable), "sync": c.sync.model_dump(mode="json"),
        "routing_replay": c.routing_replay, "correction": c.correction.kind,
        "warnings": [d.code for d in ctx.compiled.diagnostics if not d.is_error],
    })
    needed = [2, 3, 4, 6, 8] + ([5] if plan.catalog.is_moe else [])
    undefined = [lv for lv in needed if not thresholds(doc, lv)]
    if undefined:
        o.findings.append(f"no expectation for level(s) {undefined}: a failure there could not be told "
                          "from a pass")
    o.check("levels without an expectation", "==", 0, len(undefined), "every level compares with something")
    return o
