"""The converter without torch: where every work item is a tensor written as stored or a BF16/float32 weight
quantized to block FP8 with float32 scales, and pcc.fused's kernels compile (llvmlite, a dependency),
`pcc convert` streams the checkpoint with those kernels through plain buffers (mappings) and never imports torch,
nor numpy.

Importing torch takes 1.0-1.2 CPU-seconds on this machine, before anything else can run: about a third of
block-FP8 conversions of the bench's 1-2 GB checkpoints (docs/convert.md "Speed"); numpy 0.14. The bytes are those of
`pcc.convert.run._pipeline` (tests/convert/test_convert_bytes.py pins them for both paths): the same pieces
(PIECE_BYTES, whole 128-row scale blocks), the kernel of `pcc.numerics.quantize`'s fused branch, the same
writer. Its threads: a reader maps the large source pieces (`Source.map_bytes`) and reads the small ones into a
reused ring (`Source.read_bytes`, `_Ring`), the caller's thread checks copied pieces for NaN/inf and hands each
quantized piece's block rows to the chunk workers (one per core, kept on it, as `pcc.numerics.quantize`'s), so
small tensors (a MoE's experts) are quantized side by side; the writer waits for each batch's workers in order,
then writes. An error is the torch path's, word for
word: a NaN/inf a kernel finds is reported by running that piece through the torch path.
"""

from __future__ import annotations

import collections
import functools
import math
import mmap
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
_MAP_MIN = 4 << 20  # source pieces this large are mapped, smaller ones read into a ring of _SMALL_RING bytes
_SMALL_RING = 32 << 20
_BATCH_BYTES = 4 << 20  # small pieces read into the ring and handed on together, up to this many bytes
_DONE = object()


