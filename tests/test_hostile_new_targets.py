"""Hostile inputs for the verbs of the new targets (`pcc import verl|te`, `pcc run --target verl`):
none may hang, grow without bound, trace back or execute anything (docs/safety.md)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

BOMB = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{c}: &{c} [{', '.join([f'*{p}'] * 9)}]\n" for p, c in zip("abcdefgh", "bcdefghi"))


def pcc(*argv: str, timeout: float = 60, env: dict[str, str] | None = None) -> tuple[int, dict]:
    """`pcc ARGV --json` in a child (a hang is a timeout, not a stuck test run), with `env` added to its
    environment: (exit code, envelope). --json goes before any `--`."""
    cut = argv.index("--") if "--" in argv else len(argv)
    p = subprocess.run([sys.executable, "-m", "pcc.cli", *argv[:cut], "--json", *argv[cut:]], capture_output=True,
                       text=True, timeout=timeout, cwd=ROOT, env={**os.environ, "PCC_THREADS": "1", **(env or {})})
    assert "Traceback" not in p.stderr, p.stderr
    return p.returncode, json.loads(p.stdout)


@pytest.fixture(scope="module")
def d(tmp_path_factory):
    d = tmp_path_factory.mktemp("hostile-new")
    (d / "zero.yaml").symlink_to("/dev/zero")
    os.mkfifo(d / "fifo.yaml")
    (d / "bomb.yaml").write_text(BOMB)
    (d / "self.yaml").write_text("a: &a [1, *a]\n")
    with open(d / "sparse.yaml", "wb") as fh:
        fh.truncate(800 << 20)
    return d


@pytest.mark.parametrize("kind", ["verl", "te"])
@pytest.mark.parametrize("name, code, words", [
    ("zero.yaml", 2, "not a regular file"),
    ("fifo.yaml", 2, "a FIFO"),
    ("sparse.yaml", 1, "limit"),
    ("bomb.yaml", 1, "aliases"),
    ("self.yaml", 1, "alias"),
])
def test_import_refuses_hostile_yaml(d, kind, name, code, words):
    rc, env = pcc("import", kind, str(d / name), "--model", "qwen3_30b_a3b")
    assert rc == code == env["exit_code"], env
    assert words in env["diagnostics"][0]["message"], env


@pytest.fixture(scope="module")
def verl_job(tmp_path_factory):
    """The folder pcc writes a verl job to (verl/overrides.txt, launch.sh) of verl/tiny_cpu."""
    from pcc.cli import main

    d = tmp_path_factory.mktemp("verl-job")
    assert main(["compile", str(ROOT / "contracts" / "verl" / "tiny_cpu.prec"), "-o", str(d / "bundle")]) == 0
    return d / "bundle"


@pytest.mark.parametrize("text, line, words", [
    ("[1, 2]\n", 1, "the document is not a mapping"),
    ("levels: 3\n", 1, "levels is not a list"),
    ("levels:\n- thresholds:\n  - source: contract\n    op: '<='\n", 3, "has no metric"),
    ("levels:\n- thresholds:\n  - {source: contract, metric: route_agreement, op: 'rm -rf', value: 1}\n", 3, ".op:"),
    (BOMB, 1, "aliases"),
])
def test_verl_import_of_a_folder_with_a_hostile_expectations_file(verl_job, tmp_path, text, line, words):
    job = tmp_path / "job"
    (job / "validate").mkdir(parents=True)
    (job / "verl").mkdir()
    for f in ("overrides.txt", "launch.sh"):
        (job / "verl" / f).write_bytes((verl_job / "verl" / f).read_bytes())
    (job / "validate" / "expectations.yaml").write_text(text)
    rc, env = pcc("import", "verl", str(job), "--model", "tiny_moe")
    assert rc == 1 == env["exit_code"], env
    first = env["diagnostics"][0]
    assert first["code"] == "PCC801" and words in first["message"] and first["line"] == line, first


def test_an_internal_error_is_one_line(monkeypatch, capsys):
    import pcc.importer
    from pcc.cli import main

    def boom(*args, **kwargs):
        raise ValueError("first line\nsecond line")

    monkeypatch.setattr(pcc.importer, "import_source", boom)
    assert main(["import", "te", str(ROOT / "README.md"), "--model", "tiny_moe"]) == 3
    err = capsys.readouterr().err
    assert err == "pcc: internal error: ValueError: first line second line (please report)\n", err


@pytest.mark.parametrize("flag", [["--steps", "3"], ["--seed", "1"], ["-o", "somewhere"], ["--no-plots"],
                                  ["--model", "tiny_dense"], ["--resume"]])
@pytest.mark.parametrize("target", ["verl", "miles"])
def test_a_launcher_target_refuses_the_embedded_runtimes_flags(flag, target, capsys):
    """`pcc run B --target verl --steps 3` ran the job with verl's own step count: the flag was dropped silently."""
    from pcc.cli import main

    contract = ROOT / "contracts" / ("verl/tiny_cpu.prec" if target == "verl" else "tiny_cpu.prec")
    assert main(["run", str(contract), "--target", target, "--dry-run", *flag]) == 2
    assert f"--target {target} does not run" in capsys.readouterr().err


