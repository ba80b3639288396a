"""Quantize / dequantize throughput of pcc.numerics on a BF16 weight, next to two yardsticks.

    python bench/quantize.py [--sizes 4096 8192] [--repeat N]

GB/s counts the BF16 input bytes (2 per element) for both directions.  Yardsticks,
measured in the same run: a plain x.to(torch.float8_e4m3fn) cast (the floor: no
amax, no scale) and a straightforward block-FP8 quantizer written the way public
converters write it (pad, per-block amax, divide, clamp, cast on the whole tensor).
"""

from __future__ import annotations

import argparse
import os
import time

import torch
import torch.nn.functional as F

from pcc.numerics import quantize

SCHEMES = ("fp8_block", "mxfp8", "mxfp4", "nvfp4", "int4_g128")


def reference_block_fp8(w: torch.Tensor, block: int = 128):
    n, k = w.shape
    nb, kb = -(-n // block), -(-k // block)
    wp = F.pad(w.float(), (0, kb * block - k, 0, nb * block - n)).view(nb, block, kb, block)
    scale = wp.abs().amax(dim=(1, 3), keepdim=True) / 448.0
    scale = torch.where(scale == 0, torch.ones_like(scale), scale)
    q = (wp / scale).clamp(-448.0, 448.0).to(torch.float8_e4m3fn)
    return q.view(nb * block, kb * block)[:n, :k], scale.view(nb, kb)


def best_seconds(fn, repeat: int) -> float:
    fn()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def run(n: int, repeat: int) -> None:
    x = torch.randn(n, n, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    gb = x.numel() * x.element_size() / 1e9
    cast = gb / best_seconds(lambda: x.to(torch.float8_e4m3fn), repeat)
    ref = gb / best_seconds(lambda: reference_block_fp8(x), repeat)
    same = torch.equal(reference_block_fp8(x)[0].view(torch.uint8), quantize(x, "fp8_block").codes.view(torch.uint8))
    print(f"\n{n}x{n} bf16 ({gb * 1e3:.0f} MB), torch threads={torch.get_num_threads()}, best of {repeat}")
    print(f"{'what':<26}{'quant GB/s':>11}{'dequant GB/s':>14}{'q / cast':>10}{'q / ref':>9}")
    print(f"{'cast to e4m3 (floor)':<26}{cast:>11.2f}{'':>14}{1.0:>10.2f}{cast / ref:>9.2f}")
    print(f"{'reference block fp8':<26}{ref:>11.2f}{'':>14}{ref / cast:>10.2f}{1.0:>9.2f}")
    for name in SCHEMES:
        q = quantize(x, name)
        qs = gb / best_seconds(lambda: quantize(x, name), repeat)
        ds = gb / best_seconds(lambda: q.dequantize(torch.bfloat16), repeat)
        print(f"{name:<26}{qs:>11.2f}{ds:>14.2f}{qs / cast:>10.2f}{qs / ref:>9.2f}")
    print(f"fp8_block codes identical to the reference quantizer: {same}")


def machine() -> str:
    """Cores, load average and date, printed before and after the measurements."""
    return (f"{os.cpu_count()} cores, load average " + " ".join(f"{x:.2f}" for x in os.getloadavg())
            + time.strftime(", %Y-%m-%d %H:%M %Z"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[4096, 8192])
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    print(machine())
    for n in args.sizes:
        run(n, args.repeat)
    print("after: " + machine())


if __name__ == "__main__":
    main()
