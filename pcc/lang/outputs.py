"""One way out for the files pcc writes itself (plans, formatted contracts, schemas, imported
contracts, the converter's shard records, the runtime's checkpoints, summaries and plots, validate's
reports and the versions it installs): whole or not at all (docs/safety.md)."""

from __future__ import annotations

import os
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator


@contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """A new, uniquely named (O_EXCL) temporary file beside `path` for the block to write, by name, with
    any writer (safetensors, matplotlib); renamed onto `path` when the block ends, removed if it raises,
    so a reader (or a resume after a kill) never sees half a file. A new file gets the umask's mode and
    a replaced one keeps its own."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}-{os.urandom(4).hex()}.tmp")
    os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
    try:
        yield tmp
        if path.exists():
            os.chmod(tmp, path.stat().st_mode & 0o7777)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_atomic(path: str | Path, text: str) -> None:
    """`text` written to `path` through `atomic_path`."""
    with atomic_path(path) as tmp:
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write(text)
