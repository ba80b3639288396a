"""`pcc convert CONTRACT` keeps the converter plan it compiled (pcc.convert.plan_cache, docs/convert.md
"Start-up"): the next conversion of the same source by the same contract takes it without compiling, with
the same bytes, while every file and folder the compile read reads the same; anything changed compiles."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_convert_bundle_plan import _contract, _no_compile, _outputs
from test_convert_bytes import make_source

from pcc.convert import ConvertError, plan_cache, run
from pcc.convert.source import open_source

pytestmark = pytest.mark.skipif(os.environ.get("PCC_FUSED") == "0", reason="PCC_FUSED=0 turns the fused kernel off")


@pytest.fixture
def lane(tmp_path, monkeypatch):
    """A BF16 tiny_moe source and a `model from` contract for it, and a private cache that keeps what a compile
    read however recently it changed (a file's ctime cannot be set back)."""
    monkeypatch.setenv("PCC_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(plan_cache, "_TOO_NEW_S", 0.0)
    monkeypatch.setattr(plan_cache, "_TOO_NEW_WHOLE_S", 0.0)
    src = tmp_path / "src"
    make_source(src, "bf16")
    return src, _contract(tmp_path, src)


def _convert(contract, src, dst) -> str:
    return run.convert(str(contract), str(src), str(dst))["plan"]


def test_the_second_conversion_takes_the_kept_plan_with_the_same_bytes(lane, tmp_path, monkeypatch):
    src, contract = lane
    assert _convert(contract, src, tmp_path / "a") == "compiled"
    _no_compile(monkeypatch)
    assert _convert(contract, src, tmp_path / "b") == "cached"
    assert _outputs(tmp_path / "b") == _outputs(tmp_path / "a")
    (entry,) = (tmp_path / "cache" / "convert-plans").glob("*.json")
    deps = {tuple(d[:2]) for d in json.loads(entry.read_text().partition("\n")[2])["deps"]}
    mine = {d for d in deps if not Path(d[1]).is_relative_to(Path(plan_cache.__file__).parents[2])}  # (pcc's data too)
    # no file of the source: the compile takes the headers and config.json the conversion opened, which the
    # fingerprint in the key covers
    assert mine == {("file", str(contract))}


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
    assert _convert(child, src, tmp_path / "a") == "compiled"
    assert _convert(child, src, tmp_path / "b") == "cached"
    base.write_text(base.read_text().replace("keep bf16 : embed, lm_head, norm, router",
                                             "keep bf16 : embed, lm_head, norm, router, attn"))
    assert _convert(child, src, tmp_path / "c") == "compiled"
    assert _outputs(tmp_path / "c") != _outputs(tmp_path / "a")  # the parent's edit is in the checkpoint


def _compiled_anew(contract, src, dst, monkeypatch) -> None:
    """What compiling the contract against `src` writes (no kept plan looked up)."""
    with monkeypatch.context() as m:
        m.setattr(plan_cache, "lookup", lambda *a: None)
        assert _convert(contract, src, dst) == "compiled"


def test_the_next_checkpoint_of_a_run_takes_the_kept_plan(lane, tmp_path, monkeypatch):
    """Another folder of the same fingerprint (config.json, names, dtypes, shapes), other weights: the plan kept,
    with the new folder as its model, so the bytes and records are what compiling against that folder writes."""
    src, contract = lane
    assert _convert(contract, src, tmp_path / "a") == "compiled"
    other = tmp_path / "iter_2"
    make_source(other, "bf16", seed=30)
    _no_compile(monkeypatch)
    assert _convert(contract, other, tmp_path / "b") == "cached"
    monkeypatch.undo()
    monkeypatch.setenv("PCC_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(plan_cache, "_TOO_NEW_S", 0.0)
    monkeypatch.setattr(plan_cache, "_TOO_NEW_WHOLE_S", 0.0)
    _compiled_anew(contract, other, tmp_path / "c", monkeypatch)
    assert _outputs(tmp_path / "b") == _outputs(tmp_path / "c") != _outputs(tmp_path / "a")


def test_a_config_written_otherwise_takes_the_plan_another_config_compiles(lane, tmp_path, monkeypatch):
    """config.json written otherwise (the same values: the same fingerprint) takes the kept plan, with what
    compiling writes; another config compiles."""
    src, contract = lane
    assert _convert(contract, src, tmp_path / "a") == "compiled"
    other = tmp_path / "other"
    make_source(other, "bf16", seed=30)
    config = json.loads((other / "config.json").read_text())
    (other / "config.json").write_text(json.dumps(config, indent=7))
    assert _convert(contract, other, tmp_path / "b") == "cached"
    _compiled_anew(contract, other, tmp_path / "d", monkeypatch)
    assert _outputs(tmp_path / "b") == _outputs(tmp_path / "d")
    (src / "config.json").write_text(json.dumps({**config, "bos_token_id": 7}))
    assert _convert(contract, src, tmp_path / "c") == "compiled"


def test_pccs_own_code_is_in_the_key(tmp_path):
    """Every file under pcc's package and data folders, bytecode aside, links followed."""
    (tmp_path / "pkg" / "__pycache__").mkdir(parents=True)
    (tmp_path / "pkg" / "a.py").write_text("x = 1\n")
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "t.yaml").write_text("k: 1\n")
    (tmp_path / "pkg" / "linked").symlink_to(tmp_path / "elsewhere")
    (tmp_path / "pkg" / "loop").symlink_to(tmp_path / "pkg")
    roots = [tmp_path / "pkg"]
    before, _ = plan_cache._code(roots)
    (tmp_path / "pkg" / "__pycache__" / "a.cpython-311.pyc").write_bytes(b"\0")
    assert plan_cache._code(roots)[0] == before
    (tmp_path / "elsewhere" / "t.yaml").write_text("k: 2\n")
    after_data, _ = plan_cache._code(roots)
    (tmp_path / "pkg" / "a.py").write_text("x = 2\n")
    after_code, newest = plan_cache._code(roots)
    assert len({before, after_data, after_code}) == 3 and newest > time.time() - 5
    from pcc.resources import data_dir

    code = plan_cache._code_roots()  # the package, and the data folders beside it (a checkout) or in it (a wheel)
    assert Path(plan_cache.__file__).resolve().parents[1] in code
    assert all(any(data_dir(d).resolve().is_relative_to(r) for r in code) for d in ("grammar", "targets"))


def test_the_installed_distributions_are_in_the_key_not_what_the_process_added_to_sys_path(lane, tmp_path,
                                                                                           monkeypatch):
    """A test or a verifier that puts an engine's folder on sys.path changes no key; $PYTHONPATH, which a new
    process reads, does."""
    src, contract = lane
    (tmp_path / "engine" / "thing-1.0.dist-info").mkdir(parents=True)
    opened = open_source(src)
    before = plan_cache._keys(str(contract), opened)[0]
    monkeypatch.syspath_prepend(str(tmp_path / "engine"))
    assert plan_cache._keys(str(contract), opened)[0] == before
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "engine"))
    assert plan_cache._keys(str(contract), opened)[0] != before


