"""The conventions every `pcc` verb shares (docs/cli.md): one spelling per flag with hidden
aliases, a bundle wherever a contract goes, one --json envelope on success and failure, one
exit-code table, and an internal error as one line instead of a traceback."""

from __future__ import annotations

import argparse
import ast
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

import pcc.cli
from pcc.cli import ENVELOPE_KEYS, main, parser

ROOT = Path(__file__).resolve().parents[1]
GOOD = """contract cli {
  model tiny_moe
  hardware cpu

  rollout sglang {
    experts.* : fp8_block
  }

  routing replay rollout
}
"""
BAD = GOOD.replace("experts.*", "expert.*")  # PCC201: matches no operator family


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("cli")
    (d / "good.prec").write_text(GOOD)
    (d / "bad.prec").write_text(BAD)
    assert main(["compile", str(d / "good.prec"), "-o", str(d / "bundle")]) == 0
    (d / "empty").mkdir()
    return d


def _envelope(capsys, command: str, exit_code: int):
    """stdout is exactly one JSON document, the envelope, and it agrees with the exit code."""
    env = json.loads(capsys.readouterr().out)
    assert tuple(env) == ENVELOPE_KEYS
    assert env["command"] == command and env["exit_code"] == exit_code and env["ok"] is (exit_code == 0)
    assert isinstance(env["diagnostics"], list)
    for d in env["diagnostics"]:
        assert {"code", "severity", "message"} <= set(d) and d["severity"] in ("error", "warning")
    if exit_code != 0 and command not in ("diff", "fmt"):
        assert any(d["severity"] == "error" for d in env["diagnostics"]), env
    return env


