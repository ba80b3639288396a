"""Hostile inputs for the verbs of the new targets (`pcc import verl|te`, `pcc run --target verl`):
none may hang, grow without bound, trace back or execute anything (docs/safety.md)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

BOMB = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{c}: &{c} [{', '.join([f'*{p}'] * 9)}]\n" for p, c in zip("abcdefgh", "bcdefghi"))


def pcc(*argv: str, timeout: float = 60) -> tuple[int, dict]:
    """`pcc ARGV --json` in a child (a hang is a timeout, not a stuck test run): (exit code, envelope)."""
    p = subprocess.run([sys.executable, "-m", "pcc.cli", *argv, "--json"], capture_output=True, text=True,
                       timeout=timeout, cwd=ROOT, env={**os.environ, "PCC_THREADS": "1"})
    assert "Traceback" not in p.stderr, p.stderr
    return p.returncode, json.loads(p.stdout)


@pytest.fixture(scope="module")
def d(tmp_path_factory):
    d = tmp_path_factory.mktemp("hostile-new")
    (d / "zero.yaml").symlink_to("/dev/zero")
    os.mkfifo(d / "fifo.yaml")
    (d / "bomb.yaml").write_text(BOMB)
    (d / "self.yaml").write_text("a: &a [1, *a]\n")
    with open(d / "sparse.yaml", "wb") as fh:
        fh.truncate(800 << 20)
    return d


@pytest.mark.parametrize("kind", ["verl", "te"])
@pytest.mark.parametrize("name, code, words", [
    ("zero.yaml", 2, "not a regular file"),
    ("fifo.yaml", 2, "a FIFO"),
    ("sparse.yaml", 1, "limit"),
    ("bomb.yaml", 1, "aliases"),
    ("self.yaml", 1, "alias"),
])
def test_import_refuses_hostile_yaml(d, kind, name, code, words):
    rc, env = pcc("import", kind, str(d / name), "--model", "qwen3_30b_a3b")
    assert rc == code == env["exit_code"], env
    assert words in env["diagnostics"][0]["message"], env
