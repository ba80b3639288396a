"""`pcc compile CONTRACT -o BUNDLE`: check, resolve, lower every target, write the bundle."""

from __future__ import annotations

import json
import sys


def cmd_compile(args) -> int:
    from pcc.bundle import BundleError, write_bundle
    from pcc.plan import compile_file

    c = compile_file(args.file)
    for d in c.diagnostics:
        if not args.json:
            print(d.render(c.sources), file=sys.stderr)
    if not c.ok:
        if args.json:
            print(json.dumps({"file": args.file, "ok": False, "diagnostics": [d.to_json() for d in c.diagnostics]}))
        return 1
    try:
        files = write_bundle(c.plan, args.output, force=args.force)
    except BundleError as exc:
        print(f"pcc compile: {exc}", file=sys.stderr)
        return 1
    verified = verify_engines(c.plan, args.output) if args.verify else []
    failed = [v for v in verified if not v["ok"]]
    if args.json:
        print(json.dumps({"file": args.file, "ok": not failed, "bundle": args.output, "files": sorted(files),
                          "verify": verified, "diagnostics": [d.to_json() for d in c.diagnostics]}, indent=1))
    else:
        print(f"{args.output}: {len(files)} files from {args.file}")
        for v in verified:
            print(f"  verify {v['target']}: {'ok' if v['ok'] else 'REJECTED: ' + v['message']}")
    return 1 if failed else 0


def verify_engines(plan, bundle: str) -> list[dict]:
    """Run the bundle's engine arguments through the engines' own parsers and config classes."""
    import contextlib
    import os
    import warnings

    from pcc.lower import lower

    def megatron():
        from pcc.lower import verify_megatron as vm

        lo = lower(plan, "megatron")
        here = os.getcwd()
        os.chdir(bundle)  # the precision file is named relative to the bundle
        try:
            vm.verify_megatron_args(lo.args, vm.model_args(plan), vm.device_arch(plan), lo.env)
        finally:
            os.chdir(here)

    def sglang():
        from pcc.lower.verify_sglang import verify_sglang_args

        verify_sglang_args(lower(plan, "sglang").args)

    out = []
    for name, check in (("megatron", megatron), ("sglang", sglang)):
        try:
            with open(os.devnull, "w") as null, warnings.catch_warnings(), contextlib.redirect_stderr(null):
                warnings.simplefilter("ignore")  # the engines warn about missing GPU libraries on import
                check()
        except ImportError as exc:
            out.append({"target": name, "ok": False, "message": f"the engine's parser is not installed ({exc}); "
                        "bash requirements/install-engines.sh"})
        except Exception as exc:  # the engine's own rejection, reported as such
            out.append({"target": name, "ok": False, "message": str(exc)})
        else:
            out.append({"target": name, "ok": True, "message": ""})
    return out


def register(sub) -> None:
    s = sub.add_parser("compile", help="compile a contract into a runnable job bundle")
    s.add_argument("file")
    s.add_argument("-o", "--output", required=True, help="the bundle directory to write")
    s.add_argument("--force", action="store_true", help="replace an existing bundle")
    s.add_argument("--verify", action="store_true", help="check the engine arguments with the engines' parsers")
    s.add_argument("--json", action="store_true")
    s.set_defaults(fn=cmd_compile)
