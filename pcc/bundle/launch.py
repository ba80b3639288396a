"""`pcc run --target miles|verl`: launch a bundle on the framework its contract names: Miles
(Megatron + SGLang over Ray) or verl (`python3 -m verl.trainer.main_ppo` with Hydra overrides).

pcc never reimplements either: it checks that what the launch needs is present, says
exactly what is missing and how to get it, and runs the bundle's FRAMEWORK/launch.sh with the
job's own arguments after it. `--dry-run` prints the command and environment instead. Each
framework builds one `Launch`; `run_launch` prints or starts it the same way for both.

Miles' arguments come in this order, and where two set the same flag the later wins
(argparse keeps the last value): the architecture (miles/model_args.txt), the contract's
flags (miles/args.txt), the checkpoints, the job file, then the arguments given after `--`.
The job file holds Miles flags, one per line (blank lines and '#' comments skipped); it is
$PCC_MILES_JOB, else the file `job` beside the bundle (beside the contract file when a
contract is launched). verl's is found the same way ($PCC_VERL_JOB) and holds one Hydra
override per line; it goes between the bundle's overrides and the arguments (Hydra applies
overrides in order: the later wins). Either way an argument that sets what the bundle sets
again is listed by the dry run, not refused. Nothing in the bundle changes, so its manifest
still checks.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import unicodedata
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from pcc.lang.diagnostics import PccError
from pcc.lang.inputs import read_json
from pcc.lower import JOB_FILE, PATH_VARIABLES
from pcc.lower.miles import JOB_VARIABLE, MODEL_ARGS

MAX_JOB = 1 << 20  # a job file: overrides or flags, a few hundred bytes; a larger file is not one

NEEDED = {
    "PCC_ROLLOUT_CHECKPOINT": "build it with: pcc convert BUNDLE --from <bf16 checkpoint> --to <dir>",
    "PCC_REF_LOAD": "the BF16 trainer weights (Megatron checkpoint or HF directory)",
    "MILES_DIR": "a Miles checkout (the directory holding train.py)",
}


def _bundle_dir(source: str) -> tuple[Path, tempfile.TemporaryDirectory | None, set[str]]:
    """The bundle to launch: `source` itself, or a fresh compile of a contract file; and the files its
    manifest lists."""
    from pcc.bundle import BundleError, is_bundle, read_bundle
    from pcc.bundle.write import write_bundle
    from pcc.lower import compile_file

    if is_bundle(source):
        return Path(source), None, set(read_bundle(source).manifest["files"])
    c = compile_file(source)
    if not c.ok:
        for d in c.diagnostics:
            print(d.render(c.sources), file=sys.stderr)
        raise BundleError(f"{source}: the contract has errors")
    tmp = tempfile.TemporaryDirectory(prefix="pcc-bundle-")
    out = Path(tmp.name) / "bundle"
    return out, tmp, set(write_bundle(c.plan, out))


def words(text: str) -> list[str]:
    """The arguments of a flag file, as launch.sh reads them: each line split on blanks (spaces,
    tabs), blank lines and lines whose first word starts with '#' skipped; no quoting."""
    out: list[str] = []
    for line in text.split("\n"):
        w = [x for x in re.split(r"[ \t]+", line) if x]
        if w and not w[0].startswith("#"):
            out += w
    return out


def override_lines(text: str) -> list[str]:
    """The overrides of a verl job file, as launch.sh reads them: one a line, blanks around it trimmed,
    blank lines and lines starting with '#' skipped (a value may hold spaces: Hydra keeps them)."""
    return [t for t in (line.strip(" \t\r\v\f") for line in text.split("\n")) if t and not t.startswith("#")]


def job_file(source: str, env: dict[str, str], variable: str) -> Path | None:
    """The job file launch.sh reads (None: none), as it resolves it: $variable when set (empty: none),
    else `job` beside the bundle, or beside the contract file."""
    if variable in env:
        return Path(env[variable]) if env[variable] else None
    path = Path(os.path.abspath(source)).parent / JOB_FILE
    return path if path.is_file() else None


def _job(source: str, env: dict[str, str], variable: str, read: Callable[[str], list[str]]):
    """The job file and its arguments; for a launched contract file (compiled into a temporary bundle,
    beside which launch.sh would look) the file is named to launch.sh through `variable`."""
    from pcc.bundle import is_bundle

    job = job_file(source, env, variable)
    if not is_bundle(source):
        env[variable] = str(job) if job else ""
    return job, _printable(job, _job_text(job), read) if job and job.exists() else []


def _printable(job: Path, text: str, read: Callable[[str], list[str]]) -> list[str]:
    """The job file's arguments, line by line as `read` takes them; an argument holding a character a terminal
    does not show as it is (ESC, CR, NUL, a no-break or zero-width space) is refused at load (PCC717) naming
    its line: what a dry run prints would not be what runs."""
    out: list[str] = []
    for n, line in enumerate(text.split("\n"), 1):
        for arg in read(line):
            bad = next((c for c in arg if not c.isprintable()), None)
            if bad is not None:
                crlf = " (Windows or old Mac line endings? save the file with LF ones)" if bad == "\r" else ""
                raise PccError(f"{job}:{n}: {shown(arg)} holds U+{ord(bad):04X} "
                               f"{unicodedata.name(bad, 'a control character')}{crlf}; a job file holds printable "
                               "text only, so what the dry run shows is what runs", code="PCC717")
            out.append(arg)
    return out


def _job_text(job: Path) -> str:
    """The job file's text, read through pcc.lang.inputs: a regular file of at most MAX_JOB bytes, UTF-8;
    InputError (PCC109) naming it otherwise."""
    from pcc.lang.inputs import InputError, read_bytes

    try:
        return read_bytes(job, MAX_JOB, "job file").decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(f"{job}: the job file is not UTF-8 text ({exc.reason} at byte {exc.start})") from None


def _job_missing(env: dict[str, str], variable: str, what: str) -> list[str]:
    job = env.get(variable)
    return [f"{variable}={job}: no such file (the job file: {what})"] if job and not Path(job).is_file() else []


def shown(text: str, quote: Callable[[str], str] = str) -> str:
    """`text` for a dry run's comment line: `quote(text)` when every character is printable, else Python's
    escaped one-line form ('a\\nb'), so a newline in a value never ends the comment (a pasted dry run would
    run the rest as a command)."""
    return quote(text) if text.isprintable() else repr(text)


def shell_word(arg: str) -> str:
    """`arg` as a shell word that shows what it is: shlex.quote when every character is printable, else
    bash's $'...' with the others escaped (\\x1b, \\u00a0), so an ESC or CR in a value never redraws the
    terminal over the command that runs; pasted, it runs as printed."""
    if arg.isprintable():
        return shlex.quote(arg)
    return "$'" + "".join(_escaped(c) for c in arg) + "'"


def _escaped(c: str) -> str:
    """One character inside $'...'; \\u above ASCII, as \\xHH there is a raw byte, not the character."""
    if c in "\\'":
        return "\\" + c
    if c.isprintable():
        return c
    n = ord(c)
    return f"\\x{n:02x}" if n < 0x80 else f"\\u{n:04x}" if n < 0x10000 else f"\\U{n:08x}"


def _job_comments(job: Path | None, variable: str, changed: list[dict]) -> list[str]:
    """The dry run's lines on the job file and on every value the job or the command line sets again."""
    out = [f"# job file: {shown(str(job), shlex.quote) if job else f'none (set {variable}, or write {JOB_FILE} beside the bundle)'}"]
    return out + [f"# {shown(o['flag'])}: the {o['from']} sets {shown(o['now'] or '(no value)')} over the bundle's "
                  f"{shown(o['bundle'] or '(no value)')}" + (f" (the contract's {o['field']})" if o.get("field") else "")
                  for o in changed]


