"""Weight synchronization: convert a trainer version, transfer it in buckets, and describe it in a manifest.

The converter plan decides what crosses: for `moves full_weights`, every operator,
as BF16 over a `bridge bf16` (the rollout rebuilds its codes + scales on install, as
SGLang does) or already in its rollout checkpoint layout (`bridge fp8|packed`:
codes + scales, packed, as `pcc convert` writes them); for `moves adapter`, the
LoRA tensors only.
Buckets travel as safetensors bytes, so what the rollout installs is what was
sent; the manifest's per-tensor checksums let it refuse a damaged version whole.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import torch
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

from pcc.lang.diagnostics import PccError


class SyncError(PccError, RuntimeError):
    """A version could not be activated; the message names the version and the tensor."""

    code = "PCC703"


@dataclass(frozen=True)
class Fault:
    """Damage injected into one transfer: drop or corrupt `tensor` of `version`."""

    version: int
    kind: str  # "drop" | "corrupt"
    tensor: str


def convert_adapter(adapters: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """LoRA tensors (PEFT names: `<module>.lora_A.weight`), BF16 as the adapter is served."""
    return {k: v.detach().to(torch.bfloat16).contiguous() for k, v in adapters.items()}


def checksum(t: torch.Tensor) -> str:
    return hashlib.sha256(t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()).hexdigest()


def manifest(version: int, moves: str, tensors: dict[str, torch.Tensor], bridge: str | None = None) -> dict:
    return {"version": version, "moves": moves, "bridge": bridge,
            "tensors": {k: {"dtype": str(t.dtype).removeprefix("torch."), "shape": list(t.shape),
                            "bytes": t.numel() * t.element_size(), "sha256": checksum(t)} for k, t in tensors.items()}}


def transfer(tensors: dict[str, torch.Tensor], bucket_bytes: int, fault: Fault | None = None,
             version: int | None = None) -> list[bytes]:
    """Serialize into buckets of about `bucket_bytes` each (what crosses the wire)."""
    if fault is not None and fault.version == version and fault.tensor not in tensors:
        raise ValueError(f"fault injection: '{fault.tensor}' is not part of version {version}'s transfer "
                         f"(e.g. '{next(iter(tensors))}')")
    buckets, cur, size = [], {}, 0
    for k, t in tensors.items():
        if fault is not None and fault.version == version and fault.tensor == k:
            if fault.kind == "drop":
                continue
            t = t.clone()
            raw = t.reshape(-1).view(torch.uint8)
            raw[0] ^= 0xFF
        cur[k] = t
        size += t.numel() * t.element_size()
        if size >= bucket_bytes:
            buckets.append(st_save(cur))
            cur, size = {}, 0
    if cur:
        buckets.append(st_save(cur))
    return buckets


def receive(buckets: list[bytes]) -> dict[str, torch.Tensor]:
    out = {}
    for b in buckets:
        out.update(st_load(b))
    return out


def verify(man: dict, received: dict[str, torch.Tensor]) -> None:
    """Every manifest tensor present, with its dtype, shape and checksum; nothing extra."""
    v = man["version"]
    for k, meta in man["tensors"].items():
        t = received.get(k)
        if t is None:
            raise SyncError(f"version {v}: tensor '{k}' missing from the transfer; activation refused")
        if list(t.shape) != meta["shape"] or str(t.dtype).removeprefix("torch.") != meta["dtype"]:
            raise SyncError(f"version {v}: tensor '{k}' arrived as {t.dtype} {list(t.shape)}, manifest says "
                            f"{meta['dtype']} {meta['shape']}; activation refused")
        if checksum(t) != meta["sha256"]:
            raise SyncError(f"version {v}: tensor '{k}' fails its checksum (corrupted in transfer); activation refused")
    extra = sorted(set(received) - set(man["tensors"]))
    if extra:
        raise SyncError(f"version {v}: tensor '{extra[0]}' is not in the manifest; activation refused")
