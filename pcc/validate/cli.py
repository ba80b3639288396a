"""`pcc validate`: the validation ladder. Torch is imported only inside the handler.

The handler is `fn(args, rep) -> exit code` (pcc/cli.py, docs/cli.md)."""

from __future__ import annotations

import sys


def register(sub) -> None:
    from pcc.runtime.cli import bounded

    s = sub.add_parser("validate", help="the validation ladder: find where trainer and rollout first disagree")
    s.add_argument("contract", metavar="CONTRACT|BUNDLE")
    s.add_argument("--levels", default="1-8", help="levels to run, e.g. 1-8, 4, 2,4-6 (9 = performance profile)")
    s.add_argument("--engine", default="local", metavar="local|http://HOST:PORT",
                   help="the rollout engine: the embedded runtime, or a server speaking the contract's rollout "
                        "engine's API (SGLang, or vLLM's OpenAI-compatible server for 'rollout vllm')")
    s.add_argument("-o", "--out", default="", metavar="DIR", help="run directory (default runs/validate-<contract>)")
    s.add_argument("--keep-going", action="store_true", help="run every level even after one fails")
    s.add_argument("--model", default="auto", help="re-resolve the contract on this catalog (e.g. tiny_moe), "
                   "on hardware cpu; auto (the default): the contract's own model when it is CPU-size, else the "
                   "stand-in of the same structure; with --engine http the contract's own model is used")
    s.add_argument("--seed", type=bounded("seed"), default=0)
    s.add_argument("--steps", type=bounded("steps"), default=None, help="level 8: RL steps (default 6)")
    s.add_argument("--inject-fault", action="append", default=[], metavar="NAME",
                   help="self-test: inject a known fault (scale_layout, accumulation, swapped_expert, "
                        "inactive_adapter, mixed_version)")
    s.add_argument("--no-plots", action="store_true")
    s.add_argument("--format", choices=("text", "html"), default="text",
                   help="html: also write DIR/index.html, the contract's precision map with the ladder's plots")
    s.add_argument("--json", action="store_true", help="print one JSON envelope on stdout, report.json its "
                   "result (docs/cli.md)")
    s.set_defaults(fn=cmd_validate)


def cmd_validate(args, rep) -> int:
    from pathlib import Path

    from pcc.runtime.session import set_threads

    from .context import ValidateConfig
    from .faults import FaultError
    from .ladder import parse_levels, validate

    try:
        levels = parse_levels(args.levels)
    except ValueError as exc:
        raise rep.usage(str(exc)) from None
    if args.engine != "local" and not args.engine.startswith(("http://", "https://")):
        raise rep.usage(f"--engine {args.engine!r}: expected local or http://HOST:PORT")
    rep.contract_file(args.contract)  # exit 2 when it names no contract or bundle
    set_threads()
    cfg = ValidateConfig(seed=args.seed)
    if args.steps is not None:
        cfg.steps = args.steps
    out = Path(args.out or f"runs/validate-{Path(args.contract).stem}")
    try:
        model = None if args.engine != "local" and args.model == "auto" else args.model
        report = validate(args.contract, levels, out, engine=args.engine, model=model,
                          keep_going=args.keep_going, cfg=cfg, inject=tuple(args.inject_fault),
                          progress=sys.stderr.isatty() and not rep.json, plots=not args.no_plots)
    except FaultError as exc:
        raise rep.usage(str(exc)) from None
    except OSError as exc:  # a full or read-only disk under --out: one line naming the path
        where = exc.filename or out
        return rep.fail(f"{where}: cannot write: {exc.strerror}", file=str(where), code="PCC709")
    rep.result = report
    for lv in report["levels"]:
        line = f"level {lv['level']} {lv['name']}: {lv['status']}"
        if lv["status"] in ("fail", "error"):
            line += f"; localizes {lv['localizes']}" if lv["localizes"] else ""
            for f in lv["findings"][:3]:
                line += f"\n    {f}"
            rep.error(f"level {lv['level']} {lv['name']}: {lv['status']}"
                      + (f"; localizes {lv['localizes']}" if lv["localizes"] else ""), echo=False)
        rep.say(line)
    rep.say(f"report: {out / 'report.md'}")
    if args.format == "html":
        from pcc.lang.outputs import write_atomic
        from pcc.lower import compile_file
        from pcc.plan.html_map import run_page

        from .report import PLOT_TITLES

        compiled = compile_file(rep.contract_file(args.contract))
        if compiled.plan is not None:
            write_atomic(out / "index.html", run_page(compiled.plan, compiled.diagnostics, out, PLOT_TITLES,
                                                      args.contract, "pcc validate"))
            rep.say(f"page: {out / 'index.html'}")
    return 0 if report["ok"] else 1
