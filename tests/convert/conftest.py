"""Fixtures of the converter tests."""

from __future__ import annotations

import pytest


@pytest.fixture
def torch_path():
    """Conversions take pcc.convert.run's torch pipeline, also where pcc.convert.fast would take them (llvmlite
    installed): for tests that look inside that pipeline (its row pieces, codes buffers, `_compute`). Its own
    patch, which a test's `monkeypatch.undo()` leaves in place."""
    from pcc.convert import fast

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(fast, "eligible", lambda *a, **k: None)
        yield
