"""The example contracts in contracts/: clean, canonical, and the same plan in every syntax."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pcc.contract.io import export, load
from pcc.plan import compile_file
from pcc.plan.dump import plan_json

ROOT = Path(__file__).resolve().parent.parent
CONTRACTS = sorted((ROOT / "contracts").glob("*.prec"))
# The warnings each example is allowed, and why (also stated in the contract's header).
ALLOWED_WARNINGS = {
    # MLA kv_a projection [576, 6144] pads its edge 128x128 blocks; FP8 rollout with a
    # BF16 trainer at 16K tokens (seed: drifts from 8K).
    "glm52_fp8_rollout.prec": {"PCC205", "PCC407"},
    # tiny_moe is smaller than one 128x128 block; requantizing a tiny model every update.
    "tiny_cpu.prec": {"PCC205", "PCC409"},
    # The child's trainer rules override the parent's real-FP8 'gemm' rule everywhere.
}
EXPECTED = {
    "bf16_baseline.prec", "unified_fp8.prec", "unified_fp8_fake_fwd.prec", "unified_fp8_fake_fwd_bwd.prec",
    "int4_qat_w4a16.prec", "mxfp8_blackwell.prec", "selective_nvfp4.prec", "k3_mxfp4_lora.prec",
    "glm52_fp8_rollout.prec", "qwen38_nvfp4_lora.prec", "miles_mode1.prec", "tiny_cpu.prec",
}


def _ids(p: Path) -> str:
    return p.name


_COMPILED: dict[Path, object] = {}


def _compiled(path: Path):
    if path not in _COMPILED:
        _COMPILED[path] = compile_file(str(path))
    return _COMPILED[path]


def test_the_seed_configurations_are_all_here() -> None:
    assert EXPECTED <= {p.name for p in CONTRACTS}


@pytest.mark.parametrize("path", CONTRACTS, ids=_ids)
def test_contract_checks_clean(path: Path) -> None:
    c = _compiled(path)
    errors = [d.render(c.sources) for d in c.diagnostics if d.is_error]
    assert c.ok and not errors, "\n".join(errors)
    warnings = {d.code for d in c.diagnostics if not d.is_error}
    allowed = ALLOWED_WARNINGS.get(path.name, set())
    assert warnings <= allowed, f"{path.name}: unexpected warnings {sorted(warnings - allowed)}"
    assert path.read_text(encoding="utf-8").startswith("#"), "each example starts with a header comment"


def test_contracts_are_formatted() -> None:
    every = sorted((ROOT / "contracts").rglob("*.prec"))  # the framework and target variants too
    proc = subprocess.run([sys.executable, "-m", "pcc.cli", "fmt", "--check", *map(str, every)],
                          capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize("fmt", ["json", "yaml"])
@pytest.mark.parametrize("path", CONTRACTS, ids=_ids)
def test_export_compiles_to_the_same_plan(path: Path, fmt: str, tmp_path: Path) -> None:
    loaded = load(str(path))
    original = _compiled(path)
    assert original.plan is not None
    out = tmp_path / f"{path.stem}.{fmt}"
    out.write_text(export(loaded.contract, fmt), encoding="utf-8")
    again = compile_file(str(out))
    assert again.ok, "\n".join(d.render() for d in again.diagnostics)
    assert plan_json(again.plan) == plan_json(original.plan)


def test_child_contract_matches_parent_plus_overrides(tmp_path: Path) -> None:
    """A child's plan differs from its parent's only where its rules override."""
    parent = _compiled(ROOT / "contracts" / "unified_fp8.prec").plan
    child = _compiled(ROOT / "contracts" / "unified_fp8_fake_fwd.prec").plan
    ops = child.catalog.operators
    assert [parent.scheme_name("rollout", i) for i in range(len(ops))] == \
           [child.scheme_name("rollout", i) for i in range(len(ops))]
    q = next(i for i, op in enumerate(ops) if op.family == "attn.q")
    assert parent.decision("fprop", q).gemm == "real"
    assert child.decision("fprop", q).gemm == "qdq"
    assert child.scheme_name("dgrad", q) == child.scheme_name("wgrad", q) == "bf16"


def test_child_export_stands_alone(tmp_path: Path) -> None:
    """A child's export is the merged contract: recompiling it does not merge the parent twice."""
    src = ROOT / "contracts"
    for name in ("unified_fp8.prec", "unified_fp8_fake_fwd.prec"):
        shutil.copy(src / name, tmp_path / name)
    child = tmp_path / "unified_fp8_fake_fwd.prec"
    out = tmp_path / "unified_fp8_fake_fwd.json"
    out.write_text(export(load(str(child)).contract, "json"), encoding="utf-8")
    assert plan_json(compile_file(str(out)).plan) == plan_json(_compiled(src / "unified_fp8_fake_fwd.prec").plan)
