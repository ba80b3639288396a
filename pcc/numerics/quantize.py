"""quantize / dequantize / qdq: codes and scales as the engines compute them.

Every grouping is one case.  The tensor is viewed as [B*rows, cols] and each
row as nbc runs of C columns (zero-padded at the right edge); a scale block is
R consecutive rows of one run (R = 1 except for 2-D blocks and whole-tensor
scaling).  Zero padding never changes an amax, so a partial edge block is
scaled by its real elements only; codes are cropped back to the logical shape.

Work is done in row chunks of about a million elements (whole scale blocks): float32
temporaries then stay in cache and are recycled by the allocator instead of being
page-faulted in afresh, which is most of the cost of a whole-tensor implementation on
CPU.  A chunk is read once: its block amax, scales and codes are computed together
(a whole-tensor amax, for tensor scaling and NVFP4's outer scale, is one pass before).

Chunks run on a pool of worker threads, one per usable core and kept on it, each with ONE
intra-op thread, taking chunks from a shared queue.  torch's own OpenMP parallelism waits at
every operator for its slowest thread; on a loaded machine one of them is often
descheduled by another process, and chunked quantizers ran 5-10x slower with two
OpenMP threads than with one (bench/quantize.py, docs/numerics.md "Speed").  With a
queue, a core that is free takes the next chunk instead.  Stochastic rounding draws
from its generator in chunk order, so it runs its chunks in order in the caller.
"""

from __future__ import annotations

import math
import os
import threading
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Callable, Iterable

import torch
import torch.nn.functional as F

from . import formats as fm
from .packing import pack_e2m1x2, pack_int32x8, unpack_e2m1x2, unpack_int32x8
from pcc.contract.scheme import Grouping, Scheme, preset

_PASSTHROUGH_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
_FP8 = {"fp8_e4m3": fm.E4M3, "fp8_e5m2": fm.E5M2, "mxfp8": fm.E4M3}
_INT_BITS = {"int4": 4, "int8": 8}
# Exponent of the element format's largest binade (OCP MX v1.0; FP8 for UE8M0-scaled block FP8).
_MX_EMAX = {"mxfp8": 8, "mxfp4": 2, "fp8_e4m3": 8, "fp8_e5m2": 15}
_CHUNK = 1 << 20  # elements per row chunk
_POOL: ThreadPoolExecutor | None = None
_POOL_LOCK = threading.Lock()
_WORKER = threading.local()


def _cpus() -> list[int] | None:
    """The CPUs the calling thread may run on (its affinity mask, which containers and taskset
    narrow; a chunk worker's is its one core), or None where the platform does not say (not Linux)."""
    try:
        return sorted(os.sched_getaffinity(0))
    except AttributeError:
        return None


def cores() -> int:
    """CPUs this process may run on."""
    cpus = _cpus()
    return max(1, len(cpus)) if cpus is not None else os.cpu_count() or 1


def _pool() -> ThreadPoolExecutor:
    """The chunk workers, started once: one per core, each with one intra-op thread, each kept on
    a core of its own (where the platform lets a thread set its affinity).

    Unpinned, the kernel's balancer left the converter's threads sharing one core beside a
    CPU-bound process that had the other to itself (both cores looked fully busy to it); pinned,
    each core's run queue is shared fairly: a conversion beside one such process took 2.6 s
    instead of 3.3, beside two 3.4 instead of 4.6, and the same quiet (docs/numerics.md "Speed").
    Chunks come from a shared queue, so a worker whose core is crowded simply takes fewer.
    torch.set_num_threads is per thread for the thread that calls it, but also sets the
    default of threads that start later; the caller's own count is put back once every
    worker has set its own."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            n = cores()
            keep = torch.get_num_threads()
            ready = threading.Barrier(n + 1)
            cpus = iter(_cpus() or [])

            def init():
                _WORKER.active = True
                torch.get_num_threads()  # torch initialises a thread's count on first use: do that first
                torch.set_num_threads(1)
                cpu = next(cpus, None)  # (each worker runs init once, holding the GIL here)
                if cpu is not None:
                    try:
                        os.sched_setaffinity(0, {cpu})  # 0: the calling thread, on Linux
                    except OSError:  # a sandbox that refuses it: the kernel places the thread
                        pass
                ready.wait()

            pool = ThreadPoolExecutor(n, thread_name_prefix="pcc-chunks")
            for _ in range(n):  # each blocks at the barrier, so each starts its own thread
                pool.submit(init)
            ready.wait()
            torch.set_num_threads(keep)
            _POOL = pool
    return _POOL


def _forget_pool() -> None:
    """A forked child has none of its parent's threads: it starts its own pool when it needs one."""
    global _POOL, _POOL_LOCK
    _POOL, _POOL_LOCK = None, threading.Lock()


