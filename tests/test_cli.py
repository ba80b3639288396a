"""The command line: exit codes, --json, schema freshness, and a cold start without torch.
The conventions shared by every verb (aliases, bundles, the envelope): tests/test_cli_conventions.py."""

import json
import subprocess
import sys
from pathlib import Path

from pcc.cli import main
from pcc.contract.schema import schema_files
from pcc.resources import data_dir

GOOD = """contract cli {
  model tiny_moe
  hardware cpu

  rollout sglang {
    experts.* : fp8_block
  }

  routing replay rollout
}
"""


def _write(tmp_path, text, name="c.prec"):
    p = tmp_path / name
    p.write_text(text)
    return str(p)


def test_check_exit_codes_and_json(tmp_path, capsys):
    good = _write(tmp_path, GOOD)
    assert main(["check", good]) == 0
    capsys.readouterr()
    bad = _write(tmp_path, GOOD.replace("experts.*", "expert.*"), "bad.prec")
    assert main(["check", "--json", bad]) == 1
    out = json.loads(capsys.readouterr().out)
    (diag,) = [d for d in out["diagnostics"] if d["severity"] == "error"]
    assert diag["code"] == "PCC201" and diag["line"] == 6 and diag["col"] == 5
    assert "did you mean 'experts.*'" in diag["hint"]


def test_usage_error_exits_2():
    r = subprocess.run([sys.executable, "-m", "pcc.cli", "check"], capture_output=True)
    assert r.returncode == 2


def test_export_then_check_gives_the_same_plan(tmp_path, capsys):
    prec = _write(tmp_path, GOOD)
    for fmt in ("json", "yaml"):
        other = str(tmp_path / f"c.{fmt}")
        assert main(["export", prec, "--format", fmt, "-o", other]) == 0
        capsys.readouterr()
        assert main(["plan", prec]) == 0
        a = capsys.readouterr().out
        assert main(["plan", other]) == 0
        b = capsys.readouterr().out
        assert a == b and json.loads(a)["lock"].startswith("sha256:")


def test_explain_reports_trace_and_bytes(capsys, tmp_path):
    assert main(["explain", "--json", _write(tmp_path, GOOD)]) == 0
    info = json.loads(capsys.readouterr().out)["result"]
    assert set(info["trace"]) == {"rollout", "fprop", "dgrad", "wgrad", "optimizer", "sync"}
    roll = {p["scheme"]: p["operators"] for p in info["trace"]["rollout"]}
    assert roll["fp8_block"] == 4 * 8 * 3  # tiny_moe: 4 layers x 8 experts x (gate, up, down)
    reps = {r["name"]: r for r in info["representations"]}
    # FP8 weights + fp32 scales are smaller than the bf16 trainer copy.
    assert reps["rollout weights (packed)"]["bytes"] < reps["trainer parameter"]["bytes"]


def test_checked_in_schema_is_current():
    for name, text in schema_files().items():
        assert (data_dir("schemas") / name).read_text() == text, "run: pcc schema"


def test_schema_validates_the_json_form(tmp_path, capsys):
    import jsonschema

    schema = json.loads((data_dir("schemas") / "contract.schema.json").read_text())
    assert main(["export", _write(tmp_path, GOOD), "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    jsonschema.validate(doc, schema)
    doc["rollout"]["bogus"] = 1
    try:
        jsonschema.validate(doc, schema)
    except jsonschema.ValidationError:
        pass
    else:
        raise AssertionError("the schema accepted an unknown field")


def test_check_does_not_import_torch(tmp_path):
    code = ("import sys; from pcc.cli import main; main(['check', sys.argv[1]]); "
            "bad = [m for m in ('torch', 'numpy', 'sglang', 'megatron') if m in sys.modules]; "
            "sys.exit(3 if bad else 0)")
    r = subprocess.run([sys.executable, "-c", code, _write(tmp_path, GOOD)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_fmt_check(tmp_path):
    p = _write(tmp_path, GOOD.replace("  hardware cpu\n", "  hardware   cpu\n"))
    assert main(["fmt", "--check", p]) == 1
    assert main(["fmt", "--write", p]) == 0
    assert main(["fmt", "--check", p]) == 0
    assert Path(p).read_text() == GOOD


def test_run_without_out_writes_under_the_working_directory(tmp_path, monkeypatch, capsys):
    """Regression: a default meant for `pcc schema --out` once redirected `pcc run`'s output."""
    monkeypatch.chdir(tmp_path)
    contract = Path(__file__).resolve().parents[1] / "contracts" / "tiny_cpu.prec"
    assert main(["run", str(contract), "--steps", "1", "--prompts", "2", "--group", "2", "--no-plots"]) == 0
    assert (tmp_path / "runs" / "tiny-cpu-s0" / "summary.json").is_file()
    assert not (data_dir("schemas") / "summary.json").exists()


def test_model_from_a_checkpoint_resolves_against_its_real_names(tmp_path):
    """`model from "<dir>"`: patterns resolve against the checkpoint's own names and shapes, read from
    config.json and the safetensors headers (a tensor the catalog does not know becomes family 'other')."""
    import torch
    from safetensors.torch import save_file

    from pcc.models.builtin import _CONFIGS
    from pcc.plan import compile_file

    config = json.loads((_CONFIGS / "tiny_dense.json").read_text())
    ckpt = tmp_path / "ckpt dir"
    ckpt.mkdir()
    (ckpt / "config.json").write_text(json.dumps(config))
    from pcc.models import load_catalog

    tensors = {op.tensor: torch.zeros(op.shape, dtype=torch.bfloat16)
               for op in load_catalog("tiny_dense").operators if op.family != "kv_cache"}
    tensors["visual.proj.weight"] = torch.zeros(4, 4, dtype=torch.bfloat16)
    save_file(tensors, str(ckpt / "model.safetensors"))
    contract = tmp_path / "c.prec"
    contract.write_text('contract c {\n  model from "ckpt dir"\n  hardware H100\n  rollout {\n    linear : fp8_block\n'
                        '    keep bf16 : "visual.*"\n  }\n}\n')
    c = compile_file(str(contract))
    assert c.ok, [d.render() for d in c.diagnostics]
    ops = c.plan.catalog.operators
    assert len(ops) == len(tensors) + config["num_hidden_layers"]  # + one KV cache per layer
    visual = next(i for i, op in enumerate(ops) if op.tensor == "visual.proj.weight")
    assert ops[visual].family == "vision" and c.plan.scheme_name("rollout", visual) == "bf16"
    q = next(i for i, op in enumerate(ops) if op.family == "attn.q")
    assert c.plan.scheme_name("rollout", q) == "fp8_block"


def test_fmt_json_and_version(tmp_path, capsys):
    p = _write(tmp_path, GOOD.replace("  hardware cpu\n", "  hardware   cpu\n"))
    assert main(["fmt", "--check", "--json", p]) == 1
    assert json.loads(capsys.readouterr().out)["result"] == [{"file": p, "ok": True, "canonical": False}]
    r = subprocess.run([sys.executable, "-m", "pcc.cli", "--version"], capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.startswith("pcc ")
