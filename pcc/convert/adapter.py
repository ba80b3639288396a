"""Trainer-side LoRA adapter -> PEFT layout (adapter_config.json + adapter_model.safetensors),
the form SGLang's `--lora-paths` and `/load_lora_adapter` read.

Input: safetensors (a file, or a directory of them) with `{module}.lora_A.weight` [r, in] and
`{module}.lora_B.weight` [out, r] per target, `module` the Hugging Face module name
(`model.layers.0.self_attn.q_proj`). Every module must be one of the contract's LoRA targets,
every target present, shapes and rank as the contract says.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from pcc.convert import ConvertError
from pcc.convert.contract import load_plan
from pcc.convert.destination import (
    check_destination,
    check_work,
    destination_lock,
    is_adapter,
)
from pcc.convert.source import checked_header, inside

_SUFFIXES = (".lora_A.weight", ".lora_B.weight", ".lora_A", ".lora_B")


def export_adapter(contract: str, source: str, destination: str, force: bool = False) -> dict:
    plan = load_plan(contract)
    c = plan.contract
    if c.trainable.kind != "lora":
        raise ConvertError(f"{contract}: 'trainable {c.trainable.kind}' has no adapter to export")
    dst = Path(destination)
    with destination_lock(dst.resolve()):
        check_destination(dst, force, is_adapter, "an exported adapter (only adapter_config.json and "
                          "adapter_model.safetensors)")
        work = dst.with_name(f".{dst.name}.partial")
        check_work(work, is_adapter)
        return _export(plan, source, dst, work)


def _export(plan, source: str, dst: Path, work: Path) -> dict:
    """The adapter read, checked against the contract's targets and rank, written in PEFT layout."""
    from safetensors import SafetensorError
    from safetensors.torch import save_file

    c = plan.contract
    src = Path(source)
    files = [inside(src, f.name, "adapter file") for f in sorted(src.glob("*.safetensors"))] if src.is_dir() else [src]
    if not files or not all(f.is_file() for f in files):
        raise ConvertError(f"{source}: no safetensors adapter files", code="PCC713")
    for f in files:
        try:
            checked_header(f)
        except ConvertError as err:
            raise ConvertError(f"unreadable adapter: {err}", code="PCC713") from None
    ops = plan.catalog.operators
    targets = {ops[i].tensor[: -len(".weight")]: ops[i] for i in plan.trainable}
    tensors, rank = {}, c.trainable.rank
    for f in files:
        try:
            tensors.update(_read_adapter_file(f, targets, rank))
        except SafetensorError as err:  # the header was checked; a file changed under us
            raise ConvertError(f"{f}: unreadable adapter ({err})", code="PCC713") from None
    missing = [m for m in targets for p in ("lora_A", "lora_B") if f"base_model.model.{m}.{p}.weight" not in tensors]
    if missing:
        raise ConvertError(f"{source}: adapter lacks {len(missing)} tensors, first {missing[0]}")
    config = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": rank, "lora_alpha": c.trainable.alpha or rank,
              "lora_dropout": c.trainable.dropout, "bias": "none", "fan_in_fan_out": False, "inference_mode": True,
              "target_modules": sorted({m.rsplit(".", 1)[-1] for m in targets}), "modules_to_save": None,
              "base_model_name_or_path": None}
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    save_file(dict(sorted(tensors.items())), str(work / "adapter_model.safetensors"), metadata={"format": "pt"})
    (work / "adapter_config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    if dst.exists():
        shutil.rmtree(dst)
    os.replace(work, dst)
    return {"ok": True, "destination": str(dst), "modules": len(targets), "rank": rank,
            "target_modules": config["target_modules"], "bytes": sum(t.numel() * t.element_size() for t in tensors.values())}


def _read_adapter_file(f: Path, targets: dict, rank: int) -> dict:
    """`base_model.model.{module}.lora_{A,B}.weight` -> tensor for every tensor of one adapter file."""
    from safetensors import safe_open

    tensors = {}
    with safe_open(str(f), framework="pt") as h:
        for name in h.keys():
            suffix = next((s for s in _SUFFIXES if name.endswith(s)), None)
            module = name[: -len(suffix)] if suffix else None
            if module not in targets:
                raise ConvertError(f"{f}: {name} is not a LoRA tensor of a contract target "
                                   f"({len(targets)} targets, e.g. {next(iter(targets))})")
            t = h.get_tensor(name)
            _check_finite(f, name, t)
            part = "lora_A" if "lora_A" in suffix else "lora_B"
            n, k = targets[module].shape
            want = [rank, k] if part == "lora_A" else [n, rank]
            if list(t.shape) != want:
                raise ConvertError(f"{f}: {name} has shape {list(t.shape)}, the contract's rank {rank} "
                                   f"and {module} {list(targets[module].shape)} need {want}")
            tensors[f"base_model.model.{module}.{part}.weight"] = t.contiguous()
    return tensors


def _check_finite(f: Path, name: str, t) -> None:
    """A LoRA tensor holding NaN or inf (a diverged run) is refused: the engine would serve NaN (PCC713)."""
    import torch

    from pcc.numerics import all_finite

    if not all_finite(t):
        bad = (~torch.isfinite(t)).nonzero()[0].tolist()
        raise ConvertError(f"{f}: {name} holds NaN or inf (first at {bad}): the run that trained it diverged; "
                           "export the adapter of an earlier step", code="PCC713")
