"""`pcc convert CONTRACT` keeps the converter plan it compiled (pcc.convert.plan_cache, docs/convert.md
"Start-up"): the next conversion of the same source by the same contract takes it without compiling, with
the same bytes, while every file and folder the compile read reads the same; anything changed compiles."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_convert_bundle_plan import _contract, _no_compile, _outputs
from test_convert_bytes import make_source

from pcc.convert import plan_cache, run
from pcc.convert.source import open_source

pytestmark = pytest.mark.skipif(os.environ.get("PCC_FUSED") == "0", reason="PCC_FUSED=0 turns the fused kernel off")


def _age(*paths: Path) -> None:
    """Files written a minute ago: the cache keeps no plan read from a file changed as its compile began."""
    then = time.time() - 60
    for path in paths:
        for p in [path, *path.rglob("*")] if path.is_dir() else [path]:
            os.utime(p, (then, then))


@pytest.fixture
def lane(tmp_path, monkeypatch):
    """A BF16 tiny_moe source and a `model from` contract for it, both a minute old, and a private cache."""
    monkeypatch.setenv("PCC_CACHE", str(tmp_path / "cache"))
    src = tmp_path / "src"
    make_source(src, "bf16")
    contract = _contract(tmp_path, src)
    _age(src, contract)
    return src, contract


def _convert(contract, src, dst) -> str:
    return run.convert(str(contract), str(src), str(dst))["plan"]


def test_the_second_conversion_takes_the_kept_plan_with_the_same_bytes(lane, tmp_path, monkeypatch):
    src, contract = lane
    assert _convert(contract, src, tmp_path / "a") == "compiled"
    _no_compile(monkeypatch)
    assert _convert(contract, src, tmp_path / "b") == "cached"
    assert _outputs(tmp_path / "b") == _outputs(tmp_path / "a")
    (entry,) = (tmp_path / "cache" / "convert-plans").glob("*.json")
    deps = [d[:2] for d in json.loads(entry.read_text())["deps"]]  # the source's config and shards: its fingerprint
    assert deps == [["file", str(contract)], ["file", str(src / "model.safetensors.index.json")]]


def test_an_edited_contract_compiles_even_with_its_size_and_time(lane, tmp_path):
    src, contract = lane
    assert _convert(contract, src, tmp_path / "a") == "compiled"
    st = contract.stat()
    contract.write_text(contract.read_text().replace("embed, lm_head", "lm_head, embed"))
    os.utime(contract, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert contract.stat().st_size == st.st_size
    assert _convert(contract, src, tmp_path / "b") == "compiled"


def test_an_edited_extended_contract_compiles(lane, tmp_path):
    """The parent is no argument of the command: it is kept as a file the compile read."""
    src, contract = lane
    base = tmp_path / "base.prec"
    base.write_text(contract.read_text().replace("linear : fp8_block", "linear : bf16"))
    child = tmp_path / "child.prec"
    child.write_text('contract child extends "base.prec" {\n  rollout sglang {\n    linear : fp8_block\n  }\n}\n')
    _age(base, child)
    assert _convert(child, src, tmp_path / "a") == "compiled"
    assert _convert(child, src, tmp_path / "b") == "cached"
    base.write_text(base.read_text().replace("keep bf16 : embed, lm_head, norm, router",
                                             "keep bf16 : embed, lm_head, norm, router, attn"))
    _age(base)
    assert _convert(child, src, tmp_path / "c") == "compiled"
    assert _outputs(tmp_path / "c") != _outputs(tmp_path / "a")  # the parent's edit is in the checkpoint


def test_another_source_or_other_tensors_compile(lane, tmp_path):
    src, contract = lane
    assert _convert(contract, src, tmp_path / "a") == "compiled"
    other = tmp_path / "other"
    make_source(other, "bf16", seed=30)  # the same names and shapes, other bytes, another folder
    _age(other)
    assert _convert(contract, other, tmp_path / "b") == "compiled"
    config = json.loads((src / "config.json").read_text())
    (src / "config.json").write_text(json.dumps({**config, "bos_token_id": 7}))
    assert _convert(contract, src, tmp_path / "c") == "compiled"


def test_pccs_own_code_is_in_the_key(tmp_path):
    """Every file under pcc's package and data folders, bytecode aside."""
    (tmp_path / "pkg" / "__pycache__").mkdir(parents=True)
    (tmp_path / "pkg" / "a.py").write_text("x = 1\n")
    (tmp_path / "data.yaml").write_text("k: 1\n")
    roots = [tmp_path / "pkg", tmp_path / "data.yaml"]
    before = plan_cache._code_digest(roots[:1])
    (tmp_path / "pkg" / "__pycache__" / "a.cpython-311.pyc").write_bytes(b"\0")
    assert plan_cache._code_digest(roots[:1]) == before
    (tmp_path / "pkg" / "a.py").write_text("x = 2\n")
    assert plan_cache._code_digest(roots[:1]) != before
    (tmp_path / "pkg" / "a.py").rename(tmp_path / "pkg" / "b.py")
    assert plan_cache._code_digest(roots[:1]) not in {before}
    src_root = Path(plan_cache.__file__).resolve().parents[1]
    assert src_root in plan_cache._code_roots()
    assert any(r.name == "targets" for r in plan_cache._code_roots())