def _flags(args: list[str]) -> dict[str, list[str]]:
    """flag -> its values, last one winning (argparse's rule for options that take values)."""
    out: dict[str, list[str]] = {}
    flag = None
    for a in args:
        if a.startswith("--"):
            flag = a
            out[flag] = []
        elif flag is not None:
            out[flag].append(a)
    return out


def overrides(bundle_args: dict[str, list[str]], later: list[str], where: str,
              parse: Callable[[list[str]], dict[str, list[str]]] = _flags) -> list[dict]:
    """The flags (verl: the keys) `later` sets again, with both values: the later one wins."""
    return [{"flag": f, "bundle": " ".join(bundle_args[f]), "now": " ".join(v), "from": where}
            for f, v in parse(later).items() if f in bundle_args and bundle_args[f] != v]


def missing(env: dict[str, str]) -> list[str]:
    """What the launch cannot start without, each with how to get it."""
    out = []
    if shutil.which("ray", path=env.get("PATH")) is None:
        out.append("ray is not on PATH: install Ray on the cluster head (pip install 'ray[default]')")
    for var, how in NEEDED.items():
        if not env.get(var):
            out.append(f"{var} is not set: {how}")
    miles = env.get("MILES_DIR")
    if miles and not (Path(miles) / "train.py").is_file():
        out.append(f"MILES_DIR={miles} has no train.py: clone Miles there")
    return out + _job_missing(env, JOB_VARIABLE, "Miles flags, one per line")


