"""HttpEngine against a server speaking SGLang's endpoints and JSON shapes (sglang_stub), backed by
the embedded runtime: the fixed-prefix, routes and live-update levels pass through it, and the
partial version it is sent is refused over HTTP."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from pcc.runtime.contract import compile_for_runtime  # noqa: E402
from pcc.runtime.model import Arch  # noqa: E402
from pcc.validate.context import ValidateConfig  # noqa: E402
from pcc.validate.ladder import validate  # noqa: E402
from pcc.validate.local import LocalEngine  # noqa: E402
from sglang_stub import Stub  # noqa: E402

from test_validate_ladder import CFG  # noqa: E402


@pytest.mark.parametrize("contract", ["contracts/tiny_cpu.prec"])
def test_http_engine_levels_4_to_6(tmp_path, contract):
    plan = compile_for_runtime(contract).plan
    engine = LocalEngine(plan, Arch.from_catalog(plan.catalog))
    with Stub(engine) as stub:
        r = validate(contract, [4, 5, 6], tmp_path, engine=stub.url, cfg=ValidateConfig(**CFG), plots=False)
    by = {lv["level"]: lv for lv in r["levels"]}
    assert r["ok"], [(lv["level"], lv["error"], lv["findings"]) for lv in r["levels"]]
    assert by[4]["figures"]["served version"] == 0
    assert by[5]["figures"]["route_agreement"] >= 0.98  # expert ids decoded from base64 int32
    assert by[6]["figures"]["partial versions served"] == 0
    assert by[6]["figures"]["active version"] == 1


@pytest.mark.parametrize("moves, name", [("full_weights", "model.safetensors"), ("full_weights", "pcc_manifest.json"),
                                         ("adapter", "adapter_model.safetensors"), ("adapter", "adapter_config.json")])
def test_a_version_install_cut_short_leaves_no_half_file(tmp_path, full_disk_at, moves, name):
    """The files a server loads a version from go through pcc.lang.outputs: a write cut short (here the
    rename, as after a kill) leaves those before it whole, none of its own, and no temporary."""
    import torch

    from pcc.validate.engine import Version
    from pcc.validate.http_client import HttpClient

    plan = compile_for_runtime("contracts/tiny_cpu.prec").plan
    client = HttpClient("http://127.0.0.1:9", tmp_path, plan, None)
    full_disk_at(name)
    with pytest.raises(OSError, match="No space left"):
        client.install(Version(1, moves, {"w": torch.ones(2)}, {"version": 1}))
    written = [p.name for p in tmp_path.glob("*/*")]
    assert name not in written and not [n for n in written if n.startswith(".")], written
