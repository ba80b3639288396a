"""Engine facts keyed by engine version (targets/engines.yaml, pcc/lower/engine_support.py).

Every support row is checked against the targeted version's own definitions: SGLang's ServerArgs
parser and Transformer Engine's recipe module as installed (the versions the file targets), and
targets/miles_flags.json (Miles and its Megatron fork at the targeted commits). A targeted version
older than a row's `since` makes the target report PCC614 on the rule that asked for it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pcc.lower import compile_file, lower
from pcc.lower import engine_support as es

ROOT = Path(__file__).resolve().parents[2]
CONTRACTS = sorted((ROOT / "contracts").glob("*.prec"))
FLAGS = json.loads((ROOT / "targets" / "miles_flags.json").read_text(encoding="utf-8"))
SUPPORT = es.table()["support"]
TE_CLASSES = {"delayed": "DelayedScaling", "mxfp8": "MXFP8BlockScaling", "tensorwise": "Float8CurrentScaling",
              "blockwise": "Float8BlockScaling", "nvfp4": "NVFP4BlockScaling"}


def _split(key: str) -> tuple[str, str | None]:
    flag, _, value = key.partition(" ")
    return flag, value or None


def test_the_verifying_packages_are_the_targeted_versions():
    """The engines pcc verifies with are installed at the versions targets/engines.yaml targets."""
    sglang = (ROOT / "requirements" / "sglang.txt").read_text(encoding="utf-8")
    megatron = (ROOT / "requirements" / "megatron.txt").read_text(encoding="utf-8")
    assert f"sglang=={es.targeted('sglang')}\n" in sglang
    assert f"transformer-engine=={es.targeted('transformer_engine')}\n" in megatron


def test_versions_and_rows_are_well_formed():
    for engine, t in es.table()["target"].items():
        es._key(engine, str(t["version"]))
        for key, row in SUPPORT.get(engine, {}).items():
            es._key(engine, str(row["since"]))
            assert row["source"], (engine, key)
            assert not es.older(engine, es.targeted(engine), str(row["since"])), \
                f"{engine} {key}: the targeted version predates it, so every contract asking for it fails"
    for arch, rows in es.table()["miles_hardware"].items():
        assert all(r["source"] and es._key("miles", str(r["since"])) for r in rows), arch


@pytest.mark.engines
def test_sglang_rows_are_in_the_targeted_sglang_parser():
    vs = pytest.importorskip("pcc.lower.verify_sglang")
    try:
        _, parser = vs._server_args()
    except vs.EngineMissing as exc:
        pytest.skip(str(exc))
    import sglang

    assert sglang.__version__ == es.targeted("sglang")
    actions = {o: a for a in parser._actions for o in a.option_strings}
    for key in SUPPORT["sglang"]:
        flag, value = _split(key)
        assert flag in actions, key
        assert value is None or value in actions[flag].choices, key


@pytest.mark.engines
def test_transformer_engine_rows_are_in_the_targeted_recipe_module():
    vm = pytest.importorskip("pcc.lower.verify_megatron")
    try:
        recipe = vm.recipe_module()
    except vm.EngineMissing as exc:
        pytest.skip(str(exc))
    assert (vm.te_dir() / f"transformer_engine-{es.targeted('transformer_engine')}.dist-info").is_dir()
    source = (vm.te_dir() / "transformer_engine" / "common" / "recipe" / "__init__.py").read_text()
    for key in SUPPORT["transformer_engine"]:
        flag, value = _split(key)
        if flag.startswith("--"):
            assert hasattr(recipe, TE_CLASSES[value]), key
        else:
            assert flag in source, key


@pytest.mark.parametrize("engine", ["megatron", "miles"])
def test_fork_and_miles_rows_are_in_their_parsers_at_the_targeted_commit(engine):
    """targets/miles_flags.json is generated from the targeted commits (its sources name them)."""
    commit = FLAGS["sources"][engine]["commit"]
    assert commit[:9] in es.table()["target"][engine]["source"]
    for key in SUPPORT[engine]:
        flag, value = _split(key)
        if not flag.startswith("--"):
            continue  # environment variables read by the engine's code, not its parser
        d = FLAGS["flags"][flag]
        assert d["from"] == engine, key
        assert value is None or value in d["choices"], key


def _compile(tmp_path, text: str):
    path = tmp_path / "c.prec"
    path.write_text(text, encoding="utf-8")
    return compile_file(str(path))


def _target(monkeypatch, engine: str, version: str):
    monkeypatch.setitem(es.table()["target"], engine, {**es.table()["target"][engine], "version": version})


def test_shipped_contracts_need_nothing_newer_than_the_targets():
    for path in CONTRACTS:
        assert "PCC614" not in {d.code for d in compile_file(str(path)).diagnostics}, path.name


MXFP8 = ("contract c {\n  model qwen3_30b_a3b\n  hardware B200\n  rollout sglang { experts : mxfp8 }\n"
         "  trainer megatron { }\n  routing replay rollout\n}\n")


def test_an_older_sglang_without_the_quantization_is_pcc614_on_the_rule(tmp_path, monkeypatch):
    assert not [d for d in _compile(tmp_path, MXFP8).diagnostics if d.is_error]
    _target(monkeypatch, "sglang", "0.5.5")
    c = _compile(tmp_path, MXFP8)
    d = next(d for d in c.diagnostics if d.code == "PCC614")
    assert d.is_error and not c.ok and (d.span.line, d.span.col) == (4, 20)
    assert "SGLang 0.5.5" in d.message and "--quantization mxfp8" in d.message and "0.5.14" in d.message


def test_an_older_sglang_without_routed_experts_is_pcc614_on_routing_replay(tmp_path, monkeypatch):
    _target(monkeypatch, "sglang", "0.5.5")
    text = MXFP8.replace("experts : mxfp8", "experts : fp8_block")
    d = next(d for d in _compile(tmp_path, text).diagnostics if d.code == "PCC614")
    assert "--enable-return-routed-experts" in d.message and d.span.line == 6


def test_an_older_transformer_engine_without_nvfp4_is_pcc614_on_the_trainer_rule(tmp_path, monkeypatch):
    _target(monkeypatch, "transformer_engine", "2.7")
    c = compile_file(str(ROOT / "contracts/selective_nvfp4.prec"))
    d = next(d for d in c.diagnostics if d.code == "PCC614")
    assert "Transformer Engine 2.7" in d.message and "nvfp4" in d.message
    assert (d.span.line, d.span.col) == (17, 5)  # fprop experts : nvfp4 real


def test_an_older_miles_without_disk_delta_sync_is_pcc614_on_sync(tmp_path, monkeypatch):
    text = MXFP8.replace("B200", "H100").replace("experts : mxfp8", "experts : fp8_block").replace(
        "routing replay rollout", "routing replay rollout\n  sync full_weights { schedule async max_staleness 1 transfer disk }")
    plan = _compile(tmp_path, text).plan
    assert "disk-delta" in lower(plan, "miles").args
    _target(monkeypatch, "miles", "2026-07-01")
    d = next(d for d in _compile(tmp_path, text).diagnostics if d.code == "PCC614")
    assert "disk-delta" in d.message and "01a6d7bb7" in d.message and d.span.line == 7


def test_miles_on_cdna4_ran_block_fp8_only_from_its_amd_launcher(tmp_path, monkeypatch):
    text = MXFP8.replace("B200", "MI355X").replace("experts : mxfp8", "experts : fp8_block")
    assert "PCC615" not in {d.code for d in _compile(tmp_path, text).diagnostics}
    _target(monkeypatch, "miles", "2026-07-01")  # before miles#1465
    d = next(d for d in _compile(tmp_path, text).diagnostics if d.code == "PCC615")
    assert not d.is_error and "BF16 only" in d.message and d.span.line == 4


def test_version_order():
    assert es.older("sglang", "0.5.5", "0.5.14") and not es.older("sglang", "0.5.23", "0.5.14")
    assert es.older("miles", "2026-07-01", "2026-07-15")
    with pytest.raises(ValueError):
        es._key("sglang", "latest")
