"""The directory a conversion or adapter export writes: what may be replaced, and with what consent.

Nothing is destroyed that pcc did not make: an existing destination is replaced only with `--force`,
and `--force` replaces only a directory that looks like the same verb's own output (a rollout
checkpoint holds `pcc_convert.json`; an exported adapter holds nothing but `adapter_config.json` and
`adapter_model.safetensors`). An empty directory is no one's work and is always replaced. PCC711.
"""

from __future__ import annotations

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
