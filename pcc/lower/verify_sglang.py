"""Check SGLang arguments with SGLang's own ServerArgs parser, and a checkpoint's
quantization_config with SGLang's own quantization config classes.

Install: requirements/sglang.txt (sglang without its dependencies plus what
`sglang.srt.server_args` imports; about 1.8 GB with torch). What is checked here, on a CPU:
the argparse layer (flag names, types, choices: e.g. `--quantization`, `--kv-cache-dtype`,
`--lora-target-modules`) and `ServerArgs.from_cli_args`. What is not: `check_server_args()`
and the model-loading checks need a CUDA torch, a model config and a GPU (`--quantization`
values are checked against the runtime registry only at model load; nvfp4/mxfp8 KV caches
check the GPU generation there). The quantization config classes import
`sglang.srt.layers.*`, which imports torchvision; the only torchvision wheels the package
index here offers are CUDA builds that fail to load against the CPU torch, so on a CPU
machine `verify_quantization_config` raises CannotCheck: "cannot check here", never "valid".
"""

from __future__ import annotations

import argparse
import functools
import importlib
import tempfile

from pcc.lang.diagnostics import PccError
from pcc.lower.engine_errors import EngineMissing, VerifyError

HINT = "install with the lines in requirements/sglang.txt"
# quant_method -> (module under sglang.srt.layers.quantization, class) SGLang builds from it.
QUANT_CLASSES = {
    "fp8": ("fp8", "Fp8Config"),
    "mxfp8": ("fp8", "Fp8Config"),
    "mxfp4": ("mxfp4", "Mxfp4Config"),
    "modelopt": ("modelopt_quant", "ModelOptFp4Config"),
    "compressed-tensors": ("compressed_tensors.compressed_tensors", "CompressedTensorsConfig"),
}


class CannotCheck(PccError, RuntimeError):
    """SGLang has the check, but it cannot run on this machine (the message says why)."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # argparse would print usage and exit
        raise VerifyError(message)


@functools.lru_cache(maxsize=1)
def _server_args():
    try:
        from sglang.srt.server_args import ServerArgs
    except ImportError as exc:
        raise EngineMissing(f"SGLang's ServerArgs is not importable ({exc}); {HINT}") from exc
    parser = _Parser(prog="sglang.launch_server")
    ServerArgs.add_cli_args(parser)
    return ServerArgs, parser


def verify_sglang_args(args: list[str]):
    """Parse `args` (no --model-path: paths reach the server from the environment) as
    `python -m sglang.launch_server` would, and build its ServerArgs."""
    ServerArgs, parser = _server_args()
    with tempfile.TemporaryDirectory(prefix="pcc-sglang-model-") as model:
        ns = parser.parse_args(["--model-path", model] + list(args))
        try:
            return ServerArgs.from_cli_args(ns)
        except (ValueError, TypeError, AssertionError) as exc:
            raise VerifyError(f"ServerArgs.from_cli_args: {exc}") from exc


def quant_config_class(quant_method: str):
    """SGLang's config class for `quant_method`; CannotCheck where it cannot be imported here."""
    if quant_method not in QUANT_CLASSES:
        raise VerifyError(f"pcc knows no SGLang config class for quant_method {quant_method!r} "
                          f"(known: {', '.join(QUANT_CLASSES)})")
    _server_args()  # EngineMissing first: without sglang nothing can be checked
    module, name = QUANT_CLASSES[quant_method]
    try:
        mod = importlib.import_module(f"sglang.srt.layers.quantization.{module}")
    except (ImportError, RuntimeError, OSError) as exc:  # e.g. a CUDA torchvision under a CPU torch
        raise CannotCheck(f"{name} cannot be imported on this machine ({type(exc).__name__}: "
                          f"{str(exc).splitlines()[0] if str(exc) else ''}); it needs SGLang's full "
                          "dependencies with a matching torch/torchvision") from exc
    return getattr(mod, name)


def verify_quantization_config(cfg: dict):
    """Build SGLang's own quantization config object from a checkpoint's quantization_config."""
    cls = quant_config_class(str(cfg.get("quant_method", "")))
    try:
        return cls.from_config(dict(cfg))
    except (ValueError, KeyError, TypeError, AssertionError) as exc:
        raise VerifyError(f"{cls.__name__}.from_config: {exc}") from exc
