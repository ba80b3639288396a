"""Bundles: byte-identical, atomic, manifest-checked; the merged contract round-trips."""

import json
from pathlib import Path

import pytest

from pcc.bundle import BundleError, read_bundle
from pcc.bundle.write import bundle_files, contract_source, write_bundle
from pcc.plan import compile_file
from pcc.plan.dump import plan_json

ROOT = Path(__file__).resolve().parents[2]
CONTRACTS = sorted((ROOT / "contracts").glob("*.prec"))
LIGHT = ("expectations",)  # targets with no engine-specific module needed for these tests


@pytest.mark.parametrize("path", CONTRACTS, ids=lambda p: p.stem)
def test_merged_contract_source_gives_the_same_plan(path, tmp_path):
    """contract.prec in a bundle is the merged contract; compiling it gives the same Plan."""
    plan = compile_file(str(path)).plan
    src = tmp_path / "contract.prec"
    src.write_text(contract_source(plan.contract))
    again = compile_file(str(src))
    assert again.ok, [d.render() for d in again.diagnostics if d.is_error]
    a, b = json.loads(plan_json(plan)), json.loads(plan_json(again.plan))
    a.pop("contract"), b.pop("contract"), a.pop("lock"), b.pop("lock")
    assert a == b


def test_bundle_is_byte_identical_and_checked(tmp_path):
    plan = compile_file(str(ROOT / "contracts" / "glm52_fp8_rollout.prec")).plan
    first = bundle_files(plan, LIGHT)[0]
    assert first == bundle_files(plan, LIGHT)[0]
    out = tmp_path / "b"
    write_bundle(plan, out, targets=LIGHT)
    b = read_bundle(out)
    assert b.manifest["lock"] == json.loads((out / "plan.json").read_text())["lock"]
    assert (out / "run.sh").stat().st_mode & 0o111
    assert "validate/expectations.yaml" in b.manifest["files"]
    with pytest.raises(BundleError, match="exists"):
        write_bundle(plan, out, targets=LIGHT)
    (out / "plan.json").write_text("{}")
    with pytest.raises(BundleError, match="plan.json does not match"):
        read_bundle(out)
    write_bundle(plan, out, force=True, targets=LIGHT)
    read_bundle(out)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")], "temporary directories left behind"


def test_the_framework_is_in_the_plan_and_its_lock(tmp_path):
    """The same contract on Miles and on verl gives two bundles (miles/ or verl/): their plans and lock
    hashes differ, and each is byte-identical when compiled again."""
    locks = {}
    for framework in ("miles", "verl"):
        src = tmp_path / f"{framework}.prec"
        src.write_text(f'contract same extends "{ROOT / "contracts/bf16_baseline.prec"}" {{\n'
                       f'  framework {framework}\n}}\n')
        text = plan_json(compile_file(str(src)).plan)
        assert text == plan_json(compile_file(str(src)).plan)
        doc = json.loads(text)
        assert doc["framework"] == framework
        files = bundle_files(compile_file(str(src)).plan, LIGHT)[0]
        assert json.loads(files["manifest.json"])["lock"] == doc["lock"]
        locks[framework] = doc["lock"]
    assert locks["miles"] != locks["verl"]
    implicit = json.loads(plan_json(compile_file(str(ROOT / "contracts/bf16_baseline.prec")).plan))
    assert implicit["framework"] == "miles"  # Megatron + SGLang without the statement runs on Miles


def test_a_failed_write_leaves_nothing(tmp_path, monkeypatch):
    import pcc.bundle.write as bundle

    plan = compile_file(str(ROOT / "contracts" / "tiny_cpu.prec")).plan

    def boom(*a, **k):
        raise RuntimeError("disk full")

    monkeypatch.setattr(bundle, "bundle_files", lambda p, t, c: ({"run.sh": "x", "a/b.txt": "y"}, []))
    monkeypatch.setattr(Path, "chmod", boom)
    with pytest.raises(RuntimeError):
        write_bundle(plan, tmp_path / "b")
    assert list(tmp_path.iterdir()) == []


