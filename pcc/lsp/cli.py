"""`pcc lsp`: the language server over stdio (docs/editor.md). It speaks LSP, not pcc's report
frame, so it has no --json; exit 0 when the editor ends the session, 1 when pygls is missing."""

from __future__ import annotations


def cmd_lsp(args, rep) -> int:
    try:
        from pcc.lsp.server import main
    except ImportError as exc:
        if "pygls" not in str(exc) and "lsprotocol" not in str(exc):
            raise
        return rep.fail("pcc lsp needs pygls, which is not installed: pip install 'pygls>=2,<3' "
                        "(or pcc's 'lsp' extra)")
    return main()


def register(subparsers) -> None:
    s = subparsers.add_parser("lsp", help="the .prec language server (LSP over stdio) for editors: diagnostics, "
                              "hover, completion, definitions, formatting, quick fixes (docs/editor.md)")
    s.set_defaults(fn=cmd_lsp)
