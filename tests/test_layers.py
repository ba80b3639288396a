"""pcc's packages import in one direction only: a stage may import its own stage and earlier
ones, never a later one. docs/architecture.md.

Every pcc/**/*.py is parsed with `ast`; module-level and function-level imports count
(`import pcc.x`, `from pcc.x import y`, `from pcc import x`, relative imports, and
`importlib.import_module("pcc.x")` with a literal name).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PCC = ROOT / "pcc"

# The stage order, earliest first. "pcc" is the package root (pcc/__init__.py: __version__);
# every other entry is pcc/<name>/ or pcc/<name>.py. Per-package cli.py modules belong to their
# package's stage; pcc/cli.py, the `pcc` command, is last.
STAGES = [
    "pcc",        # __version__
    "resources",  # the data folders (grammar, schemas, contracts, targets)
    "objcode",    # a kernel's cached object code loaded without LLVM (ELF, x86-64)
    "fused",      # the LLVM block-FP8 kernel: no torch, no numpy (numerics and convert's torch-free path)
    "lang",       # parser, spans, diagnostics, formatter
    "contract",   # the pydantic model; the scheme defined once
    "numerics",   # formats and quantizers; takes the contract's scheme objects
    "models",     # architecture catalogs, checkpoint reading
    "plan",       # contract + catalog -> Plan; checks
    "lower",      # Plan -> per-target artifacts
    "bundle",     # the job directory, the Miles launch
    "runtime",    # the embedded CPU RL runtime
    "convert",    # rollout checkpoints (uses the runtime model for NVFP4 calibration)
    "validate",   # the ladder, on the runtime and converted checkpoints
    "diff",       # semantic contract diff
    "importer",   # pcc import: contracts from checkpoint configs and Miles launches
    "lsp",        # pcc lsp: the language server (editors), over plan and lower
    "cli",        # the `pcc` command
]
RANK = {name: i for i, name in enumerate(STAGES)}

# Known backwards imports, in files whose owners are removing them: (file relative to the
# repository root, imported module) -> why it is still here and who removes it. Delete an entry
# with the import; test_allowed_entries_are_still_needed fails on an entry that no longer matches.
#
# Empty: nothing in pcc imports a later stage. (pcc/numerics/scheme.py -> pcc.lang and
# pcc/runtime/cli.py -> pcc.bundle.launch are gone; pcc/lower/* -> pcc.plan.checks helpers is
# an import of an earlier stage, lower after plan, so it needs no entry.)
ALLOWED: dict[tuple[str, str], str] = {}

LEVEL_MODULE = re.compile(r"^pcc\.validate\.levels\.l\d+_\w+$")


def _module_of(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _stage_of_file(path: Path) -> str:
    parts = path.relative_to(PCC).parts
    if len(parts) == 1:
        return "pcc" if parts[0] == "__init__.py" else parts[0].removesuffix(".py")
    return parts[0]


def _is_pcc_module(name: str) -> bool:
    rel = Path(*name.split(".")[1:]) if "." in name else Path()
    return (PCC / rel).with_suffix(".py").is_file() or (PCC / rel / "__init__.py").is_file()


def _stage_of_module(name: str) -> str | None:
    parts = name.split(".")
    if parts[0] != "pcc":
        return None
    return parts[1] if len(parts) > 1 else "pcc"


def imports(path: Path, module: str | None = None) -> list[tuple[int, str]]:
    """(line, full module name) for every pcc import in `path` (the module `module`), at any depth."""
    module = module or _module_of(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            out.append((node.lineno, target))
            # `from pcc import runtime` / `from . import l4_scoring`: the names may be modules
            for a in node.names:
                sub = f"{target}.{a.name}"
                if target.startswith("pcc") and _is_pcc_module(sub):
                    out.append((node.lineno, sub))
        elif (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)
              and isinstance(node.args[0].value, str)
              and (getattr(node.func, "attr", None) or getattr(node.func, "id", None)) == "import_module"):
            out.append((node.lineno, node.args[0].value))
    return sorted(((line, name) for line, name in out if name == "pcc" or name.startswith("pcc.")), key=lambda x: x[0])


def _files() -> list[Path]:
    return sorted(PCC.rglob("*.py"))


def test_every_package_has_a_stage():
    stages = {_stage_of_file(f) for f in _files()}
    assert stages <= set(STAGES), f"place these in STAGES (and docs/architecture.md): {sorted(stages - set(STAGES))}"


def _backwards() -> list[tuple[str, int, str, str]]:
    found = []
    for f in _files():
        own = _stage_of_file(f)
        for line, name in imports(f):
            stage = _stage_of_module(name)
            if stage in RANK and RANK[stage] > RANK[own]:
                found.append((str(f.relative_to(ROOT)), line, name, stage))
    return found


def test_no_package_imports_a_later_stage():
    bad = [f"{file}:{line}: {own} imports {name} (stage {stage!r} comes later)"
           for file, line, name, stage in _backwards()
           for own in [_stage_of_file(ROOT / file)]
           if (file, name) not in ALLOWED]
    assert not bad, "imports against the stage order " + " < ".join(STAGES) + ":\n" + "\n".join(bad)


def test_allowed_entries_are_still_needed():
    live = {(file, name) for file, _, name, _ in _backwards()}
    stale = sorted(set(ALLOWED) - live)
    assert not stale, f"these imports are gone: delete their ALLOWED entries in tests/test_layers.py: {stale}"


def test_validate_levels_do_not_import_each_other():
    bad = []
    for f in sorted((PCC / "validate" / "levels").glob("*.py")):
        module = _module_of(f)
        if not LEVEL_MODULE.match(module):
            continue
        bad += [f"{f.relative_to(ROOT)}:{line}: imports {name}" for line, name in imports(f)
                if LEVEL_MODULE.match(name) and name != module]
    assert not bad, "a level module imports another level (share through levels/common.py):\n" + "\n".join(bad)


def test_the_scanner_sees_every_import_form(tmp_path):
    """The checks above are only as good as `imports`: each form resolves to its full module name."""
    src = tmp_path / "l9_fake.py"
    src.write_text("""
import os
import pcc.runtime.model
from pcc import __version__, runtime
from pcc.plan import compile_file
from . import Outcome, l4_scoring
from .common import readback
from ..expect import thresholds
import importlib


def later():
    from pcc.convert.tensors_gone import x
    importlib.import_module("pcc.diff.cli")
""")
    found = [name for _, name in imports(src, "pcc.validate.levels.l9_fake")]
    assert found == ["pcc.runtime.model", "pcc", "pcc.runtime", "pcc.plan", "pcc.validate.levels",
                     "pcc.validate.levels.l4_scoring", "pcc.validate.levels.common", "pcc.validate.expect",
                     "pcc.convert.tensors_gone", "pcc.diff.cli"]
    assert [_stage_of_module(n) for n in found][:4] == ["runtime", "pcc", "runtime", "plan"]