@dataclass
class Launch:
    """One framework's launch of a bundle, as `run` prints it (--dry-run) or starts it: the exact command,
    the bundle's launch script that runs it, the document and comment lines a dry run prints, and what
    the launch cannot start without."""

    command: list[str]
    script: Path
    env: dict[str, str]  # the environment the script runs in
    document: dict  # the --dry-run --json result
    comments: list[str]  # the --dry-run text before the command
    missing: Callable[[], list[str]]  # asked only when launching (verl's asks python3)


def miles_launch(source: str, bundle: Path, extra: list[str]) -> Launch:
    """`ray job submit ... python3 train.py` with the architecture, the contract's flags, the checkpoints,
    the job file and `extra`, in that order (later flags win)."""
    import json

    env = dict(os.environ)
    job, job_args = _job(source, env, JOB_VARIABLE, words)
    launch = bundle / "miles" / "launch.sh"
    runtime_env = read_json(bundle / "miles" / "runtime-env.json", what="runtime environment")["env_vars"]
    script, *own = [str(bundle / a) if (bundle / a).is_file() else a
                    for a in (bundle / "miles" / "args.txt").read_text().split("\n")[:-1]]
    model = words((bundle / MODEL_ARGS).read_text())
    paths = {v: os.environ.get(v, f"<{v}>") for v in ("PCC_ROLLOUT_CHECKPOINT", "PCC_REF_LOAD")}
    tail = ["--hf-checkpoint", paths["PCC_ROLLOUT_CHECKPOINT"], "--ref-load", paths["PCC_REF_LOAD"]]
    if "PCC_TIS_FUNCTION" in launch.read_text():
        tail += ["--custom-tis-function-path", os.environ.get("PCC_TIS_FUNCTION", "<PCC_TIS_FUNCTION>")]
    bundle_flags = _flags(model + own + tail)
    changed = overrides(bundle_flags, job_args, "job") + overrides(bundle_flags, extra, "command line")
    command = (["ray", "job", "submit", "--address", os.environ.get("RAY_ADDRESS", "http://127.0.0.1:8265"),
                "--runtime-env-json", json.dumps({"env_vars": runtime_env}, sort_keys=True), "--", "python3",
                script] + model + own + tail + job_args + extra)
    document = {"command": command, "env": runtime_env, "cwd": os.environ.get("MILES_DIR"), "launch": str(launch),
                "paths": {k: PATH_VARIABLES[k] for k in paths}, "job": str(job) if job else None,
                "job_args": job_args, "extra_args": extra, "overrides": changed}
    comments = ["# environment (sent to Ray as the job's runtime env)"]
    comments += [f"{k}={shell_word(v)}" for k, v in runtime_env.items()]
    comments += _job_comments(job, JOB_VARIABLE, changed)
    comments.append(f"# from MILES_DIR={shown(os.environ.get('MILES_DIR', '<MILES_DIR>'), shlex.quote)}")
    return Launch(command, launch, env, document, comments, lambda: missing(env))