def test_pcc_changed_since_this_process_loaded_it_keeps_nothing(lane, tmp_path, monkeypatch):
    """What compiled may be the code loaded before the change, and the key the code after it."""
    import pcc

    src, contract = lane
    monkeypatch.setattr(pcc, "IMPORTED_AT", 0.0)  # as if every file changed after the import (at the epoch: an
    # hour before now failed in a checkout whose files were all older than an hour)
    assert _convert(contract, src, tmp_path / "a") == "compiled"
    assert not list((tmp_path / "cache" / "convert-plans").glob("*.json"))


def test_a_link_pointed_elsewhere_compiles(lane, tmp_path):
    """The parent, reached through a link to a folder: the same bytes elsewhere are not the same file (an
    `extends` outside the allowed folders is refused, a `..` after a link leads somewhere else)."""
    src, contract = lane
    for name, rule in (("one", "linear : bf16"), ("two", "linear : fp8_block")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "base.prec").write_text(contract.read_text().replace("linear : fp8_block", rule))
    (tmp_path / "sub").symlink_to(tmp_path / "one")
    child = tmp_path / "child.prec"
    child.write_text('contract child extends "sub/base.prec" {\n  trainable all\n}\n')
    assert _convert(child, src, tmp_path / "a") == "compiled"
    assert _convert(child, src, tmp_path / "b") == "cached"
    (tmp_path / "sub").unlink()
    (tmp_path / "sub").symlink_to(tmp_path / "two")
    assert _convert(child, src, tmp_path / "c") == "compiled"
    assert _outputs(tmp_path / "c") != _outputs(tmp_path / "a")


