"""Converter plans that `pcc convert CONTRACT` compiled, kept for the next conversion: an implicit bundle.

Compiling a contract takes 0.2-0.45 s (importing the compiler, lowering every target as `pcc check` does), a
third of converting a 1.4 GB checkpoint on sixteen cores (docs/convert.md "Speed"). Its converter plan is a
function of pcc's code and data, the files and folders the compile reads, and the source checkpoint, so it
is kept in `$PCC_CACHE/convert-plans/` (default ~/.cache/pcc) under a key over pcc's code, the Python and
installed distributions, the contract as given, the working directory, the extends roots and the source's
fingerprint, with every file and folder the compile read (seen through Python's audit hooks), where each
one's path leads and its digest. It is handed back only while each of them still leads to the same place and
reads the same: an edited contract, an extended file, a symlink pointed elsewhere, or pcc itself changed, and
the contract is compiled again. The compile reads no file of the source: it takes the config.json and headers
the conversion opened (pcc.convert.contract.load_plan), all of which the fingerprint covers.

A checkpoint of the same fingerprint in another folder (the next one a training run saves) takes it too: what
the compile read inside the source folder is recorded relative to it and must read the same in the new one,
and the plan's model, the one place a converter plan names its source, is the new folder as given, as a
compile against it writes it. A plan that names the source anywhere else stays with that folder.

Not kept: a compile that wrote a file, ran a process or opened a socket; one that read a file changed (or
replaced) in the 0.05 s before it began, or that ran pcc code changed since this process loaded pcc (what ran
would not be what is hashed). A cache that cannot be read or written, or an entry that is not exactly what
was written, is no error: the contract is compiled."""

from __future__ import annotations

import hashlib
import json
import os
import stat
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from pcc.convert.contract import _well_formed
from pcc.convert.source import INDEX
from pcc.lang.inputs import InputError, loads_json, read_bytes

VERSION = 3
KEEP = 32  # entries kept; the least recently used beyond that are removed
_MAX_DEP = 64 << 20  # a file the compile read, hashed whole up to this size (a safetensors file: its header)
_MAX_ENTRY = 256 << 20
# A file changed this close to the compile's start is not trusted to be the bytes it read (`_too_new`): the
# kernel stamps a change with a clock that lags time.time() by up to a tick (4-10 ms), or truncates it to whole
# seconds on some file systems (FAT's two).
_TOO_NEW_S, _TOO_NEW_WHOLE_S = 0.05, 2.0
_WRITE = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
_UNCACHEABLE = ("subprocess.Popen", "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork",
                "socket.connect", "socket.bind", "urllib.Request", "os.remove", "os.rename", "os.mkdir",
                "os.rmdir", "os.truncate", "os.chmod", "os.chown", "os.utime", "os.symlink", "os.link")
_DECODE = (OSError, ValueError, UnicodeError)  # a path with a NUL byte or an undecodable name reads as no file


class _Reads:
    """What one thread's compile opened and listed (absolute, as opened), and whether it did anything a cache
    cannot replay."""

    def __init__(self):
        self.files: set[str] = set()
        self.folders: set[str] = set()
        self.refused: str | None = None


_local = threading.local()  # this thread's _Reads while it compiles: two compiles on two threads keep apart
_hooked = False


def _hook(event: str, args: tuple) -> None:
    """Never raises: an audit hook's exception would be the audited operation's."""
    reads = getattr(_local, "reads", None)
    if reads is None:
        return
    try:
        _see(reads, event, args)
    except Exception as exc:  # whatever it is, the compile is not kept
        reads.refused = reads.refused or f"{event}: {exc!r}"


def _absolute(path) -> str:
    """`path` as the system resolves it from here: joined to the working directory, `..` and links kept."""
    path = os.fsdecode(path)
    return path if os.path.isabs(path) else os.path.join(os.getcwd(), path)


def _see(reads: _Reads, event: str, args: tuple) -> None:
    if event == "open":
        path, mode, flags = args
        if not isinstance(path, (str, bytes, os.PathLike)):
            return  # an open of a descriptor: its path was seen when it was opened
        path = _absolute(path)
        if path.endswith(".pyc"):
            return  # the import system's bytecode: the sources are in the code's digest
        if (mode and any(c in mode for c in "wax+")) or (mode is None and flags & _WRITE):
            reads.refused = reads.refused or f"wrote {path}"
        else:
            reads.files.add(path)
    elif event in ("os.listdir", "os.scandir"):
        path = args[0]
        if path is None or isinstance(path, (str, bytes, os.PathLike)):
            reads.folders.add(_absolute("." if path is None else path))
    elif event.startswith(_UNCACHEABLE):
        reads.refused = reads.refused or event


