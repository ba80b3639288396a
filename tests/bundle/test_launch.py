"""`pcc run --target miles`: the exact command with --dry-run, and what is missing otherwise."""

import json
import os
import subprocess
from pathlib import Path

from pcc.bundle import write_bundle
from pcc.cli import main
from pcc.plan import compile_file

ROOT = Path(__file__).resolve().parents[2]


def test_dry_run_prints_the_command_with_absolute_bundle_files(tmp_path, capsys):
    bundle = tmp_path / "b"
    write_bundle(compile_file(str(ROOT / "contracts/selective_nvfp4.prec")).plan, bundle)
    assert main(["run", str(bundle), "--target", "miles", "--dry-run", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)["result"]
    cmd = out["command"]
    assert cmd[:3] == ["ray", "job", "submit"] and "--fp4-format" in cmd
    precision = Path(cmd[cmd.index("--te-precision-config-file") + 1])
    assert precision.is_absolute() and precision.is_file()
    assert out["env"] == json.loads((bundle / "miles/runtime-env.json").read_text())["env_vars"]


def test_launch_script_finds_bundle_files_from_miles_dir(tmp_path):
    bundle = tmp_path / "my bundle"
    write_bundle(compile_file(str(ROOT / "contracts/selective_nvfp4.prec")).plan, bundle)
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "ray").write_text('#!/usr/bin/env python3\nimport json, sys\nprint(json.dumps(sys.argv[1:]))\n')
    (fake / "ray").chmod(0o755)
    env = {**os.environ, "PATH": f"{fake}:{os.environ['PATH']}", "PCC_ROLLOUT_CHECKPOINT": "/ckpt",
           "PCC_REF_LOAD": "/ref", "MILES_DIR": str(tmp_path)}
    argv = json.loads(subprocess.run(["bash", str(bundle / "miles/launch.sh")], env=env, capture_output=True,
                                     text=True, check=True).stdout)
    assert Path(argv[argv.index("--te-precision-config-file") + 1]) == bundle / "trainer/te_precision.yaml"


def test_missing_pieces_are_named(tmp_path, capsys, monkeypatch):
    for var in ("PCC_ROLLOUT_CHECKPOINT", "PCC_REF_LOAD", "MILES_DIR"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert main(["run", str(ROOT / "contracts/bf16_baseline.prec"), "--target", "miles"]) == 1
    err = capsys.readouterr().err
    for what in ("ray is not on PATH", "PCC_ROLLOUT_CHECKPOINT", "PCC_REF_LOAD", "MILES_DIR"):
        assert what in err
