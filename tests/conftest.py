"""Markers applied by what a test needs: a test that takes one of the engine-parser fixtures
(`engine` for megatron-core, `sglang`, `engines` for both) is an `engines` test, so
`pytest -m "not engines"` runs exactly what a machine without requirements/install-engines.sh can."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

# pcc's user cache (compiled kernels, warm starts, converter plans) for the tests, not the user's ~/.cache/pcc
os.environ.setdefault("PCC_CACHE", str(Path(tempfile.gettempdir()) / "pcc-test-cache"))

ENGINE_FIXTURES = {"engine", "engines", "sglang"}


def pytest_collection_modifyitems(items):
    for item in items:
        if ENGINE_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.engines)


@pytest.fixture
def full_disk_at(monkeypatch):
    """`full_disk_at(name)`: os.replace fails with ENOSPC for files called `name`, what a kill or a full disk
    between a write and its rename leaves (the writer must leave no final file and no temporary)."""
    real = os.replace

    def arm(name: str) -> None:
        def replace(src, dst):
            if os.path.basename(dst) == name:
                raise OSError(28, "No space left on device")
            return real(src, dst)

        monkeypatch.setattr(os, "replace", replace)

    return arm
