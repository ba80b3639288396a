"""The converter without torch: where every work item is a tensor written as stored or a BF16/float32 weight
quantized to block FP8 with float32 scales, and pcc.fused's kernels compile (llvmlite, a dependency),
`pcc convert` streams the checkpoint with those kernels and never imports torch, nor numpy.

Importing torch takes 1.0-1.2 CPU-seconds on this machine, before anything else can run: about a third of
block-FP8 conversions of the bench's 1-2 GB checkpoints (docs/convert.md "Speed"); numpy 0.14. The bytes are those of
`pcc.convert.run._pipeline` (tests/convert/test_convert_bytes.py pins them for both paths): the same pieces
(PIECE_BYTES, whole 128-row scale blocks), the kernel of `pcc.numerics.quantize`'s fused branch, the same
writer. The caller's thread reserves each piece's output in the writer's staging ring (`ShardWriter.reserve`,
in write order) and hands its reads and kernels to the chunk workers (one per core, kept on it, as
`pcc.numerics.quantize`'s), which read the source straight into the ring (a piece written as stored, then checked
for NaN/inf) or into a small buffer of their own that the kernel then quantizes into the ring, while it is still
in the core's cache; a writer thread waits for each batch's jobs in order and commits its spans. So each source
byte is read once and each output byte written once before the disk takes it (docs/convert.md "Speed"). An
error is the torch path's, word for word: a NaN/inf a kernel finds is reported by running that piece through
the torch path.
"""

from __future__ import annotations

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
_JOB_BYTES = 2 << 20  # source bytes per chunk-worker job (a MoE's small tensors go several to a job)
_READ_BYTES = 1 << 20  # source bytes a worker reads, then quantizes, at once: they stay in its core's cache
_BATCH_BYTES = 4 << 20  # small pieces handed on together, up to this many source bytes
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


def _batches(todo: list[dict], src, specs: dict, piece_bytes: int):
    """`_pieces` in write order, consecutive small ones together up to _BATCH_BYTES of source (one hand-off to the
    writer for a few of a MoE's experts), a larger one alone (what a batch reserves of the writer's ring at once
    stays under STAGE_COUNT - 2 slots: its spans wait for no bytes of their own batch)."""
    batch, nbytes = [], 0
    for piece in _pieces(todo, src, specs, piece_bytes):
        if batch and nbytes + piece[3] > _BATCH_BYTES:
            yield batch
            batch, nbytes = [], 0
        batch.append(piece)
        nbytes += piece[3]
    if batch:
        yield batch


