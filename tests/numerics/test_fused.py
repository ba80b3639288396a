"""The fused block-FP8 kernel (pcc.fused; llvmlite is a dependency) gives the torch path's codes and
scales bit for bit: its E4M3 rounding on float32 magnitudes in steps and around every rounding boundary, the
scale of every BF16 amax, and whole tensors of every grouping it takes; NaN/inf gets the torch path's error."""

from __future__ import annotations

import os

import pytest
import torch

from pcc import fused
from pcc.numerics import quantize

pytestmark = pytest.mark.skipif(os.environ.get("PCC_FUSED") == "0", reason="PCC_FUSED=0 turns the fused kernel off")


@pytest.fixture
def torch_path(monkeypatch):
    """Quantize with the kernels turned off, as where llvmlite is missing."""
    def run(*args, **kwargs):
        with monkeypatch.context() as m:
            m.setattr(fused, "_KERNELS", {"bf16": None, "f32": None})
            return quantize(*args, **kwargs)
    return run


def _same(a, b) -> bool:
    return (a.codes.dtype == b.codes.dtype and torch.equal(a.codes.view(torch.uint8), b.codes.view(torch.uint8))
            and a.scales.dtype == b.scales.dtype and torch.equal(a.scales, b.scales) and a.shape == b.shape)


def _kernel_used(monkeypatch) -> list:
    calls = []
    real = fused.fp8_fp32_blocks
    monkeypatch.setattr(fused, "fp8_fp32_blocks", lambda *a: calls.append(a) or real(*a))
    return calls


def test_rounding_to_e4m3_is_torchs_cast(monkeypatch):
    """Rows whose first element is 448 have scale 1 exactly, so the codes are the rounding of the values
    themselves: every 509th float32 pattern below 448, and 17 patterns around every midpoint of E4M3 values."""
    top = 0x43E00000  # bits of 448.0
    sampled = torch.arange(0, top, 509, dtype=torch.int64)
    values = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).float()
    values = values[torch.isfinite(values) & (values >= 0)].unique()
    mids = ((values[1:] + values[:-1]) / 2).view(torch.int32).to(torch.int64)
    around = (mids[:, None] + torch.arange(-8, 9)).reshape(-1)
    bits = torch.cat([sampled, around, torch.tensor([0x00000001, 0x007FFFFF, 0x00800000, top - 1])])
    y = bits.to(torch.int32).view(torch.float32)
    y = torch.cat([y, -y])
    cols = 128
    y = torch.nn.functional.pad(y, (0, -y.numel() % (cols - 1))).view(-1, cols - 1)
    x = torch.cat([torch.full((y.shape[0], 1), 448.0), y], dim=1).contiguous()
    calls = _kernel_used(monkeypatch)
    q = quantize(x, {"format": "fp8_e4m3", "grouping": {"kind": "row"}})
    assert calls and bool((q.scales == 1.0).all())
    assert torch.equal(q.codes.view(torch.uint8), x.to(torch.float8_e4m3fn).view(torch.uint8))


def test_the_scale_of_every_bf16_amax(torch_path, monkeypatch):
    amax = torch.arange(0, 0x7F80, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)  # every finite one
    x = torch.stack([amax, -amax / 3, torch.zeros_like(amax)], dim=1).contiguous()
    calls = _kernel_used(monkeypatch)
    got = quantize(x, "fp8_row")
    assert calls and _same(got, torch_path(x, "fp8_row"))


def test_every_bf16_x_of_sampled_amax(torch_path, monkeypatch):
    """A BF16 x / scale is Markstein's product by the scale's reciprocal, corrected once (a block row holding a
    scale under 2^-64 divides): rows of every BF16 x at most an amax, for amax values at the edges (subnormal,
    where the correction's residual would underflow, around the switch to dividing at 0x23E0, whose scale is
    2^-64, 1, 448, the largest) and a
    seeded sample. bench/kernel_exhaustive.py compares all 32,640 amax values, 1.07 billion pairs."""
    edges = [0x0001, 0x007F, 0x0080, 0x00FF, *range(0x04F0, 0x0500), *range(0x23D0, 0x23F0), 0x3F80, 0x43E0,
             0x7F7F]
    sample = torch.randint(0, 0x7F80, (64,), generator=torch.Generator().manual_seed(29))
    amax = torch.tensor(edges + sample.tolist(), dtype=torch.int32)
    every = torch.arange(1 << 16, dtype=torch.int32)
    bits = torch.where((every & 0x7FFF)[None, :] <= amax[:, None], every[None, :], 0)
    x = bits.to(torch.int16).view(torch.bfloat16).contiguous()
    calls = _kernel_used(monkeypatch)
    got = quantize(x, "fp8_row")
    assert calls and _same(got, torch_path(x, "fp8_row"))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("shape, scheme", [
    ((130, 260), "fp8_block"),  # partial blocks at both edges
    ((1100, 1024), "fp8_block"),  # 1.1M elements: block rows on both chunk workers
    ((7, 3, 40), "fp8_row"),
    ((64, 100), {"format": "fp8_e4m3", "grouping": {"kind": "group", "size": 32}}),
    ((256, 384), {"format": "fp8_e4m3", "weights": {"kind": "block", "rows": 32, "cols": 64}}),
])
def test_whole_tensors_match_the_torch_path(shape, scheme, dtype, torch_path, monkeypatch):
    g = torch.Generator().manual_seed(29)
    x = (torch.randn(shape, generator=g) * torch.logspace(-30, 3, shape[-1])).to(dtype)
    flat = x.view(-1)
    flat[::37] = 0.0
    flat[1::41] = -0.0
    flat[2::43] = torch.finfo(dtype).tiny / 4  # subnormal
    flat[3::47] = torch.finfo(dtype).max / 2
    if len(shape) == 2 and shape[0] >= 64:
        x[:64, :32] = 0.0  # an all-zero block: scale 1
    calls = _kernel_used(monkeypatch)
    got = quantize(x, scheme, name="w")
    assert calls and _same(got, torch_path(x, scheme, name="w"))
    out = torch.empty(x.numel() + 100, dtype=torch.uint8)
    into = quantize(x, scheme, out=out)
    assert into.codes.data_ptr() == out.data_ptr() and _same(into, got)


def test_nan_or_inf_is_the_torch_paths_error(torch_path):
    x = torch.randn(300, 300).to(torch.bfloat16)
    x[200, 150] = float("inf")
    with pytest.raises(ValueError) as fast:
        quantize(x, "fp8_block", name="w")
    with pytest.raises(ValueError) as slow:
        torch_path(x, "fp8_block", name="w")
    assert str(fast.value) == str(slow.value) and "scale block (1, 1)" in str(fast.value)


def test_not_taken_where_the_bytes_would_differ(monkeypatch):
    """FP16 sources, given amaxes, tensor scaling, pow2 scales and non-contiguous tensors take the torch path."""
    calls = _kernel_used(monkeypatch)
    x = torch.randn(256, 256)
    quantize(x.half(), "fp8_block")
    quantize(x, "fp8_tensor")
    quantize(x, "fp8_tensor", amax=x.abs().max())
    quantize(x, {"format": "fp8_e4m3", "weights": {"kind": "block", "rows": 128, "cols": 128}, "scale": "pow2"})
    quantize(x.t(), "fp8_block")
    assert calls == []
