#!/usr/bin/env python3
"""Regenerate targets/miles_flags.json: the flags Miles' launcher parses, from the public sources.

Miles (radixark/miles) cannot be installed here, so its parser is checked against this file in
CI (tests/lower/test_engine_flags.py). Two parts, each read at a pinned commit of a local git
copy of the repository (`git archive`, nothing is fetched):

- Megatron: the parser of the Megatron-LM Miles runs (radixark/Megatron-LM, branch miles-main),
  built by importing that tree's megatron/training/arguments.py in a child process and calling
  its add_megatron_arguments (many flags are generated from TransformerConfig's annotations, so
  reading the source text would miss them). The package is entered without
  megatron/training/__init__.py, whose training loop needs GPU libraries; the get_* helpers that
  arguments.py imports from it are only called while parsing, never while building the parser.
- Miles: the add_argument / reset_arg calls of miles/utils/arguments.py, miles/dashboard/args.py
  and miles/backends/sglang_utils/arguments.py, read with `ast` (importing them needs Ray, the
  SGLang router and GPU packages). A reset_arg on a flag Megatron already defines only changes its
  default; on another flag it adds it. A value that is not a literal (choices built from an enum)
  is recorded as unknown ("choices": "dynamic"). The SGLang server flags Miles registers as
  --sglang-<field> come from SGLang's own parser; the file records the fields Miles skips.

Each flag: "from" (megatron or miles), "nargs" (0 for a switch, 1 for one value, "?", "+", "*",
or a count), "type" (int, float, str, or the converter's name), "choices" (a list, "dynamic" or
null), and "required": true for a flag the parser requires. Usage (defaults: the mirrors under /work/.mirror and the commits below):

    python tools/miles_flags.py [--miles GIT_DIR] [--miles-commit C] [--megatron GIT_DIR]
                                [--megatron-commit C] [-o targets/miles_flags.json]
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "targets" / "miles_flags.json"
MILES = ("radixark/miles", "/work/.mirror/radixark+miles/repo", "31f1ca961a94cb860cec3b2dea34ec332bfa8f76")
MEGATRON = ("radixark/Megatron-LM", "/work/.mirror/radixark+Megatron-LM/repo",
            "2e64d788b67fe8155774200c87606e1e449c494b")
MILES_FILES = ("miles/utils/arguments.py", "miles/dashboard/args.py", "miles/backends/sglang_utils/arguments.py")
SWITCH_ACTIONS = {"store_true", "store_false", "store_const", "count", "help", "version"}


def git_show(git_dir: str, commit: str, path: str) -> str:
    return subprocess.run(["git", "--git-dir", git_dir, "show", f"{commit}:{path}"], check=True,
                          capture_output=True, text=True).stdout


def _nargs(action_name: str | None, nargs) -> object:
    if action_name in SWITCH_ACTIONS or action_name == "BooleanOptionalAction":
        return 0
    return 1 if nargs is None else nargs


def dump_megatron(tree: str) -> dict:
    """(In the child process) the fork's Megatron parser, flag -> definition."""
    import types
    import typing
    import warnings

    warnings.simplefilter("ignore")
    sys.path.insert(0, tree)
    if not hasattr(typing, "override"):  # Python < 3.12: megatron imports typing.override
        import typing_extensions

        typing.override = typing_extensions.override
    import megatron

    if Path(megatron.__path__[0]).resolve() != (Path(tree) / "megatron").resolve():
        raise SystemExit(f"imported megatron from {megatron.__path__[0]}, not {tree}")
    training = types.ModuleType("megatron.training")
    training.__path__ = [str(Path(tree) / "megatron" / "training")]

    def helper(name):
        if name.startswith("get_"):
            def unavailable(*args, **kwargs):
                raise RuntimeError(f"megatron.training.{name} is not available while building the parser")
            return unavailable
        raise AttributeError(name)

    training.__getattr__ = helper
    sys.modules["megatron.training"] = training
    from megatron.training import arguments

    parser = arguments.add_megatron_arguments(argparse.ArgumentParser(allow_abbrev=False))
    out = {}
    for act in parser._actions:
        kind = type(act).__name__
        name = {"_StoreTrueAction": "store_true", "_StoreFalseAction": "store_false",
                "_StoreConstAction": "store_const", "_CountAction": "count", "_HelpAction": "help",
                "BooleanOptionalAction": "BooleanOptionalAction"}.get(kind)
        conv = act.type
        typename = None if conv is None else getattr(conv, "__name__", type(conv).__name__)
        choices = None if act.choices is None else sorted(str(c) for c in act.choices)
        for opt in act.option_strings:
            if opt.startswith("--"):
                out[opt] = {"from": "megatron", "nargs": _nargs(name, act.nargs), "type": typename,
                            "choices": choices, **({"required": True} if act.required else {})}
    return out


def _constants(tree: ast.Module) -> dict[str, object]:
    out = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            try:
                out[node.targets[0].id] = ast.literal_eval(node.value)
            except ValueError:
                pass
    return out


