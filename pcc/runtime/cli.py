"""`pcc run` (the embedded runtime, the default target) and `pcc experiment trainer-variants`.

Nothing heavy is imported at module level: torch loads inside the handlers. Other targets
(`--target miles`, `--target verl`) are registered by the `pcc` command (`add_run_target`); this module
knows only its own. Handlers are `fn(args, rep) -> exit code` (pcc/cli.py, docs/cli.md).
"""

from __future__ import annotations

import argparse
import shlex
import sys

# --target NAME -> fn(args, rep): the embedded runtime here, others added by pcc/cli.py.
RUN_TARGETS: dict = {}


def add_run_target(name: str, fn) -> None:
    RUN_TARGETS[name] = fn


def bounded(name: str):
    """An argparse type for the run setting `name`: its range is pcc.runtime.loop.RANGES (the one RunConfig
    checks), so `--lr -1` or `--temperature 0` is a usage error naming the flag and its range."""
    from .settings import RANGES, in_range

    kind = int if isinstance(RANGES[name][0], int) else float

    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {'a whole number' if kind is int else 'a number'}, "
                                             f"got {text!r}") from None
        why = in_range(name, value)
        if why is not None:
            raise argparse.ArgumentTypeError(why)
        return value

    parse.__name__ = name  # argparse names the type in "invalid <name> value"
    return parse


def _common(s) -> None:
    s.add_argument("contract", metavar="CONTRACT|BUNDLE",
                   help="a contract file, or a bundle directory with contract.prec")
    s.add_argument("--model", default="auto", help="run the contract on this catalog instead (tiny_moe, tiny_dense, tiny_moe_128, tiny_shared_moe, "
                                   "or auto (the default): the contract's own model when it is CPU-size, else its "
                                   "stand-in of the same structure, docs/runtime.md): "
                                   "re-resolved on hardware cpu with one-device parallelism")
    s.add_argument("--seed", type=bounded("seed"), default=0)
    s.add_argument("--prompts", type=bounded("prompts"), default=None, help="prompts per step (default 64; 1-4096)")
    s.add_argument("--group", type=bounded("group"), default=None, help="samples per prompt (default 8; 2-256)")
    s.add_argument("--lr", type=bounded("lr"), default=None, help="learning rate (default 3e-4; 0 < lr <= 1)")
    s.add_argument("--temperature", type=bounded("temperature"), default=None,
                   help="sampling temperature (default 1; 0.01-100)")
    s.add_argument("--json", action="store_true", help="print one JSON envelope on stdout (docs/cli.md)")


def register(sub) -> None:
    add_run_target("embedded", _run_embedded)
    s = sub.add_parser("run", help="run the compiled RL job on the embedded CPU runtime (default target)")
    _common(s)
    s.add_argument("--target", default="embedded", choices=RUN_TARGETS,
                   help="where to run: embedded (the default: the CPU runtime on this machine, no GPU), or a "
                        "registered launcher: miles (Megatron + SGLang over Ray) or verl (verl's main_ppo), from the bundle")
    s.add_argument("--dry-run", action="store_true",
                   help="with a target that launches elsewhere: print the launch, start nothing")
    s.add_argument("--steps", type=bounded("steps"), default=30)
    s.add_argument("-o", "--out", metavar="DIR", help="run directory (default runs/<contract>-s<seed>); an existing "
                   "run is continued only with --resume, started again only with --force (docs/runtime.md)")
    g = s.add_mutually_exclusive_group()
    g.add_argument("--resume", action="store_true", help="continue the run in --out from its last completed step "
                   "(the same contract and settings)")
    g.add_argument("--force", action="store_true", help="start the run in --out again, deleting its metrics and "
                   "checkpoints (never a directory of other files)")
    s.add_argument("--no-plots", action="store_true", help="skip the PNG plots (they need matplotlib)")
    s.add_argument("--format", choices=("text", "html"), default="text",
                   help="html: also write DIR/index.html, the contract's precision map with the run's plots")
    s.add_argument("--inject-fault", metavar="KIND:VERSION:TENSOR",
                   help="fault injection: drop or corrupt one tensor of one version's transfer")
    s.add_argument("--crash-at", type=bounded("crash_at"), metavar="STEP", help="fault injection: crash in STEP, after its rollout")
    s.set_defaults(fn=cmd_run, passthrough=[])
    s.epilog = ("pcc run BUNDLE --target miles|verl [--dry-run] -- ARGS...: ARGS go to the launcher (Miles' own flags, "
                "verl's Hydra overrides)")
    _pass_through(s)

    e = sub.add_parser("experiment", help="controlled experiments on the embedded runtime")
    esub = e.add_subparsers(dest="experiment", required=True)
    t = esub.add_parser("trainer-variants", help="seed Table 5: BF16 / forward QDQ / forward+backward QDQ / real "
                                                  "trainer against the contract's quantized rollout")
    _common(t)
    t.add_argument("--steps", type=bounded("steps"), default=4)
    t.set_defaults(fn=cmd_trainer_variants)


def _pass_through(s) -> None:
    """`pcc run ... -- ARGS...`: what follows the first `--` is the launcher's (args.passthrough),
    never parsed here. argparse alone cannot take options after a positional and a `--`."""
    parse = s.parse_known_args

    def parse_known_args(args=None, namespace=None):
        args = list(sys.argv[1:] if args is None else args)
        cut = args.index("--") if "--" in args else len(args)
        ns, rest = parse(args[:cut], namespace)
        ns.passthrough = args[cut + 1:]
        return ns, rest

    s.parse_known_args = parse_known_args


