"""Known faults the ladder must catch, each at its own level (`--inject-fault NAME`).

A self-test of the ladder, and the tests' fixtures: each fault is a realistic bug at one
boundary, injected into the embedded engine or the converted checkpoint, never into the
comparison that is supposed to catch it.
"""

from __future__ import annotations

import contextlib
import torch

from pcc.lang.diagnostics import PccError
from pcc.lang.outputs import atomic_path

FAULTS = {
    "scale_layout": (2, "the converter writes one operator's block scales in a per-row (or transposed) layout"),
    "accumulation": (3, "the rollout's low-precision GEMM accumulates in BF16 instead of promoting to FP32"),
    "swapped_expert": (5, "the engine's loader places two routed experts of one layer in each other's slots"),
    "inactive_adapter": (6, "an update's tensor arrives (checksum ok) but the kernel keeps reading the old one"),
    "mixed_version": (6, "an activation arriving mid-batch takes effect at the next token of a trajectory"),
}


class FaultError(PccError, ValueError):
    """`--inject-fault` names a fault the ladder does not know."""


def check(names) -> tuple[str, ...]:
    for n in names:
        if n not in FAULTS:
            raise FaultError(f"unknown fault '{n}'; known: {', '.join(FAULTS)}")
    return tuple(names)


# -- level 2: the converted checkpoint ------------------------------------------------------
def after_convert(ctx, directory) -> None:
    if "scale_layout" not in ctx.faults:
        return
    from safetensors.torch import save_file

    from pcc.convert.source import open_source

    src = open_source(directory)
    tensors = {n: src.load(n).clone() for n in src.where}
    files = set(src.where.values())
    src.close()
    name = next((n for n in tensors if n.endswith(("weight_scale_inv", "weight_scale", "_scales"))
                 and tensors[n].dim() == 2), None)
    if name is None or len(files) != 1:
        raise FaultError("scale_layout: the checkpoint has no 2-D scale tensor in a single shard")
    s = tensors[name]
    weight = tensors[name.replace("_scale_inv", "").replace("_scales", "_blocks").replace("_scale", "")]
    rows = weight.shape[-2] if name.endswith("_scales") else weight.shape[0]
    if s.shape[0] < rows:  # block scales written one per row
        tensors[name] = s.repeat_interleave(-(-rows // s.shape[0]), 0)[:rows].contiguous()
    else:  # per-row scales written column-major
        tensors[name] = s.t().contiguous()
    if tensors[name].shape == s.shape:
        raise FaultError(f"scale_layout: {name} {list(s.shape)} has no other layout of a different shape")
    with atomic_path(directory / next(iter(files))) as tmp:  # the fault is the new layout, not half a file
        save_file(tensors, str(tmp), metadata={"format": "pt"})


# -- level 3: the rollout kernel ------------------------------------------------------------
def _bf16_accumulating_gemm(qa, qb, out_dtype=torch.float32):
    """A block-scaled GEMM whose accumulator is BF16: every product is added and rounded."""
    va, vb = qa.dequantize(torch.float32), qb.dequantize(torch.float32)
    acc = torch.zeros(va.shape[0], vb.shape[0], dtype=torch.bfloat16)
    for k in range(va.shape[1]):
        acc = (acc.float() + va[:, k:k + 1] * vb[None, :, k]).to(torch.bfloat16)
    return acc.to(out_dtype)


@contextlib.contextmanager
def active(faults):
    """Patch the rollout engine's kernel for the ladder's duration (the trainer's is untouched)."""
    if "accumulation" not in faults:
        yield
        return
    import pcc.runtime.rollout as rollout

    saved = rollout.scaled_gemm
    rollout.scaled_gemm = _bf16_accumulating_gemm
    try:
        yield
    finally:
        rollout.scaled_gemm = saved


# -- levels 5 and 6: the engine ---------------------------------------------------------------
def engine_class(ctx):
    from .local import LocalEngine

    faults = set(ctx.faults)
    if not faults & {"swapped_expert", "inactive_adapter", "mixed_version"}:
        return LocalEngine
    layer = ctx.arch.layers // 2

    class FaultyEngine(LocalEngine):
        previous = None

        def _loaded(self, w):
            if "swapped_expert" in faults and w.manifest.get("moves") == "full_weights" and ctx.arch.is_moe:
                for proj in ("gate_proj", "up_proj", "down_proj"):
                    a, b = (f"model.layers.{layer}.mlp.experts.{e}.{proj}.weight" for e in (0, 1))
                    for d in (w.quantized, w.values):
                        if a in d:
                            d[a], d[b] = d[b], d[a]
            if "inactive_adapter" in faults and self.previous is not None and w.version > self.previous.version:
                self._keep_one_stale(w, self.previous)
            self.previous = w

        def _keep_one_stale(self, w, old):
            if w.adapters:
                mod = sorted(w.adapters)[0]
                w.adapters = {**w.adapters, mod: old.adapters.get(mod, w.adapters[mod])}
            else:  # a full-weight update: one quantized (else wide 2-D) operator keeps its old weights
                pool = w.quantized if w.quantized else {n: v for n, v in w.values.items() if v.dim() == 2}
                name = sorted(n for n in pool if ".layers." in n)[0]
                target = w.quantized if w.quantized else w.values
                source = old.quantized if w.quantized else old.values
                setattr(w, "quantized" if w.quantized else "values", {**target, name: source[name]})

        def _serving(self, w0, w_now):
            return w_now if "mixed_version" in faults else w0

    return FaultyEngine


__all__ = ["FAULTS", "FaultError", "active", "after_convert", "check", "engine_class"]
