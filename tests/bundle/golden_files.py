"""How a golden bundle stores a bundle's files (tests/bundle/test_golden.py, tests/lower/test_lower_vllm.py)."""

import hashlib
from pathlib import Path

from pcc.lower.vllm import WORKER

ROOT = Path(__file__).resolve().parents[2]
LARGE = 64 << 10
# Bundle files that are a pcc module's source, shipped as a file: golden as the module's path.
SHIPPED = {WORKER: "pcc/lower/vllm_worker.py"}


def expected_files(files: dict[str, str]) -> dict[str, str]:
    out = {}
    for path, text in files.items():
        data = text.encode()
        if path in SHIPPED and text == (ROOT / SHIPPED[path]).read_text(encoding="utf-8"):
            out[path + ".source"] = SHIPPED[path] + "\n"
        elif len(data) > LARGE:
            out[path + ".sha256"] = hashlib.sha256(data).hexdigest() + "\n"
        else:
            out[path] = text
    return out
