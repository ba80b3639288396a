"""`pcc run --target miles`: launch a bundle on Miles (Megatron + SGLang over Ray).

pcc never reimplements Miles: it checks that what the launch needs is present, says
exactly what is missing and how to get it, and runs the bundle's miles/launch.sh.
`--dry-run` prints the command and environment instead.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from pcc.lower import PATH_VARIABLES

NEEDED = {
    "PCC_ROLLOUT_CHECKPOINT": "build it with: pcc convert BUNDLE --from <bf16 checkpoint> --to <dir>",
    "PCC_REF_LOAD": "the BF16 trainer weights (Megatron checkpoint or HF directory)",
    "MILES_DIR": "a Miles checkout (the directory holding train.py)",
}


def _bundle_dir(source: str) -> tuple[Path, tempfile.TemporaryDirectory | None]:
    """The bundle to launch: `source` itself, or a fresh compile of a contract file."""
    from pcc.bundle import BundleError, is_bundle, read_bundle, write_bundle
    from pcc.lower import compile_file

    if is_bundle(source):
        read_bundle(source)
        return Path(source), None
    c = compile_file(source)
    if not c.ok:
        for d in c.diagnostics:
            print(d.render(c.sources), file=sys.stderr)
        raise BundleError(f"{source}: the contract has errors")
    tmp = tempfile.TemporaryDirectory(prefix="pcc-bundle-")
    out = Path(tmp.name) / "bundle"
    write_bundle(c.plan, out)
    return out, tmp


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
    return out


def run_miles(source: str, dry_run: bool, as_json: bool) -> int:
    import json

    from pcc.bundle import BundleError

    try:
        bundle, tmp = _bundle_dir(source)
    except BundleError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    try:
        launch = bundle / "miles" / "launch.sh"
        runtime_env = json.loads((bundle / "miles" / "runtime-env.json").read_text())["env_vars"]
        args = [str(bundle / a) if (bundle / a).is_file() else a
                for a in (bundle / "miles" / "args.txt").read_text().split("\n")[:-1]]
        paths = {v: os.environ.get(v, f"<{v}>") for v in ("PCC_ROLLOUT_CHECKPOINT", "PCC_REF_LOAD")}
        command = (["ray", "job", "submit", "--address", os.environ.get("RAY_ADDRESS", "http://127.0.0.1:8265"),
                    "--runtime-env-json", json.dumps({"env_vars": runtime_env}, sort_keys=True), "--", "python3"]
                   + args + ["--hf-checkpoint", paths["PCC_ROLLOUT_CHECKPOINT"],
                             "--ref-load", paths["PCC_REF_LOAD"]])
        if dry_run:
            if as_json:
                print(json.dumps({"command": command, "env": runtime_env, "cwd": os.environ.get("MILES_DIR"),
                                  "launch": str(launch), "paths": {k: PATH_VARIABLES[k] for k in paths}}, indent=1))
            else:
                print("# environment (sent to Ray as the job's runtime env)")
                for k, v in runtime_env.items():
                    print(f"{k}={shlex.quote(v)}")
                print(f"# from MILES_DIR={shlex.quote(os.environ.get('MILES_DIR', '<MILES_DIR>'))}")
                print(shlex.join(command))
            return 0
        problems = missing(dict(os.environ))
        if problems:
            print("error: cannot launch on Miles:", file=sys.stderr)
            for p in problems:
                print(f"  - {p}", file=sys.stderr)
            return 1
        return subprocess.call(["bash", str(launch)])
    finally:
        if tmp is not None:
            tmp.cleanup()
