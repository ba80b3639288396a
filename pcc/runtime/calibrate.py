"""Static activation scales, calibrated the ModelOpt way, and the quantizer that uses them.

SGLang's ModelOpt NVFP4 path does not measure activations per call: it quantizes each
GEMM input with the checkpoint's static per-tensor `input_scale` (global encode factor
1 / input_scale), which ModelOpt calibrated offline as amax / (6 * 448) over a fixed
calibration set, running the model unquantized with every routed expert seeing every
token. A token's codes therefore never depend on which other rows share its GEMM
(batch, prefill vs decode). `input_scales` is that calibration; the sync's converter
step (`weights.convert_full`) calls it for every version it converts.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from pcc.numerics import Quantized, geometry
from pcc.numerics import formats as fm
from pcc.numerics.packing import pack_e2m1x2
from pcc.plan.encode import static_targets  # noqa: F401 (defined there, torch-free; importers take it from here)

from .model import Arch, bf16, forward
from .task import ReverseTask

CALIBRATION_ROWS, CALIBRATION_SEED = 64, 2718  # a fixed batch of task sequences (prompt + answer)
NVFP4_RANGE = fm.E4M3.max * fm.E2M1.max  # 448 * 6: ModelOpt's input_scale = amax / NVFP4_RANGE


def calibration_tokens(task: ReverseTask | None = None) -> torch.Tensor:
    return (task or ReverseTask()).sequences(CALIBRATION_ROWS, torch.Generator().manual_seed(CALIBRATION_SEED))


class _Amax:
    """A BF16 execution that records max|input| of chosen operators; at each MoE router it also runs
    every expert over every token (ModelOpt's MoE calibration), so no expert is left uncalibrated."""

    def __init__(self, arch: Arch, weights: dict[str, torch.Tensor], names):
        self.arch, self.w, self.names, self.amax = arch, weights, set(names), {}

    def _see(self, name: str, x: torch.Tensor) -> None:
        if name in self.names:
            self.amax[name] = max(self.amax.get(name, 0.0), float(x.abs().max()))

    def linear(self, name: str, x: torch.Tensor) -> torch.Tensor:
        self._see(name, x)
        if name.endswith(".mlp.gate.weight"):
            pre = name.removesuffix("gate.weight") + "experts."
            for e in range(self.arch.experts):
                q = f"{pre}{e}."
                a = bf16(F.silu(self.linear(q + "gate_proj.weight", x)) * self.linear(q + "up_proj.weight", x))
                self._see(q + "down_proj.weight", a)
        return bf16(bf16(x) @ bf16(self.w[name]).t())

    def weight(self, name: str) -> torch.Tensor:
        return self.w[name]

    def kv(self, layer, k, v):
        return k, v


@torch.no_grad()
def input_scales(plan, weights: dict[str, torch.Tensor], tokens: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    """Checkpoint name -> float32 scalar `input_scale` (amax / the layout's `input_range`: 6 * 448 for NVFP4,
    448 for a MIXED_PRECISION FP8 member) for every operator whose layout stores one,
    from an unquantized BF16 forward of `weights` over the calibration batch. An operator no token
    reaches keeps 1.0 (the converter's uncalibrated value)."""
    targets = static_targets(plan)
    if not targets:
        return {}
    arch = Arch.from_catalog(plan.catalog)
    rec = _Amax(arch, {k: v.float() for k, v in weights.items()}, targets)
    forward(arch, rec, calibration_tokens() if tokens is None else tokens)
    top = {n: plan.layouts[plan.index[n]].input_range for n in targets}  # 6 * 448 (NVFP4), 448 (ModelOpt FP8)
    return {targets[n]: torch.tensor(rec.amax[n] / top[n] if rec.amax.get(n) else 1.0, dtype=torch.float32)
            for n in targets}


def quantize_static(x: torch.Tensor, scheme, input_scale: torch.Tensor) -> Quantized:
    """NVFP4 activation codes with a static global encode factor 1 / input_scale, as SGLang's
    `scaled_fp4_quant(x, 1 / input_scale)`: block scale e4m3(amax_b * S / 6) saturating at 448,
    elements e2m1(x * S / scale_b) saturating at 6. With input_scale = amax(x) / (6 * 448) it is
    exactly pcc.numerics' dynamic NVFP4 quantizer."""
    x2 = x.float().reshape(-1, x.shape[-1])
    geo = geometry(x2.shape, scheme.grouping_of("activation"))
    if geo.block_rows != 1:
        raise ValueError(f"static NVFP4 activations need 1 x N groups, got {scheme.grouping_of('activation')}")
    n, k, c = x2.shape[0], x2.shape[1], geo.block_cols
    pad = -k % c
    xb = F.pad(x2, (0, pad)).view(n, -1, c)
    s_enc = (1.0 / input_scale.float()).reshape(())
    inv6 = torch.tensor(1.0 / fm.E2M1.max, dtype=torch.float32)
    s_b = fm.encode_fp8((xb.abs().amax(-1) * (s_enc * inv6)).clamp(max=fm.FLT_MAX), fm.E4M3)
    factor = (1.0 / (s_b.float() * (1.0 / s_enc))).clamp(max=fm.FLT_MAX)
    codes = fm.encode_e2m1(xb * factor[..., None]).view(n, -1)[:, :k]
    if scheme.packing == "e2m1x2":
        codes = pack_e2m1x2(codes)
    return Quantized(codes, s_b.reshape(geo.scale_shape), x2.shape, scheme, "activation", outer_scale=s_enc)
