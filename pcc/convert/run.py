"""`pcc convert`: stream a source checkpoint through the converter plan into a rollout checkpoint.

Three threads overlap the work: a reader loads the next source tensors, the caller's thread
quantizes (torch releases the GIL), a writer appends bytes to the current shard. Queues hold
a few tensors or pieces: a tensor larger than PIECE_BYTES moves in pieces of about that size
(written as stored, quantized in row pieces after an amax pass where its scale needs one, a
quantized source's rows, a fused MXFP4 tensor an expert at a time), so memory does not grow with
the largest tensor (docs/convert.md, "Streaming"). The output is built in a hidden sibling directory
and renamed into place only when complete and checked. Where every tensor is copied or quantized to block
FP8 and llvmlite is installed, pcc.convert.fast streams the same bytes without importing torch.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import math
import os
import queue
import shutil
import sys
import threading
import time
from pathlib import Path

from pcc.convert import ConvertError, fast, plan_cache
from pcc.convert.calibration import InputScales, resolve as resolve_input_scales
from pcc.convert.contract import bundle_plan, load_plan
from pcc.convert.destination import (
    CHECKPOINT_MARK,
    check_destination,
    check_work,
    destination_lock,
    is_checkpoint,
)
from pcc.convert.shards import (
    RECORDS,
    SHARD_HASH,
    ST_BYTES,
    ST_DTYPES,
    ShardWriter,
    complete,
    plan_shards,
    writing,
)
from pcc.convert.source import INDEX, Source, open_source
from pcc.lang.inputs import InputError, read_json

DEFAULT_SHARD_BYTES = 5 * 10**9
_WIDE_SOURCE = ("BF16", "F16", "F32")
_DONE = object()
_IN_FLIGHT = 4  # source pieces mapped at once: two queued, one being computed, one being written
# Tensors written as stored (kept wide, or copied) move in pieces of at most this many bytes. 32 MiB
# converts as fast as 64 (the bench, 2026-12-02: the same seconds and CPU in three alternating runs)
# with 180 MiB less in flight, which matters beside the CUDA build of torch (500 MiB to import).
PIECE_BYTES = 32 << 20
_ST_TORCH = {v: k for k, v in ST_DTYPES.items()}  # safetensors dtype -> the plan's torch name
_RECYCLE_MIN = 1 << 20  # codes at least this large are quantized into recycled buffers (`_Recycled`)


def partial_dir(dst: Path) -> Path:
    return dst.with_name(f".{dst.name}.partial")


def convert(contract: str, src_dir: str, dst_dir: str, resume: bool = False, force: bool = False,
            max_shard_bytes: int = DEFAULT_SHARD_BYTES, progress: bool = False, calibrate: bool | None = None,
            calibration_tokens: str | None = None) -> dict:
    """calibrate: NVFP4 input scales the source lacks are calibrated (True: or refuse), calibrated
    when the model is supported and small enough (None), or left 1.0 and counted (False).

    A bundle's converter plan converts a checkpoint it was compiled for as it is (`bundle_plan`), as does one
    compiled from the same contract for a source of its fingerprint before (`plan_cache`); otherwise the contract is
    compiled against the source. The Plan itself is compiled only where the conversion needs more
    than its converter plan (`plan_of`: a quantized source, input scales, the torch path)."""
    t0 = time.perf_counter()
    with _start_up() as started, contextlib.ExitStack() as after:
        src = open_source(src_dir)
        extras = src.extra_files()  # checked before anything is written: a link out of the source is refused
        doc, planned = bundle_plan(contract, src), "bundle"
        if doc is None:
            doc, planned = plan_cache.lookup(contract, src), "cached"
        listed = _items(None, doc, src, {}) if doc is not None else None  # (its items: no input scales)
        specs = fast.eligible(src, listed[0], {}) if listed is not None else None
        if specs is None:
            doc = listed = None  # the torch path reads the Plan: a converter plan serves the torch-free one
        plan_of = functools.cache(lambda: load_plan(contract, source=src))
        if doc is None:
            from pcc.lower.converter import converter_plan

            doc, kept = plan_cache.compiled(contract, src, lambda: converter_plan(plan_of()))
            after.callback(kept)  # (kept while the checkpoint streams; waited for before returning)
            planned = "compiled"
        started()
        dst = Path(dst_dir).resolve()
        root = Path(src.root).resolve()
        if dst == root or root in dst.parents or dst in root.parents:
            raise ConvertError(f"{dst}: the destination overlaps the source checkpoint {root}; convert into a new directory")
        with destination_lock(dst):
            work = _staging(dst, resume, force)
            with _stopping(dst, work):
                made, scales = _build(plan_of, doc, listed, specs, src, work, extras, resume, max_shard_bytes,
                                      progress, calibrate, calibration_tokens)
                with writing(work):
                    _install(work, dst)
    secs = time.perf_counter() - t0
    return {"ok": True, "destination": str(dst), "layout": doc["layout"], "plan": planned, **made,
            "seconds": round(secs, 3),
            "input_gb_per_s": round(made["input_bytes"] / secs / 1e9, 3) if secs else None} | scales.summary()


def _staging(dst: Path, resume: bool, force: bool) -> Path:
    """The hidden `.DST.partial` directory the checkpoint is built in, once `dst` may be written (PCC711)."""
    check_destination(dst, force, is_checkpoint, "a pcc rollout checkpoint (it has no pcc_convert.json)")
    work = partial_dir(dst)
    check_work(work, lambda w: (w / RECORDS).is_dir())
    if work.exists() and not resume:
        if not force:
            raise ConvertError(f"{work}: an interrupted conversion is there; --resume continues it, "
                               "--force starts over", code="PCC711")
        shutil.rmtree(work)
    return work


def _build(plan_of, doc: dict, listed: tuple | None, specs: dict | None, src: Source, work: Path,
           extras: list[Path], resume: bool, max_shard_bytes: int, progress: bool, calibrate: bool | None,
           calibration_tokens: str | None) -> tuple[dict, object]:
    """The whole checkpoint in `work` (finished shards of an earlier run kept with `resume`): the summary's
    counts, and the input scales (none where a bundle's converter plan runs, `listed` its `_items` and `specs`
    their `fast.eligible`: the torch-free path it is taken for writes none)."""
    try:
        scales = InputScales() if listed else resolve_input_scales(plan_of(), src, calibrate, calibration_tokens)
    except BaseException:
        src.close()
        raise
    with writing(work):
        (work / RECORDS).mkdir(parents=True, exist_ok=True)
    items, order = listed or _items(plan_of, doc, src, scales.values)
    shards = plan_shards(order, max_shard_bytes)
    job = _job_id(doc, src, max_shard_bytes, scales.identity())
    done = {s.file for s in shards if resume and complete(work, s, job)}
    writer = ShardWriter(work, shards, done, job)
    for s in shards:
        stale = work / (s.file + ".tmp")
        if stale.exists():
            stale.unlink()
    todo = [it for it in items if any(writer.wanted(n) for n in it["emits"] + it["feeds"])]
    in_bytes = sum(_src_bytes(src, it["source"]) for it in todo)
    try:
        if not listed:  # (a bundle's items were found eligible as a whole: `todo` is some of them)
            specs = fast.eligible(src, todo, scales.values)
        if specs is not None:  # no torch needed (pcc.convert.fast)
            fast.pipeline(plan_of, src, todo, writer, in_bytes, progress, specs)
        else:
            _pipeline(plan_of(), src, todo, writer, in_bytes, progress, scales.values)
    except BaseException:
        writer.abort()
        raise
    finally:
        src.close()
    writer.finish()
    hashes = {s.file: writer.digests.get(s.file) or _recorded(work, s) for s in shards}
    with writing(work):
        _finish(doc, src, work, shards, hashes, job, scales, extras)
    return {"tensors": len(order), "shards": len(shards), "resumed_shards": len(done), "input_bytes": in_bytes,
            "output_bytes": sum(s.size for s in shards)}, scales


def _items(plan_of, doc: dict, src: Source, input_scales: dict) -> tuple[list[dict], list[tuple[str, str, list[int]]]]:
    """Work items in plan order, and every target (name, dtype, shape) in write order, from the converter plan
    (the Plan, `plan_of()`, only for a quantized source's encodings).
    A fused target is written once its last part has been computed. A source `input_scale` the plan
    also lists as an operator's target is written there (carried over), not copied a second time.
    `copy`: written as stored, in pieces; `copy_codes`: a quantized source's copied encoding whose
    codes are written as stored, in pieces, then its scales; `rows`: quantized in row pieces of a
    multiple of this many rows (a weight larger than PIECE_BYTES whose layout allows it, its recipe's
    `piece_rows`; a quantized source's requantized or widened weight whose float32 values are);
    `members`: the weights whose amax its global scale needs first (FP8 tensor scaling and NVFP4
    quantized in pieces: its own; an NVFP4 scale group's: every member's, so they share one scale).
    A run of fused (MXFP4 expert) entries is taken target by target, experts in order (every gate and
    up, then every down), so each fused target's first tensor streams an expert at a time
    (`_compute`); the write order of the targets is the plan's either way."""
    items, order, seen = [], [], {}
    for k, e in enumerate(_by_fused_target(doc["tensors"])):
        if not src.has(e["source"]):
            raise ConvertError(f"{src.root}: the plan needs {e['source']}, which the checkpoint lacks")
        recipe = doc["recipes"][e["recipe"]]
        quantized = "quantize" in recipe["steps"]
        item = {"op": k, "source": e["source"], "recipe": recipe, "targets": e["targets"], "emits": [], "feeds": [],
                "fuse": e.get("fuse"), "copy": not quantized and list(e["targets"]) == [e["source"]]
                and src.stored(e["source"])
                and src.entries[e["source"]]["shape"] == list(e["targets"][e["source"]]["shape"])
                and _ST_TORCH.get(src.entries[e["source"]]["dtype"]) == e["targets"][e["source"]]["dtype"]}
        for name, t in e["targets"].items():
            if "fuse" in e:
                seen[name] = seen.get(name, 0) + 1
                item["feeds"].append(name)
                if seen[name] < e["fuse"]["parts"]:
                    continue
            item["emits"].append(name)
            order.append((name, ST_DTYPES[t["dtype"]], t["shape"]))
        stored = src.stored(e["source"]) and src.entries[e["source"]]["dtype"] in _WIDE_SOURCE
        item["rows"] = (recipe["piece_rows"] if stored and not item["copy"] and "fuse" not in e
                        and src.nbytes(e["source"]) > PIECE_BYTES else None)
        enc = src.view.encodings.get(e["source"])
        item["copied"] = item["copy_codes"] = requantized = False
        if enc is not None:
            from pcc.convert.quantized import copied, row_unit, streams_codes

            plan = plan_of()
            requantized = not copied(src, plan, plan.index[e["source"]])
            item["copied"] = not requantized
            item["copy_codes"] = (item["copied"] and src.nbytes(e["source"]) > PIECE_BYTES
                                  and streams_codes(src, enc, e["targets"]))
            if requantized and "fuse" not in e and 4 * math.prod(enc.shape) > PIECE_BYTES:  # its float32 values
                item["rows"] = math.lcm(recipe["piece_rows"] if quantized else 1, row_unit(enc))
        item["members"] = (tuple(e.get("scale_group", [e["source"]])) if recipe["global_scale"]
                           and (stored or requantized) and ("scale_group" in e or item["rows"]) else None)
        items.append(item)
    for e in doc["copied"]:
        name = e["source"]
        if name in input_scales:
            continue
        if name not in src.entries:
            raise ConvertError(f"{src.root}: the plan copies {name}, which the checkpoint lacks")
        entry = src.entries[name]
        items.append({"op": None, "source": name, "recipe": None, "targets": None, "emits": [name], "feeds": [],
                      "fuse": None, "copy": True,
                      "rows": None, "members": None, "copied": False, "copy_codes": False})
        order.append((name, entry["dtype"], entry["shape"]))
    return items, order


def _by_fused_target(entries: list[dict]) -> list[dict]:
    """`entries`, each run of consecutive fused ones stably sorted by where its first target first appears."""
    out, run = [], []
    for e in entries + [None]:
        if e is not None and "fuse" in e:
            run.append(e)
            continue
        first: dict[str, int] = {}
        for k, f in enumerate(run):
            first.setdefault(next(iter(f["targets"])), k)
        out += sorted(run, key=lambda f: first[next(iter(f["targets"]))])
        run = []
        if e is not None:
            out.append(e)
    return out


def _src_bytes(src: Source, name: str) -> int:
    return src.nbytes(name)


def _job_id(doc: dict, src: Source, max_shard_bytes: int, scales: str) -> str:
    """Identity of a conversion: its plan, its source's tensors, its shard size, its input scales."""
    h = hashlib.sha256(json.dumps(doc, sort_keys=True).encode())
    h.update(json.dumps([src.where, src.entries, max_shard_bytes, scales], sort_keys=True).encode())
    return h.hexdigest()


def _recorded(work: Path, shard) -> str:
    """A resumed shard's digest, from the record `complete` accepted before this run wrote anything."""
    try:
        return read_json(work / shard.record, what="shard record")[SHARD_HASH]
    except (InputError, KeyError, TypeError) as err:
        raise ConvertError(f"{work / shard.record}: unreadable shard record ({err}); --force starts over") from None


def _pipeline(plan, src: Source, todo: list[dict], writer: ShardWriter, in_bytes: int, progress: bool,
              input_scales: dict) -> None:
    import torch

    from pcc.convert.quantized import (
        Encoded,
        check_codes,
        copied_tensors,
        read,
        read_rows,
    )
    from pcc.plan.encode import place_fused

    loaded: queue.Queue = queue.Queue(maxsize=2)
    out: queue.Queue = queue.Queue(maxsize=4)
    errors: list[BaseException] = []
    stop = threading.Event()

    put = functools.partial(put_until, stop)

    slots = _Slots(_IN_FLIGHT, stop)
    recycled = _Recycled()
    amaxes: dict[tuple, object] = {}  # scale members -> their amax (a group's, computed at its first member)

    def reader():
        try:
            for it in todo:
                name, buf = it["source"], None
                if it["members"] is not None:
                    if it["members"] not in amaxes:
                        amaxes[it["members"]] = _amax(src, it["members"], slots)
                    it["amax"] = amaxes[it["members"]]
                if it["copy"]:  # written as stored: in pieces of at most PIECE_BYTES
                    count = math.prod(src.entries[name]["shape"])
                    step = max(1, PIECE_BYTES // ST_BYTES[src.entries[name]["dtype"]])
                    for first in range(0, count, step) or [0]:
                        n = min(step, count - first)
                        if not slots.take():
                            return
                        buf = src.map(name, (first, n))
                        put(loaded, (it, (first, buf, first + n >= count), buf))
                    continue
                enc = src.view.encodings.get(name)
                if it["copy_codes"]:  # a copied encoding: its codes as stored, in pieces, then the rest whole
                    codes = enc.part("weight")
                    size = ST_BYTES[src.entries[codes]["dtype"]]
                    count, step = math.prod(src.entries[codes]["shape"]), max(1, PIECE_BYTES // size)
                    for first in range(0, count, step):
                        n = min(step, count - first)
                        if not slots.take():
                            return
                        buf = src.map(codes, (first, n))
                        put(loaded, (it, ("codes", buf, first + n >= count), buf))
                    rest = read(src, enc, codes=False)
                    put(loaded, (it, ("rest", rest, True), None))
                    continue
                if it["rows"] and enc is not None:  # a quantized source's rows: about PIECE_BYTES as float32
                    nrows, k = enc.shape
                    step = max(1, PIECE_BYTES // (4 * k) // it["rows"]) * it["rows"]
                    for r0 in range(0, nrows, step):
                        if stop.is_set():
                            return
                        r1 = min(r0 + step, nrows)
                        put(loaded, (it, (r0, read_rows(src, enc, r0, r1), r1 >= nrows), None))
                    continue
                if it["rows"]:  # quantized in row pieces of about PIECE_BYTES
                    nrows, *rest = src.entries[name]["shape"]
                    width = math.prod(rest)
                    row_bytes = width * ST_BYTES[src.entries[name]["dtype"]]
                    step = max(1, PIECE_BYTES // row_bytes // it["rows"]) * it["rows"]
                    for r0 in range(0, nrows, step):
                        n = min(step, nrows - r0)
                        if not slots.take():
                            return
                        buf = src.map(name, (r0 * width, n * width))
                        put(loaded, (it, (r0, buf.reshape(n, *rest), r0 + n >= nrows), buf))
                    continue
                if not src.stored(name):
                    put(loaded, (it, src.read(name), None))
                    continue
                if not slots.take():
                    return
                buf = src.map(name)
                put(loaded, (it, buf, buf))
        except BaseException as err:  # handed to the caller's thread
            errors.append(err)
            stop.set()
        finally:
            put(loaded, _DONE)

    bar = _bar(in_bytes, progress)

    def write_all():
        try:
            while True:
                item = out.get()
                if item is _DONE:
                    return
                name, tensor, nread, release, last, spent = item
                writer.write(name, _raw(tensor), last)  # (its bytes are copied or written when it returns)
                if release is not None:
                    slots.give()
                if spent is not None:
                    recycled.give(spent)
                if bar is not None and nread:
                    bar.update(nread)
        except BaseException as err:
            errors.append(err)
            stop.set()
            while out.get() is not _DONE:  # drain so the producer never blocks
                pass

    threads = [threading.Thread(target=reader, daemon=True), threading.Thread(target=write_all, daemon=True)]
    # One intra-op thread: the reader and writer threads own the other cores, and OpenMP
    # workers that spin while those run made conversions several times slower (bench/convert.py).
    intra = torch.get_num_threads()
    torch.set_num_threads(1)
    for t in threads:
        t.start()
    fused: dict[str, object] = {}  # fused targets being assembled (the first: its expert slice, `_compute`)
    row_parts: dict[str, list] = {}  # a weight quantized in row pieces: its scales (and zero points) so far
    try:
        while not stop.is_set():
            try:  # a timeout, so a reader that failed (and set `stop`) never leaves us waiting
                got = loaded.get(timeout=0.1)
            except queue.Empty:
                continue
            if got is _DONE:
                break
            it, tensor, buf = got
            if it["copy"]:  # a piece of a tensor written as stored: checked finite, then written
                first, piece, final = tensor
                name = it["source"]
                _check_finite(piece, name, src.file_of(name), first)
                if writer.wanted(name):
                    put(out, (name, piece, piece.numel() * piece.element_size(), buf, final, None))
                else:
                    slots.give()
                continue
            if it["copy_codes"]:  # a copied encoding: a piece of its codes, or at the end its other tensors
                part, value, final = tensor
                enc = src.view.encodings[it["source"]]
                targets = plan.rollout_tensors[plan.index[it["source"]]]["targets"]
                if part == "codes":
                    first = next(iter(targets))
                    check_codes(enc, first, value)
                    if writer.wanted(first):
                        put(out, (first, value, _nbytes(value), buf, final, None))
                    else:
                        slots.give()
                    continue
                for n, t in copied_tensors(enc, value.parts, targets).items():
                    if writer.wanted(n):
                        put(out, (n, input_scales.get(n, t), _nbytes(t), None, True, None))
                continue
            if it["rows"]:  # a row piece of a quantized weight: its codes now, the rest after the last piece
                r0, rows, final = tensor
                nrows = rows.enc.shape[0] if isinstance(rows, Encoded) else rows.shape[0]
                spent = _codes_out(plan, it, nrows, recycled)
                got = {n: input_scales.get(n, t) for n, t in _rows_piece(plan, src, it, r0, rows, spent).items()}
                nread = _nbytes(rows)
                if buf is not None:
                    slots.give()
                del rows, buf, tensor  # a mapped piece is unmapped once nothing views it
                names = list(got)
                if writer.wanted(names[0]):
                    put(out, (names[0], got[names[0]], nread, None, final, spent))
                elif spent is not None:
                    recycled.give(spent)
                for n in names[1:]:
                    row_parts.setdefault(n, []).append(got[n])
                if final:
                    whole = plan.rollout_tensors[plan.index[it["source"]]]["targets"]
                    for n in names[1:]:
                        parts = row_parts.pop(n)
                        t = parts[-1] if list(parts[-1].shape) == list(whole[n]["shape"]) else torch.cat(parts)
                        if writer.wanted(n):
                            put(out, (n, t, 0, None, True, None))
                continue
            nread = _src_bytes(src, it["source"])
            spent = _codes_out(plan, it, None, recycled)
            pieces = [p for p in _compute(plan, src, it, tensor, fused, place_fused, input_scales, spent)
                      if writer.wanted(p[0])]
            del tensor
            # the read buffer goes back once nothing still to be written is a view of it
            last = max((k for k, (_, t, _) in enumerate(pieces) if buf is not None and _shares(t, buf)), default=None)
            if buf is not None and last is None:
                slots.give()
            if spent is not None and not pieces:
                recycled.give(spent)
            for k, (name, t, final) in enumerate(pieces):  # the codes buffer goes back after the item's last
                put(out, (name, t, nread, buf if k == last else None, final,
                          spent if k == len(pieces) - 1 else None))
                nread = 0
    except BaseException as err:
        errors.append(err)
        stop.set()
    finally:
        wind_down(errors, stop, out, _DONE, threads, bar, lambda: torch.set_num_threads(intra))


def put_until(stop: threading.Event, q: queue.Queue, item) -> None:
    """Put `item` on `q`, waiting while it is full, unless the pipeline is stopped (then it is dropped)."""
    while not stop.is_set():
        try:
            q.put(item, timeout=0.1)
            return
        except queue.Full:
            continue


def wind_down(errors: list, stop: threading.Event, out: queue.Queue, done, threads: list, bar, cleanup) -> None:
    """The end of a pipeline (this one's and pcc.convert.fast's), after its loop or an error: the writer told
    the input is over (it consumes until `done`, also while draining after an error), the reader stopped at its
    next put, the threads joined, `cleanup()` run and the bar closed; then the first error raised, a
    ConvertError or Ctrl-C as itself, anything else as a ConvertError."""
    out.put(done)
    stop.set()
    for t in threads:
        t.join()
    try:
        cleanup()
    finally:
        if bar is not None:
            bar.close()
    if errors:
        err = errors[0]
        if isinstance(err, ConvertError) or not isinstance(err, Exception):  # Ctrl-C stays itself
            raise err
        raise ConvertError(str(err)) from err


class _Slots:
    """How many source pieces are in flight (mapped, queued, computed or being written): the bound on
    read memory, since a mapped piece stays resident until the last tensor viewing it is written."""

    def __init__(self, count: int, stop: threading.Event):
        self._free = threading.Semaphore(count)
        self._stop = stop

    def take(self) -> bool:
        """Wait for a free slot; False once the pipeline stops."""
        while not self._free.acquire(timeout=0.1):
            if self._stop.is_set():
                return False
        return not self._stop.is_set()

    def give(self) -> None:
        self._free.release()


class _Recycled:
    """Buffers the writer has finished with, for the next quantized tensors' codes (`quantize(out=)`).

    glibc maps an allocation of tens of MiB afresh and unmaps it when freed, so a new codes tensor for
    every piece was pages the kernel faulted in and zeroed: for the bench's 0.92 GB of codes, 165 000
    faults on the chunk workers and 6% of the conversion's CPU time (docs/convert.md "Speed"). The
    queues bound how many are in flight; at most `keep` wait here."""

    def __init__(self, keep: int = _IN_FLIGHT + 2):
        self._free: list = []
        self._keep = keep
        self._lock = threading.Lock()

    def take(self, nbytes: int):
        """A uint8 tensor of at least `nbytes`: the smallest free one that fits, else a new one."""
        import torch

        with self._lock:
            fits = [k for k, b in enumerate(self._free) if b.numel() >= nbytes]
            if fits:
                return self._free.pop(min(fits, key=lambda k: self._free[k].numel()))
        return torch.empty(nbytes, dtype=torch.uint8)

    def give(self, buf) -> None:
        with self._lock:
            if len(self._free) < self._keep:
                self._free.append(buf)


def _codes_out(plan, it: dict, nrows: int | None, recycled: _Recycled):
    """A recycled buffer for the codes of work item `it`'s weight (`nrows` of its rows, or whole), or None
    where nothing is quantized into one: kept wide, copied, a fused expert (placed into the fused tensor)
    or small codes."""
    from pcc.numerics import codes_nbytes

    if it["op"] is None or it["fuse"] is not None or it["copied"]:
        return None
    i = plan.index[it["source"]]
    if not plan.layouts[i].quantized:
        return None
    shape = tuple(plan.catalog.operators[i].shape)
    if nrows is not None:
        shape = (nrows,) + shape[1:]
    nbytes = codes_nbytes(shape, plan.scheme("rollout", i))
    return recycled.take(nbytes) if nbytes >= _RECYCLE_MIN else None


def _rows_piece(plan, src: Source, it: dict, r0: int, rows, out=None) -> dict:
    """Rollout tensors of rows [r0, r0 + n) of a weight, `rows` those rows as stored or encoded
    (pcc.convert.quantized.rollout_of); `out`: storage for the codes."""
    from pcc.convert.quantized import Encoded, rollout_of

    file = src.file_of(it["source"])
    n = rows.enc.shape[0] if isinstance(rows, Encoded) else rows.shape[0]
    try:
        return rollout_of(plan, plan.index[it["source"]], rows, amax=it.get("amax"), rows=slice(r0, r0 + n),
                          copy=it["copied"], out=out)
    except (ValueError, ConvertError) as err:
        raise ConvertError(f"{file}: {err} (in rows {r0}..{r0 + n})") from None


def _nbytes(t) -> int:
    """Bytes read for a piece: a stored tensor's, or an encoded piece's parts'."""
    parts = t.parts.values() if hasattr(t, "parts") else [t]
    return sum(p.numel() * p.element_size() for p in parts)


def _amax(src: Source, members: tuple, slots: _Slots):
    """max |w| over the weights `members` as they are quantized (a stored one read in row pieces of
    about PIECE_BYTES, a quantized source's dequantized): the amax of one global scale."""
    import torch

    from pcc.convert.quantized import read_rows, row_unit
    from pcc.numerics import tensor_amax

    found = []
    for name in members:
        try:
            enc = src.view.encodings.get(name)
            if enc is not None:  # its dequantized values, a piece of rows at a time
                unit = row_unit(enc)
                step = max(unit, PIECE_BYTES // (4 * enc.shape[1]) // unit * unit)
                for r0 in range(0, enc.shape[0], step):
                    rows = read_rows(src, enc, r0, min(r0 + step, enc.shape[0])).dequantize()
                    found.append(tensor_amax(rows, name))
                continue
            nrows, *rest = src.entries[name]["shape"]
            width = math.prod(rest)
            row_bytes = width * ST_BYTES[src.entries[name]["dtype"]]
            step = max(1, PIECE_BYTES // max(row_bytes, 1))
            for r0 in range(0, nrows, step):
                n = min(step, nrows - r0)
                if not slots.take():
                    break
                try:
                    found.append(tensor_amax(src.map(name, (r0 * width, n * width)), name))
                finally:
                    slots.give()
        except ValueError as err:
            raise ConvertError(f"{src.file_of(name)}: {err}") from None
    return torch.stack(found).amax()


def _shares(t, buf) -> bool:
    return t.untyped_storage().data_ptr() == buf.untyped_storage().data_ptr()


def _compute(plan, src: Source, it: dict, tensor, fused: dict, place_fused, input_scales: dict, out=None):
    """(name, tensor, last piece?) one work item contributes, in write order; NVFP4 input scales are
    the carried or calibrated ones. A quantized source's weight (`Encoded`) is copied or dequantized
    and requantized by `pcc.convert.quantized.rollout_of`. Of a fused [E, ...] target, the first
    (MXFP4 `_blocks`) is written an expert at a time, as each expert's slice is complete (its parts
    arrive expert by expert, `_by_fused_target`); the others (`_scales`, 1/16 of it) are assembled
    whole and written with the last expert. `out`: storage for the codes (`_codes_out`)."""
    import torch

    from pcc.convert.quantized import Encoded, rollout_of

    file = src.file_of(it["source"])
    if it["op"] is None:
        _check_finite(tensor, it["source"], file)
        return [(it["source"], tensor)]
    op = plan.catalog.operators[plan.index[it["source"]]]
    wide = not plan.layouts[plan.index[it["source"]]].quantized
    if not isinstance(tensor, Encoded) and not wide and src.entries[it["source"]]["dtype"] not in _WIDE_SOURCE:
        entry = src.entries[it["source"]]
        raise ConvertError(f"{file}: {op.tensor} is {entry['dtype']}; the converter quantizes BF16/FP16/FP32 weights")
    try:
        pieces = rollout_of(plan, plan.index[it["source"]], tensor, amax=it.get("amax"), copy=it["copied"],
                            out=out)
    except ValueError as err:
        raise ConvertError(f"{file}: {err}") from None
    except ConvertError as err:
        raise ConvertError(f"{file}: {err}") from None
    if not isinstance(tensor, Encoded) and wide:  # (a quantized source's values are checked as dequantized)
        _check_finite(tensor, it["source"], file)
    pieces = {n: input_scales.get(n, t) for n, t in pieces.items()}
    if it["fuse"] is None:
        return [(n, t, True) for n, t in pieces.items()]
    ready = []
    fuse = it["fuse"]
    per_expert = 1 if fuse["rows"] == "all" else 2
    for k, (name, piece) in enumerate(pieces.items()):
        shape = _fused_shape(plan, it, name)
        if k == 0:  # streamed: this expert's slice
            state = fused.setdefault(name, {"expert": 0, "parts": 0, "slice": None})
            if fuse["expert"] != state["expert"]:
                raise ConvertError(f"internal order error: {it['source']} is expert {fuse['expert']}, "
                                   f"{name} expects expert {state['expert']}")
            if state["slice"] is None:
                state["slice"] = torch.zeros([1, *shape[1:]], dtype=piece.dtype)
            place_fused(state["slice"], piece, {**fuse, "expert": 0})
            state["parts"] += 1
            if state["parts"] == per_expert:
                final = fuse["expert"] == shape[0] - 1
                ready.append((name, state["slice"][0], final))
                state.update(expert=fuse["expert"] + 1, parts=0, slice=None)
                if final:
                    del fused[name]
            continue
        if name not in fused:
            fused[name] = torch.zeros(shape, dtype=piece.dtype)
        place_fused(fused[name], piece, fuse)
        if name in it["emits"]:
            ready.append((name, fused.pop(name), True))
    return ready


def _fused_shape(plan, it: dict, name: str) -> list[int]:
    return plan.rollout_tensors[plan.index[it["source"]]]["targets"][name]["shape"]


def _check_finite(tensor, name: str, file: Path, first: int | None = None) -> None:
    """NaN or inf anywhere is refused; `first`: the tensor is the flat piece starting at that element."""
    import torch

    from pcc.numerics import all_finite

    if not all_finite(tensor):
        bad = (~torch.isfinite(tensor)).nonzero()[0].tolist()
        where = f"index {bad}" if first is None else f"flat element {first + bad[0]}"
        raise ConvertError(f"{file}: {name} holds NaN or inf (first at {where})")


def _raw(tensor):
    """The tensor's bytes as a buffer, without a copy for contiguous tensors."""
    import torch

    return tensor.contiguous().reshape(-1).view(torch.uint8).numpy()


def _bar(total: int, progress: bool):
    if not progress or not sys.stderr.isatty():
        return None
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return tqdm(total=total, unit="B", unit_scale=True, desc="convert", file=sys.stderr)


def _finish(doc: dict, src: Source, work: Path, shards, hashes: dict, job: str, scales,
            extras: list[Path]) -> None:
    """config.json, index, side files, manifest; then the written headers checked against the plan."""
    config = dict(src.config)
    config.pop("quantization_config", None)
    if doc["quantization_config"] is not None:
        config["quantization_config"] = doc["quantization_config"]
    _write_json(work / "config.json", config)
    if doc["hf_quant_config"] is not None:
        _write_json(work / "hf_quant_config.json", doc["hf_quant_config"])
    for path in extras:
        shutil.copyfile(path, work / path.name)
    weight_map = {n: s.file for s in shards for n in s.names}
    total = sum(s.size - len(s.header) for s in shards)
    if len(shards) > 1:
        _write_json(work / INDEX, {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))})
    _write_json(work / CHECKPOINT_MARK, {"contract": doc["contract"], "layout": doc["layout"], "job": job,
                                            "shard_hash": SHARD_HASH, "shards": hashes, "input_scales": scales.summary()})
    for s in shards:
        if not _written_as_planned(work / s.file, s):
            raise ConvertError(f"{work / s.file}: written header does not match the plan")


def _written_as_planned(path: Path, shard) -> bool:
    """Does the file hold the shard's planned header, byte for byte, and its planned size (read back from the
    file, not taken from what the writer was handed)?"""
    with path.open("rb") as f:
        return os.fstat(f.fileno()).st_size == shard.size and f.read(len(shard.header)) == shard.header


def _write_json(path: Path, data) -> None:
    path.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")


@contextlib.contextmanager
def _start_up():
    """The cyclic GC paused until `started()` (the contract compiled), then the objects made so far kept out of its
    collections until the conversion ends (gc.freeze): the compile allocates the contract's model, the plan and a
    MoE's thousands of operators, and the collections that traverse them again and again cost 0.04-0.06 CPU-s of
    a conversion while freeing next to nothing (docs/convert.md "Speed"). Left alone where the caller paused it."""
    import gc

    if not gc.isenabled():
        yield lambda: None
        return
    frozen = []

    def started():
        gc.freeze()
        frozen.append(True)
        gc.enable()

    gc.disable()
    try:
        yield started
    finally:
        if frozen:
            gc.unfreeze()
        gc.enable()


@contextlib.contextmanager
def _stopping(dst: Path, work: Path):
    """A conversion that stops (an error, Ctrl-C) cleans up (`_abandon`) and says what it left: its error's message
    ends with it, and Ctrl-C stays a KeyboardInterrupt whose text is that (the CLI exits 130 with it)."""
    try:
        yield
    except BaseException as err:
        left = _abandon(dst, work)
        if isinstance(err, KeyboardInterrupt):
            raise KeyboardInterrupt(f"the conversion into {dst} was interrupted: {left}") from err
        if isinstance(err, ConvertError):
            err.message = f"{err.message}; {left}"
            err.args = (err.message,)
        raise


def _abandon(dst: Path, work: Path) -> str:
    """The shard being written goes, and the staging directory with it unless it holds finished shards, which
    `--resume` continues from; what is left, in words."""
    for tmp in work.glob("*.tmp"):
        tmp.unlink(missing_ok=True)
    done = len(list((work / RECORDS).glob("*.done.json")))
    if done:
        return (f"nothing was written to {dst}; the {done} finished shard(s) in {work} are kept: rerun with --resume "
                "to continue, --force to start over")
    shutil.rmtree(work, ignore_errors=True)
    return f"nothing was written to {dst}"


def _install(work: Path, dst: Path) -> None:
    """Rename the finished output into place; a replaced destination is removed only after."""
    shutil.rmtree(work / RECORDS)
    old = None
    if dst.exists():
        old = dst.with_name(f".{dst.name}.old-{os.getpid()}")
        os.replace(dst, old)
    os.replace(work, dst)
    if old is not None:
        shutil.rmtree(old) if old.is_dir() else old.unlink()
