"""Shared by the model tests: the partial copies of a checkpoint directory a catalog must read the same."""

from __future__ import annotations

import shutil
from pathlib import Path

INDEX = "model.safetensors.index.json"


def partial_copies(shards: Path, root: Path) -> dict[str, Path]:
    """{"config-only": dir with config.json, "index-only": dir with config.json and the index} under root."""
    copies = {}
    for kind, files in (("config-only", ("config.json",)), ("index-only", ("config.json", INDEX))):
        copies[kind] = root / kind
        copies[kind].mkdir()
        for name in files:
            shutil.copy(shards / name, copies[kind] / name)
    return copies