def pipeline(plan_of, src, todo: list[dict], writer, in_bytes: int, progress: bool, specs: dict) -> None:
    """Stream `todo` into `writer` (pcc.convert.run._pipeline's contract, for what `eligible` accepted); the Plan
    (`plan_of()`) is compiled only to report a NaN or inf through the torch path."""
    from pcc.convert import run

    out: queue.Queue = queue.Queue()  # (bounded by the writer's ring: `reserve` waits for its bytes)
    errors: list[BaseException] = []
    stop = threading.Event()
    pool = _workers()
    local = threading.local()  # each worker's read buffer

    def job(calls: list[tuple]) -> int:
        """A job's reads and kernels on a chunk worker: -1, or the index in its batch of the first piece found
        holding NaN or inf. Each call holds the buffers it writes into (the ring's views, a bounce buffer, a
        tensor's scales), so they outlive a kernel still writing them after an error dropped the batch."""
        from pcc import fused

        for call in calls:
            if call[0] == "copy":
                _, k, name, offset, view, check, at = call
                src.read_bytes(name, offset, view)
                if check is not None and view.nbytes and fused.magnitude_max(
                        check[0], at, view.nbytes * 8 // check[0]) >= check[1]:
                    return k
                continue
            _, k, name, offset, nbytes, element, codes, scales, rows, cols, r, c, blocks, _ = call
            buf = getattr(local, "buf", None)
            if buf is None or len(buf) < nbytes:
                buf = local.buf = mmap.mmap(-1, max(nbytes, _READ_BYTES))
                local.at = buffer_address(buf)
            with memoryview(buf) as whole, whole[:nbytes] as into:
                src.read_bytes(name, offset, into)
            if fused.fp8_fp32_blocks(element, local.at, codes, scales, rows, cols, r, c, 0, blocks) >= 0:
                return k
        return -1

    def plan_batch(batch: list) -> tuple | None:
        """Reserve the batch's output and make its jobs; None once the pipeline stops."""
        spans, calls, views = [], [], {}  # views: each piece's bytes (a copied piece's) or codes, by index
        for k, (it, first, offset, count, final) in enumerate(batch):
            name = it["source"]
            dtype = src.entries[name]["dtype"]
            if it["copy"]:
                if not writer.wanted(name):
                    continue
                span = writer.reserve(name, count, final, stop)
                if span is None:
                    return None
                spans.append((span, None))
                views[k] = span.view
                step = 4 * _READ_BYTES
                for at in range(0, count, step):
                    n = min(step, count - at)
                    calls.append((n, ("copy", k, name, offset + at, span.view[at:at + n], _CHECKED.get(dtype),
                                      span.address + at)))
                continue
            r, c, codes_name, scales_name, nrows, cols = specs[name]
            size = ST_BYTES[dtype]
            n, nbr, nbc = count // (size * cols), -(-nrows // r), -(-cols // c)
            if first == 0:
                scales = bytearray(4 * nbr * nbc)  # float32 [nbr, nbc], filled piece by piece
                scales_of[name] = scales, buffer_address(scales)
            scales, scales_at = scales_of.pop(name) if final else scales_of[name]
            if writer.wanted(codes_name):
                span = writer.reserve(codes_name, n * cols, final, stop)
                if span is None:
                    return None
                spans.append((span, None))
                codes, at_codes = span.view, span.address
            else:  # (its shard is done: the scales still need the kernel)
                codes = memoryview(bytearray(n * cols))
                at_codes = buffer_address(codes)
            views[k] = codes
            if final and writer.wanted(scales_name):
                span = writer.reserve(scales_name, len(scales), True, stop)
                if span is None:
                    return None
                spans.append((span, scales))
            blocks, step = -(-n // r), max(1, _READ_BYTES // (r * cols * size))
            at_scales = scales_at + first // r * nbc * 4
            for b in range(0, blocks, step):
                e = min(b + step, blocks)
                rows = min(e * r, n) - b * r
                calls.append((rows * cols * size, ("q", k, name, offset + b * r * cols * size, rows * cols * size,
                                                   _ELEMENT[dtype], at_codes + b * r * cols, at_scales + b * nbc * 4,
                                                   rows, cols, r, c, e - b, (codes, scales))))
        return spans, [pool.submit(job, calls) for calls in _jobs(calls)], views

    scales_of: dict[str, tuple[bytearray, int]] = {}  # a weight quantized in row pieces: its whole scales (address)

    def write_all():
        try:
            while (item := out.get()) is not _DONE:
                batch, spans, jobs, views = item
                wait(jobs)
                bad = [j.result() for j in jobs if j.result() >= 0]
                if bad:
                    it, first, offset, count, _ = batch[min(bad)]
                    name = it["source"]
                    if it["copy"]:
                        raise _nonfinite(src, name, first, views[min(bad)], _CHECKED[src.entries[name]["dtype"]])
                    data = src.read_bytes(name, offset, memoryview(bytearray(count)))
                    raise _torch_error(plan_of(), src, it, first, data)
                for span, data in spans:
                    writer.commit(span, data)
                del item, spans, views
        except BaseException as err:
            errors.append(err)
            stop.set()
            while out.get() is not _DONE:  # drain so the producer never blocks
                pass

    bar = run._bar(in_bytes, progress)
    thread = threading.Thread(target=write_all, daemon=True)
    thread.start()
    try:
        for batch in _batches(todo, src, specs, run.PIECE_BYTES):
            if stop.is_set():
                break
            planned = plan_batch(batch)
            if planned is None:
                break
            out.put((batch, *planned))
            writer.hand_off()
            if bar is not None:
                bar.update(sum(p[3] for p in batch))
    except BaseException as err:
        errors.append(err)
        stop.set()
    finally:
        run.wind_down(errors, stop, out, _DONE, [thread], bar, lambda: pool.shutdown(wait=True, cancel_futures=True))


def _jobs(calls: list[tuple[int, tuple]]) -> list[list[tuple]]:
    """Calls, each (source bytes, the call), grouped into chunk-worker jobs of about _JOB_BYTES."""
    jobs, size = [], _JOB_BYTES
    for nbytes, call in calls:
        if size >= _JOB_BYTES:
            jobs.append([])
            size = 0
        jobs[-1].append(call)
        size += nbytes
    return jobs


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