def _snapshot(repo: Path, rev: str, files: dict[str, str]) -> Path:
    """A Hugging Face hub cache snapshot `rev` of `repo`, each file a link to a blob."""
    snap = repo / "snapshots" / rev
    snap.mkdir(parents=True)
    for name, blob in files.items():
        (snap / name).symlink_to(Path("../../blobs") / blob)
    return snap


def test_a_hub_snapshot_takes_the_plan_of_another(lane, tmp_path, monkeypatch):
    """Another revision of a hub snapshot of the same fingerprint takes the plan, whether its files are the
    same blobs or others with the same bytes, and writes what compiling it writes."""
    src, contract = lane
    repo = tmp_path / "hub" / "models--org--tiny"
    (repo / "blobs").mkdir(parents=True)
    names = {f.name: f"blob{k}" for k, f in enumerate(sorted(src.iterdir()))}
    for name, blob in names.items():
        (repo / "blobs" / blob).write_bytes((src / name).read_bytes())
    one = _snapshot(repo, "one", names)
    assert _convert(contract, one, tmp_path / "a") == "compiled"
    assert _convert(contract, _snapshot(repo, "two", names), tmp_path / "b") == "cached"
    for name, blob in names.items():
        (repo / "blobs" / f"{blob}-copy").write_bytes((repo / "blobs" / blob).read_bytes())
    three = _snapshot(repo, "three", {n: f"{b}-copy" for n, b in names.items()})
    assert _convert(contract, three, tmp_path / "c") == "cached"
    _compiled_anew(contract, repo / "snapshots" / "two", tmp_path / "d", monkeypatch)
    assert _outputs(tmp_path / "b") == _outputs(tmp_path / "d")


def test_a_plain_folder_linking_to_a_snapshots_blob_does_not_take_its_plan(lane, tmp_path, monkeypatch):
    """A hub snapshot may link its config.json into the model's blobs/, a plain folder may not (a compile refuses
    it, PCC211): the plan kept for the snapshot is not taken there, the folder is refused as it is opened
    (PCC714, the same rule). (Found by a review: open_source read config.json without that check.)"""
    src, contract = lane
    repo = tmp_path / "hub" / "models--org--tiny"
    (repo / "blobs").mkdir(parents=True)
    (repo / "blobs" / "cfg").write_bytes((src / "config.json").read_bytes())
    for name in ("one", "plain"):
        folder = repo / "snapshots" / name if name == "one" else tmp_path / name
        folder.mkdir(parents=True)
        for f in src.iterdir():
            if f.name != "config.json":
                (folder / f.name).write_bytes(f.read_bytes())
        (folder / "config.json").symlink_to(repo / "blobs" / "cfg")
    assert _convert(contract, repo / "snapshots" / "one", tmp_path / "a") == "compiled"
    with pytest.raises(ConvertError, match="outside the checkpoint directory"):
        _convert(contract, tmp_path / "plain", tmp_path / "b")