def _fp8_spec(it: dict, src) -> tuple | None:
    """(block rows, block cols, codes name, scales name, rows, cols) of a work item the kernel quantizes with
    the torch path's bytes (its recipe's `fp8_block`, pcc.lower.converter), else None."""
    if it["op"] is None or it["copy"] or it["fuse"] is not None or it["members"] is not None or it["copied"]:
        return None
    block, targets = it["recipe"]["fp8_block"], it["targets"]
    if block is None or len(targets) != 2 or it["rows"] is not None and it["rows"] % block[0]:
        return None  # (pieces of whole scale blocks only: `first // r` places a piece's scales)
    (codes, c), (scales, s) = targets.items()
    if len(c["shape"]) != 2 or 0 in c["shape"] or src.entries[it["source"]]["shape"] != list(c["shape"]):
        return None
    (n, k), (rows, cols) = c["shape"], block
    if (c["dtype"], s["dtype"], list(s["shape"])) != ("float8_e4m3fn", "float32", [-(-n // rows), -(-k // cols)]):
        return None
    return rows, cols, codes, scales, n, k


def eligible(src, todo: list[dict], input_scales: dict) -> dict | None:
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
        spec = _fp8_spec(it, src)
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


class _Ring:
    """Pieces allocated first in, first out from one reused mapping of `size` bytes: the reader takes each small
    source piece's buffer (the caller's thread each piece's codes, from a second ring) in the order the writer,
    done with it, gives it back, so a piece waits only for bytes, not for a count of pieces. A MoE's hundreds of
    small experts stream without the four-piece hand-offs a count allows (the torch path's `_Slots`), and nothing
    is mapped, zeroed or unmapped per piece (docs/convert.md "Speed"). Once past `soft` bytes a piece starts the
    ring again where it can, so small pieces keep to its first pages: every page first touched costs a fault (0.6
    ms per MiB here). A piece larger than the ring, or empty, gets a buffer of its own."""

    def __init__(self, size: int, soft: int, stop: threading.Event):
        self._map = mmap.mmap(-1, size)  # (zero pages until first written: no memset)
        self._view = memoryview(self._map)
        self._size, self._soft = size, soft
        self._live: collections.deque = collections.deque()  # (start, end) of each piece held, oldest first
        self._cond = threading.Condition()
        self._stop = stop

    def _place(self, nbytes: int) -> int | None:
        """Where `nbytes` fit now, or None."""
        if not self._live:
            return 0
        tail, start, head = self._live[0][0], self._live[-1][0], self._live[-1][1]
        if start < tail:  # the held bytes wrapped: free between the newest piece and the oldest
            return head if head + nbytes <= tail else None
        if nbytes <= tail and (head >= self._soft or head + nbytes > self._size):
            return 0
        return head if head + nbytes <= self._size else None

    def take(self, nbytes: int) -> memoryview | None:
        """`nbytes` of the ring, waiting for the writer to give back enough; None once the pipeline stops."""
        with self._cond:
            if nbytes > self._size or not nbytes:
                self._live.append(self._live[-1] if self._live else (0, 0))
                return memoryview(bytearray(nbytes))
            while (at := self._place(nbytes)) is None:
                if self._stop.is_set():
                    return None
                self._cond.wait(0.1)
            self._live.append((at, at + nbytes))
        return self._view[at:at + nbytes]

    def give(self) -> None:
        """The oldest piece's bytes back."""
        with self._cond:
            self._live.popleft()
            self._cond.notify()


def _pieces(todo: list[dict], src, specs: dict, piece_bytes: int):
    """(work item, first element or row, byte offset in its tensor, bytes, last piece of it) of every source
    piece in write order: a tensor written as stored in pieces of at most `piece_bytes`, a quantized one in
    whole block rows of about that many (`pcc.convert.run._pipeline`'s pieces)."""
    for it in todo:
        name = it["source"]
        entry = src.entries[name]
        size = ST_BYTES[entry["dtype"]]
        if it["copy"]:
            count = math.prod(entry["shape"])
            step = max(1, piece_bytes // size)
            for first in range(0, count, step) or [0]:
                n = min(step, count - first)
                yield it, first, first * size, n * size, first + n >= count
            continue
        *_, nrows, k = specs[name]
        row_bytes = k * size
        step = max(1, piece_bytes // row_bytes // it["rows"]) * it["rows"] if it["rows"] else nrows
        for r0 in range(0, nrows, step):
            n = min(step, nrows - r0)
            yield it, r0, r0 * row_bytes, n * row_bytes, r0 + n >= nrows


def pipeline(plan_of, src, todo: list[dict], writer, in_bytes: int, progress: bool, specs: dict) -> None:
    """Stream `todo` into `writer` (pcc.convert.run._pipeline's contract, for what `eligible` accepted); the Plan
    (`plan_of()`) is compiled only to report a NaN or inf through the torch path.

    What moves between the threads is a batch of pieces: one large piece (mapped), or consecutive small ones read
    into the ring together (at most _BATCH_BYTES), so a MoE's experts cost one hand-off per few of them (the
    bench's MoE: 1,749 pieces in 341 batches; docs/convert.md "Speed")."""
    from pcc import fused
    from pcc.convert import run

    loaded: queue.Queue = queue.Queue()  # (bounded by the rings' bytes and the slots)
    out: queue.Queue = queue.Queue()
    errors: list[BaseException] = []
    stop = threading.Event()
    slots = run._Slots(run._IN_FLIGHT, stop)  # large source pieces, mapped
    ring = _Ring(_SMALL_RING, _SMALL_RING // 4, stop)  # small ones, read
    codes_ring = _Ring(run._IN_FLIGHT * run.PIECE_BYTES // 2, run.PIECE_BYTES // 2, stop)  # every piece's codes
    pool = _workers()

    put = functools.partial(run.put_until, stop)

    def read_batch(batch: list, nbytes: int) -> bool:
        """Small pieces read into the ring together (mapping a small piece costs a system call and its page
        tables' teardown; reading needs memory first touched, 0.6 ms per MiB here: the ring keeps to a few);
        False once the pipeline stops."""
        buf = ring.take(nbytes)
        if buf is None:
            return False
        parts, at = [], 0
        for it, first, offset, count, final in batch:
            parts.append((it, first, src.read_bytes(it["source"], offset, buf[at:at + count]), final))
            at += count
        put(loaded, (parts, ring.give))
        return True

    def reader():
        try:
            batch, nbytes = [], 0
            for piece in _pieces(todo, src, specs, run.PIECE_BYTES):
                it, first, offset, count, final = piece
                if count < _MAP_MIN:
                    if batch and nbytes + count > _BATCH_BYTES:
                        if not read_batch(batch, nbytes):
                            return
                        batch, nbytes = [], 0
                    batch.append(piece)
                    nbytes += count
                    continue
                if batch and not read_batch(batch, nbytes):
                    return
                batch, nbytes = [], 0
                if not slots.take():
                    return
                put(loaded, ([(it, first, src.map_bytes(it["source"], offset, count), final)], slots.give))
            if batch:
                read_batch(batch, nbytes)
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
                parts, release, jobs, work, codes = item
                wait(jobs)
                bad = [j.result() for j in jobs if j.result() >= 0]
                if bad:
                    it, first, data, _ = parts[min(bad)]
                    raise _torch_error(plan_of(), src, it, first, data)
                for (it, _, data, final), w in zip(parts, work):
                    name = it["source"]
                    if w is None:  # a piece written as stored
                        if writer.wanted(name):
                            writer.write(name, data, final)
                        continue
                    _, _, codes_name, scales_name, _, _ = specs[name]
                    if writer.wanted(codes_name):
                        writer.write(codes_name, w[0], final)
                    if final and writer.wanted(scales_name):
                        writer.write(scales_name, w[1], True)
                if codes is not None:
                    codes_ring.give()
                del parts, data, item, work, w, codes  # (a mapped piece is unmapped once nothing views it)
                release()
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
            parts, release = got
            sizes = [0 if it["copy"] else data.nbytes // ST_BYTES[src.entries[it["source"]]["dtype"]]
                     for it, _, data, _ in parts]  # each quantized piece's codes: a byte per element
            codes = codes_ring.take(sum(sizes)) if any(sizes) else None
            if any(sizes) and codes is None:
                break
            work, calls, at = [], [], 0
            for k, ((it, first, data, final), size) in enumerate(zip(parts, sizes)):
                name = it["source"]
                if it["copy"]:  # checked finite, then written
                    check = _CHECKED.get(src.entries[name]["dtype"])
                    if check is not None and data.nbytes and fused.magnitude_max(
                            check[0], buffer_address(data), data.nbytes * 8 // check[0]) >= check[1]:
                        raise _nonfinite(src, name, first, data, check)
                    work.append(None)
                    continue
                r, c, _, _, nrows, cols = specs[name]
                n, nbr, nbc = size // cols, -(-nrows // r), -(-cols // c)
                if first == 0:
                    scales_of[name] = bytearray(4 * nbr * nbc)  # float32 [nbr, nbc]
                scales = scales_of.pop(name) if final else scales_of[name]
                mine, at = codes[at:at + size], at + size
                work.append((mine, scales))
                blocks, step = -(-n // r), max(1, _CHUNK // (r * cols))
                element, scale_at = _ELEMENT[src.entries[name]["dtype"]], first // r * nbc * 4
                for b in range(0, blocks, step):
                    e = min(b + step, blocks)
                    calls.append(((e - b) * r * cols, (k, element, data, mine, scales, scale_at, n, cols, r, c, b, e)))
            put(out, (parts, release, [pool.submit(_quantize, job) for job in _jobs(calls)], work, codes))
            if bar is not None:
                bar.update(sum(p[2].nbytes for p in parts))
    except BaseException as err:
        errors.append(err)
        stop.set()
    finally:
        run.wind_down(errors, stop, out, _DONE, threads, bar, lambda: pool.shutdown(wait=True, cancel_futures=True))


def _jobs(calls: list[tuple[int, tuple]]) -> list[list[tuple]]:
    """Kernel calls, each (elements, its arguments), grouped into chunk-worker jobs of about _CHUNK elements (a
    large piece's calls are that size already; a batch's small tensors go several to a job)."""
    jobs, size = [], _CHUNK
    for elements, call in calls:
        if size >= _CHUNK:
            jobs.append([])
            size = 0
        jobs[-1].append(call)
        size += elements
    return jobs


def _quantize(calls: list[tuple]) -> int:
    """A job's kernel calls on a chunk worker, each block rows [first, stop) of a piece: -1, or the index in its
    batch of the first piece a kernel found NaN or inf in. The job holds the views, so the rings' mappings outlive
    a kernel still reading one after an error dropped the batch from the queues."""
    from pcc import fused

    for k, element, data, codes, scales, at, n, cols, r, c, first, stop in calls:
        if fused.fp8_fp32_blocks(element, buffer_address(data), buffer_address(codes), buffer_address(scales) + at,
                                 n, cols, r, c, first, stop) >= 0:
            return k
    return -1


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
