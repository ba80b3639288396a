"""The fused kernel (pcc.fused) against ml_dtypes on every pair a BF16 weight block can hold: each BF16 amax a and
each BF16 x with |x| <= a, both signs.

    python bench/kernel_exhaustive.py [--step 1]

The kernel divides by a block's scale s = max(a / 448, 2^-126) (1 for a = 0) with the product by s's rounded
reciprocal and one Markstein correction (two FMAs) instead of a division; the reference is numpy's float32
division (IEEE, correctly rounded) cast to E4M3 by ml_dtypes. One row per amax (its one block: 1 x 65,536), all
x of the row's range in it; every code and scale compared. `--step k` takes every k-th amax (a quick look). Prints
the pairs compared, those that differ (the first few named) and the seconds each side took.
"""

from __future__ import annotations

import argparse
import time

import ml_dtypes
import numpy as np

from pcc import fused

WIDTH = 1 << 16  # every BF16 bit pattern: a row holds all x of its amax's range, the rest zeros


def rows(amax_bits: np.ndarray) -> np.ndarray:
    """One row per amax: every BF16 bit pattern whose magnitude is at most it (both signs, so the row's amax is
    it), zeros elsewhere."""
    every = np.arange(WIDTH, dtype=np.uint32)
    inside = (every & 0x7FFF)[None, :] <= amax_bits[:, None].astype(np.uint32)
    return np.where(inside, every, 0).astype(np.uint16)


def reference(x: np.ndarray, amax_bits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The E4M3 codes and float32 scales of rows `x` by ml_dtypes: x / s in float32, cast to E4M3."""
    a = (amax_bits.astype(np.uint32) << 16).view(np.float32)
    s = np.maximum(a / np.float32(448), np.float32(2.0**-126)).astype(np.float32)
    s[a == 0] = 1
    q = (x.astype(np.uint32) << 16).view(np.float32) / s[:, None]
    return q.astype(ml_dtypes.float8_e4m3fn).view(np.uint8), s


def kernel(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The kernel's codes and scales of rows `x`, each row one block."""
    n = len(x)
    codes, scales = np.empty(x.shape, np.uint8), np.empty(n, np.float32)
    bad = fused.fp8_fp32_blocks("bf16", x.ctypes.data, codes.ctypes.data, scales.ctypes.data, n, WIDTH, 1, WIDTH,
                                0, n)
    if bad != -1:
        raise SystemExit(f"the kernel reported block {bad} non-finite")
    return codes, scales


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--step", type=int, default=1)
    ap.add_argument("--rows", type=int, default=256, help="amax values per kernel call")
    args = ap.parse_args()
    if fused.kernel("bf16") is None:
        raise SystemExit("the fused kernel is not available here (llvmlite missing, or PCC_FUSED=0)")
    every = np.arange(0, 0x7F80, args.step, dtype=np.uint16)  # zero, subnormal and normal amax values, no inf
    pairs = differ = 0
    spent = {"kernel": 0.0, "reference": 0.0}
    named = []
    for k in range(0, len(every), args.rows):
        amax = every[k:k + args.rows]
        x = rows(amax)
        t = time.perf_counter()
        codes, scales = kernel(x)
        spent["kernel"] += time.perf_counter() - t
        t = time.perf_counter()
        want, want_scales = reference(x, amax)
        spent["reference"] += time.perf_counter() - t
        if not np.array_equal(scales, want_scales):
            raise SystemExit(f"scales differ for amax bits {amax[scales != want_scales][:5]}")
        pairs += int((((np.arange(WIDTH) & 0x7FFF)[None, :]) <= amax[:, None]).sum())
        wrong = np.nonzero(codes != want)
        differ += len(wrong[0])
        for r, c in list(zip(*wrong))[:max(0, 5 - len(named))]:
            named.append(f"amax {int(amax[r]):#06x} x {int(x[r, c]):#06x}: kernel {codes[r, c]:#04x}, "
                         f"ml_dtypes {want[r, c]:#04x}")
    print(f"{len(every):,} amax values, {pairs:,} (amax, x) pairs compared: {differ:,} codes differ")
    for line in named:
        print("  " + line)
    print(f"seconds: kernel {spent['kernel']:.1f}, ml_dtypes {spent['reference']:.1f}")
    if differ:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
