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
