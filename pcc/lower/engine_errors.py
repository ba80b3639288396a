"""The two errors every engine check raises (pcc.lower.verify_*, side_folder, pcc.importer's reading of
verl's configs), defined once so a caller catches one class whichever engine it asked.

Each keeps its builtin base: `pcc compile --verify` tells a missing engine (ImportError) from a rejection.
"""

from __future__ import annotations

from pcc.lang.diagnostics import PccError


class VerifyError(PccError, ValueError):
    """The engine rejected the input (the message is the engine's, or says which check)."""


class EngineMissing(PccError, ImportError):
    """The engine, or its side folder, is not installed here, or its checks could not run."""
