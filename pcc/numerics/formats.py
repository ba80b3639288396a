"""Element formats: exact encode/decode of FP8, FP4 (E2M1), E8M0 and the integer grids.

Every encoder here saturates: a finite value beyond the format's largest finite
value becomes that value (with its sign), the way the engines clamp before their
casts.  The quantizer rejects NaN and inf before it scales, so these functions
only see NaN/inf when called directly; docs/numerics.md lists what happens then.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

FLT_MAX = torch.finfo(torch.float32).max


@dataclass(frozen=True)
class FloatFormat:
    """A small IEEE-like float: enough facts to round to it and bound it."""

    name: str
    ebits: int
    mbits: int
    bias: int
    max: float
    dtype: torch.dtype | None  # torch storage dtype, None when torch has no cast

    @property
    def emin(self) -> int:
        """Exponent of the smallest normal; subnormals share its ulp."""
        return 1 - self.bias


E4M3 = FloatFormat("e4m3", 4, 3, 7, 448.0, torch.float8_e4m3fn)
E5M2 = FloatFormat("e5m2", 5, 2, 15, 57344.0, torch.float8_e5m2)
E2M1 = FloatFormat("e2m1", 2, 1, 1, 6.0, None)

# Code -> value for E2M1: bit 3 is the sign, bits 2..1 the exponent, bit 0 the mantissa.
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
               -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)

def encode_fp8(y: torch.Tensor, fmt: FloatFormat) -> torch.Tensor:
    """Round float32 `y` to an FP8 dtype, nearest-even, saturating at +-fmt.max."""
    return torch.clamp(y, -fmt.max, fmt.max).to(fmt.dtype)


def decode_fp8(codes: torch.Tensor) -> torch.Tensor:
    """FP8 tensor -> float32 through a 256-entry table (faster than torch's scalar cast on CPU)."""
    table = torch.arange(256, dtype=torch.uint8, device=codes.device).view(codes.dtype).float()
    return torch.take(table, codes.view(torch.uint8).to(torch.int64))


# Midpoints between neighbouring E2M1 magnitudes (0, 0.5, 1, 1.5, 2, 3, 4, 6), and whether a value exactly
# on one rounds up: ties go to the even code (mantissa bit 0), so to 0 at 0.25, 1 at 0.75 and 1.25, 2 at
# 1.75 and 2.5, 4 at 3.5 and 5.
_E2M1_MIDPOINTS = ((0.25, False), (0.75, True), (1.25, False), (1.75, True), (2.5, False), (3.5, True),
                   (5.0, False))


def encode_e2m1(y: torch.Tensor) -> torch.Tensor:
    """Round float32 `y` to E2M1 codes (uint8 0..15), nearest-even, saturating at +-6.

    The magnitude code is the number of midpoints |y| lies above (at a tie, above only where the
    upper neighbour is even): seven comparisons of float32 values, no arithmetic that could round.
    The sign of zero is kept (-0.1 -> code 8), as a hardware cvt and ml_dtypes do.  NaN has no
    E2M1 code (it gets code 0 or 8).
    """
    y = y.float()
    a = y.abs()
    code = torch.zeros(a.shape, dtype=torch.uint8, device=y.device)
    for mid, tie_up in _E2M1_MIDPOINTS:
        code += a >= mid if tie_up else a > mid
    return code.bitwise_or_(((y.view(torch.int32) >> 28) & 8).to(torch.uint8))


def decode_e2m1(codes: torch.Tensor) -> torch.Tensor:
    """E2M1 codes (any integer dtype, one code per element) -> float32 values."""
    lut = torch.tensor(E2M1_VALUES, dtype=torch.float32, device=codes.device)
    return torch.take(lut, codes.to(torch.int64) & 0xF)


def floor_log2(a: torch.Tensor) -> torch.Tensor:
    """Exact floor(log2(a)) for positive finite float32 `a` (subnormals included)."""
    _, exp = torch.frexp(a)
    return exp - 1


def pow2(exponent: torch.Tensor) -> torch.Tensor:
    """Exact float32 2**exponent for integer exponents in [-149, 127]: the exponent field, and for the
    rare subnormal results (below -126) the one mantissa bit, set only where there are any (the
    quantizer's E8M0 factors call this per chunk: a full `where` was most of their cost)."""
    e = exponent.to(torch.int32)
    bits = (e + 127).clamp_(min=0) << 23
    sub = e < -126
    if bool(sub.any()):
        bits[sub] = 1 << (e[sub] + 149).clamp_(0, 22)
    return bits.view(torch.float32)


def floor_pow2(a: torch.Tensor) -> torch.Tensor:
    """Largest power of two <= `a`, for positive normal float32 `a` (clears the mantissa)."""
    return (a.view(torch.int32) & 0x7F800000).view(torch.float32)


def decode_e8m0(byte: torch.Tensor) -> torch.Tensor:
    """E8M0 bytes -> float32 2**(byte-127); byte 255 is the format's NaN."""
    b = byte.to(torch.int32)
    value = pow2(b - 127)
    return torch.where(b == 255, torch.full_like(value, float("nan")), value)


def stochastic_round(y: torch.Tensor, fmt: FloatFormat,
                     generator: torch.Generator | None = None) -> torch.Tensor:
    """Round float32 `y` to a neighbour on `fmt`'s grid with probability by distance.

    The result is exactly representable in `fmt` (after saturation), so the
    nearest-even encoders above store it without a second rounding.
    """
    a = y.abs().clamp(max=fmt.max)
    exp = torch.where(a > 0, floor_log2(torch.where(a > 0, a, 1.0)), fmt.emin)
    ulp = pow2(exp.clamp(min=fmt.emin) - fmt.mbits)
    u = torch.rand(a.shape, generator=generator, device=a.device)
    r = torch.floor(a / ulp + u) * ulp
    return torch.copysign(r.clamp(max=fmt.max), y)