def test_force_replaces_only_a_bundle(tmp_path):
    plan = compile_file(str(ROOT / "contracts" / "tiny_cpu.prec")).plan
    precious = tmp_path / "checkpoint"
    precious.mkdir()
    (precious / "model.safetensors").write_text("weights")
    with pytest.raises(BundleError, match="not a pcc bundle"):
        write_bundle(plan, precious, force=True, targets=LIGHT)
    assert (precious / "model.safetensors").read_text() == "weights"
    afile = tmp_path / "afile"
    afile.write_text("x")
    with pytest.raises(BundleError, match="not a pcc bundle"):
        write_bundle(plan, afile, force=True, targets=LIGHT)
    assert afile.read_text() == "x"


# -- a bundle is read through one function that checks its manifest (docs/safety.md) -----------------

def _bundle(tmp_path) -> Path:
    out = tmp_path / "b"
    write_bundle(compile_file(str(ROOT / "contracts" / "tiny_cpu.prec")).plan, out, targets=LIGHT)
    return out


def _rewrite_manifest(out: Path, edit) -> None:
    m = json.loads((out / "manifest.json").read_text())
    edit(m)
    (out / "manifest.json").write_text(json.dumps(m))


def test_contract_file_checks_the_bundle(tmp_path):
    from pcc.bundle import contract_file

    out = _bundle(tmp_path)
    assert contract_file(out) == out / "contract.prec"
    (out / "contract.prec").write_text((out / "contract.prec").read_text().replace("fp8", "int4"))
    with pytest.raises(BundleError, match="contract.prec does not match the manifest") as err:
        contract_file(out)
    assert err.value.code == "PCC706" and not err.value.missing
    for bare in (tmp_path / "empty", tmp_path / "nothing"):
        bare.mkdir(exist_ok=bare.name == "nothing")
        with pytest.raises(BundleError, match="not a pcc bundle") as err:
            contract_file(bare)
        assert err.value.missing


@pytest.mark.parametrize("rel", ["/etc/hostname", "../outside.txt", "a/../../outside.txt", "", "a\\..\\b"])
def test_a_manifest_cannot_name_a_file_outside_the_bundle(tmp_path, rel):
    out = _bundle(tmp_path)
    (tmp_path / "outside.txt").write_text("secret")
    _rewrite_manifest(out, lambda m: m["files"].__setitem__(rel, "0" * 64))
    with pytest.raises(BundleError, match="outside the bundle") as err:
        read_bundle(out)
    assert err.value.code == "PCC706"


def test_a_link_out_of_the_bundle_is_refused(tmp_path):
    out = _bundle(tmp_path)
    (tmp_path / "outside.txt").write_text("secret")
    (out / "link.txt").symlink_to(tmp_path / "outside.txt")
    _rewrite_manifest(out, lambda m: m["files"].__setitem__("link.txt", "0" * 64))
    with pytest.raises(BundleError, match="links outside the bundle"):
        read_bundle(out)


@pytest.mark.parametrize("text", ["[]", '{"files": []}', '{"files": {"contract.prec": 3}}', '{"files": {}}',
                                  '{"files": {"a": "x"}}', "not json", '{"files": {}, "files": {}}'])
def test_a_malformed_manifest_is_one_coded_error(tmp_path, text):
    out = _bundle(tmp_path)
    (out / "manifest.json").write_text(text)
    with pytest.raises(BundleError) as err:
        read_bundle(out)
    assert err.value.code == "PCC706" and "manifest.json" in str(err.value)


def test_a_manifest_that_is_a_device_is_refused(tmp_path):
    out = _bundle(tmp_path)
    (out / "manifest.json").unlink()
    (out / "manifest.json").symlink_to("/dev/zero")
    with pytest.raises(BundleError, match="not a regular file"):
        read_bundle(out)


def test_a_write_the_disk_refuses_is_one_line(tmp_path):
    plan = compile_file(str(ROOT / "contracts" / "tiny_cpu.prec")).plan
    (tmp_path / "afile").write_text("x")
    with pytest.raises(BundleError, match=r"afile/b: cannot write the bundle \(.*afile: ") as err:
        write_bundle(plan, tmp_path / "afile" / "b", targets=LIGHT)
    assert err.value.code == "PCC709"
    assert (tmp_path / "afile").read_text() == "x"


