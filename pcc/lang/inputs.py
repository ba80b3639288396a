"""One way in for the files pcc reads itself (contracts, bundle manifests, run state): regular
files only, read once through one descriptor, never more than a limit (docs/safety.md).

A link to /dev/zero, a FIFO or a directory is refused before a byte is read (the descriptor is
opened non-blocking, so a FIFO without a writer cannot hang us); a sparse or growing file is
refused on its stated size and again on the bytes actually read. Callers keep the bytes for
carets instead of reading the file a second time.
"""

from __future__ import annotations

import json
import os
import stat

from pcc.lang.diagnostics import PccError

MAX_CONTRACT = 1 << 20  # contracts are small; a larger file is a mistake, not a contract
MAX_JSON = 16 << 20  # a bundle manifest, a run's state: kilobytes; a larger file is not ours


class InputError(PccError):
    """A file pcc was asked to read is refused or unreadable; the message names it (PCC109)."""

    code = "PCC109"

    def __init__(self, message: str, reason: str = "read"):
        super().__init__(message)
        self.reason = reason  # "kind" (not a regular file), "size" (over the limit), "read" (the OS refused)


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a regular file"


def read_bytes(path: str | os.PathLike, limit: int, what: str = "file") -> bytes:
    """The bytes of regular file `path`, at most `limit` of them, read once; InputError otherwise."""
    name = os.fspath(path)
    try:
        fd = os.open(name, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise InputError(f"{name}: cannot read: {exc.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise InputError(f"{name}: {_kind(st.st_mode)}, not a regular file; pcc reads a {what} from a "
                             "regular file only", "kind")
        if st.st_size > limit:
            raise InputError(f"{name}: {st.st_size} bytes, over the {_size(limit)} limit for a {what}", "size")
        chunks, n = [], 0
        while n <= limit:
            chunk = os.read(fd, min(1 << 20, limit + 1 - n))
            if not chunk:
                break
            chunks.append(chunk)
            n += len(chunk)
    except OSError as exc:
        raise InputError(f"{name}: cannot read: {exc.strerror}") from None
    finally:
        os.close(fd)
    if n > limit:
        raise InputError(f"{name}: more than the {_size(limit)} limit for a {what} (it grew while read)", "size")
    return b"".join(chunks)


def _size(n: int) -> str:
    return f"{n >> 20} MiB" if n >= 1 << 20 else f"{n >> 10} KiB"


class DuplicateKey(PccError, ValueError):
    """A JSON object names one key twice: which value was meant is unknown, so neither is taken."""


def _pairs(pairs: list[tuple[str, object]]) -> dict:
    out: dict = {}
    for key, value in pairs:
        if key in out:
            raise DuplicateKey(f"duplicate key '{key}'")
        out[key] = value
    return out


def _constant(name: str):
    raise ValueError(f"{name} is not a number pcc accepts (finite values only)")


def loads_json(text: str | bytes):
    """JSON, strictly: duplicate keys and NaN/Infinity are errors (ValueError), never a silent last-wins."""
    return json.loads(text, object_pairs_hook=_pairs, parse_constant=_constant)


def read_json(path: str | os.PathLike, limit: int = MAX_JSON, what: str = "JSON file"):
    """A JSON document from a regular file of at most `limit` bytes; InputError naming the file otherwise."""
    data = read_bytes(path, limit, what)
    try:
        return loads_json(data)
    except RecursionError:
        raise InputError(f"{os.fspath(path)}: not valid JSON (nests too deeply)") from None
    except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise InputError(f"{os.fspath(path)}: not valid JSON ({exc})") from None
