"""Find the top-level data folders (grammar/, targets/, schemas/, contracts/).

In a source checkout they sit beside the package; an installed wheel carries
them under ``pcc/_data/``. Everything that reads them goes through here.
"""

from __future__ import annotations

import os
from pathlib import Path

_PKG = Path(__file__).resolve().parent
ROOTS_ENV = "PCC_CONTRACT_ROOTS"  # more folders a contract's `extends` may reach, os.pathsep-separated


def data_dir(name: str) -> Path:
    """The folder ``name`` (e.g. "grammar"), from the wheel or the checkout."""
    for root in (_PKG / "_data", _PKG.parent):
        path = root / name
        if path.is_dir():
            return path
    raise FileNotFoundError(f"pcc data folder {name!r} not found (broken install?)")


def cache_dir(name: str) -> Path:
    """The user cache folder ``name`` of pcc (warm starts, compiled kernels): under $PCC_CACHE, by default
    ~/.cache/pcc. Not created here."""
    return Path(os.environ.get("PCC_CACHE") or Path.home() / ".cache" / "pcc") / name


def target_table(name: str) -> dict:
    """targets/NAME.yaml, read with libyaml's safe loader where PyYAML was built with it (the same
    documents, 8x faster than the pure-Python one: 35 ms of every command), else the pure one."""
    import yaml

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    return yaml.load((data_dir("targets") / f"{name}.yaml").read_text(encoding="utf-8"), Loader=loader)
