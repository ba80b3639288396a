"""One failing (or warning) contract per diagnostic code: tests/check_fixtures/.

Each fixture's first line is ``# expect: PCCnnn [FILE:]LINE[:COL]``: the code the
compiler must report, and where (FILE when the diagnostic points into another
file, e.g. the second half of an extends cycle). Files whose names do not start
with ``PCC`` are helpers of another fixture (cycle_b.prec), not fixtures.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from pcc.lang.codes import CODES
from pcc.lower import compile_file  # resolve, check and lower for every target: what `pcc check` runs

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "check_fixtures"
DOCS = ROOT / "docs" / "checks.md"
EXPECT = re.compile(rb"^# expect: (PCC\d{3})(?: (?:(?P<file>[\w\-]+\.(?:prec|yaml|yml|json)):)?(?P<line>\d+)(?::(?P<col>\d+))?)?\s*$")
# Codes no input file can produce: each has its own test below instead of a fixture.
NO_FIXTURE = {
    # PCC8xx: diagnostics of `pcc import` about its source (a checkpoint config, a Miles launch), not of a
    # contract's text; tests/importer/test_import.py triggers each (PCC811-PCC812: test_hostile_round3_import.py)
    "PCC801": "a source pcc import cannot import", "PCC802": "a source entry that matches nothing",
    "PCC803": "the source's precedence differs from pcc's", "PCC804": "a source setting pcc states differently",
    "PCC805": "a source that is no RL job",
    "PCC806": "a source entry the consuming engine ignores", "PCC807": "an engine switch pcc has no field for",
    "PCC808": "a contract field the source does not carry", "PCC809": "a launch that contradicts its checkpoint",
    "PCC810": "a source key its tool does not have",
    "PCC811": "a source past the import's bounds", "PCC812": "a bundle file outside its bundle",
    "PCC100": "the parser's defensive catch-all; see test_pcc100_internal_parser_failure",
    # PCC7xx: errors of running a bundle, not of a contract's text (test_running_errors_carry_codes)
    "PCC701": "a bundle that cannot be written or read", "PCC702": "a checkpoint conversion that cannot go on",
    "PCC703": "the embedded runtime cannot run", "PCC704": "an engine did not do what was asked",
    "PCC705": "diff cannot compare",
    # PCC208-PCC211: faults of a model directory, not of a contract's text; pcc.plan.load_model reports
    # them under PCC204 at `model from`. tests/models/test_models_inputs.py checks each code.
    "PCC208": "a quantized checkpoint pcc cannot read", "PCC209": "config.json pcc would misread",
    "PCC210": "a checkpoint file of the wrong form", "PCC211": "a checkpoint file outside its directory",
    # an input that is no regular file cannot be a committed fixture (tests/lang/test_inputs.py)
    "PCC109": "a link to /dev/zero, a FIFO", "PCC706": "a bundle that does not match its manifest",
    "PCC707": "a run directory refused", "PCC708": "a setting out of range", "PCC709": "an output the disk refused",
    # checkpoint files and destinations of `pcc convert`: tests/convert/test_convert_hostile.py checks each code
    "PCC710": "a corrupt safetensors header", "PCC711": "a destination convert will not replace",
    "PCC712": "a shard changed after conversion", "PCC713": "an adapter that cannot be read",
    "PCC714": "a checkpoint file outside its directory",
    # a model pcc.lower.fsdp_apply refuses: tests/lower/test_fsdp_apply.py checks it on a real model
    "PCC715": "a model that does not match trainer/fsdp.json",
    # a verl launch argument that replaces the trainer config the contract decides: tests/test_hostile_new_targets.py
    "PCC716": "a launch argument that switches verl's trainer config",
    # a job file argument holding a control or blank character: tests/test_hostile_round3_run.py
    "PCC717": "a job file argument a terminal does not show as it is",
    # a target lowered directly for a contract that names another engine (no contract does that;
    # tests/lower/test_lower_fsdp.py lowers a Megatron contract for fsdp)
    "PCC611": "a target asked to lower a contract whose engine is another",
    # the shipped targets/engines.yaml targets versions that have everything pcc emits
    "PCC614": "an engine version older than targets/engines.yaml names (tests/lower/test_engine_support.py)",
}


def _fixtures() -> list[Path]:
    return sorted(p for p in FIXTURES.iterdir() if p.name.startswith("PCC") and p.is_file())


def _expectation(path: Path) -> tuple[str, str | None, int | None, int | None]:
    first = path.read_bytes().split(b"\n", 1)[0]
    m = EXPECT.match(first)
    assert m, f"{path.name}: first line must be '# expect: PCCnnn LINE:COL', got {first!r}"
    code = m.group(1).decode()
    file = m.group("file").decode() if m.group("file") else None
    line = int(m.group("line")) if m.group("line") else None
    col = int(m.group("col")) if m.group("col") else None
    return code, file, line, col


def _codes_in_source() -> set[str]:
    """Every code pcc's source names as a string, outside the table itself."""
    codes = set()
    for py in (ROOT / "pcc").rglob("*.py"):
        if py != ROOT / "pcc" / "lang" / "codes.py":
            codes.update(re.findall(r"[\"'](PCC\d{3})[\"']", py.read_text(encoding="utf-8")))
    return codes


