"""What the published-corpus tests share (Miles/verl launches, NeMo RL recipes): import a copy as a user
would, check and compile what it gives, and compare the outcome with the corpus's expected.json."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Callable

from pcc.importer import import_source
from pcc.lang.diagnostics import PccError
from pcc.lower import compile_file

UPDATE = os.environ.get("PCC_UPDATE_GOLDEN") == "1"


class Expected:
    """A corpus's expected.json: one recorded outcome per copy (PCC_UPDATE_GOLDEN=1 rewrites it)."""

    def __init__(self, file: Path):
        self.file = file
        self.cases = json.loads(file.read_text()) if file.is_file() else {}

    def check(self, case: str, got: dict, lost: list[str]) -> None:
        if UPDATE:
            self.cases[case] = got
            self.file.write_text(json.dumps(dict(sorted(self.cases.items())), indent=1) + "\n")
        assert not got["outcome"].startswith("check"), f"{case}: the imported contract does not check: {got}"
        assert got == self.cases.get(case), case
        assert not lost, f"{case}: settings the round trip changes and no warning names: {lost}"


def outcome(kind: str, path: Path, model: str | None, tmp_path: Path, lost: Callable, *,
            paths: bool) -> tuple[dict, list[str]]:
    """Import, check and compile one copy: its record (refusal code, check errors, or the warnings it got;
    with `paths` each with the key it names) and the settings its round trip loses (`lost(imp, plan)`)."""
    try:
        imp = import_source(kind, str(path), model=model)
    except PccError as exc:
        refused = {"model": model, "outcome": exc.code}
        return ({**refused, "path": exc.path} if paths else refused), []
    out = tmp_path / "imported.prec"
    out.write_text(imp.text())
    compiled = compile_file(str(out))
    errors = sorted({d.code for d in compiled.diagnostics if d.severity == "error"})
    if errors:
        return {"model": model, "outcome": "check " + " ".join(errors)}, []
    warnings = sorted({f"{d.code} {d.path}" if paths else d.code for d in imp.diagnostics})
    return {"model": model, "outcome": "compiled", "warnings": warnings}, lost(imp, compiled.plan)
