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
    from pcc.diff import diff_sides
    from pcc.bundle import BundleError
    from pcc.diff.load import DiffError
    from pcc.diff.render import render
    from pcc.lang.outputs import write_atomic
    from pcc.models import CatalogError

    try:
        for side in (args.a, args.b):
            rep.contract_file(side)  # exit 2 when it names no contract or bundle, or a bundle not as compiled
        report, ca, cb = diff_sides(args.a, args.b, model=args.model)
    except (DiffError, CatalogError, BundleError) as exc:
        compiled = getattr(exc, "compiled", None)
        if compiled is not None:
            rep.extend(compiled.diagnostics, compiled.sources)
        return rep.fail(str(exc), 2, code=exc.code)
    rep.result = report
    fmt = "json" if args.format == "json" and args.out else args.format
    if args.out or not rep.json:
        if fmt == "html":
            from pcc.diff.html import page

            text = page(report, ca, cb)
        else:
            text = render(report, fmt)
        if args.out:
            try:
                write_atomic(args.out, text)
            except OSError as exc:
                return rep.fail(f"{args.out}: cannot write: {exc.strerror}", file=args.out, code="PCC709")
        else:
            sys.stdout.write(text)
    return 1 if report["changed"] else 0


def register(subparsers) -> None:
    s = subparsers.add_parser("diff", help="semantic diff of two contracts or bundles (exit 1 if they differ)")
    s.add_argument("a", metavar="A", help="contract (.prec, .yaml, .json) or bundle directory")
    s.add_argument("b", metavar="B", help="contract (.prec, .yaml, .json) or bundle directory")
    s.add_argument("--model", help="resolve both sides against this checkpoint directory or catalog name")
    s.add_argument("--format", choices=("text", "json", "markdown", "html"), default="text", action=_Format,
                   help="text, markdown, or html (B's precision map with the changed cells and the consequences, "
                   "one self-contained page); json is the same as --json")
    s.add_argument("-o", "--out", metavar="FILE", help="write the text, markdown, html or JSON report to this file "
                   "(default: stdout)")
    s.add_argument("--json", action="store_true", help="print one JSON envelope on stdout, the diff report "
                   "its result (docs/cli.md)")
    s.set_defaults(fn=cmd_diff)
