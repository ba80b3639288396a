"""`pcc run --target miles`: the exact command with --dry-run, and what is missing otherwise."""

import json
import os
import subprocess
from pathlib import Path

from pcc.bundle import FRAMEWORKS, read_bundle
from pcc.bundle.launch import LAUNCHERS
from pcc.bundle.write import write_bundle
from pcc.cli import main
from pcc.plan import compile_file

ROOT = Path(__file__).resolve().parents[2]


def test_every_framework_named_has_a_launcher():
    """pcc.bundle.FRAMEWORKS names `pcc run`'s targets for the parser (no compiler imported); the launchers are
    pcc.bundle.launch's: the same keys, or a target would parse and then fail."""
    assert set(FRAMEWORKS) == set(LAUNCHERS)


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


def _fake_ray(tmp_path):
    fake = tmp_path / "bin"
    fake.mkdir(exist_ok=True)
    (fake / "ray").write_text('#!/usr/bin/env python3\nimport json, sys\nprint(json.dumps(sys.argv[1:]))\n')
    (fake / "ray").chmod(0o755)
    (tmp_path / "train.py").write_text("")
    return fake


def test_dry_run_takes_job_file_and_arguments_after_the_bundle(tmp_path, capsys, monkeypatch):
    bundle = tmp_path / "b"
    write_bundle(compile_file(str(ROOT / "contracts/unified_fp8.prec")).plan, bundle)
    (tmp_path / "job").write_text("# job\n--rollout-batch-size 32\n--num-layers 4\n")
    monkeypatch.delenv("PCC_MILES_JOB", raising=False)
    assert main(["run", str(bundle), "--target", "miles", "--dry-run", "--json", "--", "--num-rollout", "3",
                 "--tis-clip", "1.5"]) == 0
    out = json.loads(capsys.readouterr().out)["result"]
    cmd = out["command"]
    assert cmd[-8:] == ["--rollout-batch-size", "32", "--num-layers", "4", "--num-rollout", "3", "--tis-clip", "1.5"]
    assert cmd[cmd.index("python3") + 1:cmd.index("python3") + 4] == ["train.py", "--num-layers", "48"]
    assert out["job"] == str(tmp_path / "job") and out["extra_args"] == ["--num-rollout", "3", "--tis-clip", "1.5"]
    assert {(o["flag"], o["bundle"], o["now"], o["from"]) for o in out["overrides"]} == {
        ("--num-layers", "48", "4", "job")}
    read_bundle(bundle)  # nothing in the bundle changed


