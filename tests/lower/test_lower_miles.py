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


# --- What Miles accepts from a launch (targets/miles.yaml sglang_owned) -------------------------

CONTRACTS = sorted((ROOT / "contracts").glob("*.prec"))


def _sglang_fields(args):
    return [a[len("--sglang-"):].replace("-", "_") for a in args if a.startswith("--sglang-")]


@pytest.mark.parametrize("path", CONTRACTS, ids=lambda p: p.stem)
def test_no_launch_passes_an_sglang_field_miles_owns(path):
    from pcc.lower.miles import owned_sglang_fields

    m = lower(compile_file(str(path)).plan, "miles")
    assert not set(_sglang_fields(m.args)) & owned_sglang_fields()
    assert "--sglang-enable-return-routed-experts" not in m.files["miles/launch.sh"]


def test_routing_replay_is_miles_own_flag():
    a = _miles("unified_fp8").args
    assert "--use-rollout-routing-replay" in a and "--sglang-enable-return-routed-experts" not in a
    sglang = lower(compile_file(str(ROOT / "contracts/unified_fp8.prec")).plan, "sglang").args
    assert "--enable-return-routed-experts" in sglang  # the standalone SGLang launch still sets it


def test_lora_rollout_is_configured_by_miles_from_its_own_flags():
    a = _miles("qwen38_nvfp4_lora").args
    assert _value(a, "--lora-rank") == "16" and _value(a, "--target-modules") == "k_proj,o_proj,q_proj,v_proj"
    assert not {"enable_lora", "max_lora_rank", "lora_target_modules"} & set(_sglang_fields(a))


def test_rollout_expert_and_data_parallelism_pass_through():
    a = _miles("k3_mxfp4_lora").args
    assert _value(a, "--sglang-ep-size") == "8" and _value(a, "--sglang-dp-size") == "1"
    assert "--sglang-tp-size" not in a and _value(a, "--rollout-num-gpus-per-engine") == "8"


def test_owned_fields_are_sglang_server_fields_and_the_rest_exist():
    """The owned list names real ServerArgs fields (not stale), and every --sglang-<field> a launch
    passes is one SGLang has (Miles registers --sglang-<f> for each ServerArgs field it does not skip)."""
    vs = pytest.importorskip("pcc.lower.verify_sglang")
    try:
        fields = {a.dest for a in vs._server_args()[1]._actions}  # ServerArgs.add_cli_args, as Miles registers them
    except vs.EngineMissing as exc:
        pytest.skip(str(exc))
    from pcc.lower.miles import tables

    owned = tables()["sglang_owned"]
    assert set(owned["refused"]) <= fields
    assert set(owned["overridden"]) <= fields and set(owned["passed"]) <= fields
    for path in CONTRACTS:
        assert set(_sglang_fields(lower(compile_file(str(path)).plan, "miles").args)) <= fields, path.stem


def _contract(tmp_path, body, name="c"):
    p = tmp_path / f"{name}.prec"
    p.write_text(f"contract {name} {{\n{body}}}\n")
    c = compile_file(str(p))
    assert c.ok, [d.message for d in c.diagnostics]
    return c.plan


def test_recording_experts_without_r3_is_a_miles_caveat(tmp_path):
    plan = _contract(tmp_path, "  model tiny_moe\n  hardware H100\n  rollout sglang {\n    record logprobs, experts\n"
                               "  }\n")
    m = lower(plan, "miles")
    assert [c.code for c in m.caveats] == ["PCC612"] and "rollout.record" == m.caveats[0].path


# --- AMD: what the GPU can do and what Miles runs are two facts ---------------------------------

@pytest.mark.parametrize("hw, scheme, warned", [("MI355X", "mxfp8", True), ("MI355X", "fp8_block", False),
                                                ("MI300X", "fp8_block", True), ("H100", "fp8_block", False)])
def test_low_precision_on_amd_warns_where_miles_has_no_recipe(tmp_path, hw, scheme, warned):
    plan = _contract(tmp_path, f"  model qwen3_30b_a3b\n  hardware {hw}\n  rollout sglang {{\n    experts : {scheme}\n"
                               "  }\n  routing replay rollout\n")
    m = lower(plan, "miles")
    amd = [c for c in m.caveats if c.code == "PCC615"]
    assert bool(amd) == warned, [c.message for c in m.caveats]
    if warned:  # on the rule that asked for the mode
        assert amd[0].path == "rollout.rules[0]" and hw in amd[0].message


# --- Blockwise FP8 scales by trainer architecture (targets/megatron.yaml recipe_env) -----------

