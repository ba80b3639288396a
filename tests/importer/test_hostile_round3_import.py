"""Hostile input, round 3 (issue 27), the importing class: `pcc import checkpoint|miles|verl|te` and the
published quantization configs they read. Each source below once made the import work for minutes, read a
file whole, end in an internal error (exit 3), import something other than the source says, or read a file
outside a bundle; each is now a coded line. One table per class; docs/safety.md, "Round 3: importing"."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from pcc.cli import main
from pcc.importer import ImportFailed, import_source

MODEL = "tiny_moe"
LINEAR_FP8 = {"targets": ["Linear"], "weights": {"type": "float", "num_bits": 8, "strategy": "channel"}}


def _ct(**over) -> dict:
    """A compressed-tensors config quantizing every Linear to FP8, with `over` set on it."""
    return {"quant_method": "compressed-tensors", "format": "float-quantized", "config_groups": {"g": LINEAR_FP8},
            "ignore": ["lm_head"], **over}


def _fp8(**over) -> dict:
    return {"quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": [128, 128], **over}


def _modelopt(**over) -> dict:
    return {"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16, "ignore": ["lm_head"], **over}


def _write(path, doc) -> str:
    path.write_text(json.dumps(doc) if isinstance(doc, dict) else doc, encoding="utf-8")
    return str(path)


def _refused(kind: str, source: str, code: str, model: str = MODEL) -> ImportFailed:
    with pytest.raises(ImportFailed) as err:
        import_source(kind, source, model, "H100")
    assert err.value.code == code, err.value.message
    return err.value


def _child(kind: str, source: str, model: str = MODEL, seconds: float | None = None, timeout: float = 90) -> dict:
    """The import in a fresh interpreter (its matching budget set to `seconds`): {"code", "message"} of its
    refusal, or {"code": None, "warnings": n}. A run past `timeout` fails the test (it used to take minutes)."""
    budget = f"from pcc.importer import bounds\nbounds.MATCH_SECONDS = {seconds}\n" if seconds else ""
    script = ("import json, sys\nfrom pcc.importer import import_source\n" + budget +
              "try:\n    imp = import_source(sys.argv[1], sys.argv[2], sys.argv[3], 'H100')\n"
              "    print(json.dumps({'code': None, 'warnings': len(imp.diagnostics)}))\n"
              "except Exception as exc:\n"
              "    print(json.dumps({'code': getattr(exc, 'code', repr(exc)), 'message': str(exc)[:2000]}))\n")
    out = subprocess.run([sys.executable, "-c", script, kind, source, model], capture_output=True,
                         text=True, timeout=timeout, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def _cli(capsys, *argv) -> tuple[int, str]:
    """`pcc ARGV` in this process: its exit code and everything it printed."""
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out + out.err


# -- 1. unbounded work: patterns that backtrack, lists that were matched pairwise ----------------

BACKTRACKS = "re:(.|.)*X"  # exponential in the module name's length under Python's re
MANY_STARS = "*" * 24 + "X"  # ModelOpt: `.*` 24 times, fullmatched against every module path


def _miles_with_checkpoint(tmp_path, qc: dict) -> str:
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    _write(ckpt / "config.json", {"model_type": "qwen3_moe", "quantization_config": qc})
    return _write(tmp_path / "run.sh", f"#!/bin/bash\npython3 train.py --hf-checkpoint {ckpt} --colocate\n")


UNBOUNDED = {
    "ct ignore that backtracks": ("checkpoint", lambda t: _write(t / "q.json", _ct(ignore=[BACKTRACKS])),
                                  "ignore[0] 're:(.|.)*X'"),
    "ct target that backtracks": ("checkpoint", lambda t: _write(t / "q.json", _ct(config_groups={"g": {
        **LINEAR_FP8, "targets": ["Linear", BACKTRACKS]}})), "config_groups.g.targets[1] 're:(.|.)*X'"),
    "ModelOpt exclusion of many *": ("checkpoint", lambda t: _write(t / "q.json", _modelopt(ignore=["lm_head", MANY_STARS])),
                                     f"ignore[1] {MANY_STARS!r}"),
    "Miles --hf-checkpoint with a ct ignore that backtracks": (
        "miles", lambda t: _miles_with_checkpoint(t, _ct(ignore=[BACKTRACKS])), "ignore[0] 're:(.|.)*X'"),
}


@pytest.mark.parametrize("case", UNBOUNDED)
def test_a_pattern_that_backtracks_is_stopped_by_the_budget_naming_it(tmp_path, case):
    kind, make, entry = UNBOUNDED[case]
    got = _child(kind, make(tmp_path), seconds=2)
    assert got["code"] == "PCC811", got
    assert f"matching {entry} against the model's module names ran past the 2 s budget" in got["message"]


COUNTED = {
    "ct: more regexes x module names than MAX_MATCHES": (
        lambda t: _write(t / "q.json", _ct(ignore=[f"re:.*layers\\.{i}\\." for i in range(200)])), "200 patterns"),
    "ModelOpt: more globs x module names than MAX_MATCHES": (
        lambda t: _write(t / "q.json", _modelopt(ignore=[f"*layers.{i}.*" for i in range(200)])), "200 patterns"),
    "a pattern over MAX_PATTERN characters": (
        lambda t: _write(t / "q.json", _ct(ignore=["re:" + "a" * 2000])), "longer than the 1024 characters"),
}


@pytest.mark.parametrize("case", COUNTED)
def test_patterns_are_counted_before_they_are_matched(tmp_path, monkeypatch, case):
    from pcc.importer import bounds

    make, said = COUNTED[case]
    monkeypatch.setattr(bounds, "MAX_MATCHES", 10_000)
    assert said in _refused("checkpoint", make(tmp_path), "PCC811").message


LONG_LISTS = {  # 200,000 names: looked up, not matched pairwise (fp8 20k took 147 s, 200k hours)
    "fp8 ignored_layers": lambda names: _fp8(ignored_layers=["lm_head", *names]),
    "ModelOpt ignore": lambda names: _modelopt(ignore=["lm_head", *names]),
    "ct ignore": lambda names: _ct(ignore=["lm_head", *names]),
}


@pytest.mark.parametrize("case", LONG_LISTS)
def test_a_list_of_200k_names_takes_seconds(tmp_path, case):
    names = [f"model.layers.{i % 48}.mlp.experts.{i % 128}.gate_projx{i}" for i in range(200_000)]
    got = _child("checkpoint", _write(tmp_path / "q.json", LONG_LISTS[case](names)), "qwen3_30b_a3b", timeout=60)
    assert got["code"] is None and got["warnings"] >= 200_000, got  # one PCC802 per name that matches nothing


def test_te_matcher_over_the_pattern_limit(tmp_path):
    te = tmp_path / "te.yaml"
    te.write_text("configs:\n  bf16:\n    transformer_engine_config_type: TEQuantizationParams\n    training_recipe: {}\n"
                  f"matchers:\n  all:\n    type: glob\n    enabled: true\n    pattern: '{'*a' * 600}'\n    config: bf16\n")
    err = _refused("te", str(te), "PCC811")
    assert "matcher all" in err.message and err.span is not None and err.span.line == 9


# -- 2. huge inputs: one bounded reader for every source, positions without recounting -----------

def _fifo(tmp_path) -> str:
    path = tmp_path / "fifo"
    os.mkfifo(path)
    return str(path)


def _sparse(path, size: int = 64 << 20) -> str:
    with open(path, "wb") as f:
        f.truncate(size)
    return str(path)


def _bundle(tmp_path, args: str = "--colocate\n") -> str:
    (tmp_path / "b" / "miles").mkdir(parents=True)
    _write(tmp_path / "b" / "miles" / "args.txt", args)
    return str(tmp_path / "b")


NOT_REGULAR = {  # named as what it is (PCC109, exit 2), not "no such file" or "not quantized"
    "checkpoint FIFO": ("checkpoint", _fifo),
    "checkpoint /dev/zero": ("checkpoint", lambda t: "/dev/zero"),
    "miles FIFO": ("miles", _fifo),
    "miles /dev/zero": ("miles", lambda t: "/dev/zero"),
    "a checkpoint whose config.json is a FIFO": ("checkpoint", lambda t: (t.joinpath("ck").mkdir(), os.mkfifo(
        t / "ck" / "config.json"), str(t / "ck"))[-1]),
    "a bundle whose runtime-env.json is a FIFO": ("miles", lambda t: (_bundle(t), os.mkfifo(
        t / "b" / "miles" / "runtime-env.json"), str(t / "b"))[-1]),
}


@pytest.mark.parametrize("case", NOT_REGULAR)
def test_a_source_that_is_no_regular_file_is_pcc109(tmp_path, capsys, case):
    kind, make = NOT_REGULAR[case]
    code, out = _cli(capsys, "import", kind, make(tmp_path), "--model", MODEL)
    assert code == 2 and "error[PCC109]" in out and "not a regular file" in out, out


OVERSIZED = {  # refused on the stated size (64 MiB sparse here; 1 GB is the same), before a byte is read
    "a Miles launch script": ("miles", lambda t: _sparse(t / "run.sh")),
    "a bundle's miles/args.txt": ("miles", lambda t: (_bundle(t), _sparse(t / "b" / "miles" / "args.txt"))[0]),
}


@pytest.mark.parametrize("case", OVERSIZED)
def test_a_huge_source_is_refused_on_its_size(tmp_path, case):
    kind, make = OVERSIZED[case]
    assert "over the 1 MiB limit" in _refused(kind, make(tmp_path), "PCC811").message


def test_a_verl_argument_file_of_262k_lines_takes_seconds(tmp_path):
    head = "actor_rollout_ref.rollout.name=vllm\nactor_rollout_ref.rollout.dtype=x\n"
    path = _write(tmp_path / "overrides.txt", head + "a=1\n" * (((1 << 20) - 200) // 4))
    got = _child("verl", path, timeout=60)  # each position recounted from the start took minutes
    assert got["code"] is None, got


# -- 3. internal errors on input: now coded, naming the file and the entry ----------------------

def _nested(depth: int) -> str:
    return "[" * depth + "]" * depth


def _te_nested(t) -> str:
    return _write(t / "te.yaml", f"configs: {{a: {_nested(5000)}}}\nmatchers: {{}}\n")


def _yaml_alias_chain(t) -> str:
    lines = ["configs: {}", "matchers: {}", "x0: &a0 [1]"] + [f"x{i}: &a{i} [*a{i - 1}]" for i in range(1, 2000)]
    return _write(t / "te.yaml", "\n".join(lines) + "\n")


INTERNAL = {
    "re:( in ignore": ("checkpoint", lambda t: _write(t / "q.json", _ct(ignore=["re:("])), "PCC801",
                       "ignore[0] 're:(' is not a regular expression"),
    "a number in ignore": ("checkpoint", lambda t: _write(t / "q.json", _ct(ignore=["lm_head", 1])), "PCC801",
                           "ignore[1] is a number"),
    "a mapping as a target": ("checkpoint", lambda t: _write(t / "q.json", _ct(config_groups={"g": {
        **LINEAR_FP8, "targets": [{"re": "x"}]}})), "PCC801", "config_groups.g.targets[0] is a mapping"),
    "a ModelOpt exclusion that is no regex": ("checkpoint", lambda t: _write(t / "q.json", _modelopt(
        exclude_modules=None, ignore=["lm_head", "a(b"])), "PCC801", "ignore[1] 'a(b' is not a regular expression"),
    "input_activations that are a list": ("checkpoint", lambda t: _write(t / "q.json", _ct(config_groups={"g": {
        **LINEAR_FP8, "input_activations": [8]}})), "PCC801", "config_groups.g.input_activations is a list"),
    "JSON nested 500 deep": ("checkpoint", lambda t: _write(t / "q.json", json.dumps(_fp8())[:-1]
                             + f', "ignored_layers": {_nested(500)}}}'), "PCC811", "ignored_layers[0][0]"),
    "TE YAML nested 5000 deep": ("te", _te_nested, "PCC811", "nests deeper than the 64 levels"),
    "TE YAML aliases chained 2000 deep": ("te", _yaml_alias_chain, "PCC811", "nests deeper than the 64 levels"),
    "a verl override value nested 5000 deep": ("verl", lambda t: _write(
        t / "overrides.txt", f"actor_rollout_ref.rollout.name={_nested(5000)}\n"), "PCC811",
        "actor_rollout_ref.rollout.name: nests deeper than the 64 levels"),
}


@pytest.mark.parametrize("case", INTERNAL)
def test_a_malformed_source_is_a_coded_error(tmp_path, case):
    kind, make, code, said = INTERNAL[case]
    source = make(tmp_path)
    err = _refused(kind, source, code)
    assert said in err.message and err.file == source, err.message


# -- 4. silent wrong results: refused instead of imported as something else ----------------------

SILENT = {
    "ct ignore as a string (split into characters: lm_head quantized)": (
        "checkpoint", lambda t: _write(t / "q.json", _ct(ignore="lm_head")), "ignore is a string", "ignore"),
    "ModelOpt exclude_modules as a string": (
        "checkpoint", lambda t: _write(t / "q.json", {"quantization": {"quant_algo": "NVFP4", "exclude_modules": "lm_head"}}),
        "quantization.exclude_modules is a string", "quantization.exclude_modules"),
    "weight_block_size [true, 128]": ("checkpoint", lambda t: _write(t / "q.json", _fp8(weight_block_size=[True, 128])),
                                      "weight_block_size [True, 128] is not [rows, cols]", "weight_block_size"),
    "ct block_structure [true, 128]": ("checkpoint", lambda t: _write(t / "q.json", _ct(config_groups={"g": {
        **LINEAR_FP8, "weights": {"type": "float", "num_bits": 8, "strategy": "block",
                                  "block_structure": [True, 128]}}})),
        "block_structure [True, 128] is not [rows, cols]", "config_groups.g.weights.block_structure"),
    "a 401-digit --rollout-max-response-len": (
        "miles", lambda t: _write(t / "args.txt", f"--rollout-max-response-len {'9' * 401}\n"),
        "--rollout-max-response-len '99999999999999999999'... (401 characters) is not an integer from 0 to 2147483647",
        "--rollout-max-response-len"),
    "a 401-digit verl response_length": (
        "verl", lambda t: _write(t / "overrides.txt", "actor_rollout_ref.rollout.name=vllm\n"
                                 f"actor_rollout_ref.rollout.response_length={'9' * 401}\n"),
        "rollout.response_length '99999999999999999999'... (401 characters) is not an integer from 1",
        "actor_rollout_ref.rollout.response_length"),
}


@pytest.mark.parametrize("case", SILENT)
def test_a_value_of_the_wrong_type_is_refused(tmp_path, case):
    kind, make, said, path = SILENT[case]
    err = _refused(kind, make(tmp_path), "PCC801")
    assert said in err.message and err.path == path, err.message
    assert "9" * 40 not in err.message


# -- 5. escapes: a bundle's file that links out of it --------------------------------------------

SECRET = "root:x:0:0:root:/root:/bin/bash\n"


def _linked(tmp_path, inside: str, target_name: str = "secret") -> str:
    target = tmp_path / target_name
    target.write_text(SECRET, encoding="utf-8")
    link = tmp_path / "b" / inside
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(target)
    return str(tmp_path / "b")


def _linked_folder(tmp_path) -> str:
    (tmp_path / "elsewhere").mkdir()
    _write(tmp_path / "elsewhere" / "args.txt", SECRET)
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "miles").symlink_to(tmp_path / "elsewhere")
    return str(tmp_path / "b")


ESCAPES = {
    "miles/args.txt linking out": ("miles", lambda t: _linked(t, "miles/args.txt"), "miles/args.txt"),
    "verl/overrides.txt linking out": ("verl", lambda t: _linked(t, "verl/overrides.txt"), "verl/overrides.txt"),
    "a linked miles/ folder": ("miles", _linked_folder, "miles/args.txt"),
    "rollout/quantization_config.json linking out": (
        "miles", lambda t: (_bundle(t), _linked(t, "rollout/quantization_config.json"))[1],
        "rollout/quantization_config.json"),
}


@pytest.mark.parametrize("case", ESCAPES)
def test_a_bundle_file_linking_out_is_refused_unread(tmp_path, capsys, case):
    kind, make, name = ESCAPES[case]
    code, out = _cli(capsys, "import", kind, make(tmp_path), "--model", MODEL)
    assert code == 1 and "error[PCC812]" in out and f"b/{name}: a link out of the bundle" in out, out
    assert "root:" not in out
