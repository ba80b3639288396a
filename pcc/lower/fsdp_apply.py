"""Apply a bundle's trainer/fsdp.json to the user's model: the one implementation of the library
calls the file describes (docs/lower-fsdp.md "Using the bundle in your trainer").

    from pcc.lower.fsdp_apply import apply
    run = apply(model, "job/trainer/fsdp.json")   # model: transformers, FP32, from $PCC_REF_LOAD
    fully_shard(block, **run.shard) ...; optimizer = run.optimizer(trainable, lr=...)

The model's nn.Linear modules must be exactly the ones the file names (PCC715 names a missing or
an extra one), since the file is the plan's modules by name and a model of another layout would
quietly train other modules in other precisions. pcc.lower.verify_fsdp runs this same function on
a meta-device model. torch, torchao and PEFT are imported when `apply` is called, never by `pcc check`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pcc.lang.diagnostics import PccError
from pcc.lang.inputs import read_json

SHOWN = 5  # module names a mismatch lists


class ModelMismatch(PccError):
    """The model is not the one the file was lowered for (its modules, or its parameter dtype)."""

    code = "PCC715"


@dataclass
class Applied:
    """What the trainer needs after `apply`: the converted model (changed in place), fully_shard's
    keyword arguments, the optimizer class, and the configs as built (the file's low_precision
    order, then LoraConfig)."""

    model: Any
    shard: dict[str, Any]
    optimizer: type
    configs: list[Any] = field(default_factory=list)


def load(path: str | Path) -> dict:
    """trainer/fsdp.json, through pcc's bounded reader (InputError, PCC109, naming the file)."""
    return read_json(path, what="trainer/fsdp.json")


def _named(doc: dict) -> list[str]:
    return doc["keep_wide"] + [m for g in doc["low_precision"] for m in g["modules"]]


def check_modules(model, doc: dict) -> None:
    """PCC715 unless the model's nn.Linear modules are exactly the file's (keep_wide and every group)."""
    from torch import nn

    linear = {n for n, m in model.named_modules() if isinstance(m, nn.Linear)}
    named = set(_named(doc))
    missing, extra = sorted(named - linear), sorted(linear - named)
    if missing or extra:
        parts = [f"{len(missing)} module(s) the file names are not nn.Linear modules of the model "
                 f"({', '.join(missing[:SHOWN])})"] if missing else []
        parts += [f"{len(extra)} nn.Linear module(s) of the model the file does not name "
                  f"({', '.join(extra[:SHOWN])})"] if extra else []
        raise ModelMismatch(f"the model does not match trainer/fsdp.json: {'; '.join(parts)}",
                            hint="build the model the contract was compiled for (the checkpoint at $PCC_REF_LOAD, "
                                 "with transformers' per-module layout), before any other conversion")


def _float8(cfg: dict):
    import torch
    from torchao.float8 import Float8LinearConfig
    from torchao.float8.config import CastConfig, Float8GemmConfig, ScalingGranularity, ScalingType

    casts = {k: CastConfig(scaling_type=ScalingType(v["scaling_type"]),
                           scaling_granularity=ScalingGranularity(v["scaling_granularity"]),
                           target_dtype=getattr(torch, v["target_dtype"])) for k, v in cfg["casts"].items()}
    gemms = {k: Float8GemmConfig(**cfg[k]) for k in ("gemm_config_output", "gemm_config_grad_input",
                                                      "gemm_config_grad_weight")}
    return Float8LinearConfig(**casts, **gemms, emulate=cfg["emulate"],
                              round_scales_to_power_of_2=cfg["round_scales_to_power_of_2"],
                              enable_fsdp_float8_all_gather=cfg["enable_fsdp_float8_all_gather"])


def build(kind: str, cfg: dict):
    """The torchao config object of one low_precision group."""
    import torch

    if kind == "float8":
        return _float8(cfg)
    if kind == "mxfp8":
        from torchao.prototype.moe_training.config import MXFP8TrainingOpConfig
        from torchao.prototype.mx_formats.config import ScaleCalculationMode
        from torchao.quantization.quantize_.common import KernelPreference

        return MXFP8TrainingOpConfig(kernel_preference=KernelPreference(cfg["kernel_preference"]),
                                     out_dtype=getattr(torch, cfg["out_dtype"]), wgrad_with_hp=cfg["wgrad_with_hp"],
                                     scale_calculation_mode=ScaleCalculationMode(cfg["scale_calculation_mode"]),
                                     pad_token_groups_for_grouped_mm=cfg["pad_token_groups_for_grouped_mm"])
    if kind == "blockwise":
        from torchao.prototype.blockwise_fp8_training.linear import Float8BlockwiseLinearConfig

        return Float8BlockwiseLinearConfig(**cfg)
    from torchao.quantization.qat import IntxFakeQuantizeConfig, QATConfig

    return QATConfig(weight_config=IntxFakeQuantizeConfig(getattr(torch, cfg["dtype"]), group_size=cfg["group_size"],
                                                          is_symmetric=cfg["is_symmetric"]), step="prepare")


def apply(model, fsdp_json: str | Path | dict, skip: frozenset[str] = frozenset()) -> Applied:
    """Apply trainer/fsdp.json (a path or the parsed file) to `model` in place, in the file's order:
    each low_precision group with its modules as the filter (convert_to_float8_training for float8,
    quantize_ for mxfp8, blockwise and int4_qat), then PEFT's LoRA. Group kinds in `skip` are built
    but not applied (verify_fsdp: blockwise modules are built on an SM90+ GPU only).
    The model's parameters must be in the file's sharded_param_dtype (FSDP2 shards them as the
    master copy and casts to mp_policy for compute)."""
    import torch
    from torch import nn
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy

    doc = fsdp_json if isinstance(fsdp_json, dict) else load(fsdp_json)
    check_modules(model, doc)
    master = getattr(torch, doc["sharded_param_dtype"])
    other = next(((n, p.dtype) for n, p in model.named_parameters() if p.is_floating_point() and p.dtype != master),
                 None)
    if other:
        raise ModelMismatch(f"parameter {other[0]} is {other[1]}: trainer/fsdp.json shards the parameters in "
                            f"{doc['sharded_param_dtype']} (the master copy)",
                            hint=f"load the model with dtype=torch.{doc['sharded_param_dtype']}")
    mp = doc["mp_policy"]
    shard: dict[str, Any] = {"mp_policy": MixedPrecisionPolicy(param_dtype=getattr(torch, mp["param_dtype"]),
                                                               reduce_dtype=getattr(torch, mp["reduce_dtype"]))}
    if doc["cpu_offload"]:
        shard["offload_policy"] = CPUOffloadPolicy()
    optimizer = getattr(torch.optim, doc["optimizer"].removeprefix("torch.optim."))
    configs = []
    for g in doc["low_precision"]:
        cfg, names = build(g["kind"], g["config"]), frozenset(g["modules"])
        configs.append(cfg)
        if g["kind"] in skip:
            continue
        if g["kind"] == "float8":
            from torchao.float8 import convert_to_float8_training

            convert_to_float8_training(model, module_filter_fn=lambda m, fqn, names=names: fqn in names, config=cfg)
        else:
            from torchao.quantization import quantize_

            quantize_(model, cfg, filter_fn=lambda m, fqn, names=names: fqn in names and isinstance(m, nn.Linear))
    if doc["lora"]:
        import peft

        lc = peft.LoraConfig(**doc["lora"])
        configs.append(lc)
        peft.inject_adapter_in_model(lc, model)
    return Applied(model, shard, optimizer, configs)