def hydra_keys(args: list[str]) -> dict[str, list[str]]:
    """Hydra overrides -> {key: [value]}, the later winning, as `overrides` compares them: `+key` (add) and
    `++key` (add or override) set `key`; `~key` deletes it (no value)."""
    out: dict[str, list[str]] = {}
    for o in args:
        key, eq, value = o.partition("=")
        out[key.lstrip("+~")] = [value] if eq and not key.startswith("~") else []
    return out


def _config_option(arg: str) -> bool:
    """Whether Hydra's argparse reads `arg` as --config-name or --config-path: the option, with `=VALUE`,
    abbreviated (`--config-n`: argparse's allow_abbrev), or its short form with the value joined (`-cnNAME`)."""
    flag = re.split(r"[=\s]", arg, maxsplit=1)[0]
    return flag.startswith(("-cn", "-cp")) or (len(flag) > len("--config-") and any(
        o.startswith(flag) for o in ("--config-name", "--config-path")))


def verl_launch(source: str, bundle: Path, extra: list[str]) -> Launch:
    """`python3 -m verl.trainer.main_ppo --config-name CONFIG` with the bundle's Hydra overrides
    (verl/overrides.txt), the job file's and `extra` after them (the job's data, model path, batch sizes:
    later overrides win), as verl/launch.sh runs it; the environment travels inside the overrides, to
    Ray's runtime_env."""
    from pcc.lower.verl import JOB_VARIABLE as VERL_JOB_VARIABLE, LAUNCH, OVERRIDES_FILE, contract_field, tables

    tab = tables()
    config = tab["config_name"][read_json(bundle / "plan.json", what="plan")["trainer"]["engine"]]
    own = (bundle / OVERRIDES_FILE).read_text().splitlines()
    env_prefix = tab["env_key"] + "."
    runtime_env = {k: v.strip("'") for k, _, v in
                   (o[len(env_prefix):].partition("=") for o in own if o.startswith(env_prefix))}
    env = {k: v for k, v in os.environ.items() if k != "PCC_DRY_RUN"}  # launch.sh would print, not run
    job, job_args = _job(source, env, VERL_JOB_VARIABLE, override_lines)
    for where, args in (("job file", job_args), ("command line", extra)):
        for a in filter(_config_option, args):
            raise PccError(f"the {where} sets {shown(a)}: the contract owns verl's trainer config (--config-name "
                           f"{config}, the actor strategy of its trainer); change the contract's trainer and "
                           "recompile", code="PCC716")
    bundle_keys = hydra_keys(own)
    changed = overrides(bundle_keys, job_args, "job", hydra_keys) + overrides(bundle_keys, extra, "command line",
                                                                            hydra_keys)
    for o in changed:  # every key the bundle sets is the contract's: name the field it leaves behind
        o["field"] = contract_field(o["flag"])
    command = ["python3", "-m", tab["entry"], "--config-name", config, *own, *job_args, *extra]
    document = {"command": command, "env": runtime_env, "cwd": None, "launch": str(bundle / LAUNCH),
                "config_name": config, "job": str(job) if job else None, "job_args": job_args,
                "extra_args": extra, "overrides": changed}
    comments = ["# environment (inside the overrides: Ray's runtime_env for every worker)"]
    comments += [f"{k}={shell_word(v)}" for k, v in runtime_env.items()]
    comments += _job_comments(job, VERL_JOB_VARIABLE, changed)
    comments.append(f"# verl {tab['version']}, as {LAUNCH} runs it; the job's overrides follow the bundle's")
    return Launch(command, bundle / LAUNCH, env, document, comments, lambda: verl_missing(env))


