"""Issue 14's hostile command lines, one row each: the exit code, the first error's code and a piece
of its one line (docs/safety.md). None may hang, trace back, lose data or read outside its place."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pcc.cli import main

ROOT = Path(__file__).resolve().parents[1]
TINY = str(ROOT / "contracts" / "tiny_cpu.prec")


@pytest.fixture(scope="module")
def d(tmp_path_factory):
    d = tmp_path_factory.mktemp("hostile")
    assert main(["compile", TINY, "-o", str(d / "bundle")]) == 0
    shutil.copytree(d / "bundle", d / "edited")  # an FP8 contract edited to INT4 after compile
    c = d / "edited" / "contract.prec"
    c.write_text(c.read_text().replace("fp8_block", "int4 group 32"))
    shutil.copytree(d / "bundle", d / "badmanifest")
    (d / "badmanifest" / "manifest.json").write_text("[]")
    shutil.copytree(d / "bundle", d / "badenv")  # runtime-env.json malformed, the manifest rewritten to match
    (d / "badenv" / "miles" / "runtime-env.json").write_text('{"env_vars": ["A=1"]}')
    m = json.loads((d / "badenv" / "manifest.json").read_text())
    m["files"]["miles/runtime-env.json"] = hashlib.sha256(b'{"env_vars": ["A=1"]}').hexdigest()
    (d / "badenv" / "manifest.json").write_text(json.dumps(m))
    (d / "zero.prec").symlink_to("/dev/zero")
    with open(d / "sparse.prec", "wb") as fh:
        fh.truncate(800 << 20)
    (d / "passwd.prec").write_text('contract p extends "/etc/passwd" {\n  hardware cpu\n}\n')
    (d / "syntax.prec").write_text("contract x {\n  modle tiny_moe\n}\n")
    (d / "afile").write_text("x")
    (d / "data").mkdir()
    (d / "data" / "weights.bin").write_text("precious")
    return d


RUN = ["run", TINY, "--steps", "1", "--no-plots"]
# (id, argv with {d} for the folder, exit code, first error's code (None: a usage error), text in its message)
CASES = [
    ("check-dev-zero", ["check", "{d}/zero.prec"], 2, None, "not a regular file"),
    ("check-sparse", ["check", "{d}/sparse.prec"], 2, None, "larger than a contract"),
    ("check-extends-passwd", ["check", "{d}/passwd.prec"], 1, "PCC112", "outside the folders"),
    ("check-edited-bundle", ["check", "{d}/edited"], 1, "PCC706", "contract.prec does not match"),
    ("plan-edited-bundle", ["plan", "{d}/edited"], 1, "PCC706", "contract.prec does not match"),
    ("explain-bad-manifest", ["explain", "{d}/badmanifest"], 1, "PCC706", "manifest.json: malformed"),
    ("run-edited-bundle", ["run", "{d}/edited", "--out", "{d}/r1"], 1, "PCC706", "does not match"),
    ("validate-edited-bundle", ["validate", "{d}/edited", "--out", "{d}/v1"], 1, "PCC706", "does not match"),
    ("convert-edited-bundle", ["convert", "{d}/edited", "--source", "{d}/data", "-o", "{d}/ckpt"], 1, "PCC706",
     "does not match"),
    ("verify-edited-bundle", ["verify-checkpoint", "{d}/edited", "{d}/data"], 1, "PCC706", "does not match"),
    ("diff-edited-bundle", ["diff", "{d}/edited", TINY], 2, "PCC706", "does not match"),
    ("miles-bad-runtime-env", ["run", "{d}/badenv", "--target", "miles", "--dry-run"], 1, "PCC706",
     "runtime-env.json: malformed"),
    ("temperature-negative", RUN + ["--temperature", "-1"], 2, None, "argument --temperature"),
    ("temperature-zero", RUN + ["--temperature", "0"], 2, None, "argument --temperature"),
    ("lr-negative", RUN + ["--lr", "-1"], 2, None, "argument --lr"),
    ("lr-nan", RUN + ["--lr", "nan"], 2, None, "argument --lr"),
    ("prompts-1e8", RUN + ["--prompts", "1e8"], 2, None, "argument --prompts"),
    ("prompts-huge", RUN + ["--prompts", "100000000"], 2, None, "argument --prompts"),
    ("batch-beyond-memory", RUN + ["--prompts", "4096", "--group", "256"], 2, None, "--group 256"),
    ("group-1", RUN + ["--group", "1"], 2, None, "argument --group"),
    ("steps-negative", RUN + ["--steps", "-3"], 2, None, "argument --steps"),
    ("validate-steps", ["validate", TINY, "--steps", "-3"], 2, None, "argument --steps"),
    ("experiment-temperature", ["experiment", "trainer-variants", TINY, "--temperature", "0"], 2, None,
     "argument --temperature"),
    ("run-syntax-error", ["run", "{d}/syntax.prec", "--out", "{d}/r2"], 1, "PCC101", "unexpected keyword"),
    ("validate-syntax-error", ["validate", "{d}/syntax.prec", "--out", "{d}/v2", "--no-plots"], 1, None,
     "level 1"),
    ("experiment-syntax-error", ["experiment", "trainer-variants", "{d}/syntax.prec"], 1, "PCC101",
     "unexpected keyword"),
    ("compile-under-a-file", ["compile", TINY, "-o", "{d}/afile/b"], 1, "PCC709", "cannot write the bundle"),
    ("plan-into-missing-folder", ["plan", TINY, "-o", "{d}/missing/plan.json"], 1, "PCC709", "cannot write"),
    ("export-under-a-file", ["export", TINY, "-o", "{d}/afile/x.json"], 1, "PCC709", "cannot write"),
    ("run-out-is-a-file", RUN + ["--out", "{d}/afile"], 1, "PCC707", "not a directory"),
    ("run-out-other-files", RUN + ["--out", "{d}/data", "--force"], 1, "PCC707", "not a run directory"),
    ("validate-out-other-files", ["validate", TINY, "--out", "{d}/data", "--levels", "1"], 1, "PCC707",
     "not a validation run directory"),
    ("run-resume-nothing", RUN + ["--out", "{d}/r3", "--resume"], 1, "PCC707", "no run to resume"),
]


@pytest.mark.parametrize("argv, code, diag, text", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_hostile_command_line(d, capsys, argv, code, diag, text):
    argv = [a.replace("{d}", str(d)) for a in argv] + ["--json"]
    assert main(argv) == code
    env = json.loads(capsys.readouterr().out)
    errors = [x for x in env["diagnostics"] if x["severity"] == "error"]
    assert errors and env["exit_code"] == code, env
    assert errors[0]["code"] == diag, errors
    assert any(text in x["message"] for x in errors), errors
    assert all("Traceback" not in x["message"] and "internal error" not in x["message"] for x in errors)
    assert (d / "data" / "weights.bin").read_text() == "precious"


def test_pcc_threads_zero(d, capsys, monkeypatch):
    monkeypatch.setenv("PCC_THREADS", "0")
    assert main(RUN + ["--out", str(d / "r4"), "--json"]) == 1
    env = json.loads(capsys.readouterr().out)
    assert [x["code"] for x in env["diagnostics"] if x["severity"] == "error"] == ["PCC708"]


def test_a_fifo_does_not_hang_check(d):
    fifo = d / "fifo.prec"
    os.mkfifo(fifo)
    proc = subprocess.run([sys.executable, "-m", "pcc.cli", "check", str(fifo)], capture_output=True, text=True,
                          timeout=60, cwd=ROOT)
    assert proc.returncode == 2 and "not a regular file" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_allow_root_lets_extends_reach_a_shared_folder(d, tmp_path, capsys):
    (tmp_path / "shared").mkdir()
    (tmp_path / "shared" / "base.prec").write_text("contract base {\n  model tiny_moe\n  hardware cpu\n}\n")
    (tmp_path / "proj").mkdir()
    child = tmp_path / "proj" / "c.prec"
    child.write_text('contract c extends "../shared/base.prec" {\n  hardware cpu\n}\n')
    assert main(["check", str(child)]) == 1
    env = os.environ.copy()
    try:
        assert main(["--allow-root", str(tmp_path / "shared"), "check", str(child)]) == 0
    finally:
        os.environ.clear()
        os.environ.update(env)


def test_a_config_that_is_a_device_or_not_an_object_is_one_error(tmp_path):
    from pcc.convert import ConvertError
    from pcc.convert.contract import config_of

    (tmp_path / "config.json").symlink_to("/dev/zero")
    with pytest.raises(ConvertError, match="cannot read config.json .*not a regular file"):
        config_of(tmp_path)
    (tmp_path / "config.json").unlink()
    for text, why in (("[1, 2]", "not a JSON object"), ('{"a": 1, "a": 2}', "duplicate key 'a'"),
                      ('{"a": NaN}', "finite")):
        (tmp_path / "config.json").write_text(text)
        with pytest.raises(ConvertError, match=why):
            config_of(tmp_path)


def test_json_inputs_go_through_the_bounded_reader(tmp_path, capsys):
    """Every JSON file pcc reads from a user (an import source, a checkpoint's hf_quant_config.json,
    trainer/fsdp.json, a bundle's plan.json) is refused as one coded error: never a traceback, a hang or
    a last-wins duplicate key."""
    from pcc.diff.load import _stale
    from pcc.importer import ImportFailed, read_json
    from pcc.lang.inputs import InputError
    from pcc.lower.fsdp_apply import load
    from pcc.models.quantized import QuantizedError, quantization_config

    cfg = tmp_path / "config.json"
    cfg.write_text('{"quantization_config": {}, "quantization_config": {"quant_method": "fp8"}}')
    assert main(["import", "checkpoint", str(cfg), "--model", "tiny_moe", "--json"]) == 1
    errors = json.loads(capsys.readouterr().out)["diagnostics"]
    assert errors[0]["code"] == "PCC801" and "duplicate key" in errors[0]["message"], errors
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    with pytest.raises(ImportFailed, match="a FIFO") as err:
        read_json(fifo, "runtime-env.json")  # what a Miles launch's --runtime-env-json names
    assert err.value.code == "PCC109"
    (tmp_path / "hf_quant_config.json").write_text('{"quantization": {"a": NaN}}')
    with pytest.raises(QuantizedError, match="finite values only"):
        quantization_config(tmp_path, {})
    with pytest.raises(InputError, match="a FIFO"):
        load(fifo)
    (tmp_path / "plan.json").write_text('{"lock": 1, "lock": 2}')
    assert "duplicate key 'lock'" in _stale(tmp_path / "plan.json", None)[0]