TE_FILE = """configs:
  fp8:
    transformer_engine_config_type: TEQuantizationParams
    training_recipe:
      fp8_quantization_recipe: tensorwise
matchers:
  m1:
    type: glob
    enabled: true
    pattern: "*"
    config: CONFIG
"""


@pytest.mark.parametrize("config", ["[fp8]", "{a: 1}"])
def test_te_import_of_a_matcher_whose_config_is_not_a_name(tmp_path, config, capsys):
    """A matcher's `config` as a list or mapping was an internal error (unhashable type)."""
    from pcc.cli import main

    (tmp_path / "te.yaml").write_text(TE_FILE.replace("CONFIG", config))
    assert main(["import", "te", str(tmp_path / "te.yaml"), "--model", "tiny_moe"]) == 1
    assert "error[PCC801]" in capsys.readouterr().err


@pytest.mark.parametrize("line, value, words", [
    ("      tensor_model_parallel_size: 2", "0", "trainer.parallel.tp 0"),
    ("    tensor_model_parallel_size: 4", "99999999999999999999",  # named by its verl key (importer bounds)
     "rollout.tensor_model_parallel_size '99999999999999999999' is not an integer"),
    ("  max_response_length: 4096", "-1", "rollout.max_tokens -1"),
    ("    rollout_is_threshold: 2.5", "-1", "correction.clip"),
    ("    rollout_is_threshold: 2.5", ".nan", "finite number"),
    ("    rollout_is_threshold: 2.5", ".inf", "finite number"),
])
def test_verl_import_of_a_value_no_contract_states(tmp_path, line, value, words, capsys):
    """Out-of-range values were pydantic's ValidationError, an internal error (exit 3); an infinite
    threshold was written as a contract `pcc check` refuses."""
    sys.path.insert(0, str(ROOT / "tests" / "importer"))
    from test_verl import EXAMPLE

    from pcc.cli import main

    assert line + "\n" in EXAMPLE
    (tmp_path / "job.yaml").write_text(EXAMPLE.replace(line + "\n", line.rsplit(" ", 1)[0] + f" {value}\n"))
    assert main(["import", "verl", str(tmp_path / "job.yaml"), "--model", "qwen3_30b_a3b"]) == 1
    err = capsys.readouterr().err
    assert "error[PCC801]" in err and words in err, err


@pytest.fixture(scope="module")
def bundles(verl_job, tmp_path_factory):
    """framework -> the bundle of its tiny_cpu contract."""
    from pcc.cli import main

    miles = tmp_path_factory.mktemp("miles-job") / "bundle"
    assert main(["compile", str(ROOT / "contracts" / "tiny_cpu.prec"), "-o", str(miles)]) == 0
    return {"verl": verl_job, "miles": miles}


INJECTED = "x\ntouch /tmp/pwned #"
SETS_AGAIN = {"verl": [f"actor_rollout_ref.rollout.name={INJECTED}"],
              "miles": ["--tensor-model-parallel-size", INJECTED]}


@pytest.mark.parametrize("where", ["argument", "job variable"])
@pytest.mark.parametrize("framework", ["verl", "miles"])
def test_a_dry_run_is_comments_the_environment_and_the_command_only(bundles, framework, where, tmp_path,
                                                                    monkeypatch, capsys):
    """A newline in an argument (listed as a value set again) or in $PCC_*_JOB ended the dry run's comment:
    the rest of the value was a bare line (`touch /tmp/pwned # ...`) that a pasted dry run runs."""
    import shlex

    from pcc.cli import main

    variable = {"verl": "PCC_VERL_JOB", "miles": "PCC_MILES_JOB"}[framework]
    monkeypatch.setenv(variable, str(tmp_path / INJECTED) if where == "job variable" else "")
    extra = SETS_AGAIN[framework] if where == "argument" else []
    argv = ["run", str(bundles[framework]), "--target", framework, "--dry-run"]
    assert main([*argv, "--json", "--", *extra]) == 0
    launch = json.loads(capsys.readouterr().out)["result"]
    assert main([*argv, "--", *extra]) == 0
    lines = capsys.readouterr().out.rstrip("\n").split("\n")
    env_lines = {f"{k}={shlex.quote(v)}" for k, v in launch["env"].items()}
    n = next(i for i, line in enumerate(lines) if not (line.startswith("#") or line in env_lines))
    assert len(lines[n:]) == 1, lines[n:]  # the newline is escaped ($'...'): one line, as bash reads it back
    words = subprocess.run(["bash", "-c", "printf '%s\\0' " + lines[n]], capture_output=True, check=True).stdout
    assert words.decode().split("\0")[:-1] == launch["command"], lines[n]
    assert any("touch /tmp/pwned" in line for line in lines[:n])  # the value is shown, escaped, in its comment


