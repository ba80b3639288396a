"""The .prec language: grammar, parse tree with spans, diagnostics, builder, formatter."""

from pcc.lang.build import SourceMap, build, parse_scheme
from pcc.lang.diagnostics import Diagnostic, DiagnosticError, Reporter, Span

__all__ = ["Diagnostic", "DiagnosticError", "Reporter", "SourceMap", "Span", "build", "parse_scheme"]
