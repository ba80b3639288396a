"""Quantizer throughput of pcc.numerics beside a plain cast and a straightforward quantizer per format.

    python bench/quantize.py [--sizes 4096 8192] [--rounds 5] [--busy]

For each format, in the same process and the same run: `cast` (x.to(float8_e4m3fn), no amax, no
scale: the floor), `straightforward` (the whole-tensor quantizer public converters write: pad,
reshape into blocks, amax, scale, divide, round or cast, pack; torch's default threads), the same on
one intra-op thread (`1 thread`: the same eager kernels without OpenMP's waits, which a loaded machine
makes long), and `pcc.numerics.quantize`; where llvmlite is installed, fp8_block is pcc.fused's kernel
and a `torch path` row measures it with the kernel off. The four run interleaved, in an order that alternates each round, and
each keeps its best of the rounds, so a burst of load from other processes hits all of them
alike. The straightforward codes are checked equal to pcc's (a wrong fast quantizer proves
nothing). `--busy` runs a CPU-bound process beside the bench for its whole duration. GB/s counts
the BF16 input bytes. Cores and load average are printed before and after.
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from machine import add_busy, busy, interleaved, machine

from pcc.numerics import quantize

try:
    from pcc import fused
except ImportError:  # a pcc before the fused kernel (bench/convert.py --baseline imports this file's quantizers)
    fused = None

E2M1_MID = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])
E2M1_TIE_UP = torch.tensor([False, True, False, True, False, True, False])


def _groups(w: torch.Tensor, g: int) -> torch.Tensor:
    n, k = w.shape
    return F.pad(w.float(), (0, -k % g)).view(n, -1, g)


def _e2m1(y: torch.Tensor) -> torch.Tensor:
    """Round to E2M1 codes by searching the midpoints (ties to even), as public FP4 quantizers do."""
    a = y.abs()
    idx = torch.searchsorted(E2M1_MID, a)  # midpoints < a, plus 1 where a equals a midpoint
    on = E2M1_MID[idx.clamp(max=6)] == a
    idx = idx + (on & E2M1_TIE_UP[idx.clamp(max=6)])
    return idx.to(torch.uint8) | (torch.signbit(y).to(torch.uint8) << 3)


def _pack_nibbles(c: torch.Tensor) -> torch.Tensor:
    c = F.pad(c, (0, c.shape[-1] % 2))
    return c[..., 0::2] | (c[..., 1::2] << 4)


def straightforward_fp8_block(w: torch.Tensor, block: int = 128):
    n, k = w.shape
    nb, kb = -(-n // block), -(-k // block)
    wp = F.pad(w.float(), (0, kb * block - k, 0, nb * block - n)).view(nb, block, kb, block)
    scale = wp.abs().amax(dim=(1, 3), keepdim=True) / 448.0
    scale = torch.where(scale == 0, torch.ones_like(scale), scale)
    q = (wp / scale).clamp(-448.0, 448.0).to(torch.float8_e4m3fn)
    return q.view(nb * block, kb * block)[:n, :k], scale.view(nb, kb)


def _mx_exponent(amax: torch.Tensor, emax: int) -> torch.Tensor:
    """OCP MX v1.0: floor(log2(amax)) - emax of the element format (an all-zero block: 0)."""
    e = torch.floor(torch.log2(torch.where(amax > 0, amax, 1.0))) - emax
    return torch.where(amax > 0, e, 0.0)


def straightforward_mxfp8(w: torch.Tensor):
    g = _groups(w, 32)
    e = _mx_exponent(g.abs().amax(-1, keepdim=True), 8)
    q = (g / torch.exp2(e)).clamp(-448.0, 448.0).to(torch.float8_e4m3fn)
    return q.view(w.shape[0], -1)[:, : w.shape[1]], (e + 127).to(torch.uint8).squeeze(-1)


def straightforward_mxfp4(w: torch.Tensor):
    g = _groups(w, 32)
    e = _mx_exponent(g.abs().amax(-1, keepdim=True), 2)
    codes = _e2m1(g / torch.exp2(e)).view(w.shape[0], -1)[:, : w.shape[1]]
    return _pack_nibbles(codes), (e + 127).to(torch.uint8).squeeze(-1)


def straightforward_nvfp4(w: torch.Tensor):
    g = _groups(w, 16)
    s_enc = 448.0 * 6.0 / w.float().abs().amax()  # TransformerEngine's encode factor and block scales
    s_b = (g.abs().amax(-1, keepdim=True) * (s_enc * (1.0 / 6.0))).clamp(max=448.0).to(torch.float8_e4m3fn)
    factor = (1.0 / (s_b.float() * (1.0 / s_enc))).clamp(max=torch.finfo(torch.float32).max)
    codes = _e2m1(g * factor).view(w.shape[0], -1)[:, : w.shape[1]]
    return _pack_nibbles(codes), s_b.squeeze(-1)


def straightforward_int4(w: torch.Tensor, group: int = 128):
    g = _groups(w, group)
    s = g.abs().amax(-1, keepdim=True) / 7.0
    s = torch.where(s == 0, torch.ones_like(s), s)
    q = torch.round(g / s).clamp(-7, 7).to(torch.int64).view(w.shape[0], -1)[:, : w.shape[1]]
    u = F.pad(q + 8, (0, -w.shape[1] % 8)).view(w.shape[0], -1, 8)  # compressed-tensors' pack_to_int32
    word = sum(u[..., j] << (4 * j) for j in range(8))
    return torch.where(word >= 2**31, word - 2**32, word).to(torch.int32), s.squeeze(-1)


# format -> (pcc preset, the straightforward quantizer giving the same codes and scales)
FORMATS = {
    "fp8_block": ("fp8_block", straightforward_fp8_block),
    "mxfp8": ("mxfp8", straightforward_mxfp8),
    "mxfp4": ("mxfp4", straightforward_mxfp4),
    "nvfp4": ("nvfp4", straightforward_nvfp4),
    "int4_g128": ("int4_g128", straightforward_int4),
}


def _bytes(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.uint8)


def _one_thread(fn):
    """fn on one intra-op thread (torch's count put back after)."""
    def run():
        keep = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            return fn()
        finally:
            torch.set_num_threads(keep)
    return run


def _torch_path(fn):
    """fn with pcc.fused's kernels off: pcc.numerics.quantize's torch path."""
    def run():
        keep = dict(fused._KERNELS)
        fused._KERNELS.update(bf16=None, f32=None)
        try:
            return fn()
        finally:
            fused._KERNELS.clear()
            fused._KERNELS.update(keep)
    return run


def run(n: int, rounds: int) -> None:
    x = torch.randn(n, n, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    gb = x.numel() * x.element_size() / 1e9
    print(f"\n{n}x{n} bf16 ({gb * 1e3:.0f} MB), best of {rounds} interleaved rounds; torch threads "
          f"{torch.get_num_threads()} (straightforward, cast), pcc: its chunk workers; 1 thread: straightforward on "
          "one intra-op thread")
    print(f"{'format':<17}{'cast GB/s':>10}{'straightfwd':>12}{'1 thread':>9}{'pcc GB/s':>10}{'pcc/straightfwd':>16}"
          f"{'pcc/1 thread':>13}{'pcc/cast':>10}  same codes")
    rows = [(fmt, name, ref, lambda name=name: quantize(x, name)) for fmt, (name, ref) in FORMATS.items()]
    if fused is not None and fused.available():  # fp8_block's fused kernel (pcc.fused) is on in its row above; this row: without it
        rows.insert(1, ("  torch path", "fp8_block", FORMATS["fp8_block"][1], _torch_path(lambda: quantize(x, "fp8_block"))))
    for fmt, name, ref, pcc in rows:
        t = interleaved({"cast": lambda: x.to(torch.float8_e4m3fn), "straightforward": lambda: ref(x),
                         "1 thread": _one_thread(lambda: ref(x)), "pcc": pcc}, rounds, warm=True)
        q, (codes, _) = pcc(), ref(x)
        same = torch.equal(_bytes(q.codes), _bytes(codes))
        print(f"{fmt:<17}{gb / t['cast']:>10.2f}{gb / t['straightforward']:>12.2f}{gb / t['1 thread']:>9.2f}"
              f"{gb / t['pcc']:>10.2f}{t['straightforward'] / t['pcc']:>15.1f}x{t['1 thread'] / t['pcc']:>12.1f}x"
              f"{t['cast'] / t['pcc']:>9.2f}x  {same}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[4096, 8192])
    ap.add_argument("--rounds", type=int, default=5)
    add_busy(ap)
    args = ap.parse_args()
    with busy(args.busy):
        print(machine())
        for n in args.sizes:
            run(n, args.rounds)
        print("after: " + machine())


if __name__ == "__main__":
    main()