def _record(compute):
    """compute(), and what it read on this thread (a `_Reads`)."""
    global _hooked
    if not _hooked:
        sys.addaudithook(_hook)
        _hooked = True
    reads = _Reads()
    _local.reads = reads
    try:
        return compute(), reads
    finally:
        _local.reads = None


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


def _code(roots: list[Path]) -> tuple[str, int]:
    """SHA-256 of every file under `roots` but bytecode, by path (links followed, once each), and when the
    newest of them last changed (its `_stamp`): pcc's code and data as they are now."""
    h, newest, seen = hashlib.sha256(), 0, set()
    for root in roots:
        for folder, dirs, files in os.walk(root, followlinks=True):
            real = os.path.realpath(folder)
            if real in seen:
                dirs[:] = []
                continue
            seen.add(real)
            dirs[:] = sorted(d for d in dirs if d != "__pycache__")
            for name in sorted(files):
                if name.endswith((".pyc", ".pyo")):
                    continue
                path = os.path.join(folder, name)
                try:
                    st = os.stat(path)
                    data = read_bytes(path, _MAX_ENTRY, "pcc file") if stat.S_ISREG(st.st_mode) else b"?"
                except (OSError, InputError):
                    data, st = b"!", None
                newest = max(newest, _stamp(st)) if st else time.time_ns()
                h.update(f"{os.path.relpath(path, root)}\0{len(data)}\0".encode())
                h.update(data)
    return h.hexdigest(), newest


def _distributions() -> list[str]:
    """The installed distributions by their metadata folders' names (name-version), in the site folders and
    $PYTHONPATH: not in sys.path, which a process may extend as it runs (an engine's folder), and a key must
    not follow it."""
    import site

    folders = [*site.getsitepackages(), site.getusersitepackages(),
               *(p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p)]
    names = set()
    for folder in folders:
        try:
            with os.scandir(folder) as it:
                names.update(e.name for e in it if e.name.endswith((".dist-info", ".egg-info")))
        except OSError:
            continue
    return sorted(names)


def _keys(contract: str, src) -> tuple[str, str, int]:
    """The entry's keys, for a plan any folder of the source's fingerprint takes and for one that stays with
    this source folder as given, and when pcc's code last changed."""
    from pcc.resources import ROOTS_ENV

    code, newest = _code(_code_roots())
    roots = os.environ.get(ROOTS_ENV)
    doc = {"v": VERSION, "code": code, "python": sys.version, "dists": _distributions(),
           "contract": os.fsdecode(contract), "cwd": os.getcwd(), "roots": roots,
           "roots_real": [os.path.realpath(p) for p in (roots or "").split(os.pathsep) if p],
           "fingerprint": src.fingerprint}
    return (*(hashlib.sha256(json.dumps(doc | {"source": source}, sort_keys=True).encode()).hexdigest()
              for source in (None, os.fsdecode(src.root))), newest)


def _under(path: str, root: str | None) -> str | None:
    """`path` relative to folder `root` (`.` for the folder itself) where it lies inside it, by its spelling."""
    if root is None:
        return None
    if path == root:
        return "."
    base = root.rstrip(os.sep) + os.sep
    return path[len(base):] if path.startswith(base) else None


class _Folder:
    """The source folder as a compile's paths name it (as given, from the working directory) and where it leads:
    what the compile read inside it is recorded relative to it."""

    def __init__(self, src):
        self.path = _absolute(src.root)
        self.real = _real(self.path)

    def rel(self, path: str) -> str | None:
        """`path` (as opened) relative to the folder's path, where it lies inside it; else None."""
        return _under(path, self.path)

    def rel_real(self, real: str) -> str | None:
        """`real` (where a path leads) relative to where the folder leads, where it lies inside it; else None."""
        return _under(real, self.real)

    def path_of(self, dep_path: str) -> str:
        """A recorded path as this folder has it (one recorded relative to the folder the compile read)."""
        return dep_path if os.path.isabs(dep_path) else os.path.join(self.path, dep_path)

    def real_of(self, dep_real: str) -> str | None:
        """Where a recorded place is for this folder (one recorded relative to where the compile's folder led)."""
        if os.path.isabs(dep_real):
            return dep_real
        return None if self.real is None else os.path.normpath(os.path.join(self.real, dep_real))


