"""`pcc convert BUNDLE`: a bundle compiled for the checkpoint it converts runs its converter plan
(convert/plan.json) as it is, without compiling the contract or importing the compiler; the bytes and the
job are those of converting the contract. Anything else compiles: another checkpoint, another pcc, a
conversion the torch-free path does not take. docs/convert.md "Start-up"."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from test_convert_bytes import make_source

from pcc.bundle import MANIFEST
from pcc.bundle.write import write_bundle
from pcc.cli import main
from pcc.convert import contract as convert_contract
from pcc.convert import run
from pcc.convert.source import open_source
from pcc.lower import compile_file
from pcc.lower.converter import converter_plan
from pcc.models.checkpoint import catalog_from_checkpoint, fingerprint

pytestmark = pytest.mark.skipif(os.environ.get("PCC_FUSED") == "0", reason="PCC_FUSED=0 turns the fused kernel off")
PLAN = "convert/plan.json"


def _contract(directory: Path, src: Path, rule: str = "linear : fp8_block") -> Path:
    path = directory / "c.prec"
    path.write_text(f'contract lane {{\n  model from "{src}"\n  hardware H100\n  rollout sglang {{\n    {rule}\n'
                    "    keep bf16 : embed, lm_head, norm, router\n  }\n"
                    "  trainer megatron {\n    gemm : bf16\n    optimizer adam\n  }\n  trainable all\n"
                    "  sync full_weights { schedule colocated bridge bf16 activation atomic }\n"
                    "  routing replay rollout\n}\n", encoding="utf-8")
    return path


@pytest.fixture
def compiled(tmp_path):
    """A BF16 tiny_moe source, a `model from` contract for it, and its bundle."""
    src = tmp_path / "src"
    make_source(src, "bf16")
    contract = _contract(tmp_path, src)
    c = compile_file(str(contract))
    assert c.ok
    write_bundle(c.plan, tmp_path / "bundle", contract_path=str(contract))
    return src, contract, tmp_path / "bundle"


def _no_compile(monkeypatch):
    def refuse(*a, **k):
        raise AssertionError("the contract was compiled")

    monkeypatch.setattr(convert_contract, "load_plan", refuse)
    monkeypatch.setattr(run, "load_plan", refuse)


def _outputs(d: Path) -> dict:
    return {f.name: f.read_bytes() for f in sorted(d.iterdir()) if f.is_file()}


def _rewrite(bundle: Path, rel: str, text: str) -> None:
    """Edit one file of a bundle and its manifest entry to match (what a hand edit that knows the format does)."""
    (bundle / rel).write_text(text, encoding="utf-8")
    manifest = json.loads((bundle / MANIFEST).read_text())
    manifest["files"][rel] = hashlib.sha256(text.encode()).hexdigest()
    (bundle / MANIFEST).write_text(json.dumps(manifest))


def test_a_bundle_compiled_for_the_source_converts_without_compiling(compiled, tmp_path, monkeypatch):
    src, contract, bundle = compiled
    want = run.convert(str(contract), str(src), str(tmp_path / "from-contract"))
    assert want["plan"] == "compiled"
    _no_compile(monkeypatch)
    got = run.convert(str(bundle), str(src), str(tmp_path / "from-bundle"))
    assert got["plan"] == "bundle" and got["tensors"] == want["tensors"]
    assert _outputs(tmp_path / "from-bundle") == _outputs(tmp_path / "from-contract")  # shards, config, job record


@pytest.mark.parametrize("entry", ["convert", "cli"])
def test_the_bundle_lane_imports_neither_the_grammar_nor_the_compiler(compiled, tmp_path, entry):
    """As a library call and as `pcc convert BUNDLE` (whose parser names every verb and `pcc run` target)."""
    src, _, bundle = compiled
    args = (str(bundle), str(src), str(tmp_path / "dst"))
    run_it = (f"from pcc.convert.run import convert\nplan = convert{args!r}['plan']\n" if entry == "convert" else
              "import contextlib, io\nfrom pcc.cli import main\nout = io.StringIO()\n"
              "with contextlib.redirect_stdout(out):\n"
              f"    assert main(['convert', {args[0]!r}, '--source', {args[1]!r}, '-o', {args[2]!r}, '--json']) == 0\n"
              "plan = json.loads(out.getvalue())['result']['plan']\n")
    code = ("import json, sys\n" + run_it +
            "heavy = ('lark', 'pydantic', 'yaml', 'torch', 'numpy', 'pcc.plan', 'pcc.lower', 'pcc.contract')\n"
            "print(json.dumps([plan, sorted(m for m in sys.modules if m.split('.')[0] in heavy\n"
            "                               or m.startswith(heavy[-3:]))]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout.splitlines()[-1]) == ["bundle", []]


def test_the_catalog_fingerprint_is_the_sources(compiled):
    src, _, bundle = compiled
    s = open_source(src)
    assert catalog_from_checkpoint(src).fingerprint == fingerprint(s.config, s.entries)
    assert json.loads((bundle / PLAN).read_text())["source_fingerprint"] == fingerprint(s.config, s.entries)


def test_another_checkpoint_compiles_the_contract(compiled, tmp_path):
    """A source whose config differs (here one field the plan does not even read) is not the one the bundle was
    compiled for: the contract is compiled against it, and it converts."""
    src, _, bundle = compiled
    other = tmp_path / "other"
    make_source(other, "bf16")
    config = json.loads((other / "config.json").read_text())
    (other / "config.json").write_text(json.dumps({**config, "bos_token_id": 7}))
    assert run.convert(str(bundle), str(other), str(tmp_path / "dst"))["plan"] == "compiled"


def test_a_bundle_of_another_pcc_compiles_the_contract(compiled, tmp_path):
    src, _, bundle = compiled
    manifest = json.loads((bundle / MANIFEST).read_text())
    (bundle / MANIFEST).write_text(json.dumps({**manifest, "pcc_version": "0.0.0"}))
    assert run.convert(str(bundle), str(src), str(tmp_path / "dst"))["plan"] == "compiled"


def test_a_bundle_whose_converter_plan_names_no_source_compiles_the_contract(compiled, tmp_path):
    """A bundle written before converter plans carried `source_fingerprint` still converts (compiled)."""
    src, _, bundle = compiled
    doc = json.loads((bundle / PLAN).read_text())
    del doc["source_fingerprint"]
    _rewrite(bundle, PLAN, json.dumps(doc))
    assert run.convert(str(bundle), str(src), str(tmp_path / "dst"))["plan"] == "compiled"


def test_a_conversion_the_fast_path_does_not_take_compiles(tmp_path, monkeypatch):
    """NVFP4 (input scales, a global scale): the bundle's plan is not used, the Plan is compiled."""
    src = tmp_path / "src"
    make_source(src, "bf16")
    contract = _contract(tmp_path, src, "linear : nvfp4").read_text().replace("H100", "B200")
    (tmp_path / "c.prec").write_text(contract)
    c = compile_file(str(tmp_path / "c.prec"))
    write_bundle(c.plan, tmp_path / "bundle", contract_path=str(tmp_path / "c.prec"))
    got = run.convert(str(tmp_path / "bundle"), str(src), str(tmp_path / "dst"), calibrate=False)
    assert got["plan"] == "compiled"


