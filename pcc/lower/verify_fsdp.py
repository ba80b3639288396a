"""Check the fsdp target's trainer/fsdp.json with the libraries' own classes: torch's
MixedPrecisionPolicy, torchao's Float8LinearConfig (against from_recipe_name where it names a
recipe), MXFP8TrainingOpConfig, Float8BlockwiseLinearConfig and QATConfig, and PEFT's LoraConfig;
then apply them to a meta-device model holding exactly the modules the file names, with
pcc.lower.fsdp_apply.apply (the function a trainer calls), and read back which module (or weight)
class each one became.

torchao and PEFT live in a side folder (requirements/fsdp.txt, --no-deps), never in pcc's
site-packages, so they cannot replace pcc's torch. The checks run in a child process that appends
that folder to sys.path (pcc's packages win where both have one) and answers one JSON document;
torchao's import side effects (CUDA kernels that fail to load on a CPU) stay out of the caller.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from pcc.lower.engine_errors import EngineMissing, VerifyError  # noqa: F401 - both part of this module's API
from pcc.lower.side_folder import folder, run_child

DIR_ENV = "PCC_FSDP_DIR"  # folder holding torchao/ and peft/ (pip --target); default below
HINT = "install with requirements/install-engines.sh (see requirements/fsdp.txt)"
# what each kind of group turns a module into: (module class, weight class or None for a Parameter)
EXPECTED = {"wide": ("Linear", None), "float8": ("Float8Linear", None),
            "blockwise": ("Float8BlockwiseLinear", None),
            "mxfp8": ("Linear", "MXFP8TrainingWeightWrapperTensor"), "int4_qat": ("FakeQuantizedLinear", None)}
LORA_CLASS = "peft.tuners.lora.layer.Linear"
FP8_GATHER_WEIGHT = "WeightWithDynamicFloat8CastTensor"  # enable_fsdp_float8_all_gather's weight wrapper


def engine_dir() -> Path:
    return folder(DIR_ENV, "fsdp")


def verify_fsdp_config(doc: dict, shapes: dict[str, list[int]]) -> dict:
    """Build every config in `doc` (trainer/fsdp.json) and apply it to a meta model of `shapes`
    (module name -> [out, in]). Returns {"versions", "classes": {kind: {class: count}}, "lora", "configs",
    "unchecked": {kind: why its modules were not converted on this machine}}."""
    out = run_child("pcc.lower.verify_fsdp", engine_dir(), ("torchao", "peft"), {"doc": doc, "shapes": shapes},
                    "the FSDP checks", HINT)
    if "error" in out:
        raise VerifyError(out["error"])
    gather = any(g["config"].get("enable_fsdp_float8_all_gather") for g in doc["low_precision"])
    for kind, counts in out["classes"].items():
        cls, weight = EXPECTED[kind]
        if kind == "float8" and gather:
            weight = FP8_GATHER_WEIGHT
        if kind in out["unchecked"]:
            cls = "Linear"
        want = cls + (f"[{weight}]" if weight else "")
        if set(counts) != {want}:
            raise VerifyError(f"{kind} modules became {counts}, not {want}")
    if set(out["lora"]) - {LORA_CLASS}:
        raise VerifyError(f"LoRA targets became {out['lora']}, not {LORA_CLASS}")
    return out


def verify_plan(plan) -> dict:
    """verify_fsdp_config for the fsdp target's file of `plan`, with the plan's module shapes."""
    from pcc.lower import lower
    from pcc.lower.fsdp import FILE, gemm_modules, module_name

    ops = plan.catalog.operators
    shapes = {module_name(ops[i].tensor): list(ops[i].shape) for i in gemm_modules(plan)}
    return verify_fsdp_config(json.loads(lower(plan, "fsdp").files[FILE]), shapes)


# ---- the child: runs with torchao and PEFT importable ------------------------------------------

def _child(request: dict) -> dict:
    sys.path.append(request["dir"])
    import torch
    from torch import nn

    import peft
    import torchao
    from torchao.float8 import Float8LinearConfig

    from pcc.lower.fsdp_apply import ModelMismatch, apply

    doc, shapes = request["doc"], request["shapes"]
    try:
        model = nn.Module()
        for name, (n, k) in shapes.items():
            parent = model
            *path, leaf = name.split(".")
            for part in path:
                if not hasattr(parent, part):
                    parent.add_module(part, nn.Module())
                parent = getattr(parent, part)
            parent.add_module(leaf, nn.Linear(k, n, bias=False, device="meta",
                                              dtype=getattr(torch, doc["sharded_param_dtype"])))
        sm90 = torch.cuda.is_available() and torch.cuda.get_device_capability()[0] >= 9
        unchecked = {} if sm90 or not any(g["kind"] == "blockwise" for g in doc["low_precision"]) else {
            "blockwise": "Float8BlockwiseLinear is built on an SM90+ GPU only (the config is checked)"}
        run = apply(model, doc, skip=frozenset(unchecked))
        if not issubclass(run.optimizer, torch.optim.Optimizer):
            raise VerifyError(f"{doc['optimizer']} is no torch optimizer")
        for g, built in zip(doc["low_precision"], run.configs):
            if g["kind"] != "float8" or not g["config"]["recipe"]:
                continue
            recipe = g["config"]["recipe"]
            ref = Float8LinearConfig.from_recipe_name(recipe)
            for k in g["config"]["casts"]:
                if getattr(built, k) != getattr(ref, k):
                    raise VerifyError(f"{k} is {getattr(built, k)}, recipe {recipe} has {getattr(ref, k)}")
            if built.round_scales_to_power_of_2 != ref.round_scales_to_power_of_2:
                raise VerifyError(f"round_scales_to_power_of_2 differs from recipe {recipe}")
        configs = [repr(v) for v in run.shard.values()] + [repr(c) for c in run.configs]
        lora = doc["lora"]
        modules = dict(model.named_modules())
        classes: dict[str, dict[str, int]] = {}
        kinds = [("wide", doc["keep_wide"])] + [(g["kind"], g["modules"]) for g in doc["low_precision"]]
        adapted = set(lora["target_modules"]) if lora else set()
        for kind, names in kinds:
            for name in names:
                m = modules[name]
                base = m.get_base_layer() if name in adapted else m
                w = type(base.weight).__name__
                key = type(base).__name__ + ("" if w == "Parameter" else f"[{w}]")
                classes.setdefault(kind, {}).setdefault(key, 0)
                classes[kind][key] += 1
        lora_classes: dict[str, int] = {}
        for name in adapted:
            key = f"{type(modules[name]).__module__}.{type(modules[name]).__name__}"
            lora_classes[key] = lora_classes.get(key, 0) + 1
    except (VerifyError, ModelMismatch, AssertionError, ValueError, TypeError, KeyError, AttributeError) as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}
    return {"versions": {"torch": torch.__version__.split("+")[0], "torchao": torchao.__version__,
                         "peft": peft.__version__},
            "classes": classes, "lora": lora_classes, "configs": configs, "unchecked": unchecked}


if __name__ == "__main__":
    result = _child(json.loads(sys.stdin.read()))
    sys.stdout.write("\n" + json.dumps(result, default=str) + "\n")
