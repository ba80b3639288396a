"""`pcc compile CONTRACT -o BUNDLE`: check, resolve, lower every target, write the bundle;
and the `miles` and `verl` targets of `pcc run` (registered by pcc/cli.py). Handlers are
`fn(args, rep) -> exit code` (pcc/cli.py, docs/cli.md)."""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys


def cmd_compile(args, rep) -> int:
    from pcc.bundle import BundleError
    from pcc.bundle.write import write_bundle
    from pcc.lower import compile_file

    path = rep.contract_file(args.file)
    c = compile_file(path)
    rep.extend(c.diagnostics, c.sources)
    if not c.ok:
        return 1
    try:
        files = write_bundle(c.plan, args.out, force=args.force, contract_path=path)
    except BundleError as exc:
        return rep.fail(str(exc), code=exc.code)
    verified = verify_engines(c.plan, args.out) if args.verify else []
    failed = [v for v in verified if not v["ok"]]
    for v in failed:
        asked = f" ({v['key']} is asked by {v['rule'] or v['path']})" if v.get("key") else ""
        rep.error(f"verify {v['target']}: REJECTED: {v['message']}{asked}")
    rep.result = {"file": args.file, "bundle": args.out, "files": sorted(files), "verify": verified}
    rep.say(f"{args.out}: {len(files)} files from {args.file}")
    for v in verified:
        rep.say(f"  verify {v['target']}: {'ok' if v['ok'] else 'REJECTED: ' + v['message']}")
    return 1 if failed else 0


def run_on_framework(args, rep) -> int:
    """`pcc run CONTRACT|BUNDLE --target miles|verl [--dry-run] [-- ARGS...]`: pcc.bundle.launch, in the
    frame's terms (with --json its printed launch becomes the envelope's result, its errors
    diagnostics). ARGS go to the framework after the bundle's own (later flags or overrides win)."""
    from pcc.bundle import FRAMEWORKS
    from pcc.bundle.launch import run_launch

    framework, name = args.target, FRAMEWORKS[args.target]
    rep.contract_file(args.contract)  # exit 2 when it names no contract or bundle; a bundle's manifest checked
    problem = launch_files_problem(args.contract, framework)
    if problem is not None:
        return rep.fail(problem, code="PCC706")
    extra = list(getattr(args, "passthrough", None) or [])
    if not rep.json:
        code = run_launch(framework, args.contract, args.dry_run, False, extra)
    else:
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = run_launch(framework, args.contract, args.dry_run, True, extra)
        sys.stderr.write(err.getvalue())
        if out.getvalue().strip():
            rep.result = json.loads(out.getvalue())
        if code != 0:
            text = err.getvalue().strip()
            problems = [ln.strip()[2:] for ln in text.splitlines() if ln.startswith("  - ")]
            for p in problems:
                rep.error(f"cannot launch on {name}: {p}")
            if text and not problems:
                rep.error(text.removeprefix("error: "))
    if code not in (0, 1):
        return rep.fail(f"{framework}/launch.sh exited with status {code}")
    return code


def launch_files_problem(source: str, framework: str) -> str | None:
    """What is wrong with a bundle's launch files beyond their hashes (a manifest rewritten to match an edit):
    FRAMEWORK/launch.sh present, and miles/runtime-env.json {"env_vars": {NAME: "value"}}. None when fine or
    not a bundle."""
    from pathlib import Path

    from pcc.bundle import is_bundle
    from pcc.lang.inputs import InputError, read_json

    if not is_bundle(source):
        return None
    if not (Path(source) / framework / "launch.sh").is_file():
        return (f"{Path(source) / framework / 'launch.sh'}: missing; the bundle has no {framework} target "
                f"(its contract does not name 'framework {framework}')")
    if framework != "miles":
        return None
    path = Path(source) / "miles" / "runtime-env.json"
    if not path.exists():
        return f"{path}: missing; the bundle has no Miles target (recompile with it)"
    try:
        doc = read_json(path, what="runtime environment")
    except InputError as exc:
        return exc.message
    env = doc.get("env_vars") if isinstance(doc, dict) else None
    if not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
        return f"{path}: malformed: expected {{\"env_vars\": {{NAME: \"value\", ...}}}}"
    return None


def verify_engines(plan, bundle: str) -> list[dict]:
    """Run the bundle's engine arguments through the engines' own parsers and config classes: each of its
    targets that has one (Megatron, FSDP, SGLang, vLLM, verl), in the order of `targets_for`."""
    import contextlib
    import os
    import warnings

    from pcc.lower import lower, targets_for

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

    def vllm():
        from pcc.lower import verify_vllm as vv
        from pcc.lower.checkpoint_config import quantization_config
        from pcc.lower.vllm import QUANT_FILE

        lo = lower(plan, "vllm")
        quant = []
        if QUANT_FILE in lo.files:  # the checkpoint config vLLM resolves against --quantization
            flag = lo.value("--quantization")
            quant.append({"config": quantization_config(plan), "flag": flag,
                          "model_type": plan.catalog.config.get("model_type")})
        out = vv.run_batch(args=[lo.args], quant=quant)
        for got in out["args"] + out["quant"]:
            if "error" in got:
                raise vv.VerifyError(got["error"])

    def verl():
        from pcc.lower.verify_verl import verify_verl_job
        from pcc.lower.verl import tables

        verify_verl_job(tables()["config_name"][plan.contract.trainer.engine], lower(plan, "verl").args)

    def fsdp():
        from pcc.lower.verify_fsdp import verify_plan

        verify_plan(plan)  # torchao's, torch's and PEFT's classes, applied to a meta model of the modules

    checks = {"megatron": megatron, "fsdp": fsdp, "sglang": sglang, "vllm": vllm, "verl": verl}
    out = []
    for name, check in ((n, checks[n]) for n in targets_for(plan) if n in checks):
        try:
            with open(os.devnull, "w") as null, warnings.catch_warnings(), contextlib.redirect_stderr(null):
                warnings.simplefilter("ignore")  # the engines warn about missing GPU libraries on import
                check()
        except ImportError as exc:
            out.append({"target": name, "ok": False, "message": f"the engine's parser is not installed ({exc}); "
                        "bash requirements/install-engines.sh"})
        except Exception as exc:  # the engine's own rejection, reported as such, with the rule that asked
            out.append({"target": name, "ok": False, "message": str(exc), **_asked(plan, name, str(exc))})
        else:
            out.append({"target": name, "ok": True, "message": ""})
    return out


def _asked(plan, name: str, message: str) -> dict:
    """The contract rule behind the setting an engine's rejection names: the first record of the target
    whose key the message quotes (`{}` when it names none)."""
    from pcc.lower import lower

    found = next((s for s in lower(plan, name).settings if s.key in message and s.path), None)
    if found is None:
        return {}
    span = plan.smap.find(found.path)
    return {"key": found.key, "path": found.path, "rule": str(span) if span else None}


def register(sub) -> None:
    s = sub.add_parser("compile", help="compile a contract into a runnable job bundle")
    s.add_argument("file", metavar="CONTRACT|BUNDLE")
    s.add_argument("-o", "--out", metavar="BUNDLE", help="the bundle directory to write (required)")
    s.add_argument("--output", dest="out", help=argparse.SUPPRESS)
    s.set_defaults(required_out=True)
    s.add_argument("--force", action="store_true", help="replace an existing bundle")
    s.add_argument("--verify", action="store_true", help="check the engine arguments with the engines' parsers")
    s.add_argument("--json", action="store_true", help="print one JSON envelope on stdout (docs/cli.md)")
    s.set_defaults(fn=cmd_compile)