def _refused(bundle: Path, src: Path, tmp_path: Path, capsys) -> tuple[str, str]:
    """`pcc convert --json` of a bundle that must be refused: its one diagnostic's code and the part of its message
    these tests look for; nothing written."""
    assert main(["convert", str(bundle), "--source", str(src), "-o", str(tmp_path / "dst"), "--json"]) == 1
    [d] = json.loads(capsys.readouterr().out)["diagnostics"]
    assert not (tmp_path / "dst").exists()
    said = next((m for m in ("does not match the manifest", "malformed converter plan") if m in d["message"]), None)
    return d["code"], said or d["message"]


def test_an_edited_converter_plan_is_refused(compiled, tmp_path, capsys):
    src, _, bundle = compiled
    (bundle / PLAN).write_text((bundle / PLAN).read_text().replace('"fp8_block":[128,128]', '"fp8_block":[64,64]'))
    assert _refused(bundle, src, tmp_path, capsys) == ("PCC706", "does not match the manifest")


@pytest.mark.parametrize("edit", [
    lambda d: d["recipes"][next(iter(d["recipes"]))].update(piece_rows="128"),
    lambda d: d["recipes"][next(iter(d["recipes"]))].pop("fp8_block"),
    lambda d: d["tensors"][0].update(recipe="nowhere/none"),
    lambda d: d["tensors"][0]["targets"][next(iter(d["tensors"][0]["targets"]))].update(dtype="float128"),
    lambda d: d.update(copied=[{"source": 3}]),
    lambda d: d.pop("layout"),
    lambda d: d.pop("quantization_config"),
    lambda d: d["tensors"][0].update(recipe=["a", "list"]),
    lambda d: d["tensors"][0]["targets"][next(iter(d["tensors"][0]["targets"]))].update(dtype=["bf16"]),
])
def test_a_malformed_converter_plan_matching_its_manifest_is_refused(compiled, tmp_path, capsys, edit):
    """Edited with its manifest entry to match: a coded error (PCC706), never a KeyError, nothing written."""
    src, _, bundle = compiled
    doc = json.loads((bundle / PLAN).read_text())
    edit(doc)
    _rewrite(bundle, PLAN, json.dumps(doc))
    assert _refused(bundle, src, tmp_path, capsys) == ("PCC706", "malformed converter plan")


