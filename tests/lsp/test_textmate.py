"""editors/prec.tmLanguage.json, the TextMate grammar editors highlight `.prec` with, tokenized by a
real TextMate engine (textmate-grammar-python over Oniguruma) on every shipped contract and held to
pcc's own lexer (lark, grammar/prec.lark): each keyword, number, string and comment the parser reads
gets the matching scope at the same place, and every keyword of the language is in the grammar."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

tm = pytest.importorskip("textmate_grammar.parsers.base", reason="textmate-grammar-python is in pcc's test extra")

from lark import Lark, Token  # noqa: E402

from pcc.lsp.analysis import keywords  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
GRAMMAR = json.loads((ROOT / "editors" / "prec.tmLanguage.json").read_text())
CONTRACTS = sorted((ROOT / "contracts").rglob("*.prec"))
# lark token type -> the scope the editor grammar must give it
SCOPES = {"INT": "constant.numeric", "NUMBER": "constant.numeric", "SIGNED_INT": "constant.numeric",
          "DIMS": "constant.numeric", "STRING": "string.quoted", "PATTERN": "entity.name.tag.pattern",
          "COMMENT": "comment.line"}


def _scopes(text: str) -> dict[tuple[int, int], list[str]]:
    """(line, column) of each token's start -> its scopes, from the TextMate engine."""
    element = tm.LanguageParser(GRAMMAR).parse_string(text)
    return {pos: scopes for pos, content, scopes in element.flatten() if content.strip()}


def _tokens(text: str) -> list[Token]:
    """Every token pcc's grammar (grammar/prec.lark, through lark) reads, keywords and comments included."""
    comments: list[Token] = []
    lark = Lark((ROOT / "grammar" / "prec.lark").read_text(), parser="lalr", lexer="contextual",
                keep_all_tokens=True, lexer_callbacks={"COMMENT": lambda t: comments.append(t) or t})
    tree = lark.parse(text)
    return [*tree.scan_values(lambda v: isinstance(v, Token)), *comments]


def _expected(text: str):
    """(line, column, token text, scope prefix) for what pcc's lexer reads, comments included."""
    offsets = [0] + [m.end() for m in re.finditer("\n", text)]
    for tok in _tokens(text):
        kind = tok.type
        if kind in SCOPES:
            scope = SCOPES[kind]
        elif re.fullmatch(r"[a-z_]+", str(tok)) and (kind.startswith("__ANON") or kind.isupper() and kind.endswith(
                ("KEY", "ROLE", "COMPONENT", "STATE")) or kind == str(tok).upper()):
            scope = "keyword."
        else:
            continue
        line = next(i for i in range(len(offsets) - 1, -1, -1) if offsets[i] <= tok.start_pos)
        yield line, tok.start_pos - offsets[line], str(tok), scope


@pytest.mark.parametrize("path", CONTRACTS, ids=lambda p: str(p.relative_to(ROOT / "contracts")))
def test_the_editor_grammar_scopes_what_the_parser_reads(path):
    text = path.read_text()
    got = _scopes(text)
    wrong = [(line + 1, col + 1, word, scope, got.get((line, col))) for line, col, word, scope in _expected(text)
             if not any(s.startswith(scope) for s in got.get((line, col), []))]
    assert not wrong, wrong[:5]


def test_every_keyword_of_the_language_is_highlighted():
    words = " ".join(keywords())
    scoped = {c for (_, _), scopes in _scopes(words).items() for c in scopes}
    assert all(s.startswith(("source", "keyword")) for s in scoped), scoped
    missing = [w for w in keywords() if not re.search(rf"\b{w}\b", json.dumps(GRAMMAR["repository"]))]
    assert not missing, missing
