#!/usr/bin/env python3
"""Write grammar/prec.tables.json, the contract parser's stored LALR tables (pcc.lang.tables), for the grammar
and lark installed. lark numbers states and terminals in an order that differs from run to run, so the text
differs too; tests/lang/test_tables.py checks that the stored automaton is the one lark builds from the grammar."""

from __future__ import annotations

from pcc.lang import tables
from pcc.lang.parser import CALLBACKS


def main() -> None:
    tables.path().write_text(tables.dump(CALLBACKS), encoding="utf-8")


if __name__ == "__main__":
    main()