CONTRACTS = sorted((Path(__file__).resolve().parents[2] / "contracts").glob("*.prec"))


@pytest.mark.parametrize("path", CONTRACTS, ids=[p.stem for p in CONTRACTS])
def test_every_operator_of_a_recipe_streams_as_its_recipe_says(path):
    """A recipe's `piece_rows`, `global_scale` and `fp8_block` are read for all its operators (pcc.convert.run
    `_items`): computed for each operator, they agree with the recipe it names."""
    from pcc.lower.converter import _pieces

    plan = compile_file(str(path)).plan
    doc = converter_plan(plan)
    ops = {op.tensor: i for i, op in enumerate(plan.catalog.operators)}
    for e in doc["tensors"]:
        recipe = doc["recipes"][e["recipe"]]
        assert {k: recipe[k] for k in ("piece_rows", "global_scale", "fp8_block")} == _pieces(plan, ops[e["source"]])


def test_a_converter_plan_whose_pieces_would_split_scale_blocks_is_not_run(compiled, tmp_path, monkeypatch):
    """Edited with its manifest to match, a recipe's `piece_rows` that is not a whole number of FP8 scale blocks
    would place a piece's scales wrongly: the kernel path refuses it, the contract is compiled, the bytes are
    right."""
    src, contract, bundle = compiled
    monkeypatch.setattr(run, "PIECE_BYTES", 16 << 10)  # every weight of tiny_moe quantized in row pieces
    doc = json.loads((bundle / PLAN).read_text())
    for r in doc["recipes"].values():
        if r["fp8_block"] is not None:
            r["piece_rows"] = 3
    _rewrite(bundle, PLAN, json.dumps(doc))
    assert run.convert(str(bundle), str(src), str(tmp_path / "from-bundle"))["plan"] == "compiled"
    run.convert(str(contract), str(src), str(tmp_path / "from-contract"))
    assert _outputs(tmp_path / "from-bundle") == _outputs(tmp_path / "from-contract")


def test_a_converter_plan_copying_a_tensor_the_source_lacks_is_refused(compiled, tmp_path, capsys):
    src, _, bundle = compiled
    doc = json.loads((bundle / PLAN).read_text())
    doc["copied"].append({"source": "model.nowhere", "recipe": "copy", "targets": {"model.nowhere": "as source"}})
    _rewrite(bundle, PLAN, json.dumps(doc))
    assert main(["convert", str(bundle), "--source", str(src), "-o", str(tmp_path / "dst"), "--json"]) == 1
    [d] = json.loads(capsys.readouterr().out)["diagnostics"]
    assert d["code"] == "PCC702" and "model.nowhere, which the checkpoint lacks" in d["message"]
    assert not (tmp_path / "dst").exists()
