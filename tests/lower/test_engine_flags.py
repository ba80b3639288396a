"""Every flag pcc generates for a Miles launch exists in Miles' parser with an arity, type and
choices that accept its value: targets/miles_flags.json, the flag definitions of Miles' own
parser and of the Megatron-LM fork it runs, generated from their public sources by
tools/miles_flags.py (Miles itself cannot be installed here). The file must be what the script
produces from the pinned commits, so a change in either parser shows up as a failing test.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

from pcc.lower import lower, targets_for
from pcc.lower.miles_arch import ArchGap, model_args, tables
from pcc.plan import compile_file

ROOT = Path(__file__).resolve().parents[2]
CONTRACTS = sorted((ROOT / "contracts").glob("*.prec"))
FILE = ROOT / "targets" / "miles_flags.json"
DATA = json.loads(FILE.read_text(encoding="utf-8"))
TOOL = ROOT / "tools" / "miles_flags.py"
CONVERT = {"int": int, "float": float}


def groups(args: list[str]) -> list[tuple[str, list[str]]]:
    out: list[tuple[str, list[str]]] = []
    for a in args:
        if a.startswith("--"):
            out.append((a, []))
        else:
            out[-1][1].append(a)
    return out


def problems(flag: str, values: list[str]) -> list[str]:
    """Why Miles' parser would not take `flag values` (empty: it would), from the flag file."""
    if flag.startswith(DATA["sglang_prefix"]):
        field = flag[len(DATA["sglang_prefix"]):].replace("-", "_")
        return [f"{flag}: Miles registers no --sglang-{field} (it skips {field})"] * (field in DATA["sglang_skipped"])
    d = DATA["flags"].get(flag)
    if d is None:
        return [f"{flag}: not a flag of Miles' parser"]
    n, out = d["nargs"], []
    if not (n == len(values) if isinstance(n, int) else
            len(values) <= 1 if n == "?" else len(values) >= (n == "+")):
        out.append(f"{flag}: takes {n} value(s), given {values}")
    for v in values:
        if d["type"] in CONVERT:
            try:
                CONVERT[d["type"]](v)
            except ValueError:
                out.append(f"{flag}: {v!r} is not {d['type']}")
        if isinstance(d["choices"], list) and v not in d["choices"]:
            out.append(f"{flag}: {v!r} not in {d['choices']}")
    return out


def launch_args(path: Path) -> list[str]:
    """What a bundle's miles/launch.sh passes Miles before the job: architecture, contract flags, paths."""
    plan = compile_file(str(path)).plan
    m = lower(plan, "miles")
    try:
        arch = model_args(plan)
    except ArchGap:
        arch = []
    extra = ["--custom-tis-function-path", "tis.py"] if "--custom-tis-function-path" in m.files["miles/launch.sh"] else []
    return arch + m.args[1:] + ["--hf-checkpoint", "ckpt", "--ref-load", "ref"] + extra


MILES_CONTRACTS = [p for p in CONTRACTS if "miles" in targets_for(compile_file(str(p)).plan)]


@pytest.mark.parametrize("path", MILES_CONTRACTS, ids=lambda p: p.stem)
def test_every_generated_flag_is_one_miles_parser_takes(path):
    found = [p for flag, values in groups(launch_args(path)) for p in problems(flag, values)]
    assert not found, "\n".join(found)


def test_the_check_refuses_what_miles_would():
    assert problems("--fp8-recipe", ["blockwise"]) == []
    assert problems("--fp8-recipe", ["blocks"])  # not a choice
    assert problems("--tis-clip", ["two"])  # not a float
    assert problems("--colocate", ["1"])  # a switch takes no value
    assert problems("--rotary-base", [])  # a value flag needs its value
    assert problems("--sglang-enable-return-routed-experts", [])  # Miles owns it
    assert problems("--no-such-flag", [])


def test_fork_only_flags_are_the_megatron_fork_flags_of_miles_yaml():
    """The value flags verify_megatron drops before megatron-core parses (it lacks them) are Megatron
    flags of Miles' fork, each taking one value."""
    for flag in tables()["megatron_fork_flags"]:
        d = DATA["flags"][flag]
        assert d["from"] == "megatron" and d["nargs"] == 1, (flag, d)


def test_miles_refused_sglang_fields_are_what_its_parser_skips():
    assert sorted(tables()["sglang_owned"]["refused"]) == DATA["sglang_skipped"]


def _mirrors() -> bool:
    src = DATA["sources"]
    for name, git in (("miles", "/work/.mirror/radixark+miles/repo"),
                      ("megatron", "/work/.mirror/radixark+Megatron-LM/repo")):
        ok = subprocess.run(["git", "--git-dir", git, "cat-file", "-e", src[name]["commit"]],
                            capture_output=True).returncode == 0
        if not ok:
            return False
    return True


