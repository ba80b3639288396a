"""pcc.lang.outputs.write_atomic: whole or nothing, the mode a user expects, no temporary left."""

from __future__ import annotations

import os

import pytest

from pcc.lang.outputs import write_atomic


def test_a_new_file_gets_the_umask_mode_and_a_replaced_one_keeps_its_own(tmp_path):
    old = os.umask(0o022)
    try:
        new = tmp_path / "plan.json"
        write_atomic(new, "{}\n")
        assert new.read_text() == "{}\n" and new.stat().st_mode & 0o777 == 0o644
    finally:
        os.umask(old)
    kept = tmp_path / "contract.prec"
    kept.write_text("before")
    kept.chmod(0o640)
    write_atomic(kept, "after")
    assert kept.read_text() == "after" and kept.stat().st_mode & 0o777 == 0o640
    assert sorted(p.name for p in tmp_path.iterdir()) == ["contract.prec", "plan.json"]


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path, monkeypatch):
    target = tmp_path / "record.json"
    target.write_text("whole")

    def refuse(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", refuse)
    with pytest.raises(OSError):
        write_atomic(target, "new")
    assert target.read_text() == "whole" and [p.name for p in tmp_path.iterdir()] == ["record.json"]
