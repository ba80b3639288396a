"""Shared setup for the runtime tests: a warm-start cache shared across tests (not the user's), the
runtime's intra-op thread count (PCC_THREADS, default 1, as `pcc run`), small run configs."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

os.environ.setdefault("PCC_CACHE", str(Path(tempfile.gettempdir()) / "pcc-test-cache"))

from pcc.runtime.contract import compile_for_runtime  # noqa: E402
from pcc.runtime.loop import RunConfig  # noqa: E402
from pcc.runtime.session import set_threads  # noqa: E402

set_threads()
ROOT = Path(__file__).resolve().parents[2]
CONTRACTS = ROOT / "contracts"


def plan(name: str, model: str | None = "tiny_moe"):
    return compile_for_runtime(str(CONTRACTS / f"{name}.prec"), model).plan


def small(steps: int = 2, prompts: int = 8, group: int = 4, **kw) -> RunConfig:
    return RunConfig(steps=steps, prompts=prompts, group=group, **kw)