def test_a_contract_written_as_the_compile_began_is_not_kept(lane, tmp_path):
    src, contract = lane
    os.utime(contract)  # now
    assert _convert(contract, src, tmp_path / "a") == "compiled"
    assert _convert(contract, src, tmp_path / "b") == "compiled"
    _age(contract)
    assert _convert(contract, src, tmp_path / "c") == "compiled"
    assert _convert(contract, src, tmp_path / "d") == "cached"


def test_a_compile_that_writes_or_runs_anything_is_not_kept(tmp_path):
    out, reads = plan_cache._record(lambda: (tmp_path / "w").write_text("x"))
    assert reads.refused == f"wrote {tmp_path / 'w'}"
    out, reads = plan_cache._record(lambda: subprocess.run([sys.executable, "-c", "pass"], check=True))
    assert reads.refused == "subprocess.Popen"
    (tmp_path / "r").write_text("x")
    out, reads = plan_cache._record(lambda: ((tmp_path / "r").read_text(), os.listdir(tmp_path)))
    assert reads.refused is None and reads.files == {str(tmp_path / "r")} and reads.folders == {str(tmp_path)}
    assert out[0] == "x"
    out, reads = plan_cache._record(lambda: sys.audit("open", "x"))  # an event of another form: not raised
    assert reads.refused.startswith("open: ValueError")


@pytest.mark.parametrize("damage", ["garbage", "other key", "malformed plan", "changed dependency"])
def test_a_damaged_entry_compiles_again(lane, tmp_path, damage):
    src, contract = lane
    assert _convert(contract, src, tmp_path / "a") == "compiled"
    (entry,) = (tmp_path / "cache" / "convert-plans").glob("*.json")
    doc = json.loads(entry.read_text())
    if damage == "garbage":
        entry.write_bytes(b"\x00{not json")
    elif damage == "other key":
        entry.write_text(json.dumps({**doc, "key": "0" * 64}))
    elif damage == "malformed plan":
        entry.write_text(json.dumps({**doc, "plan": {**doc["plan"], "tensors": [{"source": 1}]}}))
    else:
        entry.write_text(json.dumps({**doc, "deps": [[k, p, "0" * 64] for k, p, _ in doc["deps"]]}))
    assert _convert(contract, src, tmp_path / "b") == "compiled"
    assert _outputs(tmp_path / "b") == _outputs(tmp_path / "a")


def test_a_cache_that_cannot_be_written_is_no_error(lane, tmp_path, monkeypatch):
    src, contract = lane
    (tmp_path / "file").write_text("not a folder")
    monkeypatch.setenv("PCC_CACHE", str(tmp_path / "file"))
    assert _convert(contract, src, tmp_path / "a") == "compiled"
    assert _convert(contract, src, tmp_path / "b") == "compiled"


def test_it_keeps_the_most_recently_used(lane, tmp_path, monkeypatch):
    src, contract = lane
    monkeypatch.setattr(plan_cache, "KEEP", 2)
    sources = [src]
    for k in (1, 2):
        sources.append(tmp_path / f"src{k}")
        make_source(sources[-1], "bf16")
        _age(sources[-1])
    for k, s in enumerate(sources):
        assert _convert(contract, s, tmp_path / f"first{k}") == "compiled"
        time.sleep(0.01)
    assert len(list((tmp_path / "cache" / "convert-plans").glob("*.json"))) == 2
    assert _convert(contract, sources[0], tmp_path / "again0") == "compiled"  # the oldest went
    assert _convert(contract, sources[2], tmp_path / "again2") == "cached"


def test_the_cached_lane_imports_neither_the_grammar_nor_the_compiler(lane, tmp_path):
    src, contract = lane
    assert _convert(contract, src, tmp_path / "a") == "compiled"
    code = ("import json, sys\nfrom pcc.cli import main\nimport contextlib, io\nout = io.StringIO()\n"
            "with contextlib.redirect_stdout(out):\n"
            f"    assert main(['convert', {str(contract)!r}, '--source', {str(src)!r}, '-o', "
            f"{str(tmp_path / 'b')!r}, '--json']) == 0\n"
            "heavy = ('lark', 'pydantic', 'yaml', 'torch', 'numpy', 'pcc.plan', 'pcc.lower', 'pcc.contract')\n"
            "print(json.dumps([json.loads(out.getvalue())['result']['plan'],\n"
            "                  sorted(m for m in sys.modules if m.split('.')[0] in heavy or m.startswith(heavy[-3:]))]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout.splitlines()[-1]) == ["cached", []]
    assert open_source(src).view.encodings == {}
