"""The converter without torch: where every work item is a tensor written as stored or a BF16/float32 weight
quantized to block FP8 with float32 scales, and pcc.fused's kernels compile (llvmlite, a dependency),
`pcc convert` streams the checkpoint with those kernels through plain buffers (bytearrays, mappings) and never
imports torch, nor numpy.

Importing torch takes 1.0-1.2 CPU-seconds on this machine, before anything else can run: about a third of
block-FP8 conversions of the bench's 1-2 GB checkpoints (docs/convert.md "Speed"); numpy 0.14. The bytes are those of
`pcc.convert.run._pipeline` (tests/convert/test_convert_bytes.py pins them for both paths): the same pieces
(PIECE_BYTES, whole 128-row scale blocks), the kernel of `pcc.numerics.quantize`'s fused branch, the same
writer. Its threads: a reader maps the source pieces (`Source.map_bytes`), the caller's thread checks
copied pieces for NaN/inf and hands each quantized piece's block rows to the chunk workers (one per core,
kept on it, as `pcc.numerics.quantize`'s), so small tensors (a MoE's experts) are quantized side by side;
the writer waits for each piece's workers in order, then writes. An error is the torch path's, word for
word: a NaN/inf a kernel finds is reported by running that piece through the torch path.
"""

from __future__ import annotations

import functools
import math
import os
import queue
import threading
from concurrent.futures import ThreadPoolExecutor, wait

from pcc.convert import ConvertError
from pcc.convert.shards import ST_BYTES, buffer_address

# source dtype -> (its magnitude's width in bits, the magnitude of inf): copied tensors checked for NaN/inf
_CHECKED = {"BF16": (16, 0x7F80), "F16": (16, 0x7C00), "F32": (32, 0x7F800000)}
_UNCHECKED = ("U8", "I8", "I16", "I32", "I64", "BOOL")  # not floats: nothing to check (as `all_finite`)
_ELEMENT = {"BF16": "bf16", "F32": "f32"}  # weights the block-FP8 kernel reads
_CHUNK = 1 << 20  # elements per kernel call on a worker: pcc.numerics.quantize's chunk
_RECYCLE_MIN = 1 << 20  # codes at least this large go into recycled buffers (as pcc.convert.run's)
_DONE = object()


