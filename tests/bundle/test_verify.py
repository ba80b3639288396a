"""`pcc compile --verify`: every shipped contract's bundle is accepted by the engines' own parsers.

Needs requirements/install-engines.sh; with CI=true a missing parser fails instead of skipping.
"""

import json
import os
from pathlib import Path

import pytest

from pcc.cli import main

ROOT = Path(__file__).resolve().parents[2]
CONTRACTS = sorted((ROOT / "contracts").glob("*.prec"))


@pytest.fixture(scope="module")
def engines():
    try:
        import sglang.srt.server_args  # noqa: F401

        from pcc.lower import verify_megatron as vm

        vm._arguments()
    except ImportError as exc:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI must run the engine checks: {exc}")
        pytest.skip(f"engine parsers not installed ({exc}): bash requirements/install-engines.sh")


@pytest.mark.parametrize("path", CONTRACTS, ids=lambda p: p.stem)
def test_compile_verify_accepts_every_shipped_contract(engines, path, tmp_path, capsys):
    assert main(["compile", str(path), "-o", str(tmp_path / "b"), "--verify", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)["result"]
    assert [(v["target"], v["ok"]) for v in out["verify"]] == [("megatron", True), ("sglang", True)], out["verify"]


def test_compile_verify_checks_a_verl_contract_with_vllm_and_verl(engines, tmp_path, capsys):
    """A bundle's verification runs each of its targets' own checks: a verl contract with a vLLM rollout is
    checked by megatron-core, vLLM (its arguments and checkpoint config) and verl (its composed Hydra config)."""
    from pcc.lower import verify_verl, verify_vllm

    for engine in (verify_vllm, verify_verl):
        if not engine.engine_dir().is_dir():
            if os.environ.get("CI") == "true":
                pytest.fail(f"CI must run the engine checks: {engine.engine_dir()} is missing")
            pytest.skip(f"{engine.engine_dir()} is missing: bash requirements/install-engines.sh")
    path = ROOT / "contracts" / "verl" / "unified_fp8.prec"
    assert main(["compile", str(path), "-o", str(tmp_path / "b"), "--verify", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)["result"]
    assert [(v["target"], v["ok"]) for v in out["verify"]] == [("megatron", True), ("vllm", True), ("verl", True)]


def test_an_engine_rejection_names_the_rule_that_asked(engines, tmp_path, capsys, monkeypatch):
    """SGLang's own parser rejects a --kv-cache-dtype it does not have: the report names the setting and
    the contract rule (file:line) whose record asked for it, read from the records, not reconstructed.
    (Lowering already refuses such a record through SGLang's engine table, PCC614; with that check off, as
    when the table has drifted from the installed SGLang, the engine's own parser is what catches it.)"""
    from pcc.lower import miles, sglang

    table = {**sglang.tables(), "kv_cache_dtype": {**sglang.tables()["kv_cache_dtype"], "fp8_e4m3": "fp9_e9m9"}}
    monkeypatch.setattr(sglang, "tables", lambda: table)
    for target in (sglang, miles):  # SGLang's records, and Miles' --sglang-<field> copies of them
        monkeypatch.setattr(target, "check_flags", lambda *args: None)
    path = ROOT / "contracts" / "glm52_fp8_rollout.prec"
    assert main(["compile", str(path), "-o", str(tmp_path / "b"), "--verify", "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    (bad,) = [v for v in doc["result"]["verify"] if not v["ok"]]
    assert bad["target"] == "sglang" and "fp9_e9m9" in bad["message"]
    assert (bad["key"], bad["path"]) == ("--kv-cache-dtype", "rollout.rules[1]")
    assert bad["rule"] == f"{path}:18:5"
    assert any(f"is asked by {path}:18:5" in d["message"] for d in doc["diagnostics"])