# -- the digests of what a compile read ------------------------------------------------------------------------

def _file_digest(path: str) -> str | None:
    """The digest of file `path` as the compile sees it: a safetensors file by its size and header (the
    compile reads no tensor bytes), any other whole; None when it cannot be read or is too large."""
    if not path.endswith(".safetensors"):
        try:
            return hashlib.sha256(read_bytes(path, _MAX_DEP, "file")).hexdigest()
        except (InputError, *_DECODE):
            return None
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except _DECODE:
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
    except _DECODE:
        return None


_DIGEST = {"file": _file_digest, "folder": _folder_digest}


def _real(path: str) -> str | None:
    try:
        return os.path.realpath(path)
    except _DECODE:
        return None


def _stamp(st) -> int:
    """When the file of stat `st` last changed (its change or modification time, ns), as late as it may have: a
    time of whole seconds (one a file system truncates, or by chance) taken as up to two seconds later."""
    newest = max(st.st_mtime_ns, st.st_ctime_ns)
    return newest if newest % 10**9 else newest + int((_TOO_NEW_WHOLE_S - _TOO_NEW_S) * 1e9)


def _too_new(stamp: int, t: float) -> bool:
    """Could a file of `_stamp` `stamp` have changed at or after time `t`? A checkpoint saved and converted a
    moment later is kept; one a writer races is not."""
    return stamp / 1e9 > t - _TOO_NEW_S


def _deps(reads: _Reads, started: float, folder: _Folder) -> list[list[str]] | None:
    """[kind, path as opened, where it leads, digest] of everything the compile read, path and place relative to
    the source `folder` where they lie inside it; None when one cannot be trusted (changed or replaced as the
    compile began, or since)."""
    deps = []
    for kind, paths in (("file", reads.files), ("folder", reads.folders)):
        for path in sorted(paths):
            try:
                st = os.stat(path)
            except _DECODE:
                return None  # read, then gone: nothing to compare with next time
            if _too_new(_stamp(st), started):
                return None
            digest, real = _DIGEST[kind](path), _real(path)
            if digest is None or real is None:
                return None
            rel = folder.rel(path)
            rel_real = folder.rel_real(real) if rel is not None else None
            deps.append([kind, path if rel is None else rel, real if rel_real is None else rel_real, digest])
    return deps


def _relocatable(plan: dict, deps: list[list[str]], src, folder: _Folder) -> bool:
    """Does the plan hold for any folder of the source's fingerprint: it names the source as its model (as a
    compile against the source folder as given does) and nowhere else, what the compile read inside the folder
    is the checkpoint's own (its listing, config.json, index and shards: a contract kept there is read by its own
    path, whichever folder converts) and read through the folder's own path (a source given as `.` is read as
    `config.json`)?"""
    given = os.fsdecode(src.root)
    if plan.get("model") != given:
        return False
    if not all(os.path.isabs(path) or path in (".", "config.json", INDEX) or path.endswith(".safetensors")
               and os.sep not in path for _, path, _, _ in deps):
        return False
    text = json.dumps({**plan, "model": None})
    for name in {given, folder.path, folder.real} - {None}:
        quoted = json.dumps(name)[:-1]  # (a JSON string that is the folder, or a path inside it)
        if quoted + '"' in text or quoted + json.dumps(os.sep)[1:-1] in text:
            return False
    return not any(os.path.isabs(real) and folder.rel_real(real) is not None for _, _, real, _ in deps)


# -- the cache ----------------------------------------------------------------------------------------------

def _folder() -> Path:
    from pcc.resources import cache_dir

    return cache_dir("convert-plans")


def _usable(src) -> bool:
    """Can a kept plan run as it is: the torch-free path's kernels here, and no quantized source (both read the
    Plan, `pcc.convert.fast.eligible`)? Else nothing is looked up or kept."""
    from pcc import fused

    return not src.view.encodings and fused.available()


