"""Positioned diagnostics: `file:line:col: error[PCC301]: message`, caret, hint.

Every stage reports through :class:`Diagnostic`; nothing user-facing raises a
bare exception. Codes are stable and documented in docs/checks.md.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from typing import Iterable


@dataclass(frozen=True, slots=True)
class Span:
    """A source range; lines and columns are 1-based, end is exclusive."""

    file: str
    line: int
    col: int
    end_line: int | None = None
    end_col: int | None = None

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.col}"


@dataclass(frozen=True, slots=True)
class Diagnostic:
    code: str
    severity: str  # "error" | "warning"
    message: str
    span: Span | None = None
    hint: str | None = None
    path: str | None = None  # where in the canonical contract, when no span exists
    file: str | None = None

    @property
    def is_error(self) -> bool:
        return self.severity == "error"

    def location(self) -> str:
        if self.span is not None:
            return str(self.span)
        where = self.file or "<contract>"
        return f"{where}: {self.path}" if self.path else where

    def render(self, sources: dict[str, str] | None = None) -> str:
        """The human form, with the source line and a caret when we have it."""
        out = [f"{self.location()}: {self.severity}[{self.code}]: {self.message}"]
        text = (sources or {}).get(self.span.file) if self.span else None
        if text is not None:
            lines = text.splitlines()
            if 0 < self.span.line <= len(lines):
                src = lines[self.span.line - 1]
                if len(src) > 200:
                    src = src[:200] + "…"
                width = 1
                if self.span.end_line == self.span.line and self.span.end_col:
                    width = max(1, self.span.end_col - self.span.col)
                gutter = f"{self.span.line:>5} | "
                out.append(gutter + src.expandtabs(1))
                pad = min(self.span.col - 1, 200)
                out.append(" " * (len(gutter) - 2) + "| " + " " * pad + "^" * min(width, 80))
        if self.hint:
            out.append(f"  = hint: {self.hint}")
        return "\n".join(out)

    def to_json(self) -> dict:
        d = {"code": self.code, "severity": self.severity, "message": self.message}
        if self.span is not None:
            d.update(file=self.span.file, line=self.span.line, col=self.span.col)
        elif self.file:
            d["file"] = self.file
        if self.path:
            d["path"] = self.path
        if self.hint:
            d["hint"] = self.hint
        return d


class PccError(Exception):
    """The root of pcc's own errors: each carries a stable code (docs/checks.md) and, where it
    has one, the contract path it is about, so every caller can turn it into a Diagnostic."""

    code = ""  # each subclass or raise names its own

    def __init__(self, message: str, code: str | None = None, path: str | None = None, hint: str | None = None):
        super().__init__(message)
        self.message, self.path, self.hint = message, path, hint
        if code is not None:
            self.code = code

    def diagnostic(self, span: Span | None = None, file: str | None = None) -> Diagnostic:
        return Diagnostic(self.code, "error", self.message, span, self.hint, None if span else self.path, file)


class DiagnosticError(PccError):
    """Raised when a stage cannot go on; carries every diagnostic so far, and the text of the files
    read so far (`sources`, for carets: a caller never reads a file a second time to show one)."""

    def __init__(self, diagnostics: Iterable[Diagnostic], sources: dict[str, str] | None = None):
        self.diagnostics = list(diagnostics)
        self.sources = dict(sources or {})
        first = self.diagnostics[0] if self.diagnostics else None
        super().__init__("\n".join(d.render() for d in self.diagnostics), first.code if first else None)


@dataclass
class Reporter:
    """Collects diagnostics for one stage; `fail()` stops when errors exist."""

    diagnostics: list[Diagnostic] = field(default_factory=list)

    def error(self, code: str, message: str, span: Span | None = None, hint: str | None = None,
              path: str | None = None) -> None:
        self.diagnostics.append(Diagnostic(code, "error", message, span, hint, path))

    def warning(self, code: str, message: str, span: Span | None = None, hint: str | None = None,
                path: str | None = None) -> None:
        self.diagnostics.append(Diagnostic(code, "warning", message, span, hint, path))

    @property
    def has_errors(self) -> bool:
        return any(d.is_error for d in self.diagnostics)

    def fail_if_errors(self) -> None:
        if self.has_errors:
            raise DiagnosticError(self.diagnostics)


def did_you_mean(word: str, choices: Iterable[str]) -> str | None:
    """A "did you mean" hint, or None when nothing is close."""
    close = difflib.get_close_matches(word, list(choices), n=3, cutoff=0.6)
    if not close:
        return None
    return "did you mean " + " or ".join(f"'{c}'" for c in close) + "?"