@pytest.mark.parametrize("path", _fixtures(), ids=lambda p: p.name)
def test_fixture_reports_its_code(path: Path) -> None:
    code, file, line, col = _expectation(path)
    assert path.name.startswith(code + "_"), f"{path.name}: file name and '# expect' code disagree"
    compiled = compile_file(str(path))
    diags = compiled.diagnostics
    assert {d.code for d in diags} == {code}, (
        f"{path.name}: expected only {code}, got:\n" + "\n".join(d.render() for d in diags))
    hits = [d for d in diags if d.code == code]
    if line is not None:
        want_file = file or path.name
        at = [d for d in hits if d.span is not None and Path(d.span.file).name == want_file
              and d.span.line == line and (col is None or d.span.col == col)]
        assert at, (f"{path.name}: {code} expected at {want_file}:{line}:{col}, got "
                    + ", ".join(d.location() for d in hits))
    if any(d.is_error for d in hits):
        assert not compiled.ok
    else:
        assert compiled.ok, f"{path.name}: a warning-only fixture must still compile"


def test_the_code_table_is_what_the_source_raises() -> None:
    """pcc/lang/codes.py lists exactly the codes pcc reports: none missing, none retired."""
    used = _codes_in_source()
    assert len(used) >= 30, used  # the grep itself works
    assert not used - set(CODES), f"codes missing from pcc/lang/codes.py: {sorted(used - set(CODES))}"
    assert not set(CODES) - used, f"codes in pcc/lang/codes.py that pcc no longer reports: {sorted(set(CODES) - used)}"
    assert {c.severity for c in CODES.values()} <= {"error", "warning"}
    assert all(c.title and c.title == c.title.strip() for c in CODES.values())


def test_every_code_has_a_fixture_and_a_doc_section() -> None:
    codes = set(CODES)
    fixtures = {p.name[:6] for p in _fixtures()}
    missing = sorted(codes - fixtures - set(NO_FIXTURE))
    assert not missing, f"codes without a fixture in tests/check_fixtures/: {missing}"
    stale = sorted(fixtures - codes)
    assert not stale, f"fixtures for codes the compiler no longer emits: {stale}"
    doc = DOCS.read_text(encoding="utf-8")
    sections = set(re.findall(r"^## (PCC\d{3}): \S", doc, flags=re.M))
    undocumented = sorted(codes - sections)
    assert not undocumented, f"codes without a '## PCCnnn: title' section in docs/checks.md: {undocumented}"
    titles = dict(re.findall(r"^## (PCC\d{3}): (.*?)\s*$", doc, flags=re.M))
    differ = [c for c in codes if CODES[c].title != titles[c]]
    assert not differ, f"titles that differ between pcc/lang/codes.py and docs/checks.md: {sorted(differ)}"


def test_pcc100_internal_parser_failure(monkeypatch, tmp_path: Path) -> None:
    """PCC100 is the parser's guard against anything lark raises besides a syntax error."""
    from lark.exceptions import LarkError

    from pcc.lang import parser

    class Broken:
        def parse(self, text, start):
            raise LarkError("internal failure")

    monkeypatch.setattr(parser, "_lark", lambda: Broken())
    p = tmp_path / "any.prec"
    p.write_text("contract any { model tiny_dense hardware cpu }\n", encoding="utf-8")
    compiled = compile_file(str(p))
    assert [d.code for d in compiled.diagnostics] == ["PCC100"]
    assert not compiled.ok


def test_cli_check_json_shape() -> None:
    path = FIXTURES / "PCC301_nvfp4_on_hopper.prec"
    proc = subprocess.run([sys.executable, "-m", "pcc.cli", "check", "--json", str(path)],
                          capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert proc.returncode == 1, proc.stderr
    env = json.loads(proc.stdout)
    assert env["command"] == "check" and env["ok"] is False and env["exit_code"] == 1
    [out] = env["result"]  # one entry per file, always a list
    assert out["file"] == str(path)
    assert out["ok"] is False
    assert out["errors"] == 1 and out["warnings"] == 0
    assert out["model"] == "tiny_moe" and out["operators"] > 0
    [diag] = env["diagnostics"]
    assert diag["code"] == "PCC301" and diag["severity"] == "error"
    assert (diag["line"], diag["col"]) == (6, 5)
    assert Path(diag["file"]).name == path.name
    assert "nvfp4" in diag["message"] and diag["hint"]


def test_cli_check_clean_exit_zero() -> None:
    path = ROOT / "contracts" / "bf16_baseline.prec"
    proc = subprocess.run([sys.executable, "-m", "pcc.cli", "check", "--json", str(path)],
                          capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert proc.returncode == 0, proc.stderr
    env = json.loads(proc.stdout)
    [out] = env["result"]
    assert env["ok"] is True and out["errors"] == 0 and env["diagnostics"] == []


def test_running_errors_carry_codes(tmp_path: Path) -> None:
    """Errors of running (PCC7xx) share the root PccError and reach --json with their code."""
    from pcc.bundle import BundleError
    from pcc.convert import ConvertError
    from pcc.diff.load import DiffError
    from pcc.lang.diagnostics import PccError
    from pcc.models import CatalogError
    from pcc.runtime.contract import ContractError
    from pcc.runtime.model import ArchError
    from pcc.runtime.sync import SyncError
    from pcc.validate.engine import EngineError

    codes = {BundleError: "PCC701", ConvertError: "PCC702", ContractError: "PCC703", ArchError: "PCC703",
             SyncError: "PCC703", EngineError: "PCC704", DiffError: "PCC705", CatalogError: "PCC204"}
    for cls, code in codes.items():
        assert issubclass(cls, PccError) and cls.code == code, cls
    (tmp_path / "empty").mkdir()
    proc = subprocess.run([sys.executable, "-m", "pcc.cli", "verify-checkpoint", "--json",
                           str(ROOT / "contracts" / "tiny_cpu.prec"), str(tmp_path / "empty")],
                          capture_output=True, text=True, cwd=ROOT, timeout=120)
    env = json.loads(proc.stdout)
    assert proc.returncode == 1 and not env["ok"]
    assert [d["code"] for d in env["diagnostics"]] == ["PCC702"], env

