"""Parse .prec text into lark's tree (the AST), with positions on every node.

Lark errors become positioned diagnostics (PCC1xx); no input, however
malformed, escapes as a traceback.
"""

from __future__ import annotations

import re
from functools import lru_cache

from lark import Lark, Token, Tree
from lark.exceptions import LarkError, UnexpectedCharacters, UnexpectedEOF, UnexpectedInput, UnexpectedToken

from pcc.lang import tables
from pcc.lang.diagnostics import Diagnostic, DiagnosticError, Span, did_you_mean
from pcc.lang.inputs import MAX_CONTRACT, InputError, read_bytes


# Human names for the grammar's terminals, for "expected ..." messages.
_TERMINAL_NAMES = {
    "IDENT": "a name", "PATTERN": "an operator pattern", "STRING": "a quoted string",
    "INT": "an integer", "SIGNED_INT": "an integer", "NUMBER": "a number", "DIMS": "RxC dimensions",
    "LBRACE": "'{'", "RBRACE": "'}'", "COLON": "':'", "COMMA": "','", "EQUAL": "'='",
    "LSQB": "'['", "RSQB": "']'", "PLUS": "'+'", "CMP": "a comparison (<=, >=, <, >, ==)",
    "ROLE": "weights/activations/gradients", "COMPONENT": "fprop/dgrad/wgrad/gemm",
    "STATE": "params/master/moments/grads/param_gather", "PAR_KEY": "tp/ep/pp/cp/dp/gpus",
    "SYNC_KEY": "a sync option", "CORR_KEY": "clip/low/level/threshold", "$END": "end of file",
}


_COMMENTS: list[Token] = []  # filled by the lexer during one parse (see parse_comments)


CALLBACKS = {"COMMENT": _COMMENTS.append}


@lru_cache(maxsize=1)
def _lark() -> Lark:
    """The parser, from its stored tables where they match this grammar and lark (pcc.lang.tables)."""
    return tables.load(CALLBACKS) or Lark(tables.grammar(), **tables.OPTIONS, lexer_callbacks=CALLBACKS)


def _expected(names: set[str]) -> list[str]:
    out = set()
    for n in names:
        if n in _TERMINAL_NAMES:
            out.add(_TERMINAL_NAMES[n])
            continue
        try:
            pattern = _lark().get_terminal(n).pattern
        except KeyError:  # lark's own end marker, spelled differently across versions
            out.add("end of file")
            continue
        out.add(f"'{pattern.value}'" if pattern.type == "str" else n.lower())
    return sorted(out)


def _keywords(names: set[str]) -> list[str]:
    words = []
    for n in names:
        try:
            pattern = _lark().get_terminal(n).pattern
        except KeyError:
            continue
        if pattern.type == "str" and pattern.value.isidentifier():
            words.append(pattern.value)
    return words


def _end_span(file: str, text: str) -> Span:
    lines = text.splitlines() or [""]
    return Span(file, len(lines), len(lines[-1]) + 1)


def _diagnose(exc: UnexpectedInput, file: str, text: str) -> Diagnostic:
    line = getattr(exc, "line", None) or 1
    col = getattr(exc, "column", None) or 1
    span = Span(file, line, col, line, col + 1)
    eof = isinstance(exc, UnexpectedEOF) or (isinstance(exc, UnexpectedToken) and exc.token.type == "$END")
    if eof:
        return Diagnostic("PCC103", "error", "unexpected end of file", _end_span(file, text),
                          hint="expected " + ", ".join(_expected(set(exc.expected))) + " (is a '}' missing?)")
    if isinstance(exc, UnexpectedCharacters):
        ch = text[exc.pos_in_stream] if exc.pos_in_stream < len(text) else ""
        return Diagnostic("PCC102", "error", f"unexpected character {ch!r}", span,
                          hint="names are letters, digits, '_' and '-'; strings use double quotes")
    assert isinstance(exc, UnexpectedToken)
    tok: Token = exc.token
    expected = set(exc.expected)
    span = Span(file, tok.line, tok.column, tok.end_line, tok.end_column)
    hint = did_you_mean(str(tok), _keywords(expected)) if tok.type == "IDENT" else None
    before = text.splitlines()[tok.line - 1][: tok.column - 1] if text else ""
    name = re.match(r"\s*contract\s+([\w\-]+)$", before)
    if hint is None and name:  # `contract qwen3.5-test`: the name stopped at a character names cannot hold
        rest = re.match(r"[^\s{]*", text.splitlines()[tok.line - 1][tok.column - 1:]).group(0)
        hint = ("a contract name is letters, digits, '_' and '-' (starting with a letter or '_'): e.g. '"
                + re.sub(r"[^\w\-]", "_", name.group(1) + rest) + "'")
    if hint is None:
        hint = "expected " + ", ".join(_expected(expected))
    what = "keyword" if tok.type == "IDENT" else "token"
    return Diagnostic("PCC101", "error", f"unexpected {what} '{tok}'", span, hint=hint)


# A CR not followed by LF (old Mac line endings) ends a line, as it does for the carets (str.splitlines):
# lark counts lines by LF, and a comment would run to the end of the file. One character for one: columns keep.
_lone_cr = re.compile(r"\r(?!\n)")


def parse_text(text: str, file: str = "<string>", start: str = "start") -> Tree:
    """Parse one contract (or, with start="scheme_expr", one scheme expression).

    Raises DiagnosticError with one positioned PCC1xx error.
    """
    try:
        return _lark().parse(_lone_cr.sub("\n", text), start=start)
    except UnexpectedInput as exc:
        raise DiagnosticError([_diagnose(exc, file, text)]) from None
    except (LarkError, RecursionError) as exc:  # defensive: never a traceback
        raise DiagnosticError([Diagnostic("PCC100", "error", f"cannot parse: {exc}", Span(file, 1, 1))]) from None


def parse_comments(text: str, file: str = "<string>") -> tuple[Tree, list[Token]]:
    """Parse, also returning the comments (for the formatter, which keeps them)."""
    _COMMENTS.clear()
    tree = parse_text(text, file)
    comments = list(_COMMENTS)
    _COMMENTS.clear()
    return tree, comments


def read_source(path: str) -> str:
    """Read a contract file once as UTF-8 text: a regular file of at most MAX_CONTRACT (pcc.lang.inputs),
    not binary. Callers keep this text for carets; nothing reads the file again."""
    try:
        data = read_bytes(path, MAX_CONTRACT, "contract")
    except InputError as exc:
        if exc.reason == "kind":
            raise DiagnosticError([Diagnostic("PCC109", "error", exc.message.removeprefix(f"{path}: "),
                                              file=path)]) from None
        if exc.reason == "size":
            raise DiagnosticError([Diagnostic("PCC104", "error",
                                              f"file is larger than {MAX_CONTRACT >> 10} KiB; not a contract",
                                              Span(path, 1, 1))]) from None
        raise DiagnosticError([Diagnostic("PCC104", "error", exc.message.removeprefix(f"{path}: "),
                                          file=path)]) from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        col = exc.start - (data.rfind(b"\n", 0, exc.start) + 1) + 1
        raise DiagnosticError([Diagnostic("PCC104", "error", "file is not UTF-8 text",
                                          Span(path, line, col), hint="a contract is a text file")]) from None
    if "\x00" in text:
        line = text[: text.index("\x00")].count("\n") + 1
        raise DiagnosticError([Diagnostic("PCC104", "error", "file contains NUL bytes; not a contract",
                                          Span(path, line, 1))])
    return text
