"""One way out for the small text files pcc writes itself (plans, formatted contracts, schemas,
imported contracts, the converter's shard records): whole or not at all (docs/safety.md)."""

from __future__ import annotations

import os
from pathlib import Path


def write_atomic(path: str | Path, text: str) -> None:
    """Write `text` beside `path` and rename it into place, so a reader (or a resume after a kill)
    never sees half a file. The temporary name is unique (O_EXCL), a new file gets the umask's mode
    and a replaced one keeps its own."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}-{os.urandom(4).hex()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        if path.exists():
            os.chmod(tmp, path.stat().st_mode & 0o7777)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
