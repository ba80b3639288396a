"""Converter plans that `pcc convert CONTRACT` compiled, kept for the next conversion: an implicit bundle.

Compiling a contract takes 0.2-0.3 s (importing the compiler, lowering every target as `pcc check` does), a
third of converting a 1.4 GB checkpoint on sixteen cores (docs/convert.md "Speed"). Its converter plan is a
function of pcc's code and data, the files and folders the compile reads, and the source checkpoint's
fingerprint, so it is kept in `$PCC_CACHE/convert-plans/` (default ~/.cache/pcc) under a key over pcc's
code, the Python and installed distributions, the contract's path, the working directory, the extends roots
and the source, with every file and folder the compile read (seen through Python's audit hooks) and their
digests. It is handed back only while each of them still reads the same: an edited contract, an extended
file, a model folder or pcc itself changed, and the contract is compiled again. The source's own config.json,
shards and listing are what its fingerprint covers, as for a bundle's converter plan (`bundle_plan`).

A compile that wrote a file, ran a process or opened a socket is not kept; nor one that read a file changed
in the second before it began (a write racing the compile could otherwise leave a plan for the old bytes
under the new bytes' digest). A cache that cannot be read or written is no error: the contract is compiled."""

from __future__ import annotations

import hashlib
import json
import os
import stat
import sys
import threading
import time
from pathlib import Path

from pcc.convert.contract import _well_formed
from pcc.lang.inputs import InputError, loads_json, read_bytes

VERSION = 1
KEEP = 32  # entries kept; the least recently used beyond that are removed
_MAX_DEP = 64 << 20  # a file the compile read, hashed whole up to this size (a safetensors file: its header)
_MAX_ENTRY = 256 << 20
_TOO_NEW_S = 1.0  # a file changed this close to the compile's start is not trusted to be the bytes it read
_WRITE = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
_UNCACHEABLE = ("subprocess.Popen", "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork",
                "socket.connect", "socket.bind", "urllib.Request", "os.remove", "os.rename", "os.mkdir")


class _Reads:
    """What one thread's compile opened and listed, and whether it did anything a cache cannot replay."""

    def __init__(self):
        self.thread = threading.get_ident()
        self.files: set[str] = set()
        self.folders: set[str] = set()
        self.refused: str | None = None


_active: _Reads | None = None
_hooked = False


def _hook(event: str, args: tuple) -> None:
    """Never raises: an audit hook's exception would be the audited operation's."""
    reads = _active
    if reads is None or reads.thread != threading.get_ident():
        return
    try:
        _see(reads, event, args)
    except Exception as exc:  # (noqa: BLE001 - whatever it is, the compile is not kept)
        reads.refused = reads.refused or f"{event}: {exc!r}"


def _see(reads: _Reads, event: str, args: tuple) -> None:
    if event == "open":
        path, mode, flags = args
        if not isinstance(path, (str, bytes, os.PathLike)):
            return  # an open of a descriptor: its path was seen when it was opened
        path = os.fsdecode(path)
        if path.endswith(".pyc"):
            return  # the import system's bytecode: the sources are what is hashed
        if (mode and any(c in mode for c in "wax+")) or (mode is None and flags & _WRITE):
            reads.refused = reads.refused or f"wrote {path}"
        else:
            reads.files.add(os.path.abspath(path))
    elif event in ("os.listdir", "os.scandir"):
        path = args[0]
        if isinstance(path, (str, bytes, os.PathLike)):
            reads.folders.add(os.path.abspath(os.fsdecode(path)))
    elif event.startswith(_UNCACHEABLE):
        reads.refused = reads.refused or event


def _record(compute):
    """compute(), and what it read (a `_Reads`)."""
    global _active, _hooked
    if not _hooked:
        sys.addaudithook(_hook)
        _hooked = True
    reads = _Reads()
    _active = reads
    try:
        return compute(), reads
    finally:
        _active = None


# -- what the key covers ---------------------------------------------------------------------------------------

def _code_roots() -> list[Path]:
    """pcc's package and its data folders (grammar, targets, schemas, contracts)."""
    from pcc.resources import data_dir

    pkg = Path(__file__).resolve().parents[1]
    roots = [pkg]
    for name in ("grammar", "targets", "schemas", "contracts"):
        try:
            path = data_dir(name).resolve()
        except FileNotFoundError:
            continue
        if not path.is_relative_to(pkg):
            roots.append(path)
    return roots


def _code_digest(roots: list[Path]) -> str:
    """SHA-256 of every file under `roots` but bytecode, by path: pcc's code and data as they are now."""
    h = hashlib.sha256()
    for root in roots:
        for folder, dirs, files in os.walk(root):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__")
            for name in sorted(files):
                if name.endswith((".pyc", ".pyo")):
                    continue
                path = os.path.join(folder, name)
                try:
                    data = Path(path).read_bytes()
                except OSError:
                    continue
                h.update(f"{os.path.relpath(path, root)}\0{len(data)}\0".encode())
                h.update(data)
    return h.hexdigest()