def test_dry_run_text_names_the_job_file_and_what_it_overrides(tmp_path, capsys, monkeypatch):
    bundle = tmp_path / "b"
    write_bundle(compile_file(str(ROOT / "contracts/bf16_baseline.prec")).plan, bundle)
    monkeypatch.setenv("PCC_MILES_JOB", str(tmp_path / "my.job"))
    (tmp_path / "my.job").write_text("--tensor-model-parallel-size 2\n")
    assert main(["run", str(bundle), "--target", "miles", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert f"# job file: {tmp_path / 'my.job'}" in out
    assert "# --tensor-model-parallel-size: the job sets 2 over the bundle's 4" in out
    assert out.strip().splitlines()[-1].endswith("--tensor-model-parallel-size 2")


def test_run_passes_arguments_to_launch_sh(tmp_path, capsys, monkeypatch):
    bundle = tmp_path / "b"
    write_bundle(compile_file(str(ROOT / "contracts/unified_fp8.prec")).plan, bundle)
    fake = _fake_ray(tmp_path)
    for k, v in {"PATH": f"{fake}:{os.environ['PATH']}", "PCC_ROLLOUT_CHECKPOINT": "/ckpt", "PCC_REF_LOAD": "/ref",
                 "MILES_DIR": str(tmp_path)}.items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("PCC_MILES_JOB", raising=False)
    (tmp_path / "job").write_text("--rollout-batch-size 32\n")
    argv = []

    def call(cmd, env=None):
        argv.extend(json.loads(subprocess.run(cmd, env=env, capture_output=True, text=True, check=True).stdout))
        return 0

    monkeypatch.setattr(subprocess, "call", call)
    assert main(["run", str(bundle), "--target", "miles", "--", "--num-rollout", "3", "--wandb-run-name", "a b"]) == 0
    assert argv[-6:] == ["--rollout-batch-size", "32", "--num-rollout", "3", "--wandb-run-name", "a b"]


def test_a_launched_contract_takes_the_job_file_beside_it(tmp_path, capsys, monkeypatch):
    import shutil

    contract = tmp_path / "c.prec"
    shutil.copy(ROOT / "contracts/bf16_baseline.prec", contract)
    (tmp_path / "job").write_text("--rollout-batch-size 16\n")
    monkeypatch.delenv("PCC_MILES_JOB", raising=False)
    assert main(["run", str(contract), "--target", "miles", "--dry-run", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)["result"]
    assert out["job"] == str(tmp_path / "job") and out["command"][-2:] == ["--rollout-batch-size", "16"]


def test_the_embedded_runtime_takes_no_launcher_arguments(capsys):
    assert main(["run", str(ROOT / "contracts/tiny_cpu.prec"), "--", "--rollout-batch-size", "32"]) == 2
    assert "--target miles" in capsys.readouterr().err


def _fake_python(tmp_path, missing: str = ""):
    """A python3 that answers the launcher's import probe with `missing` and prints any other argv as JSON."""
    import sys

    fake = tmp_path / "pybin"
    fake.mkdir(exist_ok=True)
    (fake / "python3").write_text(f"#!{sys.executable}\nimport json, sys\nif sys.argv[1] == '-c':\n"
                                  f"    print({missing!r})\nelse:\n    print(json.dumps(sys.argv[1:]))\n")
    (fake / "python3").chmod(0o755)
    return fake


def test_verl_dry_run_is_the_command_launch_sh_runs(tmp_path, capsys):
    import shlex

    bundle = tmp_path / "my bundle"
    write_bundle(compile_file(str(ROOT / "contracts/verl/unified_fp8.prec")).plan, bundle)
    extra = ["data.train_files=/data/my set.parquet", "actor_rollout_ref.model.path=/m"]
    assert main(["run", str(bundle), "--target", "verl", "--dry-run", "--json", "--", *extra]) == 0
    out = json.loads(capsys.readouterr().out)["result"]
    printed = subprocess.run(["bash", str(bundle / "verl/launch.sh"), *extra], capture_output=True, text=True,
                             env={**os.environ, "PCC_DRY_RUN": "1"}, check=True).stdout
    assert out["command"] == shlex.split(printed)
    assert out["command"][:5] == ["python3", "-m", "verl.trainer.main_ppo", "--config-name", "ppo_megatron_trainer"]
    assert out["command"][-2:] == extra and "actor_rollout_ref.rollout.quantization='fp8'" in out["command"]
    assert out["env"]["NVTE_FP8_BLOCK_SCALING_FP32_SCALES"] == "1"
    assert main(["run", str(bundle), "--target", "verl", "--dry-run", "--", *extra]) == 0
    assert shlex.split(capsys.readouterr().out.strip().splitlines()[-1]) == out["command"]  # every value quoted


def test_verl_run_executes_launch_sh_with_the_arguments_after_it(tmp_path, capsys, monkeypatch):
    bundle = tmp_path / "b"
    write_bundle(compile_file(str(ROOT / "contracts/verl/bf16_baseline.prec")).plan, bundle)
    monkeypatch.setenv("PATH", f"{_fake_python(tmp_path)}:{os.environ['PATH']}")
    argv = []

    def call(cmd, env=None):
        argv.extend(json.loads(subprocess.run(cmd, env=env, capture_output=True, text=True, check=True).stdout))
        return 0

    monkeypatch.setattr(subprocess, "call", call)
    assert main(["run", str(bundle), "--target", "verl", "--", "trainer.total_epochs=1", "data.val_files=a b"]) == 0
    own = (bundle / "verl/overrides.txt").read_text().splitlines()
    assert argv == ["-m", "verl.trainer.main_ppo", "--config-name", "ppo_megatron_trainer", *own,
                    "trainer.total_epochs=1", "data.val_files=a b"]


def test_verl_launch_names_what_is_missing_and_refuses_other_bundles(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("PATH", f"{_fake_python(tmp_path, 'verl ray')}:{os.environ['PATH']}")
    assert main(["run", str(ROOT / "contracts/verl/bf16_baseline.prec"), "--target", "verl", "--json"]) == 1
    messages = [d["message"] for d in json.loads(capsys.readouterr().out)["diagnostics"]]
    assert any(m.startswith("cannot launch on verl: verl is not importable") for m in messages), messages
    assert any("pip install 'ray[default]'" in m for m in messages), messages
    miles = tmp_path / "miles-bundle"
    write_bundle(compile_file(str(ROOT / "contracts/bf16_baseline.prec")).plan, miles)
    assert main(["run", str(miles), "--target", "verl", "--dry-run", "--json"]) == 1
    (d,) = json.loads(capsys.readouterr().out)["diagnostics"]
    assert d["code"] == "PCC706" and "framework verl" in d["message"]
    assert main(["run", str(ROOT / "contracts/vllm/bf16_baseline.prec"), "--target", "verl", "--dry-run"]) == 1
    assert "does not run on verl" in capsys.readouterr().err
    for framework, contract in (("verl", "tiny_cpu.prec"), ("miles", "verl/tiny_cpu.prec")):  # a contract file
        assert main(["run", str(ROOT / "contracts" / contract), "--target", framework, "--dry-run", "--json"]) == 1
        (d,) = [d for d in json.loads(capsys.readouterr().out)["diagnostics"] if d["severity"] == "error"]
        assert d["code"] == "PCC706" and f"does not run on {FRAMEWORKS[framework]}" in d["message"], d


VERL_JOB = ("# my GSM8K job\n"
            "data.train_files=/data/my set.parquet\n"
            "   actor_rollout_ref.model.path=/models/q3  \r\n"
            "\n"
            "  # a comment after blanks\n"
            "actor_rollout_ref.rollout.quantization=null\n"
            "++actor_rollout_ref.actor.megatron.override_transformer_config.fp8_recipe='tensorwise'\n"
            "trainer.total_epochs=1")  # no newline at the end


def test_verl_job_file_goes_between_the_bundle_and_the_arguments(tmp_path, capsys, monkeypatch):
    """The file `job` beside the bundle: one Hydra override a line (blanks trimmed, '#' lines skipped, spaces
    inside a value kept), after the bundle's overrides and before the command line's; launch.sh reads it
    the same way, and the dry run lists each key the job sets again over the bundle's value."""
    import shlex

    bundle = tmp_path / "b"
    write_bundle(compile_file(str(ROOT / "contracts/verl/unified_fp8.prec")).plan, bundle)
    (tmp_path / "job").write_text(VERL_JOB)
    monkeypatch.delenv("PCC_VERL_JOB", raising=False)
    job_args = ["data.train_files=/data/my set.parquet", "actor_rollout_ref.model.path=/models/q3",
                "actor_rollout_ref.rollout.quantization=null",
                "++actor_rollout_ref.actor.megatron.override_transformer_config.fp8_recipe='tensorwise'",
                "trainer.total_epochs=1"]
    extra = ["trainer.total_epochs=2"]
    assert main(["run", str(bundle), "--target", "verl", "--dry-run", "--json", "--", *extra]) == 0
    out = json.loads(capsys.readouterr().out)["result"]
    own = (bundle / "verl/overrides.txt").read_text().splitlines()
    assert out["command"] == ["python3", "-m", "verl.trainer.main_ppo", "--config-name", "ppo_megatron_trainer",
                              *own, *job_args, *extra]
    assert out["job"] == str(tmp_path / "job") and out["job_args"] == job_args and out["extra_args"] == extra
    assert out["overrides"] == [
        {"flag": "actor_rollout_ref.rollout.quantization", "bundle": "'fp8'", "now": "null", "from": "job",
         "field": "rollout.rules"},
        {"flag": "actor_rollout_ref.actor.megatron.override_transformer_config.fp8_recipe", "bundle": "'blockwise'",
         "now": "'tensorwise'", "from": "job", "field": "trainer.rules"}]
    env = {k: v for k, v in os.environ.items() if k != "PCC_VERL_JOB"}
    printed = subprocess.run(["bash", str(bundle / "verl/launch.sh"), *extra], capture_output=True, text=True,
                             env={**env, "PCC_DRY_RUN": "1"}, check=True).stdout
    assert shlex.split(printed) == out["command"]
    assert main(["run", str(bundle), "--target", "verl", "--dry-run", "--", *extra]) == 0
    text = capsys.readouterr().out
    assert f"# job file: {tmp_path / 'job'}" in text
    assert ("# actor_rollout_ref.rollout.quantization: the job sets null over the bundle's 'fp8' (the contract's "
            "rollout.rules)") in text
    read_bundle(bundle)  # nothing in the bundle changed


def test_pcc_verl_job_names_the_file_empty_means_none_and_missing_stops(tmp_path, capsys, monkeypatch):
    """$PCC_VERL_JOB as $PCC_MILES_JOB for Miles: a file in place of `job`; empty, no job file; a file
    that does not exist stops launch.sh (exit 2) and is named by `pcc run`."""
    import shlex

    bundle = tmp_path / "b"
    write_bundle(compile_file(str(ROOT / "contracts/verl/bf16_baseline.prec")).plan, bundle)
    (tmp_path / "job").write_text("trainer.total_epochs=9\n")
    (tmp_path / "other.job").write_text("trainer.total_epochs=3\n")
    own = (bundle / "verl/overrides.txt").read_text().splitlines()
    for value, tail in ((str(tmp_path / "other.job"), ["trainer.total_epochs=3"]), ("", [])):
        monkeypatch.setenv("PCC_VERL_JOB", value)
        monkeypatch.setenv("PCC_MILES_JOB", str(tmp_path / "job"))  # Miles' variable is not verl's
        assert main(["run", str(bundle), "--target", "verl", "--dry-run", "--json"]) == 0
        assert json.loads(capsys.readouterr().out)["result"]["command"][5:] == own + tail
        printed = subprocess.run(["bash", str(bundle / "verl/launch.sh")], capture_output=True, text=True,
                                 env={**os.environ, "PCC_DRY_RUN": "1"}, check=True).stdout
        assert shlex.split(printed)[5:] == own + tail
    gone = tmp_path / "no such.job"
    monkeypatch.setenv("PCC_VERL_JOB", str(gone))
    run = subprocess.run(["bash", str(bundle / "verl/launch.sh")], capture_output=True, text=True,
                         env={**os.environ, "PCC_DRY_RUN": "1"})
    assert run.returncode == 2 and f"PCC_VERL_JOB={gone}: no such file" in run.stderr
    monkeypatch.setenv("PATH", f"{_fake_python(tmp_path)}:{os.environ['PATH']}")
    assert main(["run", str(bundle), "--target", "verl", "--json"]) == 1
    messages = [d["message"] for d in json.loads(capsys.readouterr().out)["diagnostics"]]
    assert messages == [f"cannot launch on verl: PCC_VERL_JOB={gone}: no such file (the job file: Hydra "
                        "overrides, one per line)"]


def test_a_launched_verl_contract_takes_the_job_file_beside_it(tmp_path, capsys, monkeypatch):
    """`pcc run C.prec --target verl` compiles C into a temporary bundle; launch.sh still reads the job
    file beside C (named to it through $PCC_VERL_JOB), and the arguments come last."""
    contract = tmp_path / "c.prec"
    contract.write_text(f'contract c extends "{ROOT / "contracts/verl/bf16_baseline.prec"}" {{\n}}\n')
    (tmp_path / "job").write_text("data.train_files=/d.parquet\n")
    monkeypatch.delenv("PCC_VERL_JOB", raising=False)
    monkeypatch.setenv("PATH", f"{_fake_python(tmp_path)}:{os.environ['PATH']}")
    argv = []

    def call(cmd, env=None):
        argv.extend(json.loads(subprocess.run(cmd, env=env, capture_output=True, text=True, check=True).stdout))
        return 0

    monkeypatch.setattr(subprocess, "call", call)
    assert main(["run", str(contract), "--target", "verl", "--", "trainer.total_epochs=1"]) == 0
    assert argv[-2:] == ["data.train_files=/d.parquet", "trainer.total_epochs=1"]


def test_every_override_key_verl_writes_names_its_contract_field(tmp_path):
    """The dry run names the contract field behind each key a job sets again: every key the verl target
    writes (shipped verl contracts and variants with LoRA on either trainer, corrections, KV cache and
    determinism) maps to a field the Contract model has."""
    from pcc.contract.model import Contract
    from pcc.lower import lower
    from pcc.lower.verl import contract_field

    def text(body, trainer="megatron", extra=""):
        return (f"contract c {{\n  model qwen3_30b_a3b\n  hardware H100\n  rollout vllm {{\n{body}\n  }}\n"
                f"  trainer {trainer} {{\n    gemm : bf16\n  }}\n{extra}}}\n")

    variants = [text("    parallel tp 4 ep 4", extra="  correction mis clip 2 low 0.5\n"),
                text("    parallel tp 4 ep 4", extra="  trainable lora rank 16 alpha 32 targets attn.q, attn.kv, "
                                                   "attn.o\n  sync adapter\n"),
                text("    parallel tp 2", trainer="fsdp", extra="  trainable lora rank 8 alpha 16 targets attn.q\n"
                                                                "  sync adapter\n"),
                text("    kv_cache : fp8_e4m3\n    deterministic\n    parallel tp 2 dp 2 ep 4")]
    plans = [compile_file(str(p)).plan for p in sorted((ROOT / "contracts/verl").glob("*.prec"))]
    for i, t in enumerate(variants):
        (tmp_path / f"v{i}.prec").write_text(t)
        plans.append(compile_file(str(tmp_path / f"v{i}.prec")).plan)
    keys = {a.partition("=")[0] for p in plans for a in lower(p, "verl").args}
    assert {"+actor_rollout_ref.rollout.engine_kwargs.vllm.kv_cache_dtype", "actor_rollout_ref.model.lora.rank",
            "actor_rollout_ref.model.lora_rank", "algorithm.rollout_correction.rollout_is"} <= keys

    def field_of(path: str):  # a dotted contract field -> the pydantic field it names, None if none
        model = Contract
        for part in path.split("."):
            info = getattr(model, "model_fields", {}).get(part)
            if info is None:
                return None
            model = next((a for a in (info.annotation, *getattr(info.annotation, "__args__", ()))
                          if hasattr(a, "model_fields")), None)
        return info

    assert {k: contract_field(k) for k in keys if field_of(contract_field(k) or "") is None} == {}
    assert contract_field("data.train_files") is None
