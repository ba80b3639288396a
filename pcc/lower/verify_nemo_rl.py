"""Check a NeMo RL job (pcc.lower.nemo_rl's recipe) with NeMo RL's own config loading.

NeMo RL has no wheel pcc can install (`nemo-rl` on PyPI is a placeholder) and its config classes
import torch, Ray and vLLM, so its side folder (requirements/install-engines.sh) holds the pinned
tag's config loader (nemo_rl/utils/config.py: load_config with `defaults:` inheritance,
parse_hydra_overrides, its OmegaConf resolvers) and example recipes; Hydra and OmegaConf come from
verl's side folder. The child writes the recipe as launch.sh does (`defaults:` the pinned base
recipe, then config.yaml), loads it with NeMo RL's load_config, applies the job's overrides with its
parse_hydra_overrides (struct mode: an unknown key fails), resolves the interpolations as
examples/run_grpo.py does and answers the resolved config. Which keys exist is checked against
targets/nemo_rl_keys.json (the recipes' keys and the config TypedDicts' fields) by the tests.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from pcc.lower.engine_errors import EngineMissing, VerifyError  # noqa: F401 - both part of this module's API
from pcc.lower.side_folder import folder, run_child

DIR_ENV = "PCC_NEMO_RL_DIR"  # folder holding nemo_rl/utils/config.py and examples/configs
HINT = "install with requirements/install-engines.sh (NeMo RL's config loader at the pinned tag)"


def engine_dir() -> Path:
    return folder(DIR_ENV, "nemo_rl")


def verify_nemo_rl_job(base: str, recipe: str, overrides: list[str] = ()) -> dict:
    """The resolved config NeMo RL builds from `recipe` (config.yaml's text) over examples/configs/`base`."""
    from pcc.lower.verify_verl import engine_dir as verl_dir

    out = run_child("pcc.lower.verify_nemo_rl", engine_dir(), ("nemo_rl",),
                    {"base": base, "recipe": recipe, "overrides": list(overrides), "hydra": str(verl_dir())},
                    "NeMo RL's config loading", HINT)
    if "error" in out:
        raise VerifyError(out["error"])
    return out


def _child(request: dict) -> dict:
    import importlib.util
    import tempfile

    from pcc.lang.outputs import write_atomic

    sys.path.append(request["hydra"])  # hydra-core and omegaconf, from verl's side folder
    where = Path(request["dir"])
    spec = importlib.util.spec_from_file_location("nemo_rl_config", where / "nemo_rl" / "utils" / "config.py")
    config = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(config)  # not nemo_rl/__init__.py: that wants Megatron-LM beside it
    from omegaconf import OmegaConf

    base = where / "examples" / "configs" / request["base"]
    with tempfile.TemporaryDirectory() as tmp:
        recipe = Path(tmp) / "recipe.yaml"
        write_atomic(recipe, f"defaults: '{base}'\n" + request["recipe"])
        try:
            config.register_omegaconf_resolvers()
            cfg = config.load_config(recipe)
            if request["overrides"]:
                cfg = config.parse_hydra_overrides(cfg, request["overrides"])
            return {"config": OmegaConf.to_container(cfg, resolve=True)}
        except Exception as exc:  # noqa: BLE001 - the engine's own error, reported as the check's result
            return {"error": f"{type(exc).__name__}: {exc}"}


if __name__ == "__main__":
    result = _child(json.loads(sys.stdin.read()))
    sys.stdout.write("\n" + json.dumps(result, default=str) + "\n")
