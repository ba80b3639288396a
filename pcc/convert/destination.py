"""The directory a conversion or adapter export writes: what may be replaced, and with what consent.

Nothing is destroyed that pcc did not make: an existing destination is replaced only with `--force`,
and `--force` replaces only a directory that looks like the same verb's own output (a rollout
checkpoint holds `pcc_convert.json`; an exported adapter holds nothing but `adapter_config.json` and
`adapter_model.safetensors`). An empty directory is no one's work and is always replaced. PCC711.
One writer at a time: `destination_lock`.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import stat
from pathlib import Path
from typing import Callable

from pcc.convert import ConvertError

CHECKPOINT_MARK = "pcc_convert.json"
ADAPTER_FILES = frozenset({"adapter_config.json", "adapter_model.safetensors"})


def is_checkpoint(path: Path) -> bool:
    return (path / CHECKPOINT_MARK).is_file() and not (path / CHECKPOINT_MARK).is_symlink()


def is_adapter(path: Path) -> bool:
    names = {p.name for p in path.iterdir()}
    return "adapter_config.json" in names and names <= ADAPTER_FILES


def check_destination(dst: Path, force: bool, own: Callable[[Path], bool], what: str) -> None:
    """Refuse (PCC711) to write over `dst` unless it is absent or empty, or `force` and `own(dst)`."""
    if not dst.exists() and not dst.is_symlink():
        return
    if dst.is_symlink() or not dst.is_dir():
        what = "a link" if dst.is_symlink() else "not a directory"
        raise ConvertError(f"{dst}: exists and is {what}; the output is a directory of its own: choose another "
                           "destination", code="PCC711")
    if not any(dst.iterdir()):
        return
    if not force:
        raise ConvertError(f"{dst}: exists; pass --force to replace it", code="PCC711")
    if not own(dst):
        raise ConvertError(f"{dst}: not {what}, so --force will not replace it (it replaces only pcc's own "
                           "output); remove it yourself or choose another destination", code="PCC711")


def check_work(work: Path, own: Callable[[Path], bool]) -> None:
    """The hidden `.DST.partial` work directory may be removed only when it is pcc's: empty, or `own(work)`
    (a conversion's shard records, an adapter's two files)."""
    if work.is_symlink() or (work.exists() and not work.is_dir()):
        raise ConvertError(f"{work}: not a directory pcc made; remove it yourself", code="PCC711")
    if work.is_dir() and any(work.iterdir()) and not own(work):
        raise ConvertError(f"{work}: holds files pcc did not write; remove it yourself", code="PCC711")


@contextlib.contextmanager
def destination_lock(dst: Path):
    """One writer per destination: an flock on `.DST.pcc-lock` beside `dst` (where its `.DST.partial` staging
    goes; never inside a folder the checks may refuse), held from the destination checks to the rename. A
    second conversion into `dst` is refused at once (PCC711) instead of interleaving shards. The lock ends with
    its holder, killed or not (a lock file that outlived it would block `--resume` after a crash); the file
    stays, since removing it would race the next writer. Opened without following a link (PCC709)."""
    lock = dst.with_name(f".{dst.name}.pcc-lock")
    try:
        dst.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o644)
    except OSError as err:
        raise ConvertError(f"{lock}: cannot write: {err.strerror}", code="PCC709") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ConvertError(f"{lock}: not a regular file; pcc keeps the lock of {dst} there: remove it", code="PCC711")
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip()
            raise ConvertError(f"{dst}: another pcc convert (pid {holder or '?'}) is writing it now and holds {lock}; "
                               "wait for it to end or choose another destination", code="PCC711") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        os.close(fd)
