"""Check Megatron arguments with megatron-core's own parser, validation and config classes,
and build the Transformer Engine recipe object they select from TE's recipe module.

Install: requirements/megatron.txt. megatron-core 0.19.2 is the oldest wheel that ships
megatron/training/arguments.py (0.16.1, the newest for Python 3.11, ships megatron/core
only); its sources run on 3.11 except one `typing.override` import, which is backported
here from typing_extensions. `megatron/training/__init__.py` pulls in the whole training
loop, so the package is entered without it (its get_* re-exports are set from
global_vars, as that __init__ does). TE's recipe module is loaded by file path from a
side directory: the CPU-only `transformer-engine` wheel makes `import transformer_engine`
raise, which would break megatron's own optional-TE imports.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import io
import math
import os
import sys
import types
from pathlib import Path

from pcc.lower.engine_errors import EngineMissing, VerifyError
from pcc.lower.engine_support import targeted

TE_VERSION = targeted("transformer_engine")  # targets/engines.yaml; requirements/megatron.txt installs it
TE_DIR_ENV = "PCC_TE_DIR"  # folder holding transformer_engine/ (pip --target); default below
HINT = "install with the lines in requirements/megatron.txt"


def te_dir() -> Path:
    return Path(os.environ.get(TE_DIR_ENV) or Path(sys.prefix) / "engines" / "transformer-engine")


def _arguments():
    """megatron.training.arguments, imported without megatron/training/__init__.py."""
    if "megatron.training.arguments" in sys.modules:
        return sys.modules["megatron.training.arguments"]
    import typing

    try:
        import typing_extensions
        import megatron
    except ImportError as exc:
        raise EngineMissing(f"megatron-core is not installed ({exc}); {HINT}") from exc
    if not hasattr(typing, "override"):
        typing.override = typing_extensions.override
    pkg = Path(megatron.__path__[0]) / "training"
    if not (pkg / "arguments.py").is_file():
        raise EngineMissing(f"{pkg} has no arguments.py (megatron-core < 0.17 ships megatron/core only); {HINT}")
    if "megatron.training" not in sys.modules:
        mod = types.ModuleType("megatron.training")
        mod.__path__ = [str(pkg)]
        sys.modules["megatron.training"] = mod
        from megatron.training import global_vars

        for name in dir(global_vars):
            if name.startswith("get_"):
                setattr(mod, name, getattr(global_vars, name))
    import megatron.core.utils as mcu
    from packaging.version import Version

    mcu._te_version = Version(TE_VERSION)  # the TE whose recipe module te_recipe() loads
    from megatron.training import arguments

    return arguments


# What a job sets and the architecture does not (Miles takes them from the job: --seq-length, and
# --max-position-embeddings from it; one micro-batch).
JOB_STAND_INS = ["--seq-length", "4096", "--max-position-embeddings", "4096", "--micro-batch-size", "1"]


def model_args(plan) -> list[str]:
    """The architecture flags to verify the trainer's precision flags with: the ones pcc generates for
    the Miles launch (pcc.lower.miles_arch.model_args, the bundle's miles/model_args.txt), as
    megatron-core here can check them (`checkable`), plus JOB_STAND_INS. Where none can be generated
    (the Miles target reports PCC613), stand-in dimensions from the catalog, so the precision flags are
    still checked."""
    from pcc.lower.miles_arch import ArchGap, model_args as generated, tables

    try:
        arch = generated(plan)
    except ArchGap:
        cfg, cat = plan.catalog.config, plan.catalog
        out = ["--num-layers", str(cat.num_layers), "--hidden-size", str(cfg.get("hidden_size", 256)),
               "--num-attention-heads", str(cfg.get("num_attention_heads", 8))]
        if cat.is_moe:
            out += ["--num-experts", str(cat.num_experts), "--disable-bias-linear"]
        return out + JOB_STAND_INS
    return checkable(arch, tables()["megatron_fork_flags"]) + JOB_STAND_INS


def checkable(args: list[str], fork_flags: list[str]) -> list[str]:
    """Architecture flags as megatron-core's parser here can check them. Three changes, each for a check
    that tests a GPU library rather than the arguments: value flags only Miles' Megatron fork has
    (`fork_flags`, one value each; tests/lower/test_engine_flags.py checks them against the fork's
    parser) are dropped; --moe-permute-fusion is dropped (TransformerConfig asks for Transformer
    Engine's fused permutation kernels); and outside MLA RoPE fusion is turned off (TransformerConfig
    asks for TE's fused RoPE kernel; under MLA the setting is checked as it stands, since fusion
    there needs YaRN whatever is installed)."""
    fork, out, skip = set(fork_flags), [], False
    for a in args:
        if skip:
            skip = False
        elif a in fork:
            skip = True
        elif a != "--moe-permute-fusion":
            out.append(a)
    if "--multi-latent-attention" not in out and "--no-rope-fusion" not in out:
        out.append("--no-rope-fusion")
    return out


def world_size(args: argparse.Namespace) -> int:
    """Smallest world that holds the layout: TP x PP model replicas and EP x ETP x PP expert replicas."""
    tp, pp, ep = args.tensor_model_parallel_size, args.pipeline_model_parallel_size, args.expert_model_parallel_size
    etp = args.expert_tensor_parallel_size or tp
    return math.lcm(tp * pp * args.context_parallel_size, ep * etp * pp)


def device_arch(plan) -> int:
    """CUDA compute-capability major of the trainer's hardware (validate_args asks the GPU); 9 (Hopper)
    for hardware without one (the embedded CPU runtime)."""
    from pcc.lower.megatron import _arch

    return _arch(plan) or 9


def verify_megatron_args(args: list[str], model: list[str] | None = None, arch: int = 9,
                         env: dict[str, str] | None = None) -> argparse.Namespace:
    """Parse `args` (plus architecture `model` flags) with Megatron's parser, run validate_args for a
    GPU of compute capability `arch` (asked of the GPU in Megatron; declared here, no GPU needed) and
    build TransformerConfig (+ the precision file's recipe) and OptimizerConfig, with the trainer
    environment `env` applied (validate_args reads some variables)."""
    arguments = _arguments()
    parser = arguments.add_megatron_arguments(argparse.ArgumentParser(prog="megatron", allow_abbrev=False))
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            ns = parser.parse_args(list(model or []) + list(args))
    except SystemExit as exc:
        raise VerifyError(f"megatron argument parser: {err.getvalue().strip().splitlines()[-1]}") from exc
    ns.rank, ns.world_size = 0, world_size(ns)
    saved_env = dict(os.environ)
    import torch

    det, ask_gpu = torch.are_deterministic_algorithms_enabled(), arguments.get_device_arch_version
    capability = torch.cuda.get_device_capability
    arguments.get_device_arch_version = lambda: arch
    torch.cuda.get_device_capability = lambda *a: (arch, 0)  # asked for --moe-grouped-gemm
    os.environ.update(env or {})
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            arguments.validate_args(ns)
            config = arguments.core_transformer_config_from_args(ns)
        _optimizer_config(ns)
    except (AssertionError, ValueError, TypeError, FileNotFoundError) as exc:
        raise VerifyError(f"megatron validation: {exc}") from exc
    finally:  # --deterministic-mode edits os.environ and torch's global flag
        os.environ.clear()
        os.environ.update(saved_env)
        torch.use_deterministic_algorithms(det)
        arguments.get_device_arch_version = ask_gpu
        torch.cuda.get_device_capability = capability
    ns.transformer_config = config
    return ns


def _optimizer_config(ns: argparse.Namespace):
    from megatron.core.optimizer import OptimizerConfig

    return OptimizerConfig(
        optimizer=ns.optimizer, lr=ns.lr or 1e-6, bf16=ns.bf16, fp16=ns.fp16, params_dtype=ns.params_dtype,
        use_distributed_optimizer=ns.use_distributed_optimizer,
        use_precision_aware_optimizer=ns.use_precision_aware_optimizer,
        optimizer_cpu_offload=ns.optimizer_cpu_offload, main_grads_dtype=ns.main_grads_dtype,
        main_params_dtype=ns.main_params_dtype, exp_avg_dtype=ns.exp_avg_dtype,
        exp_avg_sq_dtype=ns.exp_avg_sq_dtype)


def precision_config_params(path: str, module_path: str):
    """The TEQuantizationParams Megatron gives `module_path` under the precision file (None: no match)."""
    from megatron.core.extensions.transformer_engine import TEQuantizationParams
    from megatron.core.quantization.utils import get_quant_config_or_none, load_quantization_recipe

    qc = get_quant_config_or_none(module_path, load_quantization_recipe(path))
    return None if qc is None else TEQuantizationParams.parse_from_config(qc)


def recipe_module(env: dict[str, str] | None = None):
    """TE's transformer_engine/common/recipe/__init__.py, loaded fresh with `env` applied (TE reads
    its NVTE_* defaults when the module is imported)."""
    path = te_dir() / "transformer_engine" / "common" / "recipe" / "__init__.py"
    if not path.is_file():
        raise EngineMissing(f"Transformer Engine recipe module not found at {path}; {HINT}")
    saved = dict(os.environ)
    os.environ.update(env or {})
    try:
        spec = importlib.util.spec_from_file_location("pcc_te_recipe", path)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = mod  # dataclasses look their module up while the class is built
        spec.loader.exec_module(mod)
    finally:
        os.environ.clear()
        os.environ.update(saved)
    return mod


def te_recipe(args: list[str] | argparse.Namespace, env: dict[str, str] | None = None):
    """The TE recipe object the flags select (as megatron.core.fp8_utils / fp4_utils build it), or None
    for BF16. `env` is the trainer environment (e.g. Lowered.env)."""
    ns = args if isinstance(args, argparse.Namespace) else verify_megatron_args(args, env=env)
    cfg, r = ns.transformer_config, recipe_module(env)
    if cfg.fp4:
        return r.NVFP4BlockScaling(fp8_dpa=cfg.fp8_dot_product_attention)
    if not cfg.fp8:
        return None
    fmt = {"e4m3": r.Format.E4M3, "hybrid": r.Format.HYBRID}[cfg.fp8]
    recipe = str(getattr(cfg.fp8_recipe, "value", cfg.fp8_recipe))
    if recipe == "delayed":
        return r.DelayedScaling(margin=cfg.fp8_margin, fp8_format=fmt, amax_history_len=cfg.fp8_amax_history_len,
                                amax_compute_algo=cfg.fp8_amax_compute_algo,
                                override_linear_precision=(False, False, not cfg.fp8_wgrad))
    cls = {"tensorwise": r.Float8CurrentScaling, "blockwise": r.Float8BlockScaling, "mxfp8": r.MXFP8BlockScaling}
    if recipe not in cls:
        raise VerifyError(f"no TE recipe for --fp8-recipe {recipe}")
    extra = {} if recipe == "blockwise" else {"fp8_dpa": cfg.fp8_dot_product_attention}
    return cls[recipe](fp8_format=fmt, **extra)
