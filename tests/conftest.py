"""Markers applied by what a test needs: a test that takes one of the engine-parser fixtures
(`engine` for megatron-core, `sglang`, `engines` for both) is an `engines` test, so
`pytest -m "not engines"` runs exactly what a machine without requirements/install-engines.sh can."""

from __future__ import annotations

import pytest

ENGINE_FIXTURES = {"engine", "engines", "sglang"}


def pytest_collection_modifyitems(items):
    for item in items:
        if ENGINE_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.engines)
