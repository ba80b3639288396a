"""What verl's job keys are checked against beside verl's engine table (pcc.lower.engine_table,
targets/verl_keys.json): megatron-core's TransformerConfig fields (verl builds a TransformerConfig from
actor.megatron.override_transformer_config), read from its source rather than imported (importing
megatron.core imports torch and takes seconds; the test holds the two equal). `hydra_parse`
answers Hydra's own reading of override strings (the test holds verl_source's parser to it).
"""

from __future__ import annotations

import ast
import functools
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path



@functools.lru_cache(maxsize=1)
def transformer_fields() -> frozenset[str]:
    """The dataclass fields of megatron-core's TransformerConfig and its base ModelParallelConfig,
    from their source files (empty when megatron-core is not installed)."""
    spec = importlib.util.find_spec("megatron")
    if spec is None or not spec.submodule_search_locations:
        return frozenset()
    core = Path(next(iter(spec.submodule_search_locations))) / "core"
    fields: set[str] = set()
    for file, cls in (("transformer/transformer_config.py", "TransformerConfig"),
                      ("model_parallel_config.py", "ModelParallelConfig")):
        try:
            tree = ast.parse((core / file).read_text(encoding="utf-8"))
        except (OSError, SyntaxError, UnicodeDecodeError):
            return frozenset()
        node = next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls), None)
        if node is None:
            return frozenset()
        fields |= {n.target.id for n in node.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)
                   and not (isinstance(n.annotation, ast.Name) and n.annotation.id == "ClassVar")}
    return frozenset(fields)


def hydra_parse(overrides: list[str]) -> list[dict]:
    """Hydra's OverridesParser on each string: {"key", "type", "value"} or {"error"}."""
    return _ask({"overrides": overrides})["parsed"]


def _ask(request: dict) -> dict:
    from pcc.lower.engine_errors import EngineMissing
    from pcc.lower.verify_verl import engine_dir

    where = engine_dir()
    if not (where / "verl" / "__init__.py").is_file():
        raise EngineMissing(f"verl is not installed in {where}")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    try:
        proc = subprocess.run([sys.executable, "-m", "pcc.importer.verl_config"],
                              input=json.dumps({**request, "dir": str(where)}), capture_output=True, text=True,
                              timeout=600, env=env)
        lines = proc.stdout.strip().splitlines()
        if proc.returncode != 0 or not lines:
            raise EngineMissing(f"Hydra's parser did not run (exit {proc.returncode}): "
                                f"{proc.stderr.strip()[-1000:]}")
        return json.loads(lines[-1])
    except (OSError, subprocess.TimeoutExpired, ValueError) as exc:
        raise EngineMissing(f"Hydra's parser did not run: {exc}") from None


def _child(request: dict) -> dict:
    sys.path.append(request["dir"])
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parser, out = OverridesParser.create(), []
    for text in request["overrides"]:
        try:
            o = parser.parse_override(text)
            out.append({"key": o.key_or_group, "type": o.type.name, "value": o.value()})
        except Exception as exc:  # Hydra's own verdict on the string, reported to the caller
            out.append({"error": f"{type(exc).__name__}: {exc}"})
    return {"parsed": out}


if __name__ == "__main__":
    result = _child(json.loads(sys.stdin.read()))
    sys.stdout.write("\n" + json.dumps(result, default=str) + "\n")