def _subparsers(p: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    out = {}
    for action in p._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sp in action.choices.items():
                nested = _subparsers(sp)
                out.update({f"{name} {k}": v for k, v in nested.items()} if nested else {name: sp})
    return out


# -- flags ---------------------------------------------------------------------------------------

def test_every_verb_has_json():
    verbs = _subparsers(parser())
    # `pcc lsp` is no report: its stdout is the LSP stream an editor reads, so it has no envelope
    assert "--json" not in verbs.pop("lsp")._option_string_actions
    assert set(verbs) == {"check", "fmt", "export", "plan", "explain", "schema", "compile", "diff", "convert",
                          "verify-checkpoint", "run", "experiment trainer-variants", "validate",
                          "import"}
    for name, sp in verbs.items():
        assert "--json" in sp._option_string_actions, name
        assert sp._option_string_actions["--output-format"].choices == ("text", "json", "github", "sarif"), name


def _shape(p: argparse.ArgumentParser) -> list:
    """What a parser parses: each action's strings, destination, default, choices and nargs, nested verbs too."""
    def choices(c):
        if isinstance(c, dict):  # (verbs, or a registry such as `run --target`'s)
            return {k: _shape(v) if isinstance(v, argparse.ArgumentParser) else repr(v) for k, v in c.items()}
        return c

    return [(a.option_strings, a.dest, a.default, a.nargs, a.help, choices(a.choices)) for a in p._actions]


def test_a_line_starting_with_its_verb_is_parsed_by_that_verb_alone_alike():
    """main builds only the verb's parser (`parser(verb)`, VERBS): the same subparser, help and usage as the whole
    parser's, for every verb the whole parser has and no other."""
    whole = {name.split()[0]: sp for name, sp in _subparsers(parser()).items()}
    assert set(whole) == set(pcc.cli.VERBS)
    for verb, sp in whole.items():
        alone = _subparsers(parser(verb))
        assert {name.split()[0] for name in alone} >= {verb}, verb
        one = next(s for name, s in alone.items() if name.split()[0] == verb)
        assert one.format_help() == sp.format_help() and _shape(one) == _shape(sp), verb
    nested = parser("experiment").parse_args(["experiment", "trainer-variants", "c.prec", "--json"])
    assert nested.json and nested.fn is parser().parse_args(["experiment", "trainer-variants", "c.prec"]).fn
    fresh = "from pcc.cli import parser; print(parser('run').parse_args(['run', 'c.prec', '--target', 'verl']).target)"
    done = subprocess.run([sys.executable, "-c", fresh], capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "verl", done.stderr[-2000:]  # (the launchers the bundle stage registers)


def test_a_line_not_starting_with_a_verb_gets_the_whole_parser(capsys):
    """`pcc --allow-root D check ...`, `pcc --help`, a misspelt verb: the whole parser, whose usage lists every verb."""
    assert main(["--allow-root", str(ROOT), "fmt", "--check", str(ROOT / "contracts" / "tiny_cpu.prec")]) == 0
    assert main(["chek", "x.prec"]) == 2
    err = capsys.readouterr().err
    assert "invalid choice: 'chek'" in err and all(v in err for v in pcc.cli.VERBS)


@pytest.mark.parametrize("argv", [
    ["export", "c.prec", "{}", "W"], ["plan", "c.prec", "{}", "W"], ["compile", "c.prec", "{}", "W"],
    ["schema", "{}", "W"], ["run", "c.prec", "{}", "W"], ["validate", "c.prec", "{}", "W"],
    ["convert", "c.prec", "--source", "S", "{}", "W"],
])
def test_out_is_one_flag_with_its_old_spellings(argv):
    verb = argv[0]
    old = {"export": ["--output"], "plan": ["--output"], "compile": ["--output"], "convert": ["--to"]}.get(verb, [])
    for flag in ["-o", "--out", *old]:
        args = parser().parse_args([flag if a == "{}" else a for a in argv])
        assert args.out == "W", (verb, flag)
    shown = _subparsers(parser())[verb].format_help()
    assert "-o" in shown and "--out" in shown
    for alias in old:
        assert not re.search(rf"{alias}(?![\w-])", shown), f"{verb}: the alias {alias} is hidden"  # not --output-format


@pytest.mark.parametrize("verb", ["convert", "verify-checkpoint"])
def test_source_and_from_are_one_flag(verb):
    rest = ["c.prec", "--out", "D"] if verb == "convert" else ["c.prec", "D"]
    for flag in ("--source", "--from"):
        assert parser().parse_args([verb, *rest, flag, "SRC"]).source == "SRC"
    shown = _subparsers(parser())[verb].format_help()
    assert "--source" in shown and "--from" not in shown


def test_export_writes_the_same_file_under_every_spelling(files, capsys):
    texts = set()
    for i, flag in enumerate(("-o", "--out", "--output")):
        target = files / f"export{i}.json"
        assert main(["export", str(files / "good.prec"), flag, str(target)]) == 0
        texts.add(target.read_text())
    assert len(texts) == 1 and capsys.readouterr().out == ""


def test_a_required_out_is_a_usage_error(files, capsys):
    assert main(["compile", str(files / "good.prec"), "--json"]) == 2
    env = _envelope(capsys, "compile", 2)
    assert "-o/--out" in env["diagnostics"][0]["message"]


# -- bundles -------------------------------------------------------------------------------------

@pytest.mark.parametrize("verb", ["check", "explain", "plan", "export", "fmt"])
def test_a_bundle_is_accepted_wherever_a_contract_is(verb, files, capsys):
    assert main([verb, str(files / "bundle"), "--json"]) == 0
    env = _envelope(capsys, verb, 0)
    assert env["result"]
    if verb == "check":
        assert env["result"][0]["contract"] == str(files / "bundle" / "contract.prec")


def test_a_bundle_gives_the_same_plan_as_its_contract(files, capsys):
    assert main(["plan", str(files / "good.prec")]) == 0
    a = json.loads(capsys.readouterr().out)
    assert main(["plan", str(files / "bundle")]) == 0
    assert json.loads(capsys.readouterr().out)["components"] == a["components"]


def test_compile_from_a_bundle(files, capsys):
    assert main(["compile", str(files / "bundle"), "-o", str(files / "again"), "--json"]) == 0
    assert _envelope(capsys, "compile", 0)["result"]["files"]


@pytest.mark.parametrize("verb", ["check", "explain", "plan", "export", "fmt", "compile"])
def test_a_folder_without_a_contract_is_unreadable_input(verb, files, capsys):
    extra = ["-o", str(files / "never")] if verb == "compile" else []
    assert main([verb, str(files / "empty"), *extra, "--json"]) == 2
    env = _envelope(capsys, verb, 2)
    assert "contract.prec" in env["diagnostics"][0]["message"]


def test_fmt_never_writes_into_a_bundle(files, capsys):
    assert main(["fmt", "--write", str(files / "bundle")]) == 2
    assert "generated" in capsys.readouterr().err


# -- the envelope, exit codes --------------------------------------------------------------------

def test_check_result_is_always_a_list(files, capsys):
    for argv in ([files / "good.prec"], [files / "good.prec", files / "bad.prec"]):
        code = main(["check", "--json", *map(str, argv)])
        env = _envelope(capsys, "check", code)
        assert isinstance(env["result"], list) and len(env["result"]) == len(argv)
    assert code == 1 and "PCC201" in [d["code"] for d in env["diagnostics"] if d["severity"] == "error"]


@pytest.mark.parametrize("argv, command, code", [
    (["check", "{good}"], "check", 0),
    (["check", "{bad}"], "check", 1),
    (["check", "{good}", "{missing}"], "check", 2),
    (["fmt", "--check", "{good}"], "fmt", 0),
    (["fmt", "{missing}"], "fmt", 2),
    (["export", "{good}", "--format", "yaml"], "export", 0),
    (["export", "{bad}"], "export", 0),  # loads: export does not resolve against the model
    (["export", "{missing}"], "export", 2),
    (["plan", "{good}"], "plan", 0),
    (["plan", "{bad}"], "plan", 1),
    (["explain", "{good}"], "explain", 0),
    (["explain", "{bad}"], "explain", 1),
    (["explain", "{missing}"], "explain", 2),
    (["schema", "--check", "-o", "{empty}"], "schema", 1),
    (["compile", "{bad}", "-o", "{dir}/x"], "compile", 1),
    (["compile", "{good}", "-o", "{bundle}"], "compile", 1),  # exists, no --force
    (["diff", "{good}", "{bundle}"], "diff", 0),
    (["diff", "{good}", "{missing}"], "diff", 2),
    (["diff", "{good}", "{bad}"], "diff", 2),  # cannot compare a contract with errors
    (["convert", "{missing}", "--source", "{dir}", "-o", "{dir}/y"], "convert", 2),
    (["convert", "{good}", "--from", "{dir}/nosrc", "--to", "{dir}/y"], "convert", 2),
    (["convert", "{good}", "-o", "{dir}/y"], "convert", 2),  # no --source
    (["verify-checkpoint", "{good}", "{dir}/nockpt"], "verify-checkpoint", 2),
    (["run", "{missing}"], "run", 2),
    (["run", "{bad}"], "run", 1),
    (["run", "{good}", "--dry-run"], "run", 2),  # the embedded target launches nothing
    (["run", "{bundle}", "--target", "miles", "--dry-run"], "run", 0),
    (["experiment", "trainer-variants", "{missing}"], "experiment", 2),
    (["validate", "{missing}"], "validate", 2),
    (["validate", "{good}", "--levels", "x"], "validate", 2),
    (["check"], "check", 2),  # argparse: a usage error
    (["nosuchverb"], "nosuchverb", 2),
])
def test_json_envelope_and_exit_code(argv, command, code, files, capsys):
    names = {"good": files / "good.prec", "bad": files / "bad.prec", "missing": files / "missing.prec",
             "bundle": files / "bundle", "empty": files / "empty", "dir": files}
    argv = [a.format(**names) for a in argv]
    assert main([*argv, "--json"]) == code
    env = _envelope(capsys, command, code)
    if command == "run" and code == 0:
        assert env["result"]["command"][:3] == ["ray", "job", "submit"]
    if command == "export" and code == 0:
        assert env["result"]["document"]["name"] == "cli"


def test_human_output_and_json_agree_on_exit_codes(files, capsys):
    for argv, code in ((["check", str(files / "good.prec")], 0), (["check", str(files / "bad.prec")], 1),
                       (["check", str(files / "missing.prec")], 2), (["diff", str(files / "good.prec"),
                                                                       str(files / "bundle")], 0)):
        assert main(argv) == code
    out = capsys.readouterr()
    assert "no such contract file or bundle directory" in out.err and "error[PCC201]" in out.err


def test_diff_format_json_is_the_envelope(files, capsys):
    assert main(["diff", str(files / "good.prec"), str(files / "good.prec"), "--format", "json"]) == 0
    assert _envelope(capsys, "diff", 0)["result"]["changed"] is False


# -- internal errors -----------------------------------------------------------------------------

def test_an_internal_error_is_one_line_with_its_own_exit_code(files, capsys, monkeypatch):
    def boom(args, rep):
        raise RuntimeError("boom")

    monkeypatch.setattr(pcc.cli, "cmd_check", boom)
    assert main(["check", str(files / "good.prec")]) == 3
    out = capsys.readouterr()
    assert out.out == ""
    assert out.err == "pcc: internal error: RuntimeError: boom (please report)\n"
    assert main(["check", str(files / "good.prec"), "--json"]) == 3
    env = _envelope(capsys, "check", 3)
    assert env["diagnostics"][0]["message"] == "internal error: RuntimeError: boom (please report)"


def test_no_traceback_from_the_command_line(files):
    code = ("import sys, pcc.cli\n"
            "def boom(args, rep): raise KeyError('x')\n"
            "pcc.cli.cmd_explain = boom\n"
            "sys.exit(pcc.cli.main(sys.argv[1:]))\n")
    r = subprocess.run([sys.executable, "-c", code, "explain", str(files / "good.prec")],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 3 and "Traceback" not in r.stderr
    assert r.stderr.strip().splitlines() == ["pcc: internal error: KeyError: 'x' (please report)"]


def test_interrupted_is_130(files, capsys, monkeypatch):
    def interrupt(args, rep):
        raise KeyboardInterrupt

    monkeypatch.setattr(pcc.cli, "cmd_plan", interrupt)
    assert main(["plan", str(files / "good.prec"), "--json"]) == 130
    _envelope(capsys, "plan", 130)


# -- the miles target ----------------------------------------------------------------------------

def test_the_runtime_does_not_import_the_bundle_stage():
    tree = ast.parse((ROOT / "pcc" / "runtime" / "cli.py").read_text())
    names = [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    names += [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    assert not [n for n in names if n.startswith("pcc.bundle")]
    assert "miles" in parser().parse_args(["run", "x", "--target", "miles"]).target


# -- --output-format ------------------------------------------------------------------------------

def _obj(required: list[str], **properties) -> dict:
    return {"type": "object", "required": required, "properties": properties}


# The parts of the SARIF 2.1.0 schema (docs.oasis-open.org/sarif/sarif/v2.1.0, sarif-schema-2.1.0.json)
# a pcc log uses: each object's required properties, the level enum, 1-based regions. No copy of the
# schema itself is installable here (sarif-om and jschema-to-python ship none).
REF = {name: {"$ref": f"#/$defs/{name}"} for name in ("level", "message", "rule", "result", "location")}
SARIF = _obj(["version", "runs"], version={"const": "2.1.0"}, runs={"type": "array", "items": _obj(
    ["tool"],
    tool=_obj(["driver"], driver=_obj(["name"], name={"type": "string"}, version={"type": "string"},
                                      rules={"type": "array", "uniqueItems": True, "items": REF["rule"]})),
    results={"type": "array", "items": REF["result"]})})
SARIF["$defs"] = {
    "level": {"enum": ["none", "note", "warning", "error"]},
    "message": {"type": "object", "anyOf": [{"required": ["text"]}, {"required": ["id"]}]},
    "rule": _obj(["id"], id={"type": "string"}, shortDescription=REF["message"],
                 defaultConfiguration=_obj([], level=REF["level"])),
    "result": _obj(["message"], ruleId={"type": "string"}, ruleIndex={"type": "integer", "minimum": -1},
                   level=REF["level"], message=REF["message"],
                   locations={"type": "array", "items": _obj([], physicalLocation=REF["location"])}),
    "location": {"type": "object", "anyOf": [{"required": ["address"]}, {"required": ["artifactLocation"]}],
                 "properties": {"artifactLocation": _obj([], uri={"type": "string", "format": "uri-reference"}),
                                "region": _obj([], startLine={"type": "integer", "minimum": 1},
                                               startColumn={"type": "integer", "minimum": 1})}},
}


@pytest.mark.parametrize("fmt", ["text", "json", "github", "sarif"])
def test_output_formats_on_a_bad_contract(fmt, files, capsys):
    """Each format reports the same PCC201 at bad.prec:6:5, with the same exit code."""
    bad = str(files / "bad.prec")
    assert main(["check", bad, "--output-format", fmt]) == 1
    out, err = capsys.readouterr()
    if fmt == "text":
        assert "bad.prec:6:5: error[PCC201]" in err and "PCC201" not in out
    elif fmt == "json":
        d = json.loads(out)["diagnostics"][0]
        assert (d["code"], d["file"], d["line"], d["col"]) == ("PCC201", bad, 6, 5)
    elif fmt == "github":
        lines = out.splitlines()
        assert lines and all(line.startswith(("::error ", "::warning ")) for line in lines), out
        assert lines[0].startswith(f"::error file={bad},line=6,col=5,title=PCC201::pattern 'expert.*' matches no")
        assert "%0A= hint: did you mean" in lines[0] and not err.strip().startswith(bad)
    else:
        import jsonschema

        log = json.loads(out)
        jsonschema.validate(log, SARIF, format_checker=jsonschema.FormatChecker())
        run = log["runs"][0]
        assert run["tool"]["driver"]["name"] == "pcc"
        assert [r["id"] for r in run["tool"]["driver"]["rules"]] == ["PCC201"]
        assert run["tool"]["driver"]["rules"][0]["shortDescription"]["text"] == "pattern matches nothing"
        result = run["results"][0]
        assert (result["ruleId"], result["ruleIndex"], result["level"]) == ("PCC201", 0, "error")
        location = result["locations"][0]["physicalLocation"]
        assert location["artifactLocation"]["uri"] == Path(bad).as_uri()
        assert location["region"] == {"startLine": 6, "startColumn": 5}


def test_json_is_output_format_json(files, capsys):
    bad = str(files / "bad.prec")
    assert main(["check", bad, "--json"]) == 1
    alias = capsys.readouterr().out
    assert main(["check", bad, "--output-format=json"]) == 1
    assert capsys.readouterr().out == alias
    assert main(["check", bad, "--json", "--output-format", "sarif"]) == 2  # two formats: a usage error
    log = json.loads(capsys.readouterr().out)  # in the format the line asked for last
    assert "--json is --output-format json" in log["runs"][0]["results"][0]["message"]["text"]


def test_github_and_sarif_carry_errors_without_a_position(files, capsys):
    """A usage error (no code, no line) is still one annotation and one result, without a ruleId."""
    assert main(["check", str(files / "empty"), "--output-format", "github"]) == 2
    line = capsys.readouterr().out
    assert line.startswith(f"::error file={files / 'empty'},title=pcc::") and line.count("\n") == 1
    assert main(["check", str(files / "empty"), "--output-format", "sarif"]) == 2
    result = json.loads(capsys.readouterr().out)["runs"][0]["results"][0]
    assert "ruleId" not in result and result["level"] == "error"


def test_the_json_envelope_is_strict_json_when_a_result_is_not_finite():
    """`validate --json` can carry a NaN metric (a diverged run): the envelope writes null, never a bare
    NaN/Infinity that jq and JSON.parse refuse."""
    from pcc.cli import Report, _machine_output

    rep = Report("validate", "json")
    rep.result = {"levels": [{"p99": float("nan"), "max": float("inf"), "ok": 0.5}], "t": (float("-inf"),)}

    def refuse(name):
        raise AssertionError(f"not strict JSON: {name}")

    doc = json.loads(_machine_output(rep, 1), parse_constant=refuse)
    assert doc["result"] == {"levels": [{"p99": None, "max": None, "ok": 0.5}], "t": [None]}
