"""Bundles: byte-identical, atomic, manifest-checked; the merged contract round-trips."""

import json
from pathlib import Path

import pytest

from pcc.bundle import BundleError, bundle_files, contract_source, read_bundle, write_bundle
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


def test_a_failed_write_leaves_nothing(tmp_path, monkeypatch):
    import pcc.bundle as bundle

    plan = compile_file(str(ROOT / "contracts" / "tiny_cpu.prec")).plan

    def boom(*a, **k):
        raise RuntimeError("disk full")

    monkeypatch.setattr(bundle, "bundle_files", lambda p, t: ({"run.sh": "x", "a/b.txt": "y"}, []))
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
