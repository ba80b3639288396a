"""`pcc diff A B`: exit 0 when the two contracts do the same thing, 1 when they differ,
2 when either cannot be compared (its diagnostics are printed)."""

from __future__ import annotations

import json
import sys


def cmd_diff(args) -> int:
    from pcc.diff import diff
    from pcc.diff.load import DiffError
    from pcc.diff.render import render
    from pcc.models import CatalogError

    fmt = "json" if args.json else args.format
    try:
        report = diff(args.a, args.b, model=args.model)
    except (DiffError, CatalogError) as exc:
        compiled = getattr(exc, "compiled", None)
        diags = compiled.diagnostics if compiled is not None else []
        for d in diags:
            print(d.render(compiled.sources), file=sys.stderr)
        print(f"pcc diff: {exc}", file=sys.stderr)
        if fmt == "json":
            print(json.dumps({"ok": False, "error": str(exc), "diagnostics": [d.to_json() for d in diags]}))
        return 2
    sys.stdout.write(render(report, fmt))
    return 1 if report["changed"] else 0


def register(subparsers) -> None:
    s = subparsers.add_parser("diff", help="semantic diff of two contracts or bundles (exit 1 if they differ)")
    s.add_argument("a", help="contract (.prec, .yaml, .json) or bundle directory")
    s.add_argument("b", help="contract (.prec, .yaml, .json) or bundle directory")
    s.add_argument("--model", help="resolve both sides against this checkpoint directory or catalog name")
    s.add_argument("--format", choices=("text", "json", "markdown"), default="text")
    s.add_argument("--json", action="store_true", help="same as --format json")
    s.set_defaults(fn=cmd_diff)
