"""Job bundles: one directory with everything a run needs, byte-identical for the same input.

Layout (docs/bundle.md): run.sh, contract.prec (the merged contract), plan.json,
manifest.json (sha256 of every file, pcc version, the Plan's lock hash),
README.md (the component trace), and each target's files: trainer/, rollout/,
miles/, convert/, validate/. The bundle is built in a temporary sibling
directory and renamed into place, so a crash never leaves a half bundle.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import stat
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from pcc import __version__
from pcc.contract.model import Contract
from pcc.lang.diagnostics import PccError
from pcc.lang.inputs import InputError, read_bytes, read_json
from pcc.lang.parser import MAX_BYTES as MAX_CONTRACT
from pcc.contract.fmt import lines
from pcc.lower import Lowered, lower, targets_for
from pcc.plan import Plan
from pcc.plan.dump import lock_hash, plan_dict
from pcc.plan.explain import explain, render

MANIFEST = "manifest.json"
CONTRACT = "contract.prec"
MAX_FILE = 256 << 20  # one bundle file (plan.json of a trillion-parameter model is a few MiB)
_SHA256 = re.compile(r"[0-9a-f]{64}")
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



class BundleError(PccError):
    """A bundle cannot be written or read; the message says which file and why. PCC701 by default;
    PCC706 a bundle that does not match its manifest, PCC709 a bundle the disk would not take.
    `missing`: the argument names no contract file or bundle at all (the CLI's exit 2)."""

    code = "PCC701"

    def __init__(self, message: str, code: str | None = None, missing: bool = False):
        super().__init__(message, code)
        self.missing = missing


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


@dataclass
class Bundle:
    path: Path
    manifest: dict

    @property
    def contract_path(self) -> Path:
        return self.path / CONTRACT


def read_bundle(path: str | Path) -> Bundle:
    """Open a bundle and check every file against its manifest: the manifest well-formed, each path in
    it relative and inside the bundle (no `..`, no link out), each file regular, bounded and of the
    recorded SHA-256, contract.prec among them. BundleError PCC706 names the first file that is not."""
    path = Path(path)
    try:
        manifest = read_json(path / MANIFEST, what="bundle manifest")
    except InputError as exc:
        missing = not (path / MANIFEST).exists()
        raise BundleError(f"{path}: not a pcc bundle ({exc.message})", None if missing else "PCC706",
                          missing=missing) from None
    files = manifest.get("files") if isinstance(manifest, dict) else None
    if not isinstance(files, dict) or not all(isinstance(d, str) and _SHA256.fullmatch(d) for d in files.values()):
        raise BundleError(f"{path / MANIFEST}: malformed: 'files' maps each path to its SHA-256", "PCC706")
    if CONTRACT not in files:
        raise BundleError(f"{path / MANIFEST}: does not list {CONTRACT}", "PCC706")
    root = path.resolve()
    for rel, digest in files.items():
        parts = PurePosixPath(rel)
        if not rel or parts.is_absolute() or ".." in parts.parts or "\\" in rel or "\0" in rel:
            raise BundleError(f"{path / MANIFEST}: names {rel!r}, a path outside the bundle", "PCC706")
        f = path / rel
        try:
            inside = f.resolve().is_relative_to(root)
        except (OSError, RuntimeError) as exc:  # a link loop
            raise BundleError(f"{path}: {rel}: {exc}", "PCC706") from None
        if not inside:
            raise BundleError(f"{path}: {rel} links outside the bundle", "PCC706")
        if not f.exists():
            raise BundleError(f"{path}: {rel} is missing", "PCC706")
        try:
            data = read_bytes(f, MAX_FILE, "bundle file")
        except InputError as exc:
            raise BundleError(exc.message, "PCC706") from None
        if hashlib.sha256(data).hexdigest() != digest:
            raise BundleError(f"{path}: {rel} does not match the manifest (edited after compile?); recompile the "
                              "contract", "PCC706")
    return Bundle(path, manifest)


def contract_file(arg: str | Path) -> Path:
    """CONTRACT or BUNDLE -> the contract file: the one resolution every verb that takes a contract uses
    (docs/safety.md). A directory is a bundle, and is read through `read_bundle`, so a verb never runs
    a bundle whose files differ from its manifest."""
    p = Path(arg)
    if p.is_dir():
        if not (p / MANIFEST).exists():
            hint = f"it has {CONTRACT} but no {MANIFEST}" if (p / CONTRACT).exists() else f"it has no {CONTRACT}"
            raise BundleError(f"{arg}: not a pcc bundle ({hint}); a bundle directory holds {CONTRACT} and "
                              f"{MANIFEST}, as `pcc compile` writes them", missing=True)
        return read_bundle(p).contract_path
    try:
        st = p.stat()
    except OSError as exc:
        why = "no such contract file or bundle directory" if isinstance(exc, FileNotFoundError) else \
            f"cannot read: {exc.strerror}"
        raise BundleError(f"{arg}: {why}", missing=True) from None
    if not stat.S_ISREG(st.st_mode):
        raise BundleError(f"{arg}: not a regular file; a contract is a file, a bundle a directory", missing=True)
    if st.st_size > MAX_CONTRACT:
        raise BundleError(f"{arg}: {st.st_size} bytes, larger than a contract ({MAX_CONTRACT >> 10} KiB)",
                          missing=True)
    try:
        with open(p, "rb"):  # a regular file: opening it cannot block
            pass
    except OSError as exc:
        raise BundleError(f"{arg}: cannot read: {exc.strerror}", missing=True) from None
    return p


def is_bundle(path: str | Path) -> bool:
    return (Path(path) / MANIFEST).is_file()