def test_a_checkpoint_models_bundle_names_the_checkpoint_not_a_folder_inside_it(tmp_path, monkeypatch):
    config = json.loads((ROOT / "pcc" / "models" / "configs" / "tiny_dense.json").read_text())
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "config.json").write_text(json.dumps(config))
    src = tmp_path / "c.prec"
    src.write_text('contract c {\n  model from "ckpt"\n  hardware cpu\n}\n')
    monkeypatch.chdir(tmp_path)
    c = compile_file(str(src))
    assert c.ok, [d.render() for d in c.diagnostics]
    out = tmp_path / "bundles" / "b"
    with pytest.raises(BundleError, match="relative"):
        write_bundle(c.plan, out, targets=LIGHT)  # relative to what? refused, never guessed
    write_bundle(c.plan, out, targets=LIGHT, contract_path=str(src))
    (out / "ckpt").mkdir()  # a decoy inside the bundle: never what the bundle means
    (out / "ckpt" / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 7}))
    text = (out / "contract.prec").read_text()
    assert f'model from "{tmp_path / "ckpt"}"' in text
    again = compile_file(str(out / "contract.prec"))
    assert again.ok and again.plan.catalog.num_layers == config["num_hidden_layers"]


def test_fuzzed_bundles_are_refused_with_a_code_never_a_traceback(tmp_path):
    """Random damage to a bundle's manifest and files: read_bundle answers BundleError (PCC706 or, for a
    directory that no longer is a bundle, PCC701) or accepts a bundle that still matches; nothing else."""
    import random

    out = _bundle(tmp_path)
    pristine = {p.relative_to(out).as_posix(): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    rng = random.Random(14)
    mutations = 0
    for _ in range(300):
        for rel, data in pristine.items():
            (out / rel).write_bytes(data)
        rel = rng.choice(["manifest.json", "manifest.json", "contract.prec", "plan.json"])
        data = bytearray(pristine[rel])
        kind = rng.randrange(4)
        if kind == 0 and data:  # flip bytes
            for _ in range(rng.randint(1, 4)):
                data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
        elif kind == 1:  # truncate
            data = data[:rng.randrange(len(data) + 1)]
        elif kind == 2:  # a JSON value of another shape where the manifest has its files
            m = json.loads(pristine["manifest.json"])
            m["files"][rng.choice(list(m["files"]))] = rng.choice([None, 1, [], {}, "../x", "f" * 64, True])
            rel, data = "manifest.json", bytearray(json.dumps(m).encode())
        else:  # a key renamed to a path outside
            m = json.loads(pristine["manifest.json"])
            key = rng.choice(list(m["files"]))
            m["files"][rng.choice(["/" + key, "../" + key, key + "/..", "./" + key])] = m["files"].pop(key)
            rel, data = "manifest.json", bytearray(json.dumps(m).encode())
        (out / rel).write_bytes(bytes(data))
        try:
            read_bundle(out)
        except BundleError as exc:
            assert exc.code in ("PCC706", "PCC701"), exc
            mutations += 1
    assert mutations > 250  # almost every mutation is caught (a flip inside JSON whitespace may not matter)


def test_a_full_disk_is_one_line_naming_the_path_and_leaves_nothing(tmp_path, monkeypatch):
    import errno

    plan = compile_file(str(ROOT / "contracts" / "tiny_cpu.prec")).plan
    real = Path.write_text

    def full(self, *a, **k):
        if self.name == "plan.json":
            raise OSError(errno.ENOSPC, "No space left on device", str(self))
        return real(self, *a, **k)

    monkeypatch.setattr(Path, "write_text", full)
    with pytest.raises(BundleError, match=r"cannot write the bundle \(.*plan\.json: No space left on device\)") as err:
        write_bundle(plan, tmp_path / "b", targets=LIGHT)
    assert err.value.code == "PCC709" and list(tmp_path.iterdir()) == []