@pytest.mark.engines
def test_the_file_is_what_the_script_generates(tmp_path):
    """Regenerate from the pinned commits and compare byte for byte (needs the repositories' git copies:
    pcc's fetch puts them under /work/.mirror; megatron-core's dependencies are installed with it)."""
    if not _mirrors():
        pytest.skip("no local git copy of radixark/miles and radixark/Megatron-LM at the pinned commits")
    pytest.importorskip("megatron")
    out = tmp_path / "flags.json"
    subprocess.run([sys.executable, str(TOOL), "-o", str(out)], check=True, capture_output=True, timeout=300)
    assert out.read_text(encoding="utf-8") == FILE.read_text(encoding="utf-8"), \
        "targets/miles_flags.json differs from what tools/miles_flags.py generates: rerun it and review the diff"


@pytest.mark.engines
@pytest.mark.parametrize("path", MILES_CONTRACTS, ids=lambda p: p.stem)
def test_sglang_pass_through_values_are_what_sglang_parser_takes(path):
    """Miles registers --sglang-<field> with SGLang's own definition of --<field>: each value a launch
    passes is parsed by that definition (type and choices) of the SGLang pcc targets."""
    vs = pytest.importorskip("pcc.lower.verify_sglang")
    try:
        _, parser = vs._server_args()
    except vs.EngineMissing as exc:
        pytest.skip(str(exc))
    actions = {o: a for a in parser._actions for o in a.option_strings}
    prefix = DATA["sglang_prefix"]
    for flag, values in groups(launch_args(path)):
        if not flag.startswith(prefix):
            continue
        action = actions["--" + flag[len(prefix):]]
        for v in values:
            value = action.type(v) if callable(action.type) else v
            assert action.choices is None or value in action.choices, (flag, v, action.choices)
        assert (action.nargs == 0) == (not values), (flag, values)


def miles_parser(sglang_parser) -> argparse.ArgumentParser:
    """A parser with Miles' flag definitions (targets/miles_flags.json) and its --sglang-<field> flags
    (SGLang's own definitions, less the fields Miles skips): Miles' parse_args as far as arity, types,
    choices and required flags go."""
    p = argparse.ArgumentParser(prog="miles", add_help=False, allow_abbrev=False)
    for flag, d in DATA["flags"].items():
        kw: dict = {"dest": flag, "required": d.get("required", False)}
        conv = CONVERT.get(d["type"], str)
        if d["nargs"] == 0:
            kw["action"] = "store_true"
        else:
            kw["type"] = conv
            if d["nargs"] != 1:
                kw["nargs"] = d["nargs"]
            if isinstance(d["choices"], list):
                kw["choices"] = [conv(c) for c in d["choices"]]
        p.add_argument(flag, **kw)
    prefix, skipped = DATA["sglang_prefix"], set(DATA["sglang_skipped"])
    for act in sglang_parser._actions:
        for opt in act.option_strings:
            if opt.startswith("--") and act.dest not in skipped and opt not in ("--help",):
                kw = {"dest": "sglang_" + opt[2:]}
                if act.nargs == 0:
                    kw["action"] = "store_true"
                else:
                    kw.update(nargs=act.nargs, type=act.type, choices=act.choices)
                p.add_argument(prefix + opt[2:], **kw)
    return p


def _parse(parser, args: list[str]) -> str:
    """'' when the parser takes `args`, else its error."""
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            parser.parse_args(args)
    except SystemExit:
        return err.getvalue().strip().splitlines()[-1]
    return ""


JOB = ["--rollout-batch-size", "32", "--n-samples-per-prompt", "8", "--global-batch-size", "256",
       "--rollout-max-response-len", "1024", "--prompt-data", "data.jsonl"]


@pytest.mark.engines
@pytest.mark.parametrize("path", MILES_CONTRACTS, ids=lambda p: p.stem)
def test_the_launch_with_a_job_is_a_command_miles_parser_takes(path):
    """What miles/launch.sh passes Miles (model_args.txt and args.txt read as it reads them, the
    checkpoints, a job file): refused without the job's --rollout-batch-size, taken with it."""
    vs = pytest.importorskip("pcc.lower.verify_sglang")
    try:
        _, sglang_parser = vs._server_args()
    except vs.EngineMissing as exc:
        pytest.skip(str(exc))
    from pcc.bundle.launch import words
    from pcc.lower.miles import MODEL_ARGS

    plan = compile_file(str(path)).plan
    m = lower(plan, "miles")
    launch = (words(m.files[MODEL_ARGS]) + m.files["miles/args.txt"].split("\n")[1:-1]
              + ["--hf-checkpoint", "ckpt", "--ref-load", "ref"])
    if "--custom-tis-function-path" in m.files["miles/launch.sh"]:
        launch += ["--custom-tis-function-path", "tis.py"]
    parser = miles_parser(sglang_parser)
    assert "--rollout-batch-size" in _parse(parser, launch)
    assert _parse(parser, launch + JOB) == ""
