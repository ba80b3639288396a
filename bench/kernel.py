"""The fused block-FP8 kernel (pcc.fused) on a MoE's experts, and what reading its input costs around it.

    python bench/kernel.py [--experts 512] [--rounds 5]

One thread, CPU seconds (`time.thread_time`), each row its best of `--rounds`, rows interleaved in an order that
alternates each round. BF16 experts [384, 1024] (the bench MoE's, bench/convert.py) with random normal
values, 128 x 128 blocks:

- `kernel, 4 experts (hot)`: the kernel over the same 4 experts again and again (its input in the core's cache);
- `kernel, N experts`: over N experts held in memory, each quantized once a round;
- `pread, then the kernel from 1 MiB`: each expert read from a file of the N experts (in the page cache) into a
  1 MiB buffer, then quantized from it while it is in the core's cache (pcc.convert.fast's chunk workers);
- `pread into a 32 MiB ring, kernel later`: read into a ring, quantized 20 experts later (pcc before 309ebe7:
  a reader thread and the chunk workers);
- `pread alone`: the reads of the row before, into the ring.

ns/element counts BF16 weights. Compare two trees by running this file under each (`PYTHONPATH=TREE`).
"""

from __future__ import annotations

import argparse
import mmap
import os
import tempfile
import time

import numpy as np
from machine import machine, order

from pcc import fused
from pcc.convert.shards import buffer_address as _address

ROWS, COLS, BLOCK = 384, 1024, 128


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--experts", type=int, default=512)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    if fused.kernel("bf16") is None:
        raise SystemExit("the fused kernel is not available here (llvmlite missing, or PCC_FUSED=0)")
    before, n, size = machine(), args.experts, ROWS * COLS
    rng = np.random.default_rng(0)
    bits = (rng.standard_normal((n, ROWS, COLS), dtype=np.float32) * 0.02).view(np.uint32) >> 16
    experts = np.ascontiguousarray(bits.astype(np.uint16))
    codes, scales = mmap.mmap(-1, 16 << 20), np.empty(ROWS // BLOCK * COLS // BLOCK, np.float32)
    at_codes, at_scales = _address(codes), scales.ctypes.data
    blocks = ROWS // BLOCK

    def quantize(x: int, k: int) -> None:
        where = k * size % ((16 << 20) - size)
        fused.fp8_fp32_blocks("bf16", x, at_codes + where, at_scales, ROWS, COLS, BLOCK, BLOCK, 0, blocks)

    with tempfile.NamedTemporaryFile(dir=os.environ.get("TMPDIR", "/tmp"), suffix=".bin") as f:
        f.write(experts.tobytes())
        f.flush()
        fd = f.fileno()
        os.pread(fd, 1, 0)
        small, ring = mmap.mmap(-1, 1 << 20), mmap.mmap(-1, 32 << 20)
        small_view, ring_view, ring_at = memoryview(small), memoryview(ring), _address(ring)
        nbytes = 2 * size

        def hot():
            for k in range(n):
                quantize(experts[k % 4].ctypes.data, k)

        def cold():
            for k in range(n):
                quantize(experts[k].ctypes.data, k)

        def fused_read():
            for k in range(n):
                os.preadv(fd, [small_view[:nbytes]], k * nbytes)
                quantize(_address(small), k)

        def ring_read(kernel: bool = True):
            pending = []
            for k in range(n):
                at = k * nbytes % ((32 << 20) - nbytes)
                os.preadv(fd, [ring_view[at:at + nbytes]], k * nbytes)
                pending.append((at, k))
                if len(pending) == 20 or k == n - 1:
                    for at, j in pending if kernel else ():
                        quantize(ring_at + at, j)
                    pending = []

        rows = {"kernel, 4 experts (hot)": hot, f"kernel, {n} experts": cold,
                "pread, then the kernel from 1 MiB": fused_read, "pread into a 32 MiB ring, kernel later": ring_read,
                "pread alone": lambda: ring_read(False)}
        for fn in rows.values():
            fn()
        best = dict.fromkeys(rows, float("inf"))
        for r in range(args.rounds):
            for name in order(list(rows), r):
                t = time.thread_time()
                rows[name]()
                best[name] = min(best[name], time.thread_time() - t)
    print(before)
    print(f"{n} BF16 experts [{ROWS}, {COLS}] ({n * nbytes / 1e9:.2f} GB), best of {args.rounds}, one thread")
    print(f"{'':40} {'CPU s':>7} {'ns/element':>11}")
    for name, s in best.items():
        print(f"{name:40} {s:7.3f} {s / (n * size) * 1e9:11.3f}")
    print("after: " + machine())


if __name__ == "__main__":
    main()