def lookup(contract: str, src) -> dict | None:
    """The converter plan a conversion of `src` (an opened Source), or of a checkpoint of its fingerprint in
    another folder, by `contract` compiled before, where every file and folder that compile read still leads
    to the same place and reads the same; else None."""
    if not _usable(src):
        return None
    try:
        keys = _keys(contract, src)[:2]
    except (OSError, RuntimeError, ValueError):
        return None
    folder = _Folder(src)
    for key, pinned in zip(keys, (False, True)):
        plan = _entry(key, folder)
        if plan is None:
            continue
        try:
            os.utime(_folder() / f"{key}.json")  # most recently used
        except OSError:
            pass
        return plan if pinned else {**plan, "model": os.fsdecode(src.root)}  # (as a compile against it names it)
    return None


def _entry(key: str, folder: _Folder) -> dict | None:
    """The plan kept under `key`, where it is exactly what was written and what its compile read reads the same
    (inside the source `folder` now); else None."""
    try:
        data = read_bytes(_folder() / f"{key}.json", _MAX_ENTRY, "cached converter plan")
        digest, _, body = data.partition(b"\n")
        if digest.decode("ascii", "replace") != hashlib.sha256(body).hexdigest():
            return None  # not what was written
        entry = loads_json(body)
    except (OSError, RuntimeError, InputError, ValueError):
        return None
    if not (isinstance(entry, dict) and entry.get("v") == VERSION and entry.get("key") == key
            and isinstance(entry.get("deps"), list)):
        return None
    for dep in entry["deps"]:
        if not (isinstance(dep, list) and len(dep) == 4 and dep[0] in _DIGEST and all(isinstance(x, str) for x in dep)):
            return None
        kind, rel, real, digest = dep
        path = folder.path_of(rel)
        if _real(path) != folder.real_of(real) or _DIGEST[kind](path) != digest:
            return None  # (where the folder's own files may lead, open_source checked: pcc.models.base.may_lead_to)
    plan = entry.get("plan")
    try:
        return plan if _well_formed(plan) else None
    except Exception:  # (an entry is checksummed: only a hand-made one gets here)
        return None


def compiled(contract: str, src, compute) -> tuple[dict, Callable[[], None]]:
    """compute() (the converter plan, compiled against `src`), and a function that returns once the plan is kept
    for `lookup` where it can be. It is kept on a thread of its own while the caller goes on (a conversion
    streams meanwhile: its start-up no longer waits the 0.03-0.06 s keeping takes here), and the caller calls that
    function before it returns (a cache that changes after `pcc convert` returned is no cache to test or trust)."""
    started = time.time()
    plan, reads = _record(compute)
    if reads.refused is not None or not _usable(src) or plan.get("source_fingerprint") is None:
        return plan, lambda: None
    thread = threading.Thread(target=_keep, args=(contract, src, plan, reads, started), name="pcc-keep")
    thread.start()
    return plan, thread.join


def _keep(contract: str, src, plan: dict, reads: _Reads, started: float) -> None:
    try:
        _store(contract, src, plan, reads, started)
    except (OSError, RuntimeError, ValueError):
        pass  # a cache that cannot be written is no error


def _store(contract: str, src, plan: dict, reads: _Reads, started: float) -> None:
    from pcc import IMPORTED_AT
    from pcc.lang.outputs import write_atomic

    any_folder, this_folder, newest = _keys(contract, src)  # (again after the compile: pcc's files may have changed)
    if _too_new(newest, IMPORTED_AT):
        return  # pcc changed since this process loaded it: the code that compiled may not be the code hashed
    folder = _Folder(src)
    deps = _deps(reads, started, folder)
    if deps is None:
        return
    relocatable = _relocatable(plan, deps, src, folder)
    key = any_folder if relocatable else this_folder
    kept = {**plan, "model": None} if relocatable else plan  # (the lookup names the folder it is given)
    body = json.dumps({"v": VERSION, "key": key, "deps": deps, "plan": kept})
    cache = _folder()
    cache.mkdir(parents=True, exist_ok=True)
    path = cache / f"{key}.json"
    path.unlink(missing_ok=True)  # (a replaced entry would keep its mode)
    write_atomic(path, hashlib.sha256(body.encode()).hexdigest() + "\n" + body)
    entries = sorted(cache.glob("*.json"), key=lambda p: p.stat().st_mtime, reverse=True)
    for old in entries[KEEP:]:
        old.unlink(missing_ok=True)