def _value(node: ast.expr, consts: dict) -> object:
    try:
        return ast.literal_eval(node)
    except ValueError:
        if isinstance(node, ast.Name) and node.id in consts:
            return consts[node.id]
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            left, right = _value(node.left, consts), _value(node.right, consts)
            if isinstance(left, list) and isinstance(right, list):
                return left + right
        return None


def miles_calls(text: str) -> tuple[dict, list[str], list[str]]:
    """(flag -> definition, reset_arg flags, SGLang fields Miles skips) of one Miles source file."""
    tree = ast.parse(text)
    consts = _constants(tree)
    flags: dict = {}
    resets: dict = {}
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        fname = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None
        if fname == "add_argument":
            names = node.args
        elif fname == "reset_arg" and len(node.args) >= 2:
            names = node.args[1:2]
        else:
            continue
        opts = [a.value for a in names if isinstance(a, ast.Constant) and isinstance(a.value, str)]
        if not opts or any(not isinstance(a, ast.Constant) for a in names):
            continue  # the prefixing wrapper's pass-through call, not a definition
        kw = {k.arg: k.value for k in node.keywords if k.arg}
        action = kw.get("action")
        action_name = (action.value if isinstance(action, ast.Constant) else
                       action.attr if isinstance(action, ast.Attribute) else
                       action.id if isinstance(action, ast.Name) else None)
        conv = kw.get("type")
        typename = (None if conv is None else conv.id if isinstance(conv, ast.Name) else
                    "lambda" if isinstance(conv, ast.Lambda) else ast.unparse(conv))
        if "choices" in kw:
            choices = _value(kw["choices"], consts)
            choices = "dynamic" if choices is None else sorted(str(c) for c in choices)
        else:
            choices = None
        nargs = _value(kw["nargs"], consts) if "nargs" in kw else None
        entry = {"from": "miles", "nargs": _nargs(action_name, nargs), "type": typename, "choices": choices}
        if "required" in kw and _value(kw["required"], consts) is True:
            entry["required"] = True
        long = [o for o in opts if o.startswith("--")]
        if action_name == "BooleanOptionalAction":
            long += ["--no-" + o[2:] for o in long]
        for opt in long:
            (resets if fname == "reset_arg" else flags)[opt] = entry
    skipped = consts.get("_SKIPPED_SERVER_ARGS", [])
    return flags, resets, skipped


def generate(miles_git: str, miles_commit: str, megatron_git: str, megatron_commit: str) -> str:
    with tempfile.TemporaryDirectory(prefix="pcc-megatron-fork-") as tmp:
        archive = subprocess.run(["git", "--git-dir", megatron_git, "archive", megatron_commit],
                                 check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", tmp], input=archive, check=True)
        env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
        child = subprocess.run([sys.executable, __file__, "--dump-megatron", tmp], capture_output=True, text=True,
                               env=env, cwd=tmp)
        if child.returncode != 0:
            raise SystemExit(f"building the fork's Megatron parser failed:\n{child.stderr[-3000:]}")
        flags = json.loads(child.stdout)
    skipped: list[str] = []
    for path in MILES_FILES:
        own, resets, skip = miles_calls(git_show(miles_git, miles_commit, path))
        clash = sorted(set(own) & set(flags))
        if clash:
            raise SystemExit(f"{path} defines flags Megatron defines too: {clash}")
        flags.update(own)
        flags.update({k: v for k, v in resets.items() if k not in flags})
        skipped += skip
    head = {
        "_about": "Flags Miles' launcher parses (Megatron from Miles' fork + Miles' own), generated by "
                  "tools/miles_flags.py; do not edit. --sglang-<field> flags: SGLang's server fields "
                  "except sglang_skipped.",
        "sources": {"megatron": {"repository": MEGATRON[0], "branch": "miles-main", "commit": megatron_commit,
                                 "read": "megatron/training/arguments.py add_megatron_arguments (imported)"},
                    "miles": {"repository": MILES[0], "commit": miles_commit, "read": list(MILES_FILES)}},
        "sglang_prefix": "--sglang-",
        "sglang_skipped": sorted(set(skipped)),
    }
    lines = ["{"] + [f" {json.dumps(k)}: {json.dumps(v, sort_keys=True)}," for k, v in head.items()]
    body = [f'  {json.dumps(k)}: {json.dumps(flags[k], sort_keys=True)}' for k in sorted(flags)]
    return "\n".join(lines + [' "flags": {', ",\n".join(body), " }", "}"]) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--miles", default=MILES[1], help="git directory of radixark/miles")
    ap.add_argument("--miles-commit", default=MILES[2])
    ap.add_argument("--megatron", default=MEGATRON[1], help="git directory of radixark/Megatron-LM")
    ap.add_argument("--megatron-commit", default=MEGATRON[2])
    ap.add_argument("-o", "--out", default=str(OUT))
    ap.add_argument("--dump-megatron", metavar="TREE", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.dump_megatron:
        json.dump(dump_megatron(a.dump_megatron), sys.stdout)
        return 0
    text = generate(a.miles, a.miles_commit, a.megatron, a.megatron_commit)
    out = Path(a.out)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, out)  # atomic: a reader sees the old file or the new one
    print(f"{out}: {len(json.loads(text)['flags'])} flags")
    return 0


if __name__ == "__main__":
    sys.exit(main())
