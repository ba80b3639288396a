"""Job bundles: one directory with everything a run needs, byte-identical for the same input.

Layout (docs/bundle.md): run.sh, contract.prec (the merged contract), plan.json,
manifest.json (sha256 of every file, pcc version, the Plan's lock hash),
README.md (the component trace), and each target's files: trainer/, rollout/,
miles/, convert/, validate/. This module reads a bundle (checked against its manifest) and
imports nothing of the compiler, so `pcc convert BUNDLE` starts without it; pcc.bundle.write
writes one.
"""

from __future__ import annotations

import hashlib
import re
import stat
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from pcc.lang.diagnostics import PccError
from pcc.lang.inputs import MAX_CONTRACT, InputError, read_bytes, read_json

MANIFEST = "manifest.json"
CONTRACT = "contract.prec"
MAX_FILE = 256 << 20  # one bundle file (plan.json of a trillion-parameter model is a few MiB)
# `pcc run --target FRAMEWORK`: framework -> its name in messages; pcc.bundle.launch.LAUNCHERS builds each
# launch. Here so that building the CLI's parser imports no compiler (`pcc convert BUNDLE` starts without it).
FRAMEWORKS = {"miles": "Miles", "verl": "verl", "nemo_rl": "NeMo RL"}
_SHA256 = re.compile(r"[0-9a-f]{64}")


class BundleError(PccError):
    """A bundle cannot be written or read; the message says which file and why. PCC701 by default;
    PCC706 a bundle that does not match its manifest, PCC709 a bundle the disk would not take.
    `missing`: the argument names no contract file or bundle at all (the CLI's exit 2)."""

    code = "PCC701"

    def __init__(self, message: str, code: str | None = None, missing: bool = False):
        super().__init__(message, code)
        self.missing = missing


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
