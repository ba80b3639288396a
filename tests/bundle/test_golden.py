"""Golden bundles: every shipped contract's bundle compared with checked-in expected files.

Update after an intended change (then review the diff):
    PCC_UPDATE_GOLDEN=1 python -m pytest tests/bundle/test_golden.py
contracts/vllm/X.prec, contracts/verl/X.prec, contracts/nemo_rl/X.prec and contracts/fsdp/X.prec have theirs in golden/vllm/X,
golden/verl/X, golden/nemo_rl/X and golden/fsdp/X.
Files over 64 KiB (the resolved plan and the converter plan of large models) are kept as
their sha256, and a file the bundle ships verbatim from pcc's own source (the vLLM worker extension) as
the path of that source (`X.source`), so the repository stays small; everything else is compared as text.
"""

import os
import shutil
import sys
from pathlib import Path

import pytest

from pcc.bundle.write import bundle_files
from pcc.plan import compile_file

sys.path.insert(0, str(Path(__file__).resolve().parent))
from golden_files import expected_files  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = Path(__file__).resolve().parent / "golden"
CONTRACTS = sorted(p for d in ("", "vllm", "verl", "nemo_rl", "fsdp") for p in (ROOT / "contracts" / d).glob("*.prec"))


def _name(path: Path) -> str:
    return str(path.relative_to(ROOT / "contracts").with_suffix(""))


@pytest.mark.parametrize("path", CONTRACTS, ids=_name)
def test_bundle_matches_golden(path):
    compiled = compile_file(str(path))
    assert compiled.ok
    files, _ = bundle_files(compiled.plan)
    expected = expected_files(files)
    folder = GOLDEN / _name(path)
    if os.environ.get("PCC_UPDATE_GOLDEN") == "1":
        shutil.rmtree(folder, ignore_errors=True)
        for rel, text in expected.items():
            (folder / rel).parent.mkdir(parents=True, exist_ok=True)
            (folder / rel).write_text(text)
    on_disk = {str(p.relative_to(folder)): p.read_text() for p in folder.rglob("*") if p.is_file()}
    assert sorted(on_disk) == sorted(expected), "bundle files changed; see the module docstring to update"
    for rel, text in expected.items():
        assert on_disk[rel] == text, f"{path.stem}/{rel} differs from the golden file"