@pytest.mark.parametrize("kind, words", [("not UTF-8", "not UTF-8 text"), ("sparse", "limit for a job file"),
                                         ("FIFO", "a FIFO, not a regular file")])
@pytest.mark.parametrize("framework", ["verl", "miles"])
def test_a_hostile_job_file_is_refused_naming_it(bundles, framework, kind, words, tmp_path):
    """A job file not UTF-8 was an internal error (UnicodeDecodeError, exit 3); one the size of the disk was
    read whole; a FIFO named by $PCC_*_JOB was skipped by the dry run that the launch then refused."""
    import shutil

    shutil.copytree(bundles[framework], tmp_path / "bundle")
    job = tmp_path / "job"
    variable = {"verl": "PCC_VERL_JOB", "miles": "PCC_MILES_JOB"}[framework]
    env = {variable: str(job)} if kind == "FIFO" else {}
    if kind == "FIFO":
        os.mkfifo(job)
    elif kind == "sparse":
        with open(job, "wb") as fh:
            fh.truncate(800 << 20)
    else:
        job.write_bytes(b"trainer.total_epochs=1\n\xff\xfe\n")
    rc, out = pcc("run", str(tmp_path / "bundle"), "--target", framework, "--dry-run", env=env)
    assert rc == 1 == out["exit_code"], out
    (d,) = out["diagnostics"]
    assert d["code"] == "PCC109" and d["message"].startswith(f"{job}: ") and words in d["message"], d


@pytest.mark.parametrize("where", ["command line", "job file"])
@pytest.mark.parametrize("args", [["--config-name", "ppo_trainer"], ["--config-name=ppo_trainer"], ["-cn", "ppo_trainer"],
                                  ["-cnppo_trainer"], ["--config-n", "ppo_trainer"], ["--config-path", "/x"],
                                  ["-cp", "/x"], ["--config-path=/x"]])
def test_verl_refuses_another_trainer_config(bundles, args, where, tmp_path):
    """`-- --config-name ppo_trainer` switched verl's trainer config (Hydra takes the later one) while the
    dry run still said ppo_megatron_trainer."""
    job = tmp_path / "job"
    job.write_text("".join(a + "\n" for a in args) if where == "job file" else "")
    rc, out = pcc("run", str(bundles["verl"]), "--target", "verl", "--dry-run",
                  *(["--", *args] if where == "command line" else []), env={"PCC_VERL_JOB": str(job)})
    assert rc == 1 == out["exit_code"], out
    (d,) = out["diagnostics"]
    assert d["code"] == "PCC716" and f"the {where} sets {args[0]}" in d["message"], d


def test_verl_takes_overrides_that_only_look_like_config_options(bundles, capsys, monkeypatch):
    from pcc.cli import main

    monkeypatch.setenv("PCC_VERL_JOB", "")
    extra = ["trainer.project_name=--config-name", "data.cn=-cn"]
    assert main(["run", str(bundles["verl"]), "--target", "verl", "--dry-run", "--json", "--", *extra]) == 0
    assert json.loads(capsys.readouterr().out)["result"]["command"][-2:] == extra


VERL_FSDP = """contract c {
  model qwen3_30b_a3b
  hardware H100
  framework verl
  rollout vllm {
    parallel tp 2
  }
  trainer fsdp {
    gemm : bf16
    PARALLEL
    optimizer OPTIMIZER
  }
}
"""


@pytest.mark.parametrize("parallel, optimizer, code, line", [
    ("parallel dp 8", "adam distributed", "PCC616", 10),
    ("parallel gpus 8", "adam distributed", "PCC616", 10),
    ("parallel dp 1", "sgd", "PCC625", 11),
    ("parallel dp 1", "adam distributed offload precision_aware", "PCC625", 11),
])
def test_verl_fsdp_says_what_its_trainer_parallel_and_optimizer_do_not_set(tmp_path, parallel, optimizer, code,
                                                                          line, capsys):
    """`framework verl` with `trainer fsdp { parallel dp 8 }` checked with no warning while verl/overrides.txt
    set no data-parallel size (verl's FSDP actor takes the job's GPUs); `optimizer sgd` or `precision_aware`
    ran verl's AdamW silently."""
    from pcc.cli import main

    (tmp_path / "c.prec").write_text(VERL_FSDP.replace("PARALLEL", parallel).replace("OPTIMIZER", optimizer))
    rc = main(["check", str(tmp_path / "c.prec"), "--json"])
    diags = json.loads(capsys.readouterr().out)["diagnostics"]
    assert rc == (0 if code == "PCC616" else 1), diags
    assert [(d["code"], d["line"]) for d in diags] == [(code, line)], diags


def test_verl_fsdp_on_one_rank_with_adam_checks_clean(tmp_path, capsys):
    from pcc.cli import main

    (tmp_path / "c.prec").write_text(VERL_FSDP.replace("PARALLEL", "parallel dp 1")
                                     .replace("OPTIMIZER", "adam distributed"))
    assert main(["check", str(tmp_path / "c.prec"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["diagnostics"] == []
