"""pcc.lang.outputs.write_atomic and atomic_path: whole or nothing, the mode a user expects, no
temporary left; the runtime's checkpoints and the plots go through them too."""

from __future__ import annotations

import os

import pytest

from pcc.lang.outputs import atomic_path, write_atomic


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


def test_a_writer_that_fails_halfway_leaves_the_old_file_and_no_temporary(tmp_path):
    target = tmp_path / "model.safetensors"
    target.write_bytes(b"old checkpoint")
    with pytest.raises(RuntimeError, match="disk"):
        with atomic_path(target) as tmp:
            assert tmp.parent == tmp_path and tmp.exists() and tmp != target
            tmp.write_bytes(b"half of a new")
            raise RuntimeError("disk went away")
    assert target.read_bytes() == b"old checkpoint" and [p.name for p in tmp_path.iterdir()] == [target.name]


def test_runtime_checkpoints_are_whole_or_the_old_one(tmp_path, monkeypatch):
    import torch

    import pcc.runtime.checkpoint as ckpt

    path = tmp_path / "step-1" / "model.safetensors"
    ckpt.save_tensors(path, {"w": torch.ones(4)})

    def half(tensors, filename, metadata=None):
        open(filename, "wb").write(b"\x10\x00")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(ckpt, "save_file", half)
    with pytest.raises(OSError):
        ckpt.save_tensors(path, {"w": torch.zeros(4)})
    monkeypatch.undo()
    assert torch.equal(ckpt.load_tensors(path)["w"], torch.ones(4))
    assert [p.name for p in path.parent.iterdir()] == ["model.safetensors"]


def test_plots_are_written_as_png_through_a_temporary(tmp_path):
    pytest.importorskip("matplotlib")
    from pcc.runtime.plots import plot

    history = [{"step": i, "reward": 0.5 + i / 10, "exact_match": 0.4} for i in range(3)]
    written = plot(history, tmp_path)
    assert "reward.png" in written
    assert (tmp_path / "reward.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]
