"""The `pcc` command: one frame for every verb (docs/cli.md).

Conventions, the same on every verb:

* `-o/--out` names where to write; `--source` names a source checkpoint (`--output`, `--to`
  and `--from` are kept as hidden aliases).
* A contract argument is a contract file or a bundle directory (its contract.prec), resolved
  by one function (`Report.contract_file`) before the verb runs.
* `--json` prints exactly one JSON document on stdout, success or failure, the envelope
  `{"command", "ok", "exit_code", "diagnostics", "result"}`; human text then goes to stderr.
  `--output-format text|json|github|sarif` generalizes it (json is `--json`; github and sarif print
  the diagnostics as GitHub workflow commands or one SARIF 2.1.0 log, pcc.lang.reporting).
* Exit codes: 0 ok, 1 errors found (or changes found: `diff`, `fmt --check`), 2 usage or an
  input that cannot be read, 3 internal error (a bug in pcc: one line, never a traceback),
  130 interrupted.

Each verb is `fn(args, rep) -> exit code`, with `rep` the :class:`Report` it records its
diagnostics and result in. Commands that only read contracts (check, fmt, export, explain,
plan, schema) import neither torch nor any engine, so they start fast.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import sys
from pathlib import Path

from pcc.lang.diagnostics import PccError
from pcc.lang.outputs import write_atomic

EXIT_OK = 0
EXIT_ERRORS = 1  # errors found, the operation failed, or (diff, fmt --check) changes found
EXIT_USAGE = 2  # usage error, or an input argument that names nothing readable
EXIT_INTERNAL = 3  # a bug in pcc
EXIT_INTERRUPTED = 130

ENVELOPE_KEYS = ("command", "ok", "exit_code", "diagnostics", "result")
OUTPUT_FORMATS = ("text", "json", "github", "sarif")


class UsageError(PccError):
    """Exit 2: the command line is wrong, or an input it names cannot be read (code null: not about a
    contract). Caught before PccError wherever both are."""

    def __init__(self, message: str, file: str | None = None):
        super().__init__(message)
        self.file = file


class Report:
    """What one verb reports: diagnostics (always as objects) and its result.

    In the text format the human form goes out as it happens (diagnostics rendered on stderr); in a
    machine format (json, github, sarif: `json` is true) nothing human reaches stdout and the frame
    prints :meth:`envelope`, or the diagnostics as workflow commands or SARIF.
    """

    def __init__(self, command: str, output_format: str = "text"):
        self.command, self.format = command, output_format
        self.diagnostics: list[dict] = []
        self.result = None

    @property
    def json(self) -> bool:
        """stdout carries one machine document (the verbs print nothing human there)."""
        return self.format != "text"

    # -- diagnostics
    def diagnostic(self, d, sources: dict[str, str] | None = None, echo: bool = True) -> None:
        """A pcc Diagnostic (pcc.lang.diagnostics), rendered on stderr unless --json or not `echo`."""
        self.diagnostics.append(d.to_json())
        if echo and not self.json:
            print(d.render(sources), file=sys.stderr)

    def extend(self, diagnostics, sources: dict[str, str] | None = None, echo: bool = True) -> None:
        for d in diagnostics:
            self.diagnostic(d, sources, echo)

    def error(self, message: str, file: str | None = None, code: str | None = None,
              severity: str = "error", echo: bool = True) -> None:
        """A diagnostic that is not about a contract's text (code null): unreadable input, a
        refused conversion, a failed launch. Printed as `pcc VERB: error: message` (unless
        --json, or `echo` is false: the verb's own human output already says it)."""
        d = {"code": code, "severity": severity, "message": message}
        if file is not None:
            d["file"] = file
        self.diagnostics.append(d)
        if echo and not self.json:
            where = f"{file}: " if file and not message.startswith(file) else ""
            print(f"pcc {self.command}: {severity}: {where}{message}", file=sys.stderr)

    def warning(self, message: str, file: str | None = None) -> None:
        self.error(message, file, severity="warning")

    def fail(self, message: str, exit_code: int = EXIT_ERRORS, file: str | None = None,
             code: str | None = None) -> int:
        self.error(message, file, code=code)
        return exit_code

    def say(self, text: str) -> None:
        """Human output for stdout; nothing with --json (the envelope carries the result)."""
        if not self.json:
            print(text)

    # -- inputs
    def usage(self, message: str) -> UsageError:
        return UsageError(message)

    def contract_file(self, arg: str) -> str:
        """CONTRACT or BUNDLE -> the contract file, by `pcc.bundle.contract_file` (a bundle checked
        against its manifest): exit 2 (UsageError) when `arg` names no contract file or bundle
        directory; a bundle that does not match its manifest is its BundleError (PCC706, exit 1)."""
        from pcc.bundle import BundleError, contract_file

        try:
            return str(contract_file(arg))
        except BundleError as exc:
            if exc.missing:
                raise UsageError(str(exc), arg) from None
            raise

    def envelope(self, exit_code: int) -> dict:
        return {"command": self.command, "ok": exit_code == EXIT_OK, "exit_code": exit_code,
                "diagnostics": self.diagnostics, "result": self.result}


# -- the verbs that only read contracts ---------------------------------------------------------

def cmd_check(args, rep: Report) -> int:
    from pcc.lower import compile_file

    results, worst = [], EXIT_OK
    for path in args.files:
        try:
            contract = rep.contract_file(path)
        except UsageError as exc:
            rep.error(str(exc), path)
            results.append({"file": path, "contract": None, "ok": False, "errors": 1, "warnings": 0})
            worst = EXIT_USAGE
            continue
        except PccError as exc:  # a bundle that does not match its manifest (PCC706)
            rep.error(exc.message, path, code=exc.code)
            results.append({"file": path, "contract": None, "ok": False, "errors": 1, "warnings": 0})
            worst = max(worst, EXIT_ERRORS)
            continue
        c = compile_file(contract)
        rep.extend(c.diagnostics, c.sources)
        errors = sum(d.is_error for d in c.diagnostics)
        warnings = len(c.diagnostics) - errors
        if errors:
            worst = max(worst, EXIT_ERRORS)
        entry = {"file": path, "contract": contract, "ok": c.ok, "errors": errors, "warnings": warnings}
        if c.plan is not None:
            entry["operators"] = len(c.plan.catalog.operators)
            entry["model"] = c.plan.catalog.name
        results.append(entry)
        status = "ok" if c.ok else "failed"
        extra = f" ({entry['operators']} operators of {entry['model']})" if c.plan is not None else ""
        rep.say(f"{path}: {status}{extra}, {errors} error(s), {warnings} warning(s)")
    rep.result = results
    return worst


def compiled_or_none(rep: Report, arg: str):
    """The checked plan of a contract or bundle, or None (its diagnostics reported)."""
    from pcc.lower import compile_file

    c = compile_file(rep.contract_file(arg))
    if not c.ok:
        rep.extend(c.diagnostics, c.sources)
        return None
    rep.extend(c.diagnostics, c.sources, echo=False)  # warnings: in the envelope; `pcc check` shows them
    return c


def cmd_export(args, rep: Report) -> int:
    from pcc.contract.io import canonical, export, load
    from pcc.lang.diagnostics import DiagnosticError

    path = rep.contract_file(args.file)
    try:
        loaded = load(path)
    except DiagnosticError as exc:
        rep.extend(exc.diagnostics, exc.sources)
        return EXIT_ERRORS
    rep.extend(loaded.diagnostics, loaded.sources, echo=False)
    rep.result = {"file": args.file, "format": args.format, "out": args.out, "document": canonical(loaded.contract)}
    return _emit(rep, export(loaded.contract, args.format), args.out)


def cmd_plan(args, rep: Report) -> int:
    from pcc.plan.dump import plan_json

    c = compiled_or_none(rep, args.file)
    if c is None:
        return EXIT_ERRORS
    text = plan_json(c.plan)
    rep.result = {"file": args.file, "out": args.out, "plan": json.loads(text)}
    return _emit(rep, text, args.out)


def _emit(rep: Report, text: str, out: str | None) -> int:
    """Write to `out` atomically, or to stdout (not with --json: the envelope carries it)."""
    if out:
        try:
            write_atomic(Path(out), text)
        except OSError as exc:
            return rep.fail(f"{out}: cannot write: {exc.strerror}", file=out, code="PCC709")
    elif not rep.json:
        sys.stdout.write(text)
    return EXIT_OK


def cmd_explain(args, rep: Report) -> int:
    from pcc.plan.explain import explain, render

    c = compiled_or_none(rep, args.file)
    if c is None:
        return EXIT_ERRORS
    rep.result = explain(c.plan)
    if args.format == "html":
        from pcc.plan.html_map import page

        text = page(c.plan, rep.result, [d.to_json() for d in c.diagnostics], c.sources, args.file)
    else:
        text = render(rep.result) + "\n"
    return _emit(rep, text, args.out)


def cmd_fmt(args, rep: Report) -> int:
    from pcc.lang.diagnostics import DiagnosticError
    from pcc.contract.fmt import format_source
    from pcc.lang.parser import read_source

    status, report = EXIT_OK, []
    for arg in args.files:
        try:
            path = rep.contract_file(arg)
            if args.write and Path(arg).is_dir():
                raise UsageError(f"{arg}: a bundle's contract.prec is generated (its manifest holds the hash); "
                                 "format the source contract and recompile", arg)
        except UsageError as exc:
            rep.error(str(exc), arg)
            report.append({"file": arg, "ok": False})
            status = EXIT_USAGE
            continue
        text = None
        try:
            text = read_source(path)
            out = format_source(text, path)
        except DiagnosticError as exc:
            rep.extend(exc.diagnostics, {path: text} if text is not None else exc.sources)
            report.append({"file": arg, "ok": False})
            status = max(status, EXIT_ERRORS)
            continue
        entry = {"file": arg, "ok": True, "canonical": out == text}
        report.append(entry)
        if args.check:
            if out != text:
                if not rep.json:
                    print(f"{path}: would be reformatted", file=sys.stderr)
                status = max(status, EXIT_ERRORS)
        elif args.write:
            if out != text:
                try:
                    write_atomic(Path(path), out)
                except OSError as exc:
                    rep.error(f"{path}: cannot write: {exc.strerror}", path, code="PCC709")
                    status = max(status, EXIT_ERRORS)
                    continue
            entry["written"] = out != text
        elif not rep.json:
            sys.stdout.write(out)
    rep.result = report
    return status


def cmd_schema(args, rep: Report) -> int:
    from pcc.contract.schema import schema_files

    out = Path(args.out or _default_schema_dir())
    stale, names = [], []
    for name, text in schema_files().items():
        target = out / name
        names.append(str(target))
        if args.check:
            if not target.is_file() or target.read_text(encoding="utf-8") != text:
                stale.append(str(target))
        else:
            try:
                out.mkdir(parents=True, exist_ok=True)
                write_atomic(target, text)
            except OSError as exc:
                return rep.fail(f"{target}: cannot write: {exc.strerror}", file=str(target), code="PCC709")
    for s in stale:
        rep.error(f"{s}: stale; run 'pcc schema --out {out}'", file=s)
    rep.result = {"out": str(out), "check": args.check, "files": names, "stale": stale}
    return EXIT_ERRORS if stale else EXIT_OK


def _default_schema_dir() -> str:
    from pcc.resources import data_dir

    return str(data_dir("schemas"))


# -- the frame ----------------------------------------------------------------------------------

# verb -> the module that registers it (None: this one). Commands that live beside their stage: each module
# has `register(subparsers)`, and imports nothing heavy (torch, engines) at module level, so `pcc check` stays
# fast. A command line that starts with its verb builds that verb's parser alone (`parser(verb)`), not all
# fifteen (about 10 ms of every command on two vCPUs); the table is checked against the whole parser
# (tests/test_cli_conventions.py).
VERBS: dict[str, str | None] = {
    "check": None, "fmt": None, "export": None, "plan": None, "explain": None, "schema": None,
    "compile": "pcc.bundle.cli", "diff": "pcc.diff.cli", "convert": "pcc.convert.cli",
    "verify-checkpoint": "pcc.convert.cli", "run": "pcc.runtime.cli", "experiment": "pcc.runtime.cli",
    "validate": "pcc.validate.cli", "import": "pcc.importer.cli", "lsp": "pcc.lsp.cli"}
COMMAND_MODULES: tuple[str, ...] = tuple(dict.fromkeys(m for m in VERBS.values() if m))  # each once, in order


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error raises (so the frame can answer --json with the envelope)."""

    def error(self, message):
        raise _ArgparseError(self, message)


class _ArgparseError(PccError):
    def __init__(self, parser: argparse.ArgumentParser, message: str):
        super().__init__(message)
        self.parser = parser


def add_out(s, help: str, *aliases: str, required: bool = False, **kw) -> None:
    """`-o/--out`, the one spelling for "where to write"; `aliases` work but are not shown."""
    s.add_argument("-o", "--out", help=help + (" (required)" if required else ""), **kw)
    for a in aliases:
        s.add_argument(a, dest="out", help=argparse.SUPPRESS)
    if required:
        s.set_defaults(required_out=True)


def _wire_run_targets() -> None:
    """`pcc run --target miles|verl` launches a bundle on that framework: the bundle stage's launcher,
    registered here so the runtime (a later stage than bundle) need not know about it."""
    from pcc.bundle import FRAMEWORKS
    from pcc.bundle.cli import run_on_framework
    from pcc.runtime.cli import add_run_target

    for name in FRAMEWORKS:
        add_run_target(name, run_on_framework)


def parser(verb: str | None = None) -> argparse.ArgumentParser:
    """pcc's argument parser: every verb's, or (`verb`, a key of VERBS) the one verb's that a command line starting
    with it is parsed by, alike (the same subparser; usage errors and help are its own)."""
    import importlib

    from pcc import __version__

    p = _Parser(prog="pcc", description="The precision-contract compiler for LLM RL. Conventions (flags, "
                "--json envelope, exit codes 0 ok / 1 errors or changes / 2 usage or unreadable input / "
                "3 internal error): docs/cli.md.")
    p.add_argument("--version", action="version", version=f"pcc {__version__}")
    p.add_argument("--allow-root", action="append", default=[], metavar="DIR",
                   help="a folder `extends` may also reach (repeatable; also $PCC_CONTRACT_ROOTS; docs/safety.md)")
    sub = p.add_subparsers(dest="command", required=True)

    modules = COMMAND_MODULES if verb is None else (VERBS[verb],)
    if verb is None or VERBS[verb] is None:
        _register(sub)
    for name in filter(None, modules):
        importlib.import_module(name).register(sub)
    if "pcc.runtime.cli" in modules:
        _wire_run_targets()
    _add_output_format(p)
    return p


def _register(sub) -> None:
    """This module's verbs."""
    json_help = "print one JSON envelope on stdout (docs/cli.md)"

    s = sub.add_parser("check", help="parse, resolve and check contracts")
    s.add_argument("files", nargs="+", metavar="CONTRACT|BUNDLE")
    s.add_argument("--json", action="store_true", help=json_help)
    s.set_defaults(fn=cmd_check)

    s = sub.add_parser("fmt", help="print contracts in the canonical layout")
    s.add_argument("files", nargs="+", metavar="CONTRACT|BUNDLE")
    g = s.add_mutually_exclusive_group()
    g.add_argument("--check", action="store_true", help="exit 1 if a file is not canonical")
    g.add_argument("--write", "-w", action="store_true", help="rewrite files in place")
    s.add_argument("--json", action="store_true", help=json_help)
    s.set_defaults(fn=cmd_fmt)

    s = sub.add_parser("export", help="print the canonical contract as JSON or YAML")
    s.add_argument("file", metavar="CONTRACT|BUNDLE")
    s.add_argument("--format", choices=("json", "yaml"), default="json")
    add_out(s, "write the document to this file (default: stdout)", "--output", metavar="FILE")
    s.add_argument("--json", action="store_true", help=json_help)
    s.set_defaults(fn=cmd_export)

    s = sub.add_parser("plan", help="print the resolved plan (explicit tensor lists) as JSON")
    s.add_argument("file", metavar="CONTRACT|BUNDLE")
    add_out(s, "write the plan to this file (default: stdout)", "--output", metavar="FILE")
    s.add_argument("--json", action="store_true", help=json_help)
    s.set_defaults(fn=cmd_plan)

    s = sub.add_parser("explain", help="component trace, operator coverage, representations and bytes; "
                       "--format html: the precision map")
    s.add_argument("file", metavar="CONTRACT|BUNDLE")
    s.add_argument("--format", choices=("text", "html"), default="text",
                   help="text, or html: one self-contained page, the precision map (docs/cli.md)")
    add_out(s, "write the text or the page to this file (default: stdout)", metavar="FILE")
    s.add_argument("--json", action="store_true", help=json_help)
    s.set_defaults(fn=cmd_explain)

    s = sub.add_parser("schema", help="write (or --check) the JSON Schemas generated from the model")
    add_out(s, "folder (default: the schemas/ folder pcc ships)", metavar="DIR")
    s.add_argument("--check", action="store_true", help="exit 1 if the files differ from the model")
    s.add_argument("--json", action="store_true", help=json_help)
    s.set_defaults(fn=cmd_schema)


def _add_output_format(p: argparse.ArgumentParser) -> None:
    """`--output-format` on every verb, beside its `--json` (which it generalizes), nested verbs too."""
    for action in p._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sp in action.choices.values():
                _add_output_format(sp)
    if "--json" in p._option_string_actions and "--output-format" not in p._option_string_actions:
        p.add_argument("--output-format", choices=OUTPUT_FORMATS, help="text (default); json, the envelope "
                       "(= --json); github, workflow commands; sarif, one SARIF 2.1.0 log (docs/cli.md)")


def _format_of(argv: list[str]) -> str:
    """The output format a command line asks for, read before argparse (which may refuse the line)."""
    head = argv[: argv.index("--")] if "--" in argv else argv
    fmt = "json" if "--json" in head else "text"
    for i, a in enumerate(head):
        value = a.partition("=")[2] if a.startswith("--output-format=") else (
            head[i + 1] if a == "--output-format" and i + 1 < len(head) else None)
        if value in OUTPUT_FORMATS:
            fmt = value
    return fmt


def _output_format(args, p: argparse.ArgumentParser) -> str:
    """--output-format, or json for --json (or diff's --format json); two different formats are a usage error."""
    fmt = getattr(args, "output_format", None)
    if getattr(args, "json", False):
        if fmt not in (None, "json"):
            raise _ArgparseError(p, f"--json is --output-format json; it cannot go with --output-format {fmt}")
        return "json"
    return fmt or "text"


def _machine_output(rep: Report, exit_code: int) -> str:
    """What stdout carries in a machine format: the envelope, the workflow commands, or the SARIF log."""
    if rep.format == "github":
        from pcc.lang.reporting import github

        return github(rep.diagnostics)
    if rep.format == "sarif":
        from pcc import __version__
        from pcc.lang.reporting import sarif

        return json.dumps(sarif(rep.diagnostics, __version__), indent=1) + "\n"
    return json.dumps(_finite(rep.envelope(exit_code)), indent=1, default=str, allow_nan=False) + "\n"


def _finite(doc):
    """`doc` with every NaN or infinite float as null: JSON has no NaN, and a bare `NaN` (json.dumps'
    default) makes the one document --json promises unreadable to strict parsers (jq, JSON.parse)."""
    if isinstance(doc, float) and not math.isfinite(doc):
        return None
    if isinstance(doc, dict):
        return {k: _finite(v) for k, v in doc.items()}
    if isinstance(doc, (list, tuple)):
        return [_finite(v) for v in doc]
    return doc


def _command_of(argv: list[str]) -> str:
    """The verb named on a command line argparse refused (for the envelope)."""
    return next((a for a in argv if not a.startswith("-")), "pcc")


@contextlib.contextmanager
def _stdout_to_stderr():
    """With --json, everything a verb (or a child process) writes to stdout goes to stderr,
    so stdout carries the envelope alone."""
    sys.stdout.flush()
    try:
        saved = os.dup(1)
        os.dup2(2, 1)
    except OSError:
        saved = None
    try:
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        sys.stderr.flush()
        if saved is not None:
            os.dup2(saved, 1)
            os.close(saved)


def _allow_roots(dirs: list[str]) -> None:
    """`--allow-root DIR`: through the environment, so the processes a verb starts see it too."""
    if dirs:
        from pcc.resources import ROOTS_ENV

        os.environ[ROOTS_ENV] = os.pathsep.join([os.environ.get(ROOTS_ENV, ""), *map(os.path.abspath, dirs)]).strip(
            os.pathsep)


def _run(args, rep: Report) -> int:
    if getattr(args, "required_out", False) and not args.out:
        raise UsageError("the following arguments are required: -o/--out")
    return args.fn(args, rep)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    rep = Report(_command_of(argv), _format_of(argv))
    try:
        try:
            p = parser(argv[0] if argv and argv[0] in VERBS else None)
            args = p.parse_args(argv)
            fmt = _output_format(args, p)
        except _ArgparseError as exc:
            exc.parser.print_usage(sys.stderr)
            print(f"{exc.parser.prog}: error: {exc}", file=sys.stderr)
            rep.diagnostics.append({"code": None, "severity": "error", "message": str(exc)})
            code = EXIT_USAGE
        else:
            rep.command, rep.format = args.command, fmt
            _allow_roots(args.allow_root)
            with _stdout_to_stderr() if rep.json else contextlib.nullcontext():
                try:
                    code = _run(args, rep)
                except UsageError as exc:
                    rep.error(str(exc), exc.file)
                    code = EXIT_USAGE
                except PccError as exc:  # pcc's own errors carry their code (docs/checks.md)
                    rep.error(exc.message, code=exc.code or None)
                    code = EXIT_ERRORS
    except KeyboardInterrupt as exc:  # a verb may say what was interrupted and what it left (pcc convert)
        rep.error(str(exc) or "interrupted")
        code = EXIT_INTERRUPTED
    except BrokenPipeError:
        return _reader_left()
    except Exception as exc:  # a bug in pcc: one line, never a traceback
        message = f"internal error: {type(exc).__name__}: {' '.join(str(exc).split())} (please report)"
        print(f"pcc: {message}", file=sys.stderr)
        rep.diagnostics.append({"code": None, "severity": "error", "message": message})
        code = EXIT_INTERNAL
    if rep.json:
        try:
            sys.stdout.write(_machine_output(rep, code))
            sys.stdout.flush()
        except BrokenPipeError:
            return _reader_left()
    return code


def _reader_left() -> int:
    """`pcc plan X | head`: the reader left; nothing more to say (and no error at exit)."""
    try:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):
        pass
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
