"""Run an engine's own checks from its side folder (pip --target, requirements/install-engines.sh).

vLLM, verl, torchao and PEFT are installed beside pcc, never into its site-packages, so their
requirements cannot replace pcc's torch or transformers. A check runs `python -m MODULE` in a child
that appends the folder to sys.path and answers one JSON document on its last stdout line; the
child's import side effects stay out of the caller. pcc.lower.verify_vllm, verify_verl and
verify_fsdp each name their folder and module here and keep their own checks.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from pcc.lower.engine_errors import EngineMissing

TIMEOUT_S = 600


def folder(env_var: str, name: str) -> Path:
    """$env_var, else the venv's engines/NAME (where install-engines.sh puts it)."""
    return Path(os.environ.get(env_var) or Path(sys.prefix) / "engines" / name)


def run_child(module: str, where: Path, packages: tuple[str, ...], request: dict, what: str, hint: str,
              env: dict[str, str] | None = None) -> dict:
    """`python -m module` with `request` (plus {"dir": where}) on stdin; its last stdout line as JSON.
    EngineMissing when a package is absent from `where` or the child fails (`what` names the checks)."""
    missing = [p for p in packages if not (where / p / "__init__.py").is_file()]
    if missing:
        raise EngineMissing(f"{' and '.join(missing)} not installed in {where}; {hint}")
    child_env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | (env or {})
    proc = subprocess.run([sys.executable, "-m", module], input=json.dumps({"dir": str(where)} | request),
                          capture_output=True, text=True, timeout=TIMEOUT_S, env=child_env)
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        raise EngineMissing(f"{what} did not run (exit {proc.returncode}): {proc.stderr.strip()[-2000:]}")
    return json.loads(lines[-1])