def _fp8_spec(plan, it: dict, src) -> tuple | None:
    """(block rows, block cols, codes name, scales name, rows, cols) of a work item the kernel quantizes with
    the torch path's bytes, else None."""
    from pcc.plan.layouts.fp8 import Fp8Block

    if it["op"] is None or it["copy"] or it["fuse"] is not None or it["members"] is not None or it["copied"]:
        return None
    i = plan.index[it["source"]]
    layout, scheme, op = plan.layouts[i], plan.scheme("rollout", i), plan.catalog.operators[i]
    w = scheme.grouping_of("weight")
    targets = plan.rollout_tensors[i]["targets"]
    if (type(layout) is not Fp8Block or scheme.format != "fp8_e4m3" or scheme.scale != "fp32"
            or scheme.rounding != "nearest_even" or scheme.packing is not None or w is None or w.kind != "block"
            or len(op.shape) != 2 or 0 in op.shape or src.entries[it["source"]]["shape"] != list(op.shape)
            or len(targets) != 2):
        return None
    (codes, c), (scales, s) = targets.items()
    n, k = op.shape
    if (c["dtype"], list(c["shape"]), s["dtype"], list(s["shape"])) != (
            "float8_e4m3fn", [n, k], "float32", [-(-n // w.rows), -(-k // w.cols)]):
        return None
    return w.rows, w.cols, codes, scales, n, k


def eligible(plan, src, todo: list[dict], input_scales: dict) -> dict | None:
    """Each quantized work item's `_fp8_spec` by source name, where the whole conversion can take this path
    (and the kernels it needs compiled); else None."""
    from pcc import fused

    if not fused.available() or src.view.encodings or input_scales:
        return None
    specs, needed = {}, set()
    for it in todo:
        dtype = src.entries[it["source"]]["dtype"] if src.stored(it["source"]) else None
        if it["copy"]:
            if dtype in _CHECKED:
                needed.add("magnitude")
            elif dtype not in _UNCHECKED:
                return None
            continue
        spec = _fp8_spec(plan, it, src)
        if spec is None or dtype not in _ELEMENT:
            return None
        specs[it["source"]] = spec
        needed.add(_ELEMENT[dtype])
    if not all(fused.kernel(k) is not None for k in sorted(needed)):
        return None
    return specs


def _workers() -> ThreadPoolExecutor:
    """One thread per usable core, each kept on its own core where the platform allows (as
    pcc.numerics.quantize's chunk workers, which this path does not import)."""
    try:
        cpus = sorted(os.sched_getaffinity(0))
    except AttributeError:
        cpus = []
    lock, left = threading.Lock(), iter(cpus)

    def pin():
        with lock:
            cpu = next(left, None)
        if cpu is not None:
            try:
                os.sched_setaffinity(0, {cpu})
            except OSError:
                pass

    return ThreadPoolExecutor(max(1, len(cpus) or os.cpu_count() or 1), thread_name_prefix="pcc-fast",
                              initializer=pin)


class _Recycled:
    """Codes buffers the writer has finished with (pcc.convert.run._Recycled, as bytearrays: a new one is
    zeroed, a recycled one is not)."""

    def __init__(self, keep: int):
        self._free: list = []
        self._keep = keep
        self._lock = threading.Lock()

    def take(self, nbytes: int) -> bytearray:
        if nbytes >= _RECYCLE_MIN:
            with self._lock:
                fits = [k for k, b in enumerate(self._free) if len(b) >= nbytes]
                if fits:
                    return self._free.pop(min(fits, key=lambda k: len(self._free[k])))
        return bytearray(nbytes)

    def give(self, buf: bytearray) -> None:
        if len(buf) >= _RECYCLE_MIN:
            with self._lock:
                if len(self._free) < self._keep:
                    self._free.append(buf)


def pipeline(plan, src, todo: list[dict], writer, in_bytes: int, progress: bool, specs: dict) -> None:
    """Stream `todo` into `writer` (pcc.convert.run._pipeline's contract, for what `eligible` accepted)."""
    from pcc import fused
    from pcc.convert import run

    loaded: queue.Queue = queue.Queue(maxsize=2)
    out: queue.Queue = queue.Queue(maxsize=run._IN_FLIGHT + 4)
    errors: list[BaseException] = []
    stop = threading.Event()
    slots = run._Slots(run._IN_FLIGHT, stop)
    recycled = _Recycled(run._IN_FLIGHT + 2)
    pool = _workers()

    put = functools.partial(run.put_until, stop)

    def reader():
        try:
            for it in todo:
                name = it["source"]
                entry = src.entries[name]
                size = ST_BYTES[entry["dtype"]]
                if it["copy"]:  # written as stored: in pieces of at most PIECE_BYTES
                    count = math.prod(entry["shape"])
                    step = max(1, run.PIECE_BYTES // size)
                    for first in range(0, count, step) or [0]:
                        n = min(step, count - first)
                        if not slots.take():
                            return
                        put(loaded, (it, first, src.map_bytes(name, first * size, n * size), first + n >= count))
                    continue
                *_, nrows, k = specs[name]
                row_bytes = k * size
                step = max(1, run.PIECE_BYTES // row_bytes // it["rows"]) * it["rows"] if it["rows"] else nrows
                for r0 in range(0, nrows, step):
                    n = min(step, nrows - r0)
                    if not slots.take():
                        return
                    put(loaded, (it, r0, src.map_bytes(name, r0 * row_bytes, n * row_bytes), r0 + n >= nrows))
        except BaseException as err:  # handed to the caller's thread
            errors.append(err)
            stop.set()
        finally:
            put(loaded, _DONE)

    bar = run._bar(in_bytes, progress)
    scales_of: dict[str, object] = {}  # a weight quantized in row pieces: its whole scales, filled piece by piece

    def write_all():
        try:
            while True:
                item = out.get()
                if item is _DONE:
                    return
                it, r0, data, final, work = item
                name = it["source"]
                if work is None:  # a piece written as stored
                    if writer.wanted(name):
                        writer.write(name, data, final)
                else:
                    jobs, codes, nbytes, scales = work
                    wait(jobs)
                    if any(j.result() >= 0 for j in jobs):
                        raise _torch_error(plan, src, it, r0, data)
                    _, _, codes_name, scales_name, _, _ = specs[name]
                    if writer.wanted(codes_name):
                        with memoryview(codes) as view:
                            writer.write(codes_name, view[:nbytes], final)
                    recycled.give(codes)
                    if final and writer.wanted(scales_name):
                        writer.write(scales_name, scales, True)
                del data, item  # (a mapped piece is unmapped once nothing views it)
                slots.give()
        except BaseException as err:
            errors.append(err)
            stop.set()
            while out.get() is not _DONE:  # drain so the producer never blocks
                pass

    threads = [threading.Thread(target=reader, daemon=True), threading.Thread(target=write_all, daemon=True)]
    for t in threads:
        t.start()
    try:
        while not stop.is_set():
            try:
                got = loaded.get(timeout=0.1)
            except queue.Empty:
                continue
            if got is _DONE:
                break
            it, first, data, final = got
            name = it["source"]
            dtype = src.entries[name]["dtype"]
            if it["copy"]:  # checked finite, then written
                check = _CHECKED.get(dtype)
                if check is not None and data.nbytes and \
                        fused.magnitude_max(check[0], buffer_address(data), data.nbytes * 8 // check[0]) >= check[1]:
                    raise _nonfinite(src, name, first, data, check)
                put(out, (it, first, data, final, None))
                if bar is not None:
                    bar.update(data.nbytes)
                continue
            r, c, _, _, nrows, k = specs[name]
            n = data.nbytes // (k * ST_BYTES[dtype])
            nbr, nbc = -(-nrows // r), -(-k // c)
            if first == 0:
                scales_of[name] = bytearray(4 * nbr * nbc)  # float32 [nbr, nbc]
            scales = scales_of.pop(name) if final else scales_of[name]
            codes = recycled.take(n * k)
            element, at = _ELEMENT[dtype], first // r * nbc * 4
            pieces, step = -(-n // r), max(1, _CHUNK // (r * k))
            jobs = [pool.submit(_quantize, element, data, codes, scales, at, n, k, r, c, b, min(b + step, pieces))
                    for b in range(0, pieces, step)]
            put(out, (it, first, data, final, (jobs, codes, n * k, scales)))
            if bar is not None:
                bar.update(data.nbytes)
    except BaseException as err:
        errors.append(err)
        stop.set()
    finally:
        run.wind_down(errors, stop, out, _DONE, threads, bar, lambda: pool.shutdown(wait=True, cancel_futures=True))


def _quantize(element: str, data, codes, scales, at: int, n: int, k: int, r: int, c: int, first: int, stop: int) -> int:
    """Block rows [first, stop) of a piece on a chunk worker. The job holds the arrays, so a piece dropped from
    the queues after an error is not unmapped while a kernel still reads it."""
    from pcc import fused

    return fused.fp8_fp32_blocks(element, buffer_address(data), buffer_address(codes), buffer_address(scales) + at,
                                 n, k, r, c, first, stop)


def _nonfinite(src, name: str, first: int, data, check) -> ConvertError:
    """The torch path's error for a piece written as stored that holds NaN or inf (`run._check_finite`)."""
    import numpy as np

    width, inf = check
    bits = np.frombuffer(data, dtype=np.uint16 if width == 16 else np.uint32) & (0x7FFF if width == 16 else 0x7FFFFFFF)
    at = int(np.flatnonzero(bits >= inf)[0])
    return ConvertError(f"{src.file_of(name)}: {name} holds NaN or inf (first at flat element {first + at})")


def _torch_error(plan, src, it: dict, r0: int, data) -> ConvertError:
    """A quantized piece a kernel found NaN or inf in, run through the torch path for its error, word for word."""
    import numpy as np
    import torch

    from pcc.convert import run
    from pcc.plan.encode import place_fused

    dtype = src.entries[it["source"]]["dtype"]
    *_, k = plan.catalog.operators[plan.index[it["source"]]].shape
    values = torch.from_numpy(np.frombuffer(bytearray(data), dtype=np.uint16 if dtype == "BF16" else np.float32))
    x = (values.view(torch.bfloat16) if dtype == "BF16" else values).reshape(-1, k)
    try:
        if it["rows"]:
            run._rows_piece(plan, src, it, r0, x)
        else:
            run._compute(plan, src, it, x, {}, place_fused, {})
    except ConvertError as err:
        return err
    return ConvertError(f"{src.file_of(it['source'])}: {it['source']}: NaN or inf")  # (not reached)