def _distributions() -> list[str]:
    """The installed distributions on sys.path, by their metadata folders' names (name-version)."""
    names = []
    for entry in sys.path:
        try:
            with os.scandir(entry or ".") as it:
                names += [e.name for e in it if e.name.endswith((".dist-info", ".egg-info"))]
        except OSError:
            continue
    return sorted(names)


def _key(contract: str, src) -> tuple[str, list[Path]]:
    from pcc.models.checkpoint import fingerprint
    from pcc.resources import ROOTS_ENV

    roots = _code_roots()
    doc = {"v": VERSION, "code": _code_digest(roots), "python": sys.version, "dists": _distributions(),
           "contract": str(Path(contract).resolve()), "cwd": os.getcwd(), "roots": os.environ.get(ROOTS_ENV),
           "source": str(Path(src.root).resolve()), "fingerprint": fingerprint(src.config, src.entries)}
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest(), roots


# -- the digests of what a compile read ------------------------------------------------------------------------

def _file_digest(path: str) -> str | None:
    """The digest of file `path` as the compile sees it: a safetensors file by its size and header (the
    compile reads no tensor bytes), any other whole; None when it cannot be read or is too large."""
    if not path.endswith(".safetensors"):
        try:
            return hashlib.sha256(read_bytes(path, _MAX_DEP, "file")).hexdigest()
        except InputError:
            return None
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        n = int.from_bytes(os.pread(fd, 8, 0), "little") if stat.S_ISREG(st.st_mode) else _MAX_DEP + 1
        if n > _MAX_DEP:
            return None
        return hashlib.sha256(f"{st.st_size}\0".encode() + os.pread(fd, n, 8)).hexdigest()
    except OSError:
        return None
    finally:
        os.close(fd)


def _folder_digest(path: str) -> str | None:
    try:
        return hashlib.sha256("\0".join(sorted(os.listdir(path))).encode()).hexdigest()
    except OSError:
        return None


_DIGEST = {"file": _file_digest, "folder": _folder_digest}


def _deps(reads: _Reads, code: list[Path], source: Path, started: float) -> list[list[str]] | None:
    """[kind, path, digest] of what the compile read, less what the key covers (pcc's code and data, the
    source's config.json, shards and listing); None when one cannot be trusted."""
    def covered(path: str) -> bool:
        p = Path(path)
        return (any(p.is_relative_to(r) for r in code)
                or (p.parent == source and (p.name == "config.json" or p.suffix == ".safetensors")))

    wanted = [("file", p) for p in sorted(reads.files) if not covered(p)]
    wanted += [("folder", p) for p in sorted(reads.folders) if Path(p) != source and not covered(p)]
    deps = []
    for kind, path in wanted:
        try:
            if os.stat(path).st_mtime > started - _TOO_NEW_S:
                return None
        except OSError:
            return None  # read, then gone: nothing to compare with next time
        digest = _DIGEST[kind](path)
        if digest is None:
            return None
        deps.append([kind, path, digest])
    return deps


# -- the cache ----------------------------------------------------------------------------------------------

def _folder() -> Path:
    from pcc.resources import cache_dir

    return cache_dir("convert-plans")


def lookup(contract: str, src) -> dict | None:
    """The converter plan a conversion of `src` (an opened Source) by `contract` compiled before, where
    every file and folder that compile read still reads the same; else None."""
    if src.view.encodings:
        return None
    try:
        key, _ = _key(contract, src)
        path = _folder() / f"{key}.json"
        entry = loads_json(read_bytes(path, _MAX_ENTRY, "cached converter plan"))
    except (OSError, RuntimeError, InputError, ValueError):
        return None
    if not (isinstance(entry, dict) and entry.get("v") == VERSION and entry.get("key") == key
            and isinstance(entry.get("deps"), list)):
        return None
    for dep in entry["deps"]:
        if not (isinstance(dep, list) and len(dep) == 3 and dep[0] in _DIGEST and all(isinstance(x, str) for x in dep)):
            return None
        if _DIGEST[dep[0]](dep[1]) != dep[2]:
            return None
    plan = entry.get("plan")
    if not _well_formed(plan):
        return None
    try:
        os.utime(path)  # most recently used
    except OSError:
        pass
    return plan


def compiled(contract: str, src, compute) -> dict:
    """compute() (the converter plan, compiled against `src`), kept for `lookup` where it can be."""
    started = time.time()
    plan, reads = _record(compute)
    if reads.refused is None and not src.view.encodings and plan.get("source_fingerprint") is not None:
        try:
            _store(contract, src, plan, reads, started)
        except (OSError, RuntimeError, ValueError):
            pass  # a cache that cannot be written is no error
    return plan


def _store(contract: str, src, plan: dict, reads: _Reads, started: float) -> None:
    from pcc.lang.outputs import write_atomic

    key, code = _key(contract, src)
    deps = _deps(reads, code, Path(src.root).resolve(), started)
    if deps is None:
        return
    folder = _folder()
    folder.mkdir(parents=True, exist_ok=True)
    write_atomic(folder / f"{key}.json", json.dumps({"v": VERSION, "key": key, "deps": deps, "plan": plan}))
    entries = sorted(folder.glob("*.json"), key=lambda p: p.stat().st_mtime, reverse=True)
    for old in entries[KEEP:]:
        old.unlink(missing_ok=True)
