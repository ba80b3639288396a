"""The validation tests run as `pcc run` does: the intra-op thread count from PCC_THREADS (default 1),
and a warm-start cache of their own (not the user's ~/.cache/pcc), shared with tests/runtime."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

os.environ.setdefault("PCC_CACHE", str(Path(tempfile.gettempdir()) / "pcc-test-cache"))

from pcc.runtime.session import set_threads  # noqa: E402

set_threads()
