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
    verified = _verify(c.plan) if args.verify else []
    failed = [v for v in verified if not v["ok"]]
    if args.json:
        print(json.dumps({"file": args.file, "ok": not failed, "bundle": args.output, "files": sorted(files),
                          "verify": verified, "diagnostics": [d.to_json() for d in c.diagnostics]}, indent=1))
    else:
        print(f"{args.output}: {len(files)} files from {args.file}")
        for v in verified:
            print(f"  verify {v['target']}: {'ok' if v['ok'] else 'REJECTED: ' + v['message']}")
    return 1 if failed else 0


def _verify(plan) -> list[dict]:
    """Run the generated arguments through the engines' own parsers."""
    from pcc.lower import lower

    out = []
    checks = (("megatron", "pcc.lower.verify_megatron", "verify_megatron_args"),
              ("sglang", "pcc.lower.verify_sglang", "verify_sglang_args"))
    for name, module, fn in checks:
        import importlib

        try:
            verify = getattr(importlib.import_module(module), fn)
            verify(lower(plan, name).args)
        except ImportError as exc:
            out.append({"target": name, "ok": False, "message": f"the engine's parser is not installed ({exc})"})
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