@pytest.mark.parametrize("hw, scale, value, caveat", [("H100", "fp32", "1", False), ("H100", "pow2", "0", False),
                                                      ("B200", "fp32", "0", True), ("B200", "pow2", "0", False),
                                                      ("MI355X", "fp32", "0", True)])
def test_blockwise_fp32_scales_follow_the_trainer_architecture(tmp_path, hw, scale, value, caveat):
    plan = _contract(tmp_path, f"  model qwen3_30b_a3b\n  hardware {hw}\n"
                               f"  scheme blk = fp8_e4m3 weights block 128x128 activations tile 1x128 scale {scale}\n"
                               "  rollout sglang {\n    experts : fp8_block\n  }\n"
                               "  trainer megatron {\n    gemm experts : blk\n  }\n  routing replay rollout\n")
    mega = lower(plan, "megatron")
    assert mega.env["NVTE_FP8_BLOCK_SCALING_FP32_SCALES"] == value
    assert bool(mega.caveats) == caveat
    assert json.loads(lower(plan, "miles").files["miles/runtime-env.json"])["env_vars"][
        "NVTE_FP8_BLOCK_SCALING_FP32_SCALES"] == value  # reaches Ray, so Miles' own default does not apply


# --- The launch: architecture first, job file and arguments last --------------------------------

def _bundle(tmp_path, name="unified_fp8"):
    m = _miles(name)
    bundle = tmp_path / "bundle"
    for rel, text in m.files.items():
        (bundle / rel).parent.mkdir(parents=True, exist_ok=True)
        (bundle / rel).write_text(text)
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "ray").write_text('#!/usr/bin/env python3\nimport json, sys\nprint(json.dumps(sys.argv[1:]))\n')
    (fake / "ray").chmod(0o755)
    env = {**os.environ, "PATH": f"{fake}:{os.environ['PATH']}", "PCC_ROLLOUT_CHECKPOINT": "/c", "PCC_REF_LOAD": "/r",
           "MILES_DIR": str(tmp_path)}
    env.pop("PCC_MILES_JOB", None)
    return m, bundle, env


def _python_argv(out):
    argv = json.loads(out)
    return argv[argv.index("python3") + 1:]


def test_launch_passes_architecture_job_file_and_arguments_in_order(tmp_path):
    m, bundle, env = _bundle(tmp_path)
    (tmp_path / "job").write_text("# the job\n--rollout-batch-size 32\n\n  --prompt-data /data/x.jsonl\t--num-rollout 3\n"
                                  "--num-layers 4")
    out = subprocess.run(["bash", str(bundle / "miles/launch.sh"), "--num-rollout", "5", "--wandb-run-name", "a b"],
                         env=env, capture_output=True, text=True, check=True).stdout
    argv = _python_argv(out)
    assert argv[:3] == ["train.py", "--num-layers", "48"]  # the architecture first
    assert argv[-12:] == ["--rollout-batch-size", "32", "--prompt-data", "/data/x.jsonl", "--num-rollout", "3",
                          "--num-layers", "4", "--num-rollout", "5", "--wandb-run-name", "a b"]
    assert argv.index("--ref-load") < argv.index("--rollout-batch-size")  # the job after the bundle's flags
    assert "--sglang-enable-return-routed-experts" not in argv


def test_launch_job_file_is_named_by_the_environment(tmp_path):
    m, bundle, env = _bundle(tmp_path)
    (tmp_path / "job").write_text("--rollout-batch-size 32\n")
    (tmp_path / "other").write_text("--rollout-batch-size 8\n")
    run = lambda e: subprocess.run(["bash", str(bundle / "miles/launch.sh")], env=e, capture_output=True, text=True)
    assert _python_argv(run({**env, "PCC_MILES_JOB": str(tmp_path / "other")}).stdout)[-2:] == ["--rollout-batch-size", "8"]
    assert "--rollout-batch-size" not in _python_argv(run({**env, "PCC_MILES_JOB": ""}).stdout)
    r = run({**env, "PCC_MILES_JOB": str(tmp_path / "nope")})
    assert r.returncode == 2 and "PCC_MILES_JOB" in r.stderr


def test_model_args_file_is_one_flag_per_line(tmp_path):
    m = _miles("glm52_fp8_rollout")
    lines = [ln for ln in m.files["miles/model_args.txt"].splitlines() if not ln.startswith("#")]
    assert all(ln.startswith("--") for ln in lines)
    assert "--spec miles_plugins.models.glm5.glm5 get_glm5_spec" in lines and "--num-layers 78" in lines
