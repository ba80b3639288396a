"""The Miles launch: one command for trainer + rollout, with the framework's own exclusions."""

import json
import os
import subprocess
from pathlib import Path

import pytest

from pcc.lower import lower
from pcc.plan import compile_file

ROOT = Path(__file__).resolve().parents[2]


def _miles(name):
    return lower(compile_file(str(ROOT / "contracts" / f"{name}.prec")).plan, "miles")


def _value(args, flag):
    return args[args.index(flag) + 1]


def test_glm_async_launch_with_staleness_tis_and_replay():
    m = _miles("glm52_fp8_rollout")
    a = m.args
    assert a[0] == "train_async.py" and "--colocate" not in a
    assert _value(a, "--max-weight-staleness") == "2" and "--fully-async" in a
    assert _value(a, "--tis-clip") == "2" and "--use-rollout-routing-replay" in a
    assert _value(a, "--sglang-kv-cache-dtype") == "fp8_e4m3"
    assert "--check-weight-update-equal" in a and "--check-weight-update-allow-quant-error" in a
    assert "--use-rollout-logprobs" not in a  # Miles refuses it together with --use-tis
    assert "--bf16" in a  # the Megatron trainer's own flags pass through unchanged


def test_k3_colocated_adapter_only():
    m = _miles("k3_mxfp4_lora")
    a = m.args
    assert a[0] == "train.py" and "--colocate" in a
    assert _value(a, "--lora-rank") == "16" and _value(a, "--lora-alpha") == "32"
    mods = set(_value(a, "--target-modules").split(","))
    assert mods == {"q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj"}
    assert _value(a, "--sglang-quantization") == "mxfp4"
    assert "--sglang-tp-size" not in a and _value(a, "--rollout-num-gpus-per-engine") == "8"


def test_wide_rollout_checks_weight_updates_exactly():
    a = _miles("bf16_baseline").args
    assert "--check-weight-update-equal" in a and "--check-weight-update-allow-quant-error" not in a


def test_environment_reaches_ray_runtime_env():
    m = _miles("unified_fp8")
    env = json.loads(m.files["miles/runtime-env.json"])["env_vars"]
    assert env["NVTE_FP8_BLOCK_SCALING_FP32_SCALES"] == "1"
    assert env == m.env


def test_launch_script_keeps_awkward_paths_whole(tmp_path):
    m = _miles("glm52_fp8_rollout")
    bundle = tmp_path / "bundle"
    for rel, text in m.files.items():
        (bundle / rel).parent.mkdir(parents=True, exist_ok=True)
        (bundle / rel).write_text(text)
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "ray").write_text('#!/usr/bin/env python3\nimport json, sys\nprint(json.dumps(sys.argv[1:]))\n')
    (fake / "ray").chmod(0o755)
    miles_dir = tmp_path / "miles checkout"
    miles_dir.mkdir()
    ckpt = "/data/it's a \"ckpt\"; rm -rf x"
    env = {**os.environ, "PATH": f"{fake}:{os.environ['PATH']}", "PCC_ROLLOUT_CHECKPOINT": ckpt,
           "PCC_REF_LOAD": "/ref $HOME", "MILES_DIR": str(miles_dir)}
    out = subprocess.run(["bash", str(bundle / "miles/launch.sh")], env=env, capture_output=True, text=True,
                         check=True).stdout
    argv = json.loads(out)
    assert argv[argv.index("--hf-checkpoint") + 1] == ckpt
    assert argv[argv.index("--ref-load") + 1] == "/ref $HOME"
    assert argv[argv.index("--") + 1:argv.index("--") + 3] == ["python3", "train_async.py"]
    assert json.loads(argv[argv.index("--runtime-env-json") + 1])["env_vars"] == m.env


def test_launch_script_names_what_is_missing(tmp_path):
    m = _miles("bf16_baseline")
    script = tmp_path / "launch.sh"
    script.write_text(m.files["miles/launch.sh"])
    r = subprocess.run(["bash", str(script)], env={"PATH": os.environ["PATH"]}, capture_output=True, text=True)
    assert r.returncode != 0 and "PCC_ROLLOUT_CHECKPOINT" in r.stderr


def test_correction_without_a_miles_flag_requires_its_implementation(tmp_path):
    p = tmp_path / "mis.prec"
    p.write_text("contract mis {\n  model tiny_moe\n  hardware H100\n  rollout sglang {\n    experts : fp8_block\n"
                 "  }\n  correction mis clip 2.0\n  routing replay rollout\n}\n")
    m = lower(compile_file(str(p)).plan, "miles")
    script = tmp_path / "launch.sh"
    script.write_text(m.files["miles/launch.sh"])
    env = {"PATH": os.environ["PATH"], "PCC_ROLLOUT_CHECKPOINT": "/c", "PCC_REF_LOAD": "/r", "MILES_DIR": str(tmp_path)}
    r = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True)
    assert r.returncode != 0 and "PCC_TIS_FUNCTION" in r.stderr and "correction mis" in r.stderr
    assert "--use-tis" in m.args and '--custom-tis-function-path "$PCC_TIS_FUNCTION"' in m.files["miles/launch.sh"]