def verl_missing(env: dict[str, str]) -> list[str]:
    """What `python3 -m verl.trainer.main_ppo` cannot start without, each with how to get it."""
    from pcc.lower.verl import JOB_VARIABLE as VERL_JOB_VARIABLE, tables  # the verl target only when launching it

    job = _job_missing(env, VERL_JOB_VARIABLE, "Hydra overrides, one per line")
    python = shutil.which("python3", path=env.get("PATH"))
    if python is None:
        return job + ["python3 is not on PATH"]
    probe = "import importlib.util as u; print(' '.join(m for m in ('verl', 'ray') if u.find_spec(m) is None))"
    try:
        gone = subprocess.run([python, "-c", probe], env=env, capture_output=True, text=True, timeout=60).stdout.split()
    except (OSError, subprocess.SubprocessError) as exc:
        return [f"{python} could not be asked for verl and ray ({exc})"]
    how = {"verl": f"pip install verl=={tables()['version']}", "ray": "pip install 'ray[default]'"}
    return job + [f"{m} is not importable by {python}: {how[m]}" for m in gone]


def nemo_rl_launch(source: str, bundle: Path, extra: list[str]) -> Launch:
    """`uv run python examples/run_grpo.py --config RECIPE` in $NEMO_RL_DIR, RECIPE being the bundle's
    nemo_rl/config.yaml under `defaults:` the pinned example recipe, then the job file's Hydra overrides and
    `extra` (later win), as nemo_rl/launch.sh runs it; the environment travels in megatron_cfg.env_vars."""
    import yaml

    from pcc.lower.nemo_rl import CONFIG_FILE, JOB_VARIABLE as NEMO_JOB_VARIABLE, LAUNCH, contract_field, flatten, tables

    tab = tables()
    base = tab["base_config"][read_json(bundle / "plan.json", what="plan")["trainer"]["engine"]]
    own = flatten(yaml.safe_load((bundle / CONFIG_FILE).read_text()) or {})
    runtime_env = {k.rsplit(".", 1)[1]: str(v) for k, v in own.items() if k.startswith("policy.megatron_cfg.env_vars.")}
    env = {k: v for k, v in os.environ.items() if k != "PCC_DRY_RUN"}
    job, job_args = _job(source, env, NEMO_JOB_VARIABLE, override_lines)
    for where, args in (("job file", job_args), ("command line", extra)):
        for a in args:
            if a == "--config" or a.startswith("--config="):
                raise PccError(f"the {where} sets {shown(a)}: the contract owns NeMo RL's recipe ({CONFIG_FILE} over "
                               f"examples/configs/{base}); change the contract and recompile", code="PCC716")
    nemo = os.environ.get("NEMO_RL_DIR")
    recipe = "<recipe: defaults " + (nemo or "<NEMO_RL_DIR>") + f"/examples/configs/{base} + {bundle / CONFIG_FILE}>"
    bundle_keys = {k: [str(v)] for k, v in own.items()}
    changed = overrides(bundle_keys, job_args, "job", hydra_keys) + overrides(bundle_keys, extra, "command line",
                                                                            hydra_keys)
    for o in changed:
        o["field"] = contract_field(o["flag"])
    command = ["uv", "run", "python", tab["entry"], "--config", recipe, *job_args, *extra]
    document = {"command": command, "env": runtime_env, "cwd": nemo, "launch": str(bundle / LAUNCH),
                "base_config": base, "config": str(bundle / CONFIG_FILE), "job": str(job) if job else None,
                "job_args": job_args, "extra_args": extra, "overrides": changed}
    comments = ["# environment (policy.megatron_cfg.env_vars: the Megatron policy's workers)"]
    comments += [f"{k}={shell_word(v)}" for k, v in runtime_env.items()]
    comments += _job_comments(job, NEMO_JOB_VARIABLE, changed)
    comments.append(f"# NeMo RL {tab['version']} from NEMO_RL_DIR={shown(nemo or '<NEMO_RL_DIR>', shlex.quote)}, "
                    f"as {LAUNCH} runs it; the job's overrides follow the recipe")
    return Launch(command, bundle / LAUNCH, env, document, comments, lambda: nemo_rl_missing(env))


