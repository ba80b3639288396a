"""A short supervised warm start, cached by (architecture, task, seed, recipe), so RL starts from a policy
that sometimes succeeds. It trains plain BF16 weights; the contract's numerics start with RL."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from pathlib import Path

import torch
import torch.nn.functional as F

from .checkpoint import load_tensors, save_tensors
from .model import Arch, bf16, forward, init_weights
from .task import ReverseTask

RECIPE = {"steps": 200, "batch": 64, "lr": 2e-3, "revision": 1}


def cache_dir() -> Path:
    return Path(os.environ.get("PCC_CACHE", Path.home() / ".cache" / "pcc")) / "warmstart"


def cache_key(arch: Arch, task: ReverseTask, seed: int, recipe: dict) -> str:
    doc = {"arch": dataclasses.asdict(arch), "task": dataclasses.asdict(task), "seed": seed, "recipe": recipe}
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:20]


class _Plain:
    """BF16 execution of float32 weights, for supervised training."""

    def __init__(self, w):
        self.w = w

    def linear(self, name, x):
        return bf16(bf16(x) @ bf16(self.w[name]).t())

    def weight(self, name):
        return self.w[name]

    def kv(self, layer, k, v):
        return k, v


def warm_start(arch: Arch, task: ReverseTask, seed: int, recipe: dict | None = None,
               progress=None) -> tuple[dict[str, torch.Tensor], bool]:
    """(weights, cached?) after `recipe['steps']` steps of teacher-forced cross-entropy on the answers."""
    recipe = recipe or RECIPE
    path = cache_dir() / f"{cache_key(arch, task, seed, recipe)}.safetensors"
    if path.is_file():
        return load_tensors(path), True
    w = init_weights(arch, seed)
    for t in w.values():
        t.requires_grad_(True)
    opt = torch.optim.Adam(w.values(), lr=recipe["lr"])
    gen = torch.Generator().manual_seed(seed + 1)
    ex, p = _Plain(w), task.prompt_len
    for step in range(recipe["steps"]):
        seq = task.sequences(recipe["batch"], gen)
        logits, _ = forward(arch, ex, seq[:, :-1])
        loss = F.cross_entropy(logits[:, p - 1:].reshape(-1, arch.vocab), seq[:, p:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        if progress is not None:
            progress(step + 1, recipe["steps"], float(loss))
    out = {k: v.detach().clone() for k, v in w.items()}
    save_tensors(path, out)
    return out, False
