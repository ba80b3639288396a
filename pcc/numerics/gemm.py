"""scaled_gemm: C = A B^T from codes and scales, promoting per K-chunk like block-scaled kernels.

This is not "dequantize, then GEMM": each K-chunk's partial dot products of raw
element values are accumulated in float32, and only then multiplied by the two
operands' scales and added to the float32 result, the way DeepGEMM/CUTLASS
block-scaled FP8 kernels promote their tensor-core accumulators.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from pcc.lang.diagnostics import PccError

from .quantize import Quantized


def _chunk_scales(q: Quantized, chunk: int, nchunks: int) -> torch.Tensor:
    """Per-row, per-K-chunk float32 multipliers of a 2-D operand: [rows, nchunks]."""
    geo = q.geometry
    s = q.block_scales()[0]  # [nbr, nbc]
    s = s.repeat_interleave(geo.block_rows, dim=0)[: geo.rows]
    return s.repeat_interleave(geo.block_cols // chunk, dim=1)[:, :nchunks]


def _check(qa: Quantized, qb: Quantized) -> None:
    for q, side in ((qa, "A"), (qb, "B")):
        if len(q.shape) != 2:
            raise ValueError(f"scaled_gemm: operand {side} must be 2-D, got shape {tuple(q.shape)}")
        if q.scheme.passthrough or q.zero_point is not None:
            raise ValueError(f"scaled_gemm: operand {side} must be a symmetric scaled format, got {q.scheme.format}")
    if qa.shape[1] != qb.shape[1]:
        raise ValueError(f"scaled_gemm: A is [M,K]={tuple(qa.shape)} but B is [N,K]={tuple(qb.shape)}")


def scaled_gemm(qa: Quantized, qb: Quantized, out_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """A [M,K] times B [N,K]^T from two Quantized operands, scales applied per K-chunk."""
    _check(qa, qb)
    if qa.codes.is_cuda:
        return _scaled_mm_cuda(qa, qb, out_dtype)
    k = qa.shape[1]
    chunk = math.gcd(qa.geometry.block_cols, qb.geometry.block_cols)
    nchunks = math.ceil(k / chunk)
    pad = nchunks * chunk - k
    va = F.pad(qa.element_values(), (0, pad)).view(-1, nchunks, chunk)
    vb = F.pad(qb.element_values(), (0, pad)).view(-1, nchunks, chunk)
    sa, sb = _chunk_scales(qa, chunk, nchunks), _chunk_scales(qb, chunk, nchunks)
    out = torch.zeros(va.shape[0], vb.shape[0], dtype=torch.float32, device=va.device)
    for j in range(nchunks):  # one promotion per K-chunk, as the kernels do
        out += (va[:, j] @ vb[:, j].t()) * sa[:, j, None] * sb[None, :, j]
    return out.to(out_dtype)


class ScaledMMUnsupported(PccError, RuntimeError):
    """The installed torch's `_scaled_mm` has no kernel for this scaling layout (say so, never emulate
    silently: the point of the CUDA path is to run the real low-precision GEMM)."""


def _scaled_mm_cuda(qa: Quantized, qb: Quantized, out_dtype: torch.dtype) -> torch.Tensor:
    """torch._scaled_mm for the layouts it takes: FP8 per-tensor x per-tensor, or per-row x per-row."""
    kinds = (qa.grouping.kind, qb.grouping.kind)
    fp8 = qa.codes.dtype in (torch.float8_e4m3fn, torch.float8_e5m2) and qb.codes.dtype in (
        torch.float8_e4m3fn, torch.float8_e5m2)
    if not hasattr(torch, "_scaled_mm") or not fp8 or qa.scheme.scale == "e8m0" or kinds not in (
            ("tensor", "tensor"), ("row", "row"), ("token", "row")):
        raise ScaledMMUnsupported(
            f"scaled_gemm on CUDA: this torch's _scaled_mm does not support {qa.scheme.format}/{qb.scheme.format} "
            f"with scaling layout {kinds[0]} x {kinds[1]}; supported: FP8 tensor x tensor, row x row")
    sa, sb = qa.scales.float(), qb.scales.float()
    if kinds == ("tensor", "tensor"):
        sa, sb = sa.reshape(()), sb.reshape(())
    else:
        sa, sb = sa.reshape(-1, 1), sb.reshape(1, -1)
    return torch._scaled_mm(qa.codes, qb.codes.t(), scale_a=sa, scale_b=sb, out_dtype=out_dtype)
