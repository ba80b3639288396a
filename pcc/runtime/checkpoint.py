"""Safetensors checkpoints, written atomically (`pcc.lang.outputs.atomic_path`); never pickle."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from pcc.lang.outputs import atomic_path, write_atomic


def save_tensors(path: Path, tensors: dict[str, torch.Tensor], metadata: dict[str, str] | None = None) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path) as tmp:
        save_file({k: v.detach().contiguous() for k, v in tensors.items()}, str(tmp), metadata=metadata)


def load_tensors(path: Path) -> dict[str, torch.Tensor]:
    out = {}
    with safe_open(str(path), framework="pt") as f:
        for k in f.keys():
            out[k] = f.get_tensor(k)
    return out


def save_model(dirpath: Path, weights: dict[str, torch.Tensor], config: dict) -> None:
    """A Hugging Face style checkpoint: model.safetensors (BF16) + config.json."""
    dirpath = Path(dirpath)
    save_tensors(dirpath / "model.safetensors", {k: v.to(torch.bfloat16) for k, v in weights.items()})
    write_json(dirpath / "config.json", {k: v for k, v in config.items() if not k.startswith("_")})


def load_model(dirpath: Path) -> dict[str, torch.Tensor]:
    return {k: v.float() for k, v in load_tensors(Path(dirpath) / "model.safetensors").items()}


def write_json(path: Path, doc) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, json.dumps(doc, indent=1) + "\n")
