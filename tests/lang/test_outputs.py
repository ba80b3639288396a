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


# Modules that write files other than through pcc.lang.outputs, and why each is whole anyway. A new
# writer fails `test_every_file_pcc_writes_goes_through_one_writer` until it uses atomic_path or is here;
# an entry whose module no longer writes fails too.
OWN_WRITERS = {
    "pcc/lang/outputs.py": "the one writer itself",
    "pcc/bundle/write.py": "a bundle is written into a staging directory renamed into place whole",
    "pcc/convert/run.py": "side files and records go into the staging directory, renamed into place whole",
    "pcc/convert/adapter.py": "the adapter is written into a staging directory renamed into place whole",
    "pcc/convert/shards.py": "shards stream (O_DIRECT) into the staging directory; each has a completion "
                             "record --resume checks against the file's own hash",
    "pcc/runtime/loop.py": "metrics.jsonl is an append-only log; resume drops a line cut by a crash",
    "pcc/fused.py": "the kernels' object code cache (an earlier stage than pcc.lang): each entry written through "
                    "a rename, holding its key and the code's SHA-256, checked before it is loaded",
}
_WRITES = {"write_text", "write_bytes", "rename", "mkstemp", "NamedTemporaryFile", "save_file", "savefig",
           "copyfile", "copy", "copy2"}


def _writes(tree):
    """(line, what) of every call in `tree` that writes a file, outside a `with atomic_path(...)` block."""
    import ast

    def name(call):
        f = call.func
        return f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else None

    def mode(call):
        for node in call.args[1:2] if name(call) == "open" and isinstance(call.func, ast.Name) else call.args[:1]:
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                return node.value
        return next((k.value.value for k in call.keywords if k.arg == "mode" and isinstance(k.value, ast.Constant)),
                    "r")

    out = []

    def visit(node, atomic):
        if isinstance(node, ast.With) and any(isinstance(i.context_expr, ast.Call)
                                              and name(i.context_expr) == "atomic_path" for i in node.items):
            atomic = True
        if isinstance(node, ast.Call) and not atomic:
            n = name(node)
            devnull = node.args and ast.unparse(node.args[0]) == "os.devnull"
            if (n in _WRITES or (n == "open" and set(mode(node)) & set("wax") and not devnull)
                    or (n == "replace" and (len(node.args) == 1 and not node.keywords  # Path.replace
                                            or ast.unparse(node.func) == "os.replace"))):
                out.append((node.lineno, n))
        for child in ast.iter_child_nodes(node):
            visit(child, atomic)

    visit(tree, False)
    return out


def test_every_file_pcc_writes_goes_through_one_writer():
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    found = {}
    for path in sorted((root / "pcc").rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        hits = _writes(ast.parse(path.read_text(encoding="utf-8")))
        if hits:
            found[rel] = hits
    stray = {rel: hits for rel, hits in found.items() if rel not in OWN_WRITERS}
    assert not stray, f"write through pcc.lang.outputs.atomic_path/write_atomic (or list the module, and why): {stray}"
    assert not set(OWN_WRITERS) - set(found), "listed as writing, but no longer writes: " + str(set(OWN_WRITERS) - set(found))