def test_another_spelling_of_the_source_is_named_as_given(lane, tmp_path, monkeypatch):
    """The converter plan names the source as the command did, and the job id hashes the plan: the plan kept for
    one spelling converts another to what compiling it writes."""
    src, contract = lane
    monkeypatch.chdir(tmp_path)  # (the working directory is in the key: what a relative path names)
    assert _convert(contract, src, tmp_path / "a") == "compiled"
    assert _convert(contract, Path("src"), tmp_path / "b") == "cached"
    _compiled_anew(contract, Path("src"), tmp_path / "c", monkeypatch)
    assert _outputs(tmp_path / "b") == _outputs(tmp_path / "c") != _outputs(tmp_path / "a")


def test_a_source_read_by_other_paths_stays_with_its_folder(lane, tmp_path, monkeypatch):
    """A source given as `.` is read as `config.json`, not `./config.json`: what the compile read inside it is not
    relative to it, so the plan is kept for that folder as given only."""
    src, contract = lane
    monkeypatch.chdir(src)
    assert _convert(contract, Path("."), tmp_path / "a") == "compiled"
    assert _convert(contract, Path("."), tmp_path / "b") == "cached"
    other = tmp_path / "other"
    make_source(other, "bf16", seed=30)
    monkeypatch.chdir(tmp_path)
    assert _convert(contract, other, tmp_path / "c") == "compiled"


def test_a_plan_naming_its_source_beyond_its_model_stays_with_its_folder(lane):
    src, _ = lane
    opened = open_source(src)
    folder = plan_cache._Folder(opened)
    plan = {"model": str(src), "tensors": [{"source": "model.embed_tokens.weight"}]}
    assert plan_cache._relocatable(plan, [["file", "config.json", "config.json", "0"]], opened, folder)
    for elsewhere in (str(src), f"{src}/config.json"):
        assert not plan_cache._relocatable({**plan, "note": elsewhere}, [], opened, folder)
    assert not plan_cache._relocatable({**plan, "model": "src"}, [], opened, folder)
    assert plan_cache._relocatable({**plan, "note": f"{src}-old"}, [], opened, folder)
    assert not plan_cache._relocatable(plan, [["file", f"{src}/../src/config.json", f"{src}/config.json", "0"]],
                                       opened, folder)
    assert not plan_cache._relocatable(plan, [["file", "c.prec", "c.prec", "0"]], opened, folder)


def test_a_contract_kept_in_the_source_folder_stays_with_it(lane, tmp_path):
    """Another folder's conversion by that contract reads it where it is, not the copy beside the other
    checkpoint: the plan is kept for the folder it was compiled against only."""
    src, contract = lane
    inner = src / "c.prec"
    inner.write_text(contract.read_text())
    assert _convert(inner, src, tmp_path / "a") == "compiled"
    other = tmp_path / "other"
    make_source(other, "bf16", seed=30)
    (other / "c.prec").write_text(contract.read_text())
    assert _convert(inner, other, tmp_path / "b") == "compiled"
    assert _convert(inner, src, tmp_path / "c") == "cached"


def test_a_source_index_added_takes_the_plan(lane, tmp_path, monkeypatch):
    """An index added to a source without one lists the same tensors (the same fingerprint): the kept plan is
    taken, and writes what compiling writes."""
    src, contract = lane
    index = src / "model.safetensors.index.json"
    kept = index.read_text()
    index.unlink()
    assert _convert(contract, src, tmp_path / "a") == "compiled"
    assert _convert(contract, src, tmp_path / "b") == "cached"
    index.write_text(kept)
    assert _convert(contract, src, tmp_path / "c") == "cached"
    _compiled_anew(contract, src, tmp_path / "d", monkeypatch)
    assert _outputs(tmp_path / "c") == _outputs(tmp_path / "d")


def test_compiles_on_two_threads_keep_their_own_reads(tmp_path):
    import threading

    for name in "ab":
        (tmp_path / name).write_text(name)
    got = {}

    def read(name):
        got[name] = plan_cache._record(lambda: [(tmp_path / name).read_text() for _ in range(200)])[1]

    threads = [threading.Thread(target=read, args=(n,)) for n in "ab"]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert got["a"].files == {str(tmp_path / "a")} and got["b"].files == {str(tmp_path / "b")}