def nemo_rl_missing(env: dict[str, str]) -> list[str]:
    """What nemo_rl/launch.sh cannot start without, each with how to get it."""
    from pcc.lower.nemo_rl import JOB_VARIABLE as NEMO_JOB_VARIABLE, tables

    out = _job_missing(env, NEMO_JOB_VARIABLE, "Hydra overrides, one per line")
    nemo = env.get("NEMO_RL_DIR")
    if not nemo:
        out.append(f"NEMO_RL_DIR is not set: clone NVIDIA-NeMo/RL (tag v{tables()['version']}) and set it")
    elif not (Path(nemo) / tables()["entry"]).is_file():
        out.append(f"NEMO_RL_DIR={nemo} has no {tables()['entry']}: clone NVIDIA-NeMo/RL there")
    if shutil.which("uv", path=env.get("PATH")) is None:
        out.append("uv is not on PATH (NeMo RL runs through uv): pip install uv")
    return out


def _only_listed(bundle: Path, framework: str, name: str, listed: set[str]) -> None:
    """A launch runs only what the manifest lists: a FRAMEWORK/ folder added to a bundle after compile (verl/
    beside a Miles bundle's miles/), or a file dropped into one, is refused (PCC706), never run."""
    found = sorted(p.relative_to(bundle).as_posix() for p in (bundle / framework).rglob("*")
                   if p.is_symlink() or not p.is_dir())
    extra = [p for p in found if p not in listed]
    if not extra:
        return
    why = (f"the bundle has no {name} target (its contract does not name 'framework {framework}')"
           if f"{framework}/launch.sh" in extra else "remove them or recompile")
    raise PccError(f"{bundle}: {', '.join(extra[:3])}{', ...' if len(extra) > 3 else ''}: not in its manifest "
                   f"(added after compile), and a launch runs only what pcc compiled; {why}", code="PCC706")


LAUNCHERS = {"miles": miles_launch, "verl": verl_launch, "nemo_rl": nemo_rl_launch}  # (pcc.bundle.FRAMEWORKS' keys)


def run_launch(framework: str, source: str, dry_run: bool, as_json: bool, extra: list[str] | None = None) -> int:
    """`pcc run SOURCE --target FRAMEWORK`: print the launch (dry run, as JSON or text), or say what is
    missing, or run the bundle's FRAMEWORK/launch.sh with `extra` after its own arguments."""
    import json

    from pcc.bundle import FRAMEWORKS, BundleError

    name, build = FRAMEWORKS[framework], LAUNCHERS[framework]
    extra = list(extra or [])
    try:
        bundle, tmp, listed = _bundle_dir(source)
    except BundleError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    try:
        if not (bundle / framework / "launch.sh").is_file():
            raise PccError(f"{source}: the contract does not run on {name} (write 'framework {framework}' in it)",
                           code="PCC706")
        _only_listed(bundle, framework, name, listed)
        launch = build(source, bundle, extra)
        if dry_run:
            if as_json:
                print(json.dumps(launch.document, indent=1))
            else:
                print("\n".join(launch.comments))
                print(" ".join(map(shell_word, launch.command)))
            return 0
        problems = launch.missing()
        if problems:
            print(f"error: cannot launch on {name}:", file=sys.stderr)
            for p in problems:
                print(f"  - {p}", file=sys.stderr)
            return 1
        return subprocess.call(["bash", str(launch.script), *extra], env=launch.env)
    finally:
        if tmp is not None:
            tmp.cleanup()
