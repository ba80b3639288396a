"""targets/nemo_rl_keys.json: the keys NeMo RL's pinned recipes and config classes have.

    python tools/nemo_rl_keys.py GIT_DIR   # a clone (or mirror) of NVIDIA-NeMo/RL holding the pinned commit

For each base recipe of targets/nemo_rl.yaml (examples/configs/X.yaml, `defaults:` inheritance
merged as NeMo RL's load_config merges it), every leaf key with its value as written; and the
fields of the config TypedDicts pcc writes under (nemo_rl/models/policy/__init__.py,
nemo_rl/models/generation/vllm/config.py, and the logger's, nemo_rl/utils/logger.py), read with ast (importing them needs torch and ray).
tests/lower/test_lower_nemo_rl.py checks every key a bundle writes against this table.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def show(git: str, commit: str, path: str) -> str:
    return subprocess.run(["git", "--git-dir", git, "show", f"{commit}:{path}"], check=True,
                          capture_output=True, text=True).stdout


def merge(base: dict, over: dict) -> dict:
    out = dict(base)
    for k, v in over.items():
        out[k] = merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def load(git: str, commit: str, path: str) -> dict:
    doc = yaml.safe_load(show(git, commit, path)) or {}
    parents = doc.pop("defaults", None)
    if parents is None:
        return doc
    base: dict = {}
    for p in [parents] if isinstance(parents, str) else parents:
        base = merge(base, load(git, commit, str(Path(path).parent / p)))
    return merge(base, doc)


def flatten(tree: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in tree.items():
        if isinstance(v, dict) and v:
            out.update(flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def typed_fields(source: str) -> dict[str, list[str]]:
    out = {}
    for node in ast.parse(source).body:
        if isinstance(node, ast.ClassDef):
            out[node.name] = sorted(s.target.id for s in node.body
                                    if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name))
    return out


def main(git: str) -> None:
    tab = yaml.safe_load((ROOT / "targets" / "nemo_rl.yaml").read_text())
    commit = tab["commit"]
    doc = {"version": tab["version"], "commit": commit, "recipes": {}, "classes": {}}
    for base in sorted(set(tab["base_config"].values())):
        doc["recipes"][base] = flatten(load(git, commit, f"examples/configs/{base}"))
    for path in ("nemo_rl/models/policy/__init__.py", "nemo_rl/models/generation/vllm/config.py",
                 "nemo_rl/utils/logger.py"):
        doc["classes"].update(typed_fields(show(git, commit, path)))
    (ROOT / "targets" / "nemo_rl_keys.json").write_text(json.dumps(doc, indent=1, sort_keys=True, default=str) + "\n")


if __name__ == "__main__":
    main(sys.argv[1])