def test_a_contract_written_as_the_compile_began_is_not_kept(lane, tmp_path, monkeypatch):
    """Nor one replaced keeping its time (`cp -p`, rsync): its ctime is the replacement's. (The window is made
    30 s wide, then none, for the time that passes.)"""
    src, contract = lane
    monkeypatch.setattr(plan_cache, "_TOO_NEW_S", 30.0)
    monkeypatch.setattr(plan_cache, "_TOO_NEW_WHOLE_S", 30.0)
    st = contract.stat()
    contract.write_text(contract.read_text())
    os.utime(contract, ns=(st.st_atime_ns, st.st_mtime_ns - 10**11))  # its time 100 s back
    assert _convert(contract, src, tmp_path / "a") == "compiled"
    assert _convert(contract, src, tmp_path / "b") == "compiled"
    monkeypatch.setattr(plan_cache, "_TOO_NEW_S", 0.0)
    assert _convert(contract, src, tmp_path / "c") == "compiled"
    assert _convert(contract, src, tmp_path / "d") == "cached"


def _kept_while_streaming(monkeypatch, before_streaming=lambda: None):
    """The plan kept only once the checkpoint streams (`before_streaming()` run first): a conversion that kept
    it before streaming would wait here until the test fails."""
    import threading

    streaming = threading.Event()
    store, pipeline = plan_cache._store, run.fast.pipeline

    def store_later(*args):
        if streaming.wait(10):
            store(*args)

    def stream(*args, **kwargs):
        before_streaming()
        streaming.set()
        return pipeline(*args, **kwargs)

    monkeypatch.setattr(plan_cache, "_store", store_later)
    monkeypatch.setattr(run.fast, "pipeline", stream)


def test_the_plan_is_kept_while_the_checkpoint_streams_and_before_convert_returns(lane, tmp_path, monkeypatch):
    src, contract = lane
    _kept_while_streaming(monkeypatch)
    assert _convert(contract, src, tmp_path / "a") == "compiled"
    assert len(list((tmp_path / "cache" / "convert-plans").glob("*.json"))) == 1
    assert _convert(contract, src, tmp_path / "b") == "cached"


def test_a_contract_edited_while_the_checkpoint_streams_is_not_kept(lane, tmp_path, monkeypatch):
    """What the compile read is hashed when the plan is kept, while the checkpoint streams: a contract edited
    since the compile began is not trusted to be the text it read, and nothing is kept."""
    src, contract = lane
    _kept_while_streaming(monkeypatch, lambda: contract.write_text(contract.read_text() + "\n"))
    assert _convert(contract, src, tmp_path / "a") == "compiled"
    assert not list((tmp_path / "cache" / "convert-plans").glob("*.json"))
    assert _convert(contract, src, tmp_path / "b") == "compiled"


def test_a_checkpoint_converted_a_moment_after_it_was_saved_is_kept(lane, tmp_path, monkeypatch):
    """A training run converts each checkpoint as soon as it is saved: a tenth of a second later is enough."""
    _, contract = lane
    monkeypatch.setattr(plan_cache, "_TOO_NEW_S", 0.05)
    monkeypatch.setattr(plan_cache, "_TOO_NEW_WHOLE_S", 2.0)
    saved = tmp_path / "iter_1"
    make_source(saved, "bf16", seed=30)
    time.sleep(0.1)
    assert _convert(contract, saved, tmp_path / "a") == "compiled"
    assert _convert(contract, saved, tmp_path / "b") == "cached"


def test_a_time_of_whole_seconds_may_be_two_seconds_late():
    """A file system that keeps whole seconds (FAT: two) truncates a change's time: a file stamped a second
    before the compile may have changed after it began; one with a fraction, 0.05 s before, did not."""
    from types import SimpleNamespace

    t = 1_000_000.0
    fine, whole = int((t - 0.06) * 1e9), int(t - 1) * 10**9
    assert not plan_cache._too_new(plan_cache._stamp(SimpleNamespace(st_mtime_ns=fine - 10**9, st_ctime_ns=fine)), t)
    assert plan_cache._too_new(plan_cache._stamp(SimpleNamespace(st_mtime_ns=whole, st_ctime_ns=whole)), t)
    assert not plan_cache._too_new(plan_cache._stamp(SimpleNamespace(st_mtime_ns=whole - 2 * 10**9,
                                                                     st_ctime_ns=whole - 2 * 10**9)), t)


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


