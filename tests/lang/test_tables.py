"""The stored LALR tables (grammar/prec.tables.json, pcc.lang.tables) are current: made from this grammar and the
lark installed, and the same automaton lark builds from the grammar now: every state reached from the start
states has the same actions on the same terminals (shifts to corresponding states, reductions by the same rules),
and the terminals are defined alike. (lark numbers states and terminals in an order that differs from process to
process, so the text itself is not compared.) A store of another grammar or lark is not used."""

from __future__ import annotations

import json

import lark
import pytest
from lark import Lark

from pcc.lang import parser, tables


def _built() -> Lark:
    return Lark(tables.grammar(), **tables.OPTIONS, lexer_callbacks=parser.CALLBACKS)


def _stored() -> Lark:
    got = tables.load(parser.CALLBACKS)
    assert got is not None, "grammar/prec.tables.json is stale or missing: run python tools/prec_tables.py"
    return got


def _rule(rule) -> tuple:
    return rule.origin.name, tuple(s.name for s in rule.expansion), rule.alias, rule.options.keep_all_tokens


def _same_automaton(a: Lark, b: Lark) -> int:
    """The number of states, once every state of `a` reachable from its start states is matched to one of `b`
    with the same actions; an assertion fails on the first difference."""
    ta, tb = a.parser.parser._parse_table, b.parser.parser._parse_table
    assert ta.start_states.keys() == tb.start_states.keys()
    pairs, todo = {}, [(ta.start_states[s], tb.start_states[s]) for s in sorted(ta.start_states)]
    todo += [(ta.end_states[s], tb.end_states[s]) for s in sorted(ta.end_states)]
    while todo:
        sa, sb = todo.pop()
        if sa in pairs:
            assert pairs[sa] == sb, f"state {sa} corresponds to both {pairs[sa]} and {sb}"
            continue
        pairs[sa] = sb
        acts_a, acts_b = ta.states[sa], tb.states[sb]
        assert acts_a.keys() == acts_b.keys(), f"state {sa}: terminals {sorted(acts_a)} against {sorted(acts_b)}"
        for token, (kind, arg) in acts_a.items():
            kind_b, arg_b = acts_b[token]
            assert str(kind) == str(kind_b), f"state {sa} on {token}: {str(kind)} against {str(kind_b)}"
            if str(kind) == "Shift":
                todo.append((arg, arg_b))
            else:
                assert _rule(arg) == _rule(arg_b), f"state {sa} on {token}: {_rule(arg)} against {_rule(arg_b)}"
    assert len(set(pairs.values())) == len(pairs) == len(ta.states) == len(tb.states)
    return len(pairs)


def _terminals(p: Lark) -> dict:
    return {t.name: (type(t.pattern).__name__, t.pattern.value, tuple(t.pattern.flags), t.priority)
            for t in p.terminals}


def test_the_store_is_the_automaton_lark_builds():
    stored, built = _stored(), _built()
    assert stored.source_path == "<deserialized>"  # what the parser uses (pcc.lang.parser._lark)
    assert parser._lark().source_path == "<deserialized>"
    assert _same_automaton(stored, built) > 100
    assert _terminals(stored) == _terminals(built)
    assert stored.lexer_conf.ignore == built.lexer_conf.ignore


def test_a_changed_automaton_is_told_apart():
    """The comparison can fail: one action of the stored parser changed is found."""
    stored, built = _stored(), _built()
    table = stored.parser.parser._parse_table
    state = next(s for s, acts in table.states.items() if any(str(k) == "Shift" for k, _ in acts.values()))
    token = next(t for t, (k, _) in table.states[state].items() if str(k) == "Shift")
    kind, target = table.states[state][token]
    table.states[state][token] = (kind, table.start_states["start"] if target != table.start_states["start"]
                                  else table.end_states["start"])
    with pytest.raises(AssertionError):
        _same_automaton(stored, built)


@pytest.mark.parametrize("field", ["lark", "grammar_sha256"])
def test_a_store_of_another_grammar_or_lark_is_not_used(tmp_path, monkeypatch, field):
    stored = json.loads(tables.path().read_text(encoding="utf-8"))
    stored[field] = "0.0.0" if field == "lark" else "0" * 64
    other = tmp_path / "prec.tables.json"
    other.write_text(json.dumps(stored), encoding="utf-8")
    monkeypatch.setattr(tables, "path", lambda: other)
    assert tables.load(parser.CALLBACKS) is None
    assert lark.__version__ != "0.0.0"


def test_contracts_parse_alike():
    """Every contract shipped parses to the same tree with either; a truncated one fails alike."""
    from pcc.resources import data_dir

    stored, built = _stored(), _built()
    files = sorted(data_dir("contracts").rglob("*.prec"))
    assert files
    for f in files:
        text = f.read_text(encoding="utf-8")
        assert stored.parse(text, start="start") == built.parse(text, start="start"), f
        cut = text[: len(text) // 2]
        errors = []
        for p in (stored, built):
            try:
                p.parse(cut, start="start")
                errors.append(None)
            except lark.exceptions.UnexpectedInput as err:
                errors.append((type(err).__name__, err.line, err.column, sorted(getattr(err, "expected", ()) or ())))
        assert errors[0] == errors[1], f