def _config(args, rep):
    from .loop import RunConfig
    from .settings import MAX_ROWS

    cfg = RunConfig(steps=args.steps, seed=args.seed)
    for k in ("prompts", "group", "lr", "temperature"):
        if getattr(args, k) is not None:
            setattr(cfg, k, getattr(args, k))
    if cfg.prompts * cfg.group > MAX_ROWS:
        raise rep.usage(f"--prompts {cfg.prompts} x --group {cfg.group} = {cfg.prompts * cfg.group} sequences: more "
                        f"than the {MAX_ROWS} the embedded runtime holds at once")
    return cfg


def _compile(args, rep):
    from .contract import ContractError, compile_for_runtime
    from .model import ArchError

    rep.contract_file(args.contract)  # exit 2 when it names no contract or bundle
    try:
        c = compile_for_runtime(args.contract, args.model)
        from .model import Arch

        Arch.from_catalog(c.plan.catalog)
        if c.model_override and args.model == "auto":
            print(f"note: running on {c.model_override}, a CPU-size model of the same structure as the "
                  f"contract's; --model chooses another", file=sys.stderr)
        return c
    except ContractError as exc:
        rep.extend([d for d in exc.diagnostics if d.is_error], exc.sources)
        rep.error(str(exc), code=exc.code)
    except ArchError as exc:
        rep.error(str(exc), code=exc.code)
    return None


def _fault(text: str | None):
    from .sync import Fault

    if text is None:
        return None
    kind, _, rest = text.partition(":")
    version, _, tensor = rest.partition(":")
    if kind not in ("drop", "corrupt") or not version.isdigit() or not tensor:
        raise ValueError(f"--inject-fault {text!r}: expected drop|corrupt:VERSION:TENSOR")
    return Fault(int(version), kind, tensor)


# The embedded runtime's own flags, at their defaults: a launcher target (miles, verl) takes none of them
EMBEDDED_ONLY = {"model": "auto", "seed": 0, "prompts": None, "group": None, "lr": None, "temperature": None,
                 "steps": 30, "out": None, "resume": False, "force": False, "no_plots": False, "inject_fault": None,
                 "crash_at": None, "format": "text"}


def cmd_run(args, rep) -> int:
    if args.target != "embedded":  # never ignored silently, as the embedded target refuses --dry-run and '--'
        given = [k for k, default in EMBEDDED_ONLY.items() if getattr(args, k, default) != default]
        if given:
            flag = "-o/--out" if given[0] == "out" else "--" + given[0].replace("_", "-")
            raise rep.usage(f"{flag}: a flag of the embedded runtime, which --target {args.target} does not run; "
                            "the job's own settings go after '--' (or in its job file)")
    return RUN_TARGETS[args.target](args, rep)


def _page(compiled, out, contract: str):
    """DIR/index.html: the precision map and the run's plots (pcc.plan.html_map)."""
    from pcc.lang.outputs import write_atomic
    from pcc.plan.html_map import run_page

    from .plots import CURVES

    titles = {f"{name}.png": name.replace("_", " ") for name, _, _ in CURVES}
    write_atomic(out / "index.html", run_page(compiled.plan, compiled.diagnostics, out, titles, contract, "pcc run"))
    return out / "index.html"


def _run_embedded(args, rep) -> int:
    from pathlib import Path

    if args.dry_run:
        raise rep.usage("--dry-run: the embedded target runs here and launches nothing; use --target miles or verl")
    if args.passthrough:
        raise rep.usage("arguments after '--' go to a launcher target (--target miles or verl); the embedded runtime "
                        "takes none")
    from .loop import InjectedCrash
    from .plots import PlotError
    from .report import render
    from .session import execute

    try:
        fault = _fault(args.inject_fault)
    except ValueError as exc:
        raise rep.usage(str(exc)) from None
    cfg = _config(args, rep)
    c = _compile(args, rep)
    if c is None:
        return 1
    cfg.fault, cfg.crash_at = fault, args.crash_at
    out = Path(args.out or f"runs/{c.plan.contract.name}-s{args.seed}")
    again = f"pcc run {shlex.quote(args.contract)} --resume --out {shlex.quote(str(out))}"
    try:
        summary = execute(c, cfg, out, resume=args.resume, plots=not args.no_plots, force=args.force)
    except InjectedCrash as exc:
        return rep.fail(f"{exc}; continue with: {again}")
    except KeyboardInterrupt:
        rep.error(f"interrupted; {out} keeps its last completed step: continue with: {again}")
        return 130
    except OSError as exc:  # a full or read-only disk: one line naming the path
        return rep.fail(f"{exc.filename or out}: cannot write: {exc.strerror}", file=str(exc.filename or out),
                        code="PCC709")
    except (PlotError, ValueError) as exc:
        return rep.fail(str(exc), code=getattr(exc, "code", None) or None)
    rep.result = summary
    rep.say(render(summary))
    rep.say(f"run directory: {out}")
    if args.format == "html":
        rep.say(f"page: {_page(c, out, args.contract)}")
    if summary["error"]:
        return rep.fail(summary["error"])
    return 0


def cmd_trainer_variants(args, rep) -> int:
    from .experiment import render, trainer_variants
    from .session import set_threads

    cfg = _config(args, rep)
    set_threads()
    c = _compile(args, rep)
    if c is None:
        return 1
    try:
        res = trainer_variants(c.plan, cfg)
    except ValueError as exc:
        return rep.fail(str(exc), code=getattr(exc, "code", None) or None)
    rep.result = res
    rep.say(render(res))
    if not res["finding"]["reproduced"]:
        return rep.fail("the finding was not reproduced (result.finding)")
    return 0
