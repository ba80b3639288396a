"""Writing a job bundle (pcc.bundle reads one): every file from the Plan and its lowered targets, the
manifest last; built in a temporary sibling directory and renamed into place, so a crash never leaves a
half bundle."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

from pcc import __version__
from pcc.bundle import CONTRACT, MANIFEST, BundleError, is_bundle
from pcc.contract.fmt import lines
from pcc.contract.model import Contract
from pcc.lower import Lowered, lower, targets_for
from pcc.plan import Plan
from pcc.plan.dump import lock_hash, plan_dict
from pcc.plan.explain import explain, render

EXECUTABLE = ("run.sh", "launch.sh", "launch_server.sh")


def run_sh(framework: str | None) -> str:
    """run.sh: the embedded runtime here; the framework's launch named for a cluster."""
    cluster = f'# On a cluster: `pcc run "$here" --target {framework}` (see {framework}/launch.sh).\n' if framework else ""
    return ("#!/usr/bin/env bash\n"
            "# The main job of this bundle: pcc's embedded runtime runs it on this machine (no GPU).\n"
            f"{cluster}"
            "set -euo pipefail\n"
            'here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"\n'
            'exec pcc run "$here" "$@"\n')



def contract_source(contract: Contract, model_dir: str | None = None) -> str:
    """The merged contract as canonical .prec text (what the bundle runs, parents included). A
    checkpoint model is written as `model_dir`, its absolute path: relative, it would name a folder
    inside the bundle."""
    d = contract.model_dump(mode="json", exclude_defaults=True)
    d["name"] = contract.name
    if model_dir is not None and contract.model is not None and contract.model.path is not None:
        d["model"] = {"path": model_dir}
    return "\n".join(text for _, text in lines(d)) + "\n"


def _model_dir(plan: Plan, contract_path: str | None) -> str | None:
    """The absolute checkpoint folder of a `model from` contract: the catalog's source, else the path
    relative to the contract file; a relative path with neither is refused (it would name a folder
    inside the bundle)."""
    ref = plan.contract.model
    if ref is None or ref.path is None:
        return None
    if plan.catalog.source is not None:
        return os.path.abspath(plan.catalog.source)
    if os.path.isabs(ref.path):
        return ref.path
    if contract_path is None:
        raise BundleError(f"model from {ref.path!r} is relative and the contract file it is relative to is "
                          "unknown; compile the contract file, or give the model an absolute path")
    return os.path.abspath(os.path.join(os.path.dirname(contract_path), ref.path))


def bundle_files(plan: Plan, targets: tuple[str, ...] | None = None,
                 contract_path: str | None = None) -> tuple[dict[str, str], list[Lowered]]:
    """Every file of the bundle (path -> text), manifest included; the contract's targets by default.
    `contract_path`: the contract file compiled, which a relative `model from` is relative to."""
    targets = targets_for(plan) if targets is None else targets
    lowered = [lower(plan, name) for name in targets]
    pd = plan_dict(plan)
    pd["lock"] = lock_hash(pd)
    files: dict[str, str] = {
        "run.sh": run_sh(plan.contract.runs_on),
        CONTRACT: contract_source(plan.contract, _model_dir(plan, contract_path)),
        "plan.json": json.dumps(pd, indent=1, sort_keys=True) + "\n",
    }
    for low in lowered:
        for path, text in low.files.items():
            if path in files:
                raise BundleError(f"two targets write {path}")
            files[path] = text
    files["README.md"] = _readme(plan, lowered)
    manifest = {
        "pcc_version": __version__, "contract": plan.contract.name, "lock": pd["lock"],
        "targets": list(targets),
        "files": {p: hashlib.sha256(t.encode()).hexdigest() for p, t in sorted(files.items())},
    }
    files[MANIFEST] = json.dumps(manifest, indent=1, sort_keys=True) + "\n"
    return files, lowered


# framework -> how the bundle's README says to launch it
LAUNCH_README = {
    "miles": "Launch on Miles: set `PCC_ROLLOUT_CHECKPOINT`, `PCC_REF_LOAD` and `MILES_DIR`, then "
             "`miles/launch.sh [MILES ARGS...]` (a `job` file beside the bundle adds the job's flags; later flags win).\n",
    "verl": "Launch on verl: `verl/launch.sh [HYDRA OVERRIDES...]` or `pcc run . --target verl -- OVERRIDES...` "
            "(a `job` file beside the bundle adds the job's overrides, one per line: its data, "
            "`actor_rollout_ref.model.path` and batch sizes; later overrides win).\n",
    "nemo_rl": "Launch on NeMo RL: set `NEMO_RL_DIR` (a checkout at the pinned tag), then `nemo_rl/launch.sh "
               "[HYDRA OVERRIDES...]` or `pcc run . --target nemo_rl -- OVERRIDES...` (a `job` file beside the bundle "
               "adds the job's overrides, one per line: `policy.model_name`, data, `grpo.*`, `cluster.*`; later win).\n",
}


def _readme(plan: Plan, lowered: list[Lowered]) -> str:
    notes = [f"- {low.target}: {n}" for low in lowered for n in low.notes]
    return (f"# Bundle for contract `{plan.contract.name}`\n\n"
            "Generated by pcc; do not edit (recompile the contract instead).\n\n"
            "Run the main job on this machine: `./run.sh` (pcc's embedded runtime).\n"
            + LAUNCH_README.get(plan.contract.runs_on, "") +
            "Build the rollout checkpoint: `pcc convert . --source SRC -o DST`.\n\n"
            "```\n" + render(explain(plan)) + "\n```\n\n"
            + ("## Why these values\n\n" + "\n".join(notes) + "\n" if notes else ""))


def write_bundle(plan: Plan, out: str | Path, force: bool = False,
                 targets: tuple[str, ...] | None = None, contract_path: str | None = None) -> dict[str, str]:
    """Write the bundle atomically; refuse to replace an existing directory unless `force`."""
    out = Path(out).resolve()
    if out.exists() and not force:
        raise BundleError(f"{out} exists; pass --force to replace it")
    if out.exists() and not is_bundle(out) and not (out.is_dir() and not any(out.iterdir())):
        raise BundleError(f"{out} is not a pcc bundle; --force replaces bundles only, never other files")
    files, _ = bundle_files(plan, targets, contract_path)
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        if tmp.exists():
            shutil.rmtree(tmp)
        for path, text in files.items():
            target = tmp / path
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text, encoding="utf-8")
            if target.name in EXECUTABLE:
                target.chmod(0o755)
        if out.exists():
            old = out.with_name(f".{out.name}.old-{os.getpid()}")
            os.replace(out, old)
            os.replace(tmp, out)
            shutil.rmtree(old)
        else:
            os.replace(tmp, out)
    except OSError as exc:  # a read-only or full disk: one line naming the path, nothing half-written left
        where = exc.filename or out
        raise BundleError(f"{out}: cannot write the bundle ({where}: {exc.strerror})", "PCC709") from None
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return files