@pytest.mark.parametrize("damage", ["garbage", "other key", "malformed plan", "changed dependency",
                                    "a path no file has", "not its checksum"])
def test_a_damaged_entry_compiles_again(lane, tmp_path, damage):
    src, contract = lane
    assert _convert(contract, src, tmp_path / "a") == "compiled"
    (entry,) = (tmp_path / "cache" / "convert-plans").glob("*.json")
    doc = json.loads(entry.read_text().partition("\n")[2])

    def write(d, checksum=True):
        body = json.dumps(d)
        entry.write_text((hashlib.sha256(body.encode()).hexdigest() if checksum else "0" * 64) + "\n" + body)

    if damage == "garbage":
        entry.write_bytes(b"\x00{not json")
    elif damage == "other key":
        write({**doc, "key": "0" * 64})
    elif damage == "malformed plan":
        write({**doc, "plan": {**doc["plan"], "tensors": [{"source": 1, "recipe": ["unhashable"]}]}})
    elif damage == "changed dependency":
        write({**doc, "deps": [[k, p, r, "0" * 64] for k, p, r, _ in doc["deps"]]})
    elif damage == "a path no file has":
        write({**doc, "deps": [["file", "/no\0where", "/x", "0" * 64]] + doc["deps"]})
    else:  # a plan edited without its checksum
        write({**doc, "plan": {**doc["plan"], "layout": "mxfp4"}}, checksum=False)
    assert _convert(contract, src, tmp_path / "b") == "compiled"
    assert _outputs(tmp_path / "b") == _outputs(tmp_path / "a")


def test_without_the_kernels_nothing_is_kept_or_looked_up(lane, tmp_path, monkeypatch):
    """The torch path reads the Plan: a kept converter plan could not run as it is."""
    src, contract = lane
    monkeypatch.setenv("PCC_FUSED", "0")
    assert _convert(contract, src, tmp_path / "a") == "compiled"
    assert not (tmp_path / "cache" / "convert-plans").exists()


def test_a_cache_that_cannot_be_written_is_no_error(lane, tmp_path, monkeypatch):
    src, contract = lane
    (tmp_path / "file").write_text("not a folder")
    monkeypatch.setenv("PCC_CACHE", str(tmp_path / "file"))
    assert _convert(contract, src, tmp_path / "a") == "compiled"
    assert _convert(contract, src, tmp_path / "b") == "compiled"


def test_it_keeps_the_most_recently_used(lane, tmp_path, monkeypatch):
    src, contract = lane
    monkeypatch.setattr(plan_cache, "KEEP", 2)
    contracts = []
    for k in range(3):
        contracts.append(tmp_path / f"c{k}.prec")
        contracts[-1].write_text(contract.read_text())
    for k, c in enumerate(contracts):
        assert _convert(c, src, tmp_path / f"first{k}") == "compiled"
        time.sleep(0.01)
    assert len(list((tmp_path / "cache" / "convert-plans").glob("*.json"))) == 2
    assert _convert(contracts[0], src, tmp_path / "again0") == "compiled"  # the oldest went
    assert _convert(contracts[2], src, tmp_path / "again2") == "cached"


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
    import pcc  # the child imports this pcc (the key hashes its files), not one in the working directory

    out = subprocess.run([sys.executable, "-P", "-c", code], capture_output=True, text=True, check=True,
                         env=os.environ | {"PYTHONPATH": str(Path(pcc.__file__).parents[1])})
    assert json.loads(out.stdout.splitlines()[-1]) == ["cached", []]
    assert open_source(src).view.encodings == {}
