"""`pcc lsp`: the language server (LSP over stdio, pygls). Each open contract is compiled as `pcc
check` compiles it, a short quiet time after the last keystroke; hovers, completions, definitions and
quick fixes read that compile (pcc.lsp.analysis). Catalogs are cached by pcc.models, so a large
model is built once per server."""

from __future__ import annotations

import asyncio
from urllib.parse import unquote, urlparse

from lsprotocol import types as t
from pygls.lsp.server import LanguageServer

from pcc import __version__
from pcc.contract.fmt import format_source
from pcc.lang.diagnostics import DiagnosticError, Span
from pcc.lsp import analysis

DEBOUNCE_S = 0.3  # quiet time after a change before the contract is compiled again


class PccServer(LanguageServer):
    def __init__(self):
        super().__init__("pcc", __version__)
        self.checked: dict[str, analysis.Checked] = {}
        self.pending: dict[str, asyncio.TimerHandle] = {}


server = PccServer()


def _path(uri: str) -> str:
    return unquote(urlparse(uri).path)


def _range(span: Span) -> t.Range:
    start = t.Position(max(span.line - 1, 0), max(span.col - 1, 0))
    if span.end_line and span.end_col:
        return t.Range(start, t.Position(span.end_line - 1, max(span.end_col - 1, 0)))
    return t.Range(start, t.Position(start.line, start.character + 1))


_SEVERITY = {"error": t.DiagnosticSeverity.Error, "warning": t.DiagnosticSeverity.Warning,
             "info": t.DiagnosticSeverity.Information}


def _check(ls: PccServer, uri: str) -> None:
    doc = ls.workspace.get_text_document(uri)
    checked = analysis.check(_path(uri), doc.source)
    ls.checked[uri] = checked
    out = []
    for d in analysis.diagnostics(checked):
        span = d.span or Span(checked.path, 1, 1)
        message = d.message + (f"\nhint: {d.hint}" if d.hint else "")
        out.append(t.Diagnostic(_range(span), message, severity=_SEVERITY.get(d.severity, t.DiagnosticSeverity.Error),
                                code=d.code, source="pcc", data={"hint": d.hint} if d.hint else None))
    ls.text_document_publish_diagnostics(t.PublishDiagnosticsParams(uri=uri, diagnostics=out, version=doc.version))


def _schedule(ls: PccServer, uri: str, delay: float) -> None:
    if uri in ls.pending:
        ls.pending.pop(uri).cancel()
    ls.pending[uri] = asyncio.get_running_loop().call_later(delay, _check, ls, uri)


@server.feature(t.TEXT_DOCUMENT_DID_OPEN)
async def did_open(ls: PccServer, params: t.DidOpenTextDocumentParams) -> None:
    _schedule(ls, params.text_document.uri, 0)


@server.feature(t.TEXT_DOCUMENT_DID_CHANGE)
async def did_change(ls: PccServer, params: t.DidChangeTextDocumentParams) -> None:
    _schedule(ls, params.text_document.uri, DEBOUNCE_S)


@server.feature(t.TEXT_DOCUMENT_DID_SAVE)
async def did_save(ls: PccServer, params: t.DidSaveTextDocumentParams) -> None:
    _schedule(ls, params.text_document.uri, 0)


@server.feature(t.TEXT_DOCUMENT_DID_CLOSE)
def did_close(ls: PccServer, params: t.DidCloseTextDocumentParams) -> None:
    ls.checked.pop(params.text_document.uri, None)
    ls.text_document_publish_diagnostics(t.PublishDiagnosticsParams(uri=params.text_document.uri, diagnostics=[]))


def _current(ls: PccServer, uri: str) -> analysis.Checked:
    """The compile of the text as it is now (compiled here when a change has not been yet)."""
    doc = ls.workspace.get_text_document(uri)
    checked = ls.checked.get(uri)
    if checked is None or checked.text != doc.source:
        checked = ls.checked[uri] = analysis.check(_path(uri), doc.source)
    return checked


@server.feature(t.TEXT_DOCUMENT_HOVER)
def hover(ls: PccServer, params: t.HoverParams) -> t.Hover | None:
    text = analysis.hover(_current(ls, params.text_document.uri), params.position.line, params.position.character)
    return t.Hover(t.MarkupContent(t.MarkupKind.Markdown, text)) if text else None


_KIND = {"keyword": t.CompletionItemKind.Keyword, "scheme": t.CompletionItemKind.Constant,
         "family": t.CompletionItemKind.EnumMember, "alias": t.CompletionItemKind.Enum}


@server.feature(t.TEXT_DOCUMENT_COMPLETION, t.CompletionOptions(trigger_characters=[" ", ".", ":"]))
def completion(ls: PccServer, params: t.CompletionParams) -> t.CompletionList:
    items = [t.CompletionItem(label, kind=_KIND[kind], detail=kind)
             for label, kind in analysis.completions(_current(ls, params.text_document.uri))]
    return t.CompletionList(is_incomplete=False, items=items)


@server.feature(t.TEXT_DOCUMENT_DEFINITION)
def definition(ls: PccServer, params: t.DefinitionParams) -> t.Location | None:
    span = analysis.definition(_current(ls, params.text_document.uri), params.position.line,
                               params.position.character)
    return t.Location(f"file://{span.file}", _range(span)) if span else None


@server.feature(t.TEXT_DOCUMENT_FORMATTING)
def formatting(ls: PccServer, params: t.DocumentFormattingParams) -> list[t.TextEdit] | None:
    """`pcc fmt`'s layout; nothing while the text does not parse (the diagnostics say why)."""
    doc = ls.workspace.get_text_document(params.text_document.uri)
    try:
        new = format_source(doc.source, _path(params.text_document.uri))
    except DiagnosticError:
        return None
    if new == doc.source:
        return []
    end = t.Position(len(doc.lines), 0)
    return [t.TextEdit(t.Range(t.Position(0, 0), end), new)]


@server.feature(t.TEXT_DOCUMENT_CODE_ACTION,
                t.CodeActionOptions(code_action_kinds=[t.CodeActionKind.QuickFix]))
def code_action(ls: PccServer, params: t.CodeActionParams) -> list[t.CodeAction]:
    """The fixes a diagnostic's "did you mean" hint names, one action each."""
    uri = params.text_document.uri
    checked = _current(ls, uri)
    out = []
    for d in analysis.diagnostics(checked):
        if d.span is None or not any(_range(d.span).start.line == c.range.start.line
                                     for c in params.context.diagnostics):
            continue
        for new, at in analysis.quick_fixes(d, checked.text):
            out.append(t.CodeAction(f"{d.code}: replace with '{new}'", kind=t.CodeActionKind.QuickFix,
                                    edit=t.WorkspaceEdit(changes={uri: [t.TextEdit(_range(at), new)]})))
    return out


def main() -> int:
    server.start_io()
    return 0