if hasattr(os, "register_at_fork"):  # POSIX
    os.register_at_fork(after_in_child=_forget_pool)


def run_chunks(fn: Callable, items: Iterable, ordered: bool = False) -> None:
    """fn(item) for every item; on the chunk workers unless there is one item, the caller is a
    worker itself, or `ordered` (in order, in the caller). Every call has finished when this
    returns; the first item's error (in item order) is raised."""
    items = list(items)
    if ordered or len(items) < 2 or getattr(_WORKER, "active", False) or cores() < 2:
        for it in items:
            fn(it)
        return
    futures = [_pool().submit(fn, it) for it in items]
    wait(futures)
    for f in futures:
        f.result()


@dataclass(frozen=True)
class Geometry:
    """How a tensor of `shape` splits into scale blocks under a grouping."""

    shape: tuple[int, ...]
    batch: int  # leading slices that never share a block (block grouping on >2-D tensors)
    rows: int
    cols: int
    block_rows: int
    block_cols: int
    scale_shape: tuple[int, ...]

    @property
    def grid(self) -> tuple[int, int, int]:
        """Scale blocks as [B, nbr, nbc]."""
        return (self.batch, math.ceil(self.rows / self.block_rows), math.ceil(self.cols / self.block_cols))

    def per_row(self, t: torch.Tensor) -> torch.Tensor:
        """Per-block values [B, nbr, nbc] -> repeated for each tensor row: [B*rows, nbc, 1]."""
        t = t.reshape(self.grid).repeat_interleave(self.block_rows, dim=1)[:, : self.rows]
        return t.reshape(-1, t.shape[-1], 1)

    def row_slices(self, nrows: int, align: int = 1) -> list[slice]:
        """Row chunks of about _CHUNK elements, each a whole number of `align` rows."""
        nbc, c = self.grid[2], self.block_cols
        step = max(1, _CHUNK // (nbc * c) // align) * align
        return [slice(i, min(i + step, nrows)) for i in range(0, nrows, step)]

    def blocked(self, xc: torch.Tensor) -> torch.Tensor:
        """Rows [r, cols] -> [r, nbc, C], zero-padded at the right edge."""
        nbc, c = self.grid[2], self.block_cols
        pad = nbc * c - self.cols
        if pad:
            xc = F.pad(xc, (0, pad))
        return xc.reshape(xc.shape[0], nbc, c)

    def map_rows(self, x2: torch.Tensor, out: torch.Tensor, fn: Callable, *per_row: torch.Tensor,
                 pre: Callable | None = None, post: Callable | None = None) -> torch.Tensor:
        """out[rows] = post(crop(fn(chunk, per-row chunks))) for every row chunk of x2 (on the chunk workers)."""
        def one(sl):
            xc = x2[sl]
            xc = self.blocked(pre(xc) if pre is not None else xc)
            res = fn(xc, *(t[sl] for t in per_row)).reshape(xc.shape[0], -1)[:, : self.cols]
            out[sl] = post(res) if post else res

        run_chunks(one, self.row_slices(x2.shape[0]))
        return out


def geometry(shape: torch.Size | tuple[int, ...], grouping: Grouping) -> Geometry:
    shape = tuple(shape)
    if 0 in shape:
        raise ValueError(f"cannot quantize an empty tensor of shape {shape}")
    cols = shape[-1] if shape else 1
    lead = shape[:-1]
    if grouping.kind == "block":
        if len(shape) < 2:
            raise ValueError(f"block grouping needs a tensor of at least 2 dims, got shape {shape}")
        rows, batch = shape[-2], math.prod(shape[:-2])
        r, c = grouping.rows, grouping.cols
        scale_shape = shape[:-2] + (math.ceil(rows / r), math.ceil(cols / c))
        return Geometry(shape, batch, rows, cols, r, c, scale_shape)
    rows = math.prod(lead)
    if grouping.kind == "tensor":
        return Geometry(shape, 1, rows, cols, rows, cols, ())
    if grouping.kind in ("row", "token"):
        return Geometry(shape, 1, rows, cols, 1, cols, lead + (1,))
    c = grouping.run
    return Geometry(shape, 1, rows, cols, 1, c, lead + (math.ceil(cols / c),))


def _rows(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(-1, t.shape[-1] if t.dim() else 1)


@dataclass
class Quantized:
    """A quantized tensor: codes + scales in engine storage dtypes, and how to undo them.

    codes: float8 tensor (fp8_*, mxfp8); uint8 E2M1 codes, one per element or two per
    byte with e2m1x2 (mxfp4, nvfp4); int8 codes, or int32 words with int32x8 (int4/int8);
    the cast tensor for pass-through formats.
    scales: float32 (fp32, pow2), uint8 E8M0 bytes (e8m0), float8_e4m3fn (nvfp4);
    shape Geometry.scale_shape; None for pass-through formats.
    outer_scale: nvfp4 only, float32 scalar S_enc = 448*6/amax(tensor) (an encode factor).
    zero_point: asymmetric integer schemes only, int8 of the scales' shape.
    """

    codes: torch.Tensor
    scales: torch.Tensor | None
    shape: torch.Size
    scheme: Scheme
    role: str
    outer_scale: torch.Tensor | None = None
    zero_point: torch.Tensor | None = None

    @property
    def grouping(self) -> Grouping | None:
        return self.scheme.grouping_of(self.role)

    @property
    def geometry(self) -> Geometry:
        return geometry(self.shape, self.grouping)

    def _decode_rows(self, codes: torch.Tensor) -> torch.Tensor:
        """Rows of stored codes -> float32 element values (zero point not removed)."""
        fmt, cols = self.scheme.format, self.geometry.cols
        if fmt in _FP8:
            return fm.decode_fp8(codes)
        if fmt in ("mxfp4", "nvfp4"):
            return fm.decode_e2m1(unpack_e2m1x2(codes, cols) if self.scheme.packing else codes)
        return (unpack_int32x8(codes, cols) if self.scheme.packing else codes).float()

    def element_values(self) -> torch.Tensor:
        """Codes as float32 values of the element format (zero point not removed), logical shape."""
        return self._decode_rows(_rows(self.codes)).reshape(self.shape)

    def block_scales(self) -> torch.Tensor:
        """Decoded float32 multiplier of each block, shaped [B, nbr, nbc]."""
        s = self.scales
        if self.scheme.scale == "e8m0":
            s = fm.decode_e8m0(s)
        elif self.scheme.scale == "e4m3_fp32":
            s = s.float() * (1.0 / self.outer_scale)
        return s.float().reshape(self.geometry.grid)

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        if self.scheme.passthrough:
            return self.codes.to(dtype)
        geo, codes = self.geometry, _rows(self.codes)
        out = torch.empty(codes.shape[0], geo.cols, dtype=dtype, device=codes.device)
        scale = geo.per_row(self.block_scales())
        if self.zero_point is None:
            geo.map_rows(codes, out, torch.mul, scale, pre=self._decode_rows)
        else:
            zp = geo.per_row(self.zero_point.float())
            geo.map_rows(codes, out, lambda v, s, z: (v - z) * s, scale, zp, pre=self._decode_rows)
        return out.reshape(self.shape)


def _as_scheme(scheme: Scheme | str | dict) -> Scheme:
    """A Scheme from itself, a preset name or a scheme dict; an invalid encoding is a ValueError
    with the same words the checker's PCC302 uses."""
    if isinstance(scheme, str):
        found = preset(scheme)
        if found is None:
            raise ValueError(f"unknown scheme preset {scheme!r}")
        scheme = found
    elif not isinstance(scheme, Scheme):
        scheme = Scheme.model_validate(scheme)
    problems = scheme.problems()
    if problems:
        raise ValueError(f"scheme {scheme.text()}: " + "; ".join(m for m, _ in problems))
    return scheme


def _check_finite(amax: torch.Tensor, amin: torch.Tensor, geo: Geometry, name: str | None, grouping: Grouping):
    bad = ~(torch.isfinite(amax) & torch.isfinite(amin))
    if bool(bad.any()):
        idx = tuple(int(i) for i in bad.nonzero()[0])  # (batch, block row, block col)
        where = "the tensor" if grouping.kind == "tensor" else \
            f"scale block {idx if geo.batch > 1 else idx[1:]} of grouping '{grouping}'"
        raise ValueError(f"{name or 'tensor'}: NaN or inf in {where}; refusing to compute a scale from it")


def _fp32_scale(amax: torch.Tensor, qmax: float) -> torch.Tensor:
    """amax / qmax; an all-zero block gets 1.0, an underflowing one the smallest normal."""
    s = (amax / qmax).clamp(min=torch.finfo(torch.float32).tiny)
    return torch.where(amax == 0, torch.ones_like(s), s)


def _pow2_scale(amax: torch.Tensor, qmax: float) -> torch.Tensor:
    """2**ceil(log2(amax/qmax)), via the encode factor qmax/amax rounded down to a power of two."""
    enc = fm.floor_pow2((qmax / amax).clamp(max=fm.FLT_MAX))
    return torch.where(amax == 0, torch.ones_like(enc), 1.0 / enc)


def _e8m0_exponent(amax: torch.Tensor, emax_elem: int, rule: str = "ocp", qmax: float = 0.0) -> torch.Tensor:
    """E8M0 shared exponent (int32, in [-127, 127]); an all-zero block -> 0.

    "ocp" (OCP MX v1.0): floor(log2(amax)) - emax_elem; the block's largest values may clip. It is the
    float32 exponent field of amax (a subnormal amax is below 2^-126 and clamps to -127 either way),
    read from its bits: two integer ops where frexp and its masks were ten (a fifth of MXFP8's time).
    "ceil" (TransformerEngine MXFP8, ModelOpt/SGLang MXFP4): ceil(log2(amax / qmax)), the
    smallest power of two that never clips.
    """
    if rule == "ceil":
        safe = torch.where(amax > 0, amax, 1.0)
        mant, exp2 = torch.frexp(safe / qmax)  # v = mant * 2**exp2, mant in [0.5, 1)
        exp = torch.where(amax > 0, exp2 - (mant == 0.5).to(exp2.dtype), 0)
    else:
        bits = amax.view(torch.int32)
        exp = ((bits >> 23) - (127 + emax_elem)).masked_fill_(bits == 0, 0)
    return exp.clamp_(-127, 127)


def _nvfp4_outer(g: torch.Tensor) -> torch.Tensor:
    """NVFP4's encode factor S_enc = 448*6 / amax(tensor), 1.0 if that is 0 (TransformerEngine)."""
    # a tensor numerator: `2688 / g` with a Python float is computed as g.reciprocal() * 2688, an ulp off
    # the float32 quotient TransformerEngine divides for about a quarter of amaxes
    top = torch.tensor(fm.E4M3.max * fm.E2M1.max, dtype=torch.float32, device=g.device)
    s_enc = torch.div(top, g).clamp(max=fm.FLT_MAX)
    return torch.where((g == 0) | (s_enc == 0), torch.ones_like(s_enc), s_enc)


def _nvfp4_block_scales(absmax: torch.Tensor, s_enc: torch.Tensor) -> torch.Tensor:
    """Block decode scales s_b = e4m3(amax_b * (S_enc * (1/6))), saturating at 448 (TransformerEngine)."""
    inv6 = torch.tensor(1.0 / fm.E2M1.max, dtype=torch.float32, device=absmax.device)
    return fm.encode_fp8((absmax * (s_enc * inv6)).clamp(max=fm.FLT_MAX), fm.E4M3)


def _float_encoder(amax: torch.Tensor, scheme: Scheme, generator, outer: torch.Tensor | None, own_amax: bool):
    """Scales, per-block factor and per-chunk encoder of a float scheme; `outer` is NVFP4's S_enc.

    FP8 values are clamped to the format's range only where the scale lets them exceed it: the OCP E8M0
    rule (it clips by design), stochastic rounding, and an amax given from outside. An fp32 scale
    fl(amax/max) (at least the smallest normal), a pow2 one >= amax/max, and the no-clip E8M0 rule
    bound |x/s| by max*(1+2^-22), which the cast rounds to max (the clamp was a tenth of fp8_block's
    time, bench/quantize.py)."""
    fmt = scheme.format
    elem = fm.E2M1 if fmt in ("mxfp4", "nvfp4") else _FP8[fmt]
    if fmt == "nvfp4":
        scales = _nvfp4_block_scales(amax, outer)
        factor = (1.0 / (scales.float() * (1.0 / outer))).clamp(max=fm.FLT_MAX)
        op = torch.mul  # TE multiplies by the block's encode factor
    else:
        if scheme.scale == "e8m0":
            exp = _e8m0_exponent(amax, _MX_EMAX[fmt], scheme.scale_rule, elem.max)
            scales, factor = (exp + 127).to(torch.uint8), fm.pow2(exp)
        else:
            scales = (_pow2_scale if scheme.scale == "pow2" else _fp32_scale)(amax, elem.max)
            factor = scales
        op = torch.div  # SGLang's kernels and public converters compute x / scale

    clip = (scheme.rounding == "stochastic" or not own_amax
            or scheme.scale not in ("fp32", "pow2") and not (scheme.scale == "e8m0" and scheme.scale_rule == "ceil"))

    def fn(xc, f, own=False):
        y = op(xc, f, out=xc) if own else op(xc, f)  # float32: f is float32 and x no wider
        if scheme.rounding == "stochastic":
            y = fm.stochastic_round(y, elem, generator)
        if elem is fm.E2M1:
            return fm.encode_e2m1(y)
        return y.clamp_(-elem.max, elem.max) if clip else y

    code_dtype = torch.uint8 if elem is fm.E2M1 else elem.dtype
    return scales, None, (factor,), fn, code_dtype


def _int_encoder(amax: torch.Tensor, amin: torch.Tensor, scheme: Scheme, generator):
    """Scales, zero points and per-chunk rounding of an integer scheme (codes as float)."""
    bits = _INT_BITS[scheme.format]
    if scheme.symmetric:
        qmin, qmax = -(2 ** (bits - 1) - 1), 2 ** (bits - 1) - 1
        scales = (_pow2_scale if scheme.scale == "pow2" else _fp32_scale)(amax, qmax)
        zp = torch.zeros_like(scales)
    else:
        qmin, qmax = -(2 ** (bits - 1)), 2 ** (bits - 1) - 1
        lo, hi = amin.clamp(max=0), amax.clamp(min=0)  # the range always holds 0 exactly
        scales = _fp32_scale(hi - lo, qmax - qmin)
        zp = torch.round(qmin - lo / scales).clamp(qmin, qmax)

    def fn(xc, s, z, own=False):
        y = torch.div(xc, s, out=xc) if own else xc / s
        if not scheme.symmetric:  # (z is 0 when symmetric: adding it would only turn -0.0 into +0.0)
            y = y.add_(z)
        if scheme.rounding == "stochastic":
            y = torch.floor(y + torch.rand(y.shape, generator=generator, device=y.device))
        else:
            y = torch.round(y)  # half to even
        return y.clamp_(qmin, qmax)

    zero_point = None if scheme.symmetric else zp.to(torch.int8)
    return scales, zero_point, (scales, zp), fn, torch.int8


# Magnitude bits of floats: for x >= 0 their order as integers is their order as values
# (subnormals, inf and NaN above inf included), so max|x| is an integer max of (bits & mask);
# and the magnitude at and above which a value is inf or NaN (exponent all ones).
_MAGNITUDE = {torch.bfloat16: (torch.int16, 0x7FFF, 0x7F80), torch.float16: (torch.int16, 0x7FFF, 0x7C00),
              torch.float32: (torch.int32, 0x7FFFFFFF, 0x7F800000)}


def _stats(xc: torch.Tensor, signed: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Chunk [r, nbc, C] as stored -> per row and run max|x| (or max and min when `signed`), float32.
    Magnitudes are compared as integers: exact, without a float32 abs (for BF16/FP16, of half its bytes)."""
    if signed:
        xs = xc.float()
        return xs.amax(-1), xs.amin(-1)
    if xc.dtype in _MAGNITUDE:
        as_int, mask, _ = _MAGNITUDE[xc.dtype]
        return (xc.view(as_int) & mask).amax(-1).view(xc.dtype).float(), None
    return xc.float().abs().amax(-1), None


def _over_rows(t: torch.Tensor, r: int, reduce: Callable) -> torch.Tensor:
    """Per-row values [rows, nbc] -> reduced over each `r` rows (the last group zero-padded)."""
    pad = -t.shape[0] % r
    if pad:
        t = F.pad(t, (0, 0, 0, pad))
    return reduce(t.view(-1, r, t.shape[-1]), dim=1)


def all_finite(x: torch.Tensor) -> bool:
    """No NaN or inf in `x`: BF16/FP16/FP32 by the integer max of their magnitude bits (exact, several
    times cheaper than torch.isfinite on CPU), in chunks on the chunk workers."""
    if not x.is_floating_point():
        return True
    bits = _MAGNITUDE.get(x.dtype)
    flat = x.reshape(-1)
    parts = [slice(i, i + _CHUNK) for i in range(0, flat.numel(), _CHUNK)]
    found = [True] * len(parts)

    def scan(k):
        c = flat[parts[k]]
        if bits is None:  # float64 as it is; FP8 widened (isfinite has no FP8 kernel)
            found[k] = bool(torch.isfinite(c if c.dtype == torch.float64 else c.float()).all())
        else:
            as_int, mask, top = bits
            found[k] = int((c.view(as_int) & mask).max()) < top

    run_chunks(scan, range(len(parts)))
    return all(found)


def tensor_amax(x: torch.Tensor, name: str | None = None) -> torch.Tensor:
    """max |x| as a float32 scalar, read in row chunks on the chunk workers: the whole-tensor amax that
    tensor scaling and NVFP4's outer scale need, computed a piece at a time (the max of the pieces'
    amaxes is the tensor's, exactly) or over the members of a fused group. Raises ValueError naming
    `name` if `x` holds NaN or inf."""
    if not x.is_floating_point():
        raise ValueError(f"{name or 'tensor'}: quantize needs a floating tensor, got {x.dtype}")
    geo = geometry(x.shape, Grouping.model_validate({"kind": "row"}))
    x2 = x.reshape(-1, geo.cols)
    parts = geo.row_slices(x2.shape[0])
    found: list = [None] * len(parts)

    def scan(k):
        found[k] = _stats(geo.blocked(x2[parts[k]]), False)[0].amax()

    run_chunks(scan, range(len(parts)))
    g = torch.stack(found).amax()
    if not bool(torch.isfinite(g)):
        raise ValueError(f"{name or 'tensor'}: NaN or inf in the tensor; refusing to compute a scale from it")
    return g


def quantize(x: torch.Tensor, scheme: Scheme | str | dict, role: str = "weight", name: str | None = None,
             generator: torch.Generator | None = None, amax: torch.Tensor | None = None,
             out: torch.Tensor | None = None) -> Quantized:
    """Quantize `x` as `scheme` prescribes for `role`; `generator` feeds stochastic rounding.

    `amax` (tensor scaling and NVFP4's outer scale, symmetric schemes): the whole-tensor amax to use
    instead of x's own (`tensor_amax`, which refuses NaN/inf): of the whole weight when `x` is rows of
    it, so the pieces are the whole tensor's codes and scales, or of a fused group that shares one
    global scale. Raises ValueError naming `name` and the scale block if `x` holds NaN or inf.
    `out`: a contiguous 1-D uint8 tensor of at least `codes_nbytes` bytes that the codes are written
    into (pass-through formats ignore it: their codes are x cast); a caller that reuses its buffers
    spares the kernel faulting in and zeroing fresh pages for every tensor (docs/numerics.md "Speed").
    """
    scheme = _as_scheme(scheme)
    if scheme.passthrough:
        return Quantized(x.to(_PASSTHROUGH_DTYPES[scheme.format]), None, x.shape, scheme, role)
    if not x.is_floating_point():
        raise ValueError(f"{name or 'tensor'}: quantize needs a floating tensor, got {x.dtype}")
    grouping = scheme.grouping_of(role)
    geo = geometry(x.shape, grouping)
    x2 = x.reshape(-1, geo.cols)
    if amax is None and grouping.kind != "tensor" and _fusable(x2, scheme, geo):
        fast = _fused_fp8(x2, geo, out)
        if fast is not None:  # (None: no kernels, or NaN/inf somewhere, which the path below names)
            codes, scales = fast
            return Quantized(codes.reshape(tuple(x.shape[:-1]) + (geo.cols,)), scales.reshape(geo.scale_shape),
                             x.shape, scheme, role)
    is_int = scheme.format in _INT_BITS
    signed = is_int and not scheme.symmetric
    stochastic = scheme.rounding == "stochastic"
    wide = x.dtype == torch.float64  # divided in float64, as x / scale promotes; stats in float32
    narrow = x.dtype in (torch.bfloat16, torch.float16)  # its float32 copy is ours to overwrite
    b, nbr, nbc = geo.grid
    rows_per_batch = geo.rows

    def encoder(amax, amin, outer):  # -> scales, zero points, per-block factors, chunk encoder, code dtype
        if is_int:
            return _int_encoder(amax, amin, scheme, generator)
        return _float_encoder(amax, scheme, generator, outer, given is None)

    # A whole-tensor amax first where the scale needs one: tensor scaling, NVFP4's outer scale.
    given = amax
    whole = grouping.kind == "tensor"
    outer = None
    if amax is not None:
        if signed or not (whole or scheme.format == "nvfp4"):
            raise ValueError(f"{name or 'tensor'}: a given amax is for symmetric tensor scaling and NVFP4, "
                             f"not {scheme.text()}")
        g = amax.to(torch.float32).reshape(())
        if scheme.format == "nvfp4":
            outer = _nvfp4_outer(g)
        if whole:
            amax, amin = g.reshape(1, 1, 1), (-g).reshape(1, 1, 1)
    elif whole or scheme.format == "nvfp4":
        parts = geo.row_slices(x2.shape[0])
        found: list = [None] * len(parts)

        def scan(k):
            hi, lo = _stats(geo.blocked(x2[parts[k]]), signed)
            found[k] = (hi.amax(), lo.amin() if signed else None)

        run_chunks(scan, range(len(parts)))
        g = torch.stack([f[0] for f in found]).amax()
        g_lo = torch.stack([f[1] for f in found]).amin() if signed else -g
        if scheme.format == "nvfp4":
            outer = _nvfp4_outer(g)
        if whole:
            amax, amin = g.reshape(1, 1, 1), g_lo.reshape(1, 1, 1)
            _check_finite(amax, amin, geo, name, grouping)

    probe = encoder(torch.ones(1, 1), torch.zeros(1, 1), outer if outer is not None else torch.ones(()))
    post, code_dtype = None, probe[4]
    cols = _stored_cols(scheme, geo.cols)
    if scheme.packing == "e2m1x2":
        post = pack_e2m1x2
    elif scheme.packing == "int32x8":
        post, code_dtype = (lambda r: pack_int32x8(r.to(torch.int8))), torch.int32
    codes = _codes_storage(out, (x2.shape[0], cols), code_dtype, x.device)

    if whole:
        scales, zp, per_block, fn, _ = encoder(amax.reshape(1, 1), amin.reshape(1, 1), outer)
        factors = tuple(t.reshape(1, 1, 1) for t in per_block)

        def encode_rows(sl):
            xc = geo.blocked(x2[sl] if wide else x2[sl].float())
            res = fn(xc, *factors, own=narrow).reshape(xc.shape[0], -1)[:, : geo.cols]
            codes[sl] = post(res) if post else res

        run_chunks(encode_rows, geo.row_slices(x2.shape[0]), ordered=stochastic)
    else:
        # Chunks of whole block rows, never across a batch slice: its amax, scales and codes at once.
        r = geo.block_rows
        amax = torch.empty(b * nbr, nbc, dtype=torch.float32, device=x.device)
        amin = torch.empty_like(amax) if signed else None
        scales = torch.empty(b * nbr, nbc, dtype=probe[0].dtype, device=x.device)
        zp = torch.empty(b * nbr, nbc, dtype=torch.int8, device=x.device) if signed else None
        nonfinite: list[slice] = []
        work = [(i, sl.start // r, sl) for i in range(b)
                for sl in geo.row_slices(rows_per_batch, r)]

        def encode_blocks(item):
            i, j0, sl = item
            rows = slice(i * rows_per_batch + sl.start, i * rows_per_batch + sl.stop)
            raw = geo.blocked(x2[rows])
            hi, lo = _stats(raw, signed)
            blocks = slice(i * nbr + j0, i * nbr + j0 + math.ceil((sl.stop - sl.start) / r))
            a_hi = _over_rows(hi, r, torch.amax) if r > 1 else hi
            a_lo = (_over_rows(lo, r, torch.amin) if r > 1 else lo) if signed else -a_hi
            amax[blocks] = a_hi
            if signed:
                amin[blocks] = a_lo
            if not bool(torch.isfinite(a_hi).all()) or (signed and not bool(torch.isfinite(a_lo).all())):
                nonfinite.append(blocks)
            s, z, per_block, fn, _ = encoder(a_hi, a_lo, outer)
            scales[blocks] = s
            if signed:
                zp[blocks] = z
            n = raw.shape[0]
            factors = [(t.repeat_interleave(r, 0)[:n] if r > 1 else t).unsqueeze(-1) for t in per_block]
            res = fn(raw if wide else raw.float(), *factors, own=narrow).reshape(n, -1)[:, : geo.cols]
            codes[rows] = post(res) if post else res

        run_chunks(encode_blocks, work, ordered=stochastic)
        if nonfinite:  # the error names the first bad block of the whole grid
            _check_finite(amax.view(b, nbr, nbc), amin.view(b, nbr, nbc) if signed else -amax.view(b, nbr, nbc),
                          geo, name, grouping)
    codes = codes.reshape(tuple(x.shape[:-1]) + (cols,)) if x.dim() else codes.reshape(())
    scales = scales.reshape(geo.scale_shape)
    if zp is not None:
        zp = zp.reshape(geo.scale_shape)
    return Quantized(codes, scales, x.shape, scheme, role, outer, zp)


def _fusable(x2: torch.Tensor, scheme: Scheme, geo: Geometry) -> bool:
    """Does `pcc.fused` quantize this (given kernels): E4M3 scaled by float32 blocks, rows or runs of
    its own amax, rounded to nearest, from a contiguous BF16 or float32 CPU tensor (block grouping of 2-D)."""
    return (scheme.format == "fp8_e4m3" and scheme.scale == "fp32" and scheme.rounding == "nearest_even"
            and scheme.packing is None and geo.batch == 1 and x2.dtype in (torch.bfloat16, torch.float32)
            and x2.device.type == "cpu" and x2.is_contiguous())


def _fused_fp8(x2: torch.Tensor, geo: Geometry, out: torch.Tensor | None):
    """Codes [rows, cols] and float32 scales [nbr, nbc] from the fused kernel, block rows of about _CHUNK
    elements on the chunk workers; None without the kernels or where a block holds NaN or inf."""
    from pcc import fused

    element = "bf16" if x2.dtype == torch.bfloat16 else "f32"
    if fused.kernel(element) is None:
        return None
    rows, cols = x2.shape
    r, c = geo.block_rows, geo.block_cols
    nbr, nbc = -(-rows // r), -(-cols // c)
    codes = _codes_storage(out, (rows, cols), torch.float8_e4m3fn, x2.device)
    scales = torch.empty(nbr, nbc, dtype=torch.float32)
    step = max(1, _CHUNK // (r * cols))
    bad: list[int] = []

    def run(first):
        if fused.fp8_fp32_blocks(element, x2.data_ptr(), codes.data_ptr(), scales.data_ptr(), rows, cols, r, c,
                                 first, min(first + step, nbr)) >= 0:
            bad.append(first)

    run_chunks(run, range(0, nbr, step))
    return None if bad else (codes, scales)


# packing -> (elements per stored code, bytes per stored code); unpacked codes are one byte each
_PACKED = {None: (1, 1), "e2m1x2": (2, 1), "int32x8": (8, 4)}


def _stored_cols(scheme: Scheme, cols: int) -> int:
    """Stored codes per row of `cols` elements."""
    return math.ceil(cols / _PACKED[scheme.packing][0])


def codes_nbytes(shape: torch.Size | tuple[int, ...], scheme: Scheme | str | dict, role: str = "weight") -> int:
    """Bytes of the codes `quantize` makes of a tensor of `shape` (0 for pass-through formats): the size
    of an `out` buffer."""
    scheme = _as_scheme(scheme)
    if scheme.passthrough:
        return 0
    geo = geometry(shape, scheme.grouping_of(role))
    return math.prod(shape) // geo.cols * _stored_cols(scheme, geo.cols) * _PACKED[scheme.packing][1]


def _codes_storage(out: torch.Tensor | None, shape: tuple[int, int], dtype: torch.dtype,
                   device: torch.device) -> torch.Tensor:
    """A [rows, cols] codes tensor of `dtype`: fresh, or the front of `out`'s bytes."""
    if out is None:
        return torch.empty(shape, dtype=dtype, device=device)
    nbytes = math.prod(shape) * dtype.itemsize
    if out.dtype != torch.uint8 or out.dim() != 1 or not out.is_contiguous() or out.numel() < nbytes:
        raise ValueError(f"out: a contiguous 1-D uint8 tensor of at least {nbytes} bytes, got "
                         f"{out.dtype} {list(out.shape)}")
    if out.device != device:
        raise ValueError(f"out is on {out.device}, the tensor on {device}")
    return out[:nbytes].view(dtype).view(shape)


def dequantize(q: Quantized, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return q.dequantize(dtype)


def qdq(x: torch.Tensor, scheme: Scheme | str | dict, role: str = "weight", name: str | None = None,
        generator: torch.Generator | None = None) -> torch.Tensor:
    """Quantize then dequantize back to x.dtype: what the other engine computes with."""
    return quantize(x, scheme, role, name, generator).dequantize(x.dtype)
