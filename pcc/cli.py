"""The `pcc` command. Exit codes: 0 clean, 1 errors (or changes, for `fmt --check`), 2 usage.

Commands that only read contracts (check, fmt, export, explain, plan, schema)
import neither torch nor any engine, so they start fast.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path


def _print_diagnostics(diags, sources, as_json: bool) -> None:
    if as_json:
        return
    for d in diags:
        print(d.render(sources), file=sys.stderr)


def cmd_check(args) -> int:
    from pcc.plan import compile_file

    results, worst = [], 0
    for path in args.files:
        c = compile_file(path)
        _print_diagnostics(c.diagnostics, c.sources, args.json)
        errors = sum(d.is_error for d in c.diagnostics)
        warnings = len(c.diagnostics) - errors
        worst = max(worst, 1 if errors else 0)
        entry = {"file": path, "ok": c.ok, "errors": errors, "warnings": warnings,
                 "diagnostics": [d.to_json() for d in c.diagnostics]}
        if c.plan is not None:
            entry["operators"] = len(c.plan.catalog.operators)
            entry["model"] = c.plan.catalog.name
        results.append(entry)
        if not args.json:
            status = "ok" if c.ok else "failed"
            extra = f" ({entry['operators']} operators of {entry['model']})" if c.plan is not None else ""
            print(f"{path}: {status}{extra}, {errors} error(s), {warnings} warning(s)")
    if args.json:
        print(json.dumps(results if len(results) > 1 else results[0], indent=1))
    return worst


def _compiled_or_exit(path: str, as_json: bool):
    from pcc.plan import compile_file

    c = compile_file(path)
    if not c.ok:
        _print_diagnostics(c.diagnostics, c.sources, False)
        if as_json:
            print(json.dumps({"file": path, "ok": False, "diagnostics": [d.to_json() for d in c.diagnostics]}))
        return None
    return c


def cmd_export(args) -> int:
    from pcc.contract.io import export, load
    from pcc.lang.diagnostics import DiagnosticError

    try:
        loaded = load(args.file)
    except DiagnosticError as exc:
        _print_diagnostics(exc.diagnostics, _read(args.file), False)
        return 1
    return _emit(export(loaded.contract, args.format), args.output)


def cmd_plan(args) -> int:
    from pcc.plan.dump import plan_json

    c = _compiled_or_exit(args.file, False)
    if c is None:
        return 1
    return _emit(plan_json(c.plan), args.output)


def _emit(text: str, output: str | None) -> int:
    """Write to `output` atomically, or to stdout."""
    if output:
        _atomic_write(Path(output), text)
    else:
        sys.stdout.write(text)
    return 0


def cmd_explain(args) -> int:
    from pcc.plan.explain import explain, render

    c = _compiled_or_exit(args.file, args.json)
    if c is None:
        return 1
    info = explain(c.plan)
    print(json.dumps(info, indent=1) if args.json else render(info))
    return 0


def cmd_fmt(args) -> int:
    from pcc.lang.diagnostics import DiagnosticError
    from pcc.lang.fmt import format_source
    from pcc.lang.parser import read_source

    status, report = 0, []
    for path in args.files:
        try:
            text = read_source(path)
            out = format_source(text, path)
        except DiagnosticError as exc:
            _print_diagnostics(exc.diagnostics, _read(path), args.json)
            report.append({"file": path, "ok": False, "diagnostics": [d.to_json() for d in exc.diagnostics]})
            status = max(status, 1)
            continue
        report.append({"file": path, "ok": True, "canonical": out == text})
        if args.check:
            if out != text:
                if not args.json:
                    print(f"{path}: would be reformatted", file=sys.stderr)
                status = 1
        elif args.write:
            if out != text:
                _atomic_write(Path(path), out)
        elif not args.json:
            sys.stdout.write(out)
    if args.json:
        print(json.dumps(report, indent=1))
    return status


def cmd_schema(args) -> int:
    from pcc.contract.schema import schema_files

    out = Path(args.out or _default_schema_dir())
    stale = []
    for name, text in schema_files().items():
        target = out / name
        if args.check:
            if not target.is_file() or target.read_text(encoding="utf-8") != text:
                stale.append(str(target))
        else:
            out.mkdir(parents=True, exist_ok=True)
            _atomic_write(target, text)
    for s in stale:
        print(f"{s}: stale; run 'pcc schema --out {args.out}'", file=sys.stderr)
    return 1 if stale else 0


def _read(path: str) -> dict[str, str]:
    try:
        return {path: Path(path).read_text(encoding="utf-8", errors="replace")}
    except OSError:
        return {}


def _atomic_write(path: Path, text: str) -> None:
    """Write beside the target and rename, so a reader never sees half a file."""
    path = path.resolve()
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        tmp.write_text(text, encoding="utf-8")
        if path.exists():
            os.chmod(tmp, path.stat().st_mode & 0o7777)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def _default_schema_dir() -> str:
    from pcc.resources import data_dir

    return str(data_dir("schemas"))


# Commands that live beside their stage: each module has `register(subparsers)`, and
# imports nothing heavy (torch, engines) at module level, so `pcc check` stays fast.
COMMAND_MODULES: tuple[str, ...] = ("pcc.bundle.cli", "pcc.diff.cli", "pcc.convert.cli", "pcc.runtime.cli", "pcc.validate.cli")


def parser() -> argparse.ArgumentParser:
    import importlib

    from pcc import __version__

    p = argparse.ArgumentParser(prog="pcc", description="The precision-contract compiler for LLM RL.")
    p.add_argument("--version", action="version", version=f"pcc {__version__}")
    sub = p.add_subparsers(dest="command", required=True)

    s = sub.add_parser("check", help="parse, resolve and check contracts")
    s.add_argument("files", nargs="+")
    s.add_argument("--json", action="store_true", help="machine-readable diagnostics")
    s.set_defaults(fn=cmd_check)

    s = sub.add_parser("fmt", help="print contracts in the canonical layout")
    s.add_argument("files", nargs="+")
    g = s.add_mutually_exclusive_group()
    g.add_argument("--check", action="store_true", help="exit 1 if a file is not canonical")
    g.add_argument("--write", "-w", action="store_true", help="rewrite files in place")
    s.add_argument("--json", action="store_true", help="report which files are canonical, as JSON")
    s.set_defaults(fn=cmd_fmt)

    s = sub.add_parser("export", help="print the canonical contract as JSON or YAML")
    s.add_argument("file")
    s.add_argument("--format", choices=("json", "yaml"), default="json")
    s.add_argument("--output", "-o")
    s.set_defaults(fn=cmd_export)

    s = sub.add_parser("plan", help="print the resolved plan (explicit tensor lists) as JSON")
    s.add_argument("file")
    s.add_argument("--output", "-o")
    s.set_defaults(fn=cmd_plan)

    s = sub.add_parser("explain", help="component trace, operator coverage, representations and bytes")
    s.add_argument("file")
    s.add_argument("--json", action="store_true")
    s.set_defaults(fn=cmd_explain)

    s = sub.add_parser("schema", help="write (or --check) the JSON Schemas generated from the model")
    s.add_argument("--out", default=None, help="folder (default: the schemas/ folder pcc ships)")
    s.add_argument("--check", action="store_true", help="exit 1 if the files differ from the model")
    s.set_defaults(fn=cmd_schema)

    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        return args.fn(args)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
