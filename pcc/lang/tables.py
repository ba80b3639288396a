"""The contract parser's LALR tables, stored (grammar/prec.tables.json) rather than built in every process.

Building lark's parser from grammar/prec.lark costs 0.04-0.07 s of each command (its grammar compiled, the LALR
analysis run); loading the same tables takes 0.01 s. The store is lark's own serialized form (what its standalone
generator writes as a Python literal; `Lark._load_from_dict` reads it back there too) as JSON, never pickle:
lark's `cache=` option and `Lark.save` pickle. The store names the lark version and the grammar's SHA-256 it was
made from; where either differs, `load` returns None and the parser builds its tables as before.
Regenerate with `python tools/prec_tables.py` after changing the grammar or lark (tests/lang/test_tables.py
checks that the store is current: the automaton lark builds now).
"""

from __future__ import annotations

import hashlib
import json

from pcc.resources import data_dir

# lark's parser options, given to both the build (pcc.lang.parser) and the store's load
OPTIONS = {"parser": "lalr", "lexer": "contextual", "propagate_positions": True, "maybe_placeholders": False,
           "start": ["start", "scheme_expr"]}
_CALLBACKS = "lexer_callbacks"  # functions: given at load, never stored


def grammar() -> str:
    return (data_dir("grammar") / "prec.lark").read_text(encoding="utf-8")


def _stamp(text: str) -> dict:
    import lark

    return {"lark": lark.__version__, "grammar_sha256": hashlib.sha256(text.encode()).hexdigest()}


def _encode(x):
    """JSON for lark's serialized data: dicts with other than string keys and tuples are tagged."""
    if isinstance(x, dict):
        if all(isinstance(k, str) for k in x):
            return {k: _encode(v) for k, v in x.items()}
        return {"__items__": [[_encode(k), _encode(v)] for k, v in x.items()]}
    if isinstance(x, tuple):
        return {"__tuple__": [_encode(v) for v in x]}
    if isinstance(x, list):
        return [_encode(v) for v in x]
    if x is None or isinstance(x, (str, int, float, bool)):
        return x
    raise TypeError(f"lark's serialized parser holds a {type(x).__name__}, which the table store cannot keep")


def _decode(d: dict):
    if "__items__" in d:
        return {k: v for k, v in d["__items__"]}
    if "__tuple__" in d:
        return tuple(d["__tuple__"])
    return d


def path():
    return data_dir("grammar") / "prec.tables.json"


def dump(callbacks: dict) -> str:
    """The store's text for the grammar and lark installed (built with the parser's callbacks, which are
    not stored)."""
    from lark import Lark
    from lark.lark import Rule, TerminalDef

    text = grammar()
    parser = Lark(text, **OPTIONS, **{_CALLBACKS: callbacks})
    data, memo = parser.memo_serialize([TerminalDef, Rule])
    data["options"] = {k: v for k, v in data["options"].items() if k != _CALLBACKS}
    return json.dumps({**_stamp(text), "data": _encode(data), "memo": _encode(memo)}, indent=0) + "\n"


def load(callbacks: dict):
    """lark's parser from the store, or None where the store is missing or was made from another grammar or
    another lark."""
    from lark import Lark

    try:
        stored = json.loads(path().read_text(encoding="utf-8"),
                            object_hook=_decode)
    except (OSError, ValueError):
        return None
    if {k: stored.get(k) for k in ("lark", "grammar_sha256")} != _stamp(grammar()):
        return None
    return Lark._load_from_dict(stored["data"], stored["memo"], **{_CALLBACKS: callbacks})

