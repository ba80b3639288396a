"""`pcc diff A B`: exit 0 when the two contracts do the same thing, 1 when they differ,
2 when either cannot be compared (missing, unreadable, or has errors: its diagnostics are
reported), as the exit-code table of docs/cli.md says. `--json` (and `--format json`, the
same) prints the envelope, the diff report its result. The handler is `fn(args, rep)`."""

from __future__ import annotations

import argparse
import sys


class _Format(argparse.Action):
    """`--format json` is `--json`: one JSON shape per verb, the envelope."""

    def __call__(self, parser, namespace, value, option_string=None):
        namespace.format = value
        if value == "json":
            namespace.json = True


def cmd_diff(args, rep) -> int:
    from pcc.diff import diff
    from pcc.bundle import BundleError
    from pcc.diff.load import DiffError
    from pcc.diff.render import render
    from pcc.models import CatalogError

    try:
        for side in (args.a, args.b):
            rep.contract_file(side)  # exit 2 when it names no contract or bundle, or a bundle not as compiled
        report = diff(args.a, args.b, model=args.model)
    except (DiffError, CatalogError, BundleError) as exc:
        compiled = getattr(exc, "compiled", None)
        if compiled is not None:
            rep.extend(compiled.diagnostics, compiled.sources)
        return rep.fail(str(exc), 2, code=exc.code)
    rep.result = report
    if not rep.json:
        sys.stdout.write(render(report, args.format))
    return 1 if report["changed"] else 0


def register(subparsers) -> None:
    s = subparsers.add_parser("diff", help="semantic diff of two contracts or bundles (exit 1 if they differ)")
    s.add_argument("a", metavar="A", help="contract (.prec, .yaml, .json) or bundle directory")
    s.add_argument("b", metavar="B", help="contract (.prec, .yaml, .json) or bundle directory")
    s.add_argument("--model", help="resolve both sides against this checkpoint directory or catalog name")
    s.add_argument("--format", choices=("text", "json", "markdown"), default="text", action=_Format,
                   help="text or markdown; json is the same as --json")
    s.add_argument("--json", action="store_true", help="print one JSON envelope on stdout, the diff report "
                   "its result (docs/cli.md)")
    s.set_defaults(fn=cmd_diff)
