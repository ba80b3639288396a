"""`pcc run` (the embedded runtime, the default target) and `pcc experiment trainer-variants`.

Nothing heavy is imported at module level: torch loads inside the handlers.
"""

from __future__ import annotations

import json
import sys


def _common(s) -> None:
    s.add_argument("contract", metavar="CONTRACT|BUNDLE",
                   help="a contract file, or a bundle directory with contract.prec")
    s.add_argument("--model", default="auto", help="run the contract on this catalog instead (tiny_moe, tiny_dense, tiny_moe_128, tiny_shared_moe, "
                                   "or auto (the default): the contract's own model when it is CPU-size, else its "
                                   "stand-in of the same structure, docs/runtime.md): "
                                   "re-resolved on hardware cpu with one-device parallelism")
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--prompts", type=int, default=None, help="prompts per step (default 64)")
    s.add_argument("--group", type=int, default=None, help="samples per prompt (default 8)")
    s.add_argument("--lr", type=float, default=None, help="learning rate (default 3e-4)")
    s.add_argument("--temperature", type=float, default=None)
    s.add_argument("--json", action="store_true", help="print the summary as JSON")


def register(sub) -> None:
    s = sub.add_parser("run", help="run the compiled RL job on the embedded CPU runtime (default target)")
    _common(s)
    s.add_argument("--target", default="embedded", choices=("embedded", "miles"),
                   help="where to run: the embedded runtime (no GPU), or Miles (Megatron + SGLang over Ray)")
    s.add_argument("--dry-run", action="store_true", help="with --target miles: print the command and environment")
    s.add_argument("--steps", type=int, default=30)
    s.add_argument("--out", help="run directory (default runs/<contract>-s<seed>)")
    s.add_argument("--resume", action="store_true", help="continue from the run directory's last completed step")
    s.add_argument("--no-plots", action="store_true", help="skip the PNG plots (they need matplotlib)")
    s.add_argument("--inject-fault", metavar="KIND:VERSION:TENSOR",
                   help="fault injection: drop or corrupt one tensor of one version's transfer")
    s.add_argument("--crash-at", type=int, metavar="STEP", help="fault injection: crash in STEP, after its rollout")
    s.set_defaults(fn=cmd_run)

    e = sub.add_parser("experiment", help="controlled experiments on the embedded runtime")
    esub = e.add_subparsers(dest="experiment", required=True)
    t = esub.add_parser("trainer-variants", help="seed Table 5: BF16 / forward QDQ / forward+backward QDQ / real "
                                                  "trainer against the contract's quantized rollout")
    _common(t)
    t.add_argument("--steps", type=int, default=4)
    t.set_defaults(fn=cmd_trainer_variants)


def _config(args):
    from .loop import RunConfig

    cfg = RunConfig(steps=args.steps, seed=args.seed)
    for k in ("prompts", "group", "lr", "temperature"):
        if getattr(args, k) is not None:
            setattr(cfg, k, getattr(args, k))
    return cfg


def _compile(args):
    from .contract import ContractError, compile_for_runtime
    from .model import ArchError

    try:
        c = compile_for_runtime(args.contract, args.model)
        from .model import Arch

        Arch.from_catalog(c.plan.catalog)
        if c.model_override and args.model == "auto":
            print(f"note: running on {c.model_override}, a CPU-size model of the same structure as the "
                  f"contract's; --model chooses another", file=sys.stderr)
        return c
    except ContractError as exc:
        for d in exc.diagnostics:
            if d.is_error:
                print(d.render(exc.sources), file=sys.stderr)
        print(f"error: {exc}", file=sys.stderr)
    except ArchError as exc:
        print(f"error: {exc}", file=sys.stderr)
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


def cmd_run(args) -> int:
    from pathlib import Path

    if args.target == "miles":
        from pcc.bundle.launch import run_miles

        return run_miles(args.contract, args.dry_run, args.json)

    from .loop import InjectedCrash
    from .plots import PlotError
    from .report import render
    from .session import execute

    try:
        fault = _fault(args.inject_fault)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    c = _compile(args)
    if c is None:
        return 1
    cfg = _config(args)
    cfg.fault, cfg.crash_at = fault, args.crash_at
    out = Path(args.out or f"runs/{c.plan.contract.name}-s{args.seed}")
    try:
        summary = execute(c, cfg, out, resume=args.resume, plots=not args.no_plots)
    except InjectedCrash as exc:
        print(f"error: {exc}; continue with: pcc run {args.contract} --resume --out {out}", file=sys.stderr)
        return 1
    except (PlotError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(summary, indent=1))
    else:
        print(render(summary))
        print(f"run directory: {out}")
    if summary["error"]:
        print(f"error: {summary['error']}", file=sys.stderr)
        return 1
    return 0


def cmd_trainer_variants(args) -> int:
    from .experiment import render, trainer_variants
    from .session import set_threads

    set_threads()
    c = _compile(args)
    if c is None:
        return 1
    try:
        res = trainer_variants(c.plan, _config(args))
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(res, indent=1) if args.json else render(res))
    return 0 if res["finding"]["reproduced"] else 1
