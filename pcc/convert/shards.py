"""Output shards planned up front, then written front to back.

Every target's dtype and shape is known from the converter plan before any data is read, so
shard assignment and each shard's safetensors header are fixed first: data then streams into
place, the output is the same bytes on every run, and `--resume` can trust a shard whose
completion record's digest matches the file.

Shards are digested with BLAKE3 (`SHARD_HASH`): a cryptographic hash like SHA-256, but 4-5x faster
on one core (5.0 against 1.1 GB/s here, docs/convert.md "Speed"), on a thread of its own, each slot of the
staging ring while the disk thread writes it (`ShardWriter`). A record written with SHA-256
(before) still verifies with SHA-256.
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import errno
import functools
import hashlib
import json
import math
import mmap
import os
import sys
import threading
import weakref
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path

from pcc.convert import ConvertError
from pcc.lang.inputs import InputError, read_json
from pcc.lang.outputs import write_atomic

ST_DTYPES = {"bfloat16": "BF16", "float16": "F16", "float32": "F32", "float64": "F64", "float8_e4m3fn": "F8_E4M3",
             "float8_e5m2": "F8_E5M2", "uint8": "U8", "int8": "I8", "int16": "I16", "int32": "I32",
             "int64": "I64", "bool": "BOOL"}
ST_BYTES = {"BF16": 2, "F16": 2, "F32": 4, "F64": 8, "F8_E4M3": 1, "F8_E5M2": 1, "U8": 1, "I8": 1, "I16": 2,
            "I32": 4, "I64": 8, "BOOL": 1}
RECORDS = ".pcc"  # completion records inside the partial output


@dataclass
class Shard:
    file: str
    names: list[str]
    header: bytes  # 8-byte length + padded JSON
    size: int  # whole file
    ends: list[int] = field(default_factory=list)  # each tensor's end in the data, as its header says

    @property
    def record(self) -> str:
        return f"{RECORDS}/{self.file}.done.json"


def plan_shards(targets: list[tuple[str, str, list[int]]], max_bytes: int) -> list[Shard]:
    """targets: (name, safetensors dtype, shape) in write order -> shards of at most max_bytes
    of data (a larger tensor gets a shard of its own)."""
    groups: list[list[tuple[str, str, list[int]]]] = [[]]
    fill = 0
    for t in targets:
        size = ST_BYTES[t[1]] * math.prod(t[2])
        if groups[-1] and fill + size > max_bytes:
            groups.append([])
            fill = 0
        groups[-1].append(t)
        fill += size
    n = len(groups)
    shards = []
    for k, group in enumerate(groups, 1):
        file = "model.safetensors" if n == 1 else f"model-{k:05d}-of-{n:05d}.safetensors"
        header, offset = {}, 0
        for name, dtype, shape in group:
            end = offset + ST_BYTES[dtype] * math.prod(shape)
            header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, end]}
            offset = end
        header["__metadata__"] = {"format": "pt"}
        raw = json.dumps(header, separators=(",", ":")).encode()
        raw += b" " * (-len(raw) % 8)  # align data to 8 bytes, as safetensors' own writer does
        blob = len(raw).to_bytes(8, "little") + raw
        ends = [header[name]["data_offsets"][1] for name, _, _ in group]
        shards.append(Shard(file, [t[0] for t in group], blob, len(blob) + offset, ends))
    return shards


SHARD_HASH = "blake3"  # the digest of every shard written; pcc_convert.json names it


def hasher(algorithm: str = SHARD_HASH, data: bytes = b""):
    """A fresh digest object of `algorithm` ("blake3", or "sha256" for records written before)."""
    if algorithm == "blake3":
        from blake3 import blake3

        return blake3(data)
    if algorithm == "sha256":
        return hashlib.sha256(data)
    raise ValueError(f"unknown shard hash {algorithm!r} (pcc writes {SHARD_HASH!r})")


def file_digest(path: Path, algorithm: str = SHARD_HASH) -> str:
    h = hasher(algorithm)
    with path.open("rb") as f:
        while chunk := f.read(16 << 20):
            h.update(chunk)
    return h.hexdigest()


def complete(root: Path, shard: Shard, job: str) -> bool:
    """Is this shard finished, by its record and the file's own hash (for --resume)?"""
    try:
        rec = read_json(root / shard.record, what="shard record")
    except InputError:
        return False
    path = root / shard.file
    return (isinstance(rec, dict) and rec.get("job") == job and path.is_file() and path.stat().st_size == shard.size
            and rec.get(SHARD_HASH) == file_digest(path))


# Bytes written between two background flushes of a shard written through the page cache.
FLUSH_BYTES = 64 << 20
_DATASYNC = getattr(os, "fdatasync", os.fsync)  # macOS has no fdatasync
STAGE_BYTES = 16 << 20  # one write: a slot of the staging ring
STAGE_COUNT = 5  # slots in the ring (what a batch of the fast pipeline reserves at once fits in STAGE_COUNT - 2)
# O_DIRECT wants offsets, lengths and buffer addresses aligned to the device's logical block size;
# 4096 is a multiple of every size in use, and the staging ring (mmap) is page-aligned.
_ALIGN = 4096


def _ring_memory(size: int) -> tuple[memoryview, bool]:
    """`size` bytes for the staging ring, and whether they are mapped twice back to back (one memfd, Linux), so
    a span that runs past the ring's end is one view of [at, at + nbytes) and is written in place. Elsewhere, or
    where the mapping fails, one anonymous mapping, and such a span is bounced (ShardWriter._claim). Unmapped
    once the last view of it is gone."""
    if sys.platform == "linux" and hasattr(os, "memfd_create") and size % mmap.PAGESIZE == 0:
        try:
            return _twice(size), True
        except (OSError, AttributeError):
            pass
    return memoryview(mmap.mmap(-1, size)), False  # (zero pages until first written)


_MADV_REMOVE = 9  # (Linux) a shared mapping's pages freed (the memfd's, or mmap's shared anonymous ones)


def _give_back(view: memoryview, written: list[Future]) -> None:
    """On the freeing thread: a slot's pages freed once its write and hash are done (`written`), where no later
    byte of the stream is staged there: what the ring's unmapping would free after the last write (18 ms for its
    80 MiB here), freed beside the last slots' writes instead. Where the system refuses, they are freed then."""
    wait(written)
    at = buffer_address(view)
    if sys.platform == "linux" and at is not None:
        _libc().madvise(at, view.nbytes, _MADV_REMOVE)


@functools.cache
def _libc():
    """The C library, with the signatures of the calls the ring makes (mmap, munmap, madvise), set once."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype, libc.mmap.argtypes = ctypes.c_void_p, [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int,
                                                              ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.munmap.restype, libc.munmap.argtypes = ctypes.c_int, [ctypes.c_void_p, ctypes.c_size_t]
    if hasattr(libc, "madvise"):
        libc.madvise.restype, libc.madvise.argtypes = ctypes.c_int, [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    return libc


def _twice(size: int) -> memoryview:
    libc = _libc()
    map_, unmap = libc.mmap, libc.munmap
    fd = os.memfd_create("pcc-ring", getattr(os, "MFD_CLOEXEC", 1))
    try:
        os.ftruncate(fd, size)
        base = map_(None, 2 * size, 0, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, -1, 0)  # reserved (PROT_NONE)
        if base in (None, ctypes.c_void_p(-1).value):
            raise OSError(ctypes.get_errno(), "mmap")
        for half in (base, base + size):  # the file over each half (MAP_FIXED: 0x10 on Linux)
            if map_(half, size, mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_SHARED | 0x10, fd, 0) != half:
                err = ctypes.get_errno()
                unmap(base, 2 * size)
                raise OSError(err, "mmap")
    finally:
        os.close(fd)  # (the mappings hold the file)
    memory = (ctypes.c_char * (2 * size)).from_address(base)
    weakref.finalize(memory, unmap, base, 2 * size)
    return memoryview(memory).cast("B")


def _open_direct(path: Path) -> int | None:
    """The shard opened for O_DIRECT writes, or None where the platform or filesystem refuses it."""
    flag = getattr(os, "O_DIRECT", 0)
    if not flag:
        return None
    try:
        return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | flag, 0o666)
    except OSError as err:
        if err.errno in (errno.EINVAL, errno.EOPNOTSUPP, errno.ENOTSUP):
            return None
        raise


def _digest(digest, data) -> None:
    """A slot's bytes into its shard's digest (on the hash thread, in order)."""
    digest.update(data)


def _write_all(fd: int, data: memoryview, offset: int) -> None:
    """`data` at `offset` of the file (on the disk thread)."""
    done = 0
    while done < data.nbytes:
        with data[done:] as view:
            done += os.pwrite(fd, view, offset + done)


@contextlib.contextmanager
def writing(path: Path):
    """A write the disk refuses (full, read-only, gone) is one line naming the file and the system's reason (PCC709)."""
    try:
        yield
    except OSError as err:
        raise refused(err, path) from err


def refused(err: OSError, path: Path) -> ConvertError:
    return ConvertError(f"{err.filename or path}: cannot write: {err.strerror or err}", code="PCC709")


def buffer_address(buf) -> int | None:
    """The address of a writable buffer's first byte (a numpy array, a bytearray, a writable mapping, a
    memoryview of one), or None for a read-only or empty one. The caller keeps `buf` alive while it uses it."""
    try:
        return ctypes.addressof(ctypes.c_char.from_buffer(buf))
    except (TypeError, ValueError):
        return None


def _copy(dst: memoryview, data, at: int | None = None) -> None:
    """`data`'s bytes into `dst` (as many; `at`: its address, where known): with ctypes' memmove, which lets go of
    the GIL (a memoryview copy holds it: 1.2 GB of copies stalled the quantizing threads, most on a busy
    machine), where both have an address; a read-only source (a header's bytes) copied holding it."""
    with memoryview(data) as view, view.cast("B") as raw:
        at, src = buffer_address(dst) if at is None else at, buffer_address(data)
        if at is not None and src is not None:
            ctypes.memmove(at, src, raw.nbytes)
        elif raw.nbytes:
            dst[:] = raw


class Span:
    """Bytes [start, end) of the output stream, reserved for (part of) one tensor: `view` is where they go, a
    view of the staging ring where the file's next writes come from, or a buffer of their own (`bounced`)
    copied into the ring when committed, where they would wrap the ring's end or are too long for one
    reservation. `before`: the header of the shard this span opens, committed first. `address`: the view's first
    byte's (a kernel's output pointer)."""

    __slots__ = ("_address", "before", "bounced", "end", "start", "view")

    def __init__(self, start: int, end: int, view: memoryview, bounced: bool, before: Span | None = None,
                 address: int | None = None):
        self.start, self.end, self.view, self.bounced, self.before = start, end, view, bounced, before
        self._address = address

    @property
    def address(self) -> int | None:
        if self._address is None:
            self._address = buffer_address(self.view)
        return self._address


class _Sink:
    """One shard's file: opened with O_DIRECT where offered (whole aligned blocks, the last zero-padded and
    truncated away; no page cache filled and written back: on ext4 here buffered writes cost 0.4-2.6 s of system
    time per GB, direct ones about 0.05, docs/convert.md "Speed"), else written through the page cache and
    fdatasynced in the background each FLUSH_BYTES, so the final fsync writes only the tail."""

    def __init__(self, shard: Shard, path: Path, start: int):
        self.shard, self.path, self.start, self.end = shard, path, start, start + shard.size
        fd = _open_direct(path)
        self.direct = fd is not None
        self.fd = fd if fd is not None else os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)
        self.digest = hasher(SHARD_HASH)
        self.sent = start  # the stream position up to which slots went to the disk thread
        self.futures: list[Future] = []
        self._since = 0

    def put(self, data: memoryview, offset: int) -> None:
        """On the disk thread, in order."""
        _write_all(self.fd, data, offset)
        if not self.direct:
            self._since += data.nbytes
            if self._since >= FLUSH_BYTES:
                _DATASYNC(self.fd)
                self._since = 0

    def wait(self) -> None:
        for f in self.futures:
            f.result()

    def close(self) -> None:
        try:
            self.wait()
            if self.direct:
                os.ftruncate(self.fd, self.shard.size)
            os.fsync(self.fd)
        finally:
            os.close(self.fd)

    def discard(self) -> None:
        """Closed unfinished after a failure, which this does not raise again."""
        for f in self.futures:
            with contextlib.suppress(Exception):
                f.result()
        with contextlib.suppress(OSError):
            os.close(self.fd)


class ShardWriter:
    """Receives each tensor's bytes in plan order and writes each shard as it fills; a finished shard is fsynced,
    renamed from its .tmp name and recorded with its digest.

    The shards are one stream through a staging ring of STAGE_COUNT slots of STAGE_BYTES (each shard starting at
    a slot), with two cursors: a producer `reserve`s a tensor's next bytes, gets a view of the ring where they
    will be written from, fills it (perhaps on other threads: the fast pipeline's kernels quantize into it, its
    reads land in it) and `commit`s the spans in the same order; a slot whose bytes are all committed goes to the
    disk thread and the hash thread (each only reads it), and its bytes are reserved again once both are done (in
    the ring's last pass, its pages are freed then: `_give_back`). So
    nothing is copied between computing a tensor's bytes and writing them, the disk works while the next tensors
    are computed, and the hash never delays a write (on the disk thread it made that thread the bench MoE's
    bottleneck). `write` is the three at once (the torch pipeline's writer)."""

    def __init__(self, root: Path, shards: list[Shard], done: set[str], job: str):
        self.root, self.job = root, job
        self.shards = [s for s in shards if s.file not in done]
        self.owner = {n: s for s in self.shards for n in s.names}
        self.digests = {}
        self._slot, self._count = STAGE_BYTES, STAGE_COUNT
        self._disk = ThreadPoolExecutor(1, thread_name_prefix="pcc-disk")
        self._hashing = ThreadPoolExecutor(1, thread_name_prefix="pcc-hash")
        self._freeing = ThreadPoolExecutor(1, thread_name_prefix="pcc-free")
        self._end = 0  # where the stream ends: the ring's last use of each slot (`_give_back`)
        for s in self.shards:
            self._end = self._slot_start(self._end) + s.size
        self._ring: memoryview | None = None  # made at the first reservation (`_ring_memory`)
        self._ring_at = 0  # its first byte's address
        self._doubled = False  # the ring mapped twice back to back: a span past its end is written in place
        self._lock = threading.Condition()
        self._sent: dict[int, list] = {}  # slot number (stream position // slot) -> (its hash and write, the file)
        self._submitted = 0  # slots [0, _submitted) sent to the disk (or unused, between shards)
        self._cleared = 0  # slots [0, _cleared) written and hashed: their ring bytes free again
        self._sinks: collections.deque[_Sink] = collections.deque()  # opened by `reserve`, not yet closed
        # the producer's shard, its next name, the stream position, the shard's start in the stream
        self._shard, self._pos, self._at, self._start = None, 0, 0, 0
        self._handed = 0  # the stream position up to which reserved spans will be committed (`hand_off`)

    def wanted(self, name: str) -> bool:
        return name in self.owner

    def _slot_start(self, at: int) -> int:
        """Where a shard opened at stream position `at` starts: the next slot's first byte (a slot is one write)."""
        return -(-at // self._slot) * self._slot

    # ---- the producer's side ----

    def reserve(self, name: str, nbytes: int, last: bool = True, stop=None) -> Span | None:
        """The next `nbytes` of tensor `name` (`last` on its final piece), waiting for the ring's bytes to be
        written; None once `stop` is set."""
        shard = self.owner[name]
        try:
            before = None
            if shard is not self._shard:
                before = self._open(shard, stop)
                if before is False:
                    return None
            expect = shard.names[self._pos] if self._pos < len(shard.names) else None
            if name != expect:
                raise ConvertError(f"internal order error: got {name}, {shard.file} expects {expect}")
            span = self._claim(nbytes, stop)
            if span is None:
                return None
            span.before = before
            if last:
                want = len(shard.header) + shard.ends[self._pos]
                if self._at - self._start != want:
                    raise ConvertError(f"internal size error: {name} ends at byte {self._at - self._start} of "
                                       f"{shard.file}, its header says {want}")
                self._pos += 1
            return span
        except OSError as err:
            raise refused(err, self.root / (shard.file + ".tmp")) from err

    def _open(self, shard: Shard, stop):
        """The shard's file and its header's span; False once `stop` is set."""
        if self._shard is not None and self._pos != len(self._shard.names):
            raise ConvertError(f"{self._shard.file}: left incomplete")
        if self._ring is None:
            self._ring, self._doubled = _ring_memory(self._slot * self._count)
            self._ring_at = buffer_address(self._ring)
        self._at = self._start = self._slot_start(self._at)
        self._sinks.append(_Sink(shard, self.root / (shard.file + ".tmp"), self._at))
        self._shard, self._pos = shard, 0
        header = self._claim(len(shard.header), stop)
        if header is None:
            return False
        _copy(header.view, shard.header)
        return header

    def _claim(self, nbytes: int, stop) -> Span | None:
        """The next `nbytes` of the stream: a view of the ring once its slots are free (past its end, the second
        mapping of a doubled ring), else bounced (wrapping the end of a ring mapped once, or needing a slot whose
        bytes wait for spans not yet handed off: waiting would never end)."""
        start, ring = self._at, self._slot * self._count
        self._at += nbytes
        at, slots = start % ring, range(start // self._slot, -(-(start + nbytes) // self._slot))
        wraps = at + nbytes > ring and not (self._doubled and nbytes <= ring)
        if wraps or any((k - self._count + 1) * self._slot > self._handed for k in slots):
            return Span(start, start + nbytes, memoryview(bytearray(nbytes)), True)
        for k in slots:
            if not self._ready(k, stop):
                return None
        return Span(start, start + nbytes, self._ring[at:at + nbytes], False, address=self._ring_at + at)

    def hand_off(self) -> None:
        """The spans reserved so far will be committed without waiting for more reservations (the producer
        handed them on): a later reservation may wait for their slots to be written."""
        self._handed = self._at

    def _ready(self, k: int, stop) -> bool:
        """Slot k's bytes are free: its previous use written and hashed (an error of either raised here)."""
        old = k - self._count
        if old < self._cleared:
            return True
        with self._lock:
            while self._submitted <= old:
                if stop is not None and stop.is_set():
                    return False
                self._lock.wait(0.1)
            pending = [(f, path) for s in range(self._cleared, old + 1) for f, path in self._sent.get(s, ())]
        for f, path in pending:
            try:
                f.result()
            except OSError as err:
                raise refused(err, path) from err
        with self._lock:
            for s in range(self._cleared, old + 1):
                self._sent.pop(s, None)
            self._cleared = max(self._cleared, old + 1)
        return True

    # ---- the committing side ----

    def commit(self, span: Span, data=None) -> None:
        """The span's bytes are in place (`data` copied in first, if given); spans are committed in the order
        they were reserved."""
        if span.before is not None:
            self.commit(span.before)
        if span.start == span.end:  # nothing to place (an empty tensor: its shard may be finished already)
            return
        sink = self._sinks[0]
        try:
            if data is not None:
                _copy(span.view, data, span.address)
            if not span.bounced:
                self._advance(sink, span.end)
                return
            at, ring = span.start, self._slot * self._count
            while at < span.end:  # slot by slot, each once free
                k = at // self._slot
                self._ready(k, None)
                n = min((k + 1) * self._slot, span.end) - at
                _copy(self._ring[at % ring:at % ring + n], span.view[at - span.start:at - span.start + n])
                at += n
                self._advance(sink, at)
        except OSError as err:
            raise refused(err, sink.path) from err

    def _advance(self, sink: _Sink, at: int) -> None:
        """Bytes up to stream position `at` are committed: full slots of the shard go to the disk, and the
        shard is finished where `at` is its end."""
        while sink.sent + self._slot <= at:
            self._send(sink, sink.sent + self._slot)
        if at == sink.end:
            if sink.sent < at:
                self._send(sink, at)
            self._close(sink)

    def _send(self, sink: _Sink, end: int) -> None:
        """The slot from `sink.sent` to `end` to the hash and disk threads."""
        start, ring = sink.sent, self._slot * self._count
        at, n = start % ring, end - start
        length = -(-n // _ALIGN) * _ALIGN if sink.direct else n  # (the last block zero-padded, then truncated)
        if length > n:
            self._ring[at + n:at + length] = bytes(length - n)
        view = self._ring[at:at + length]
        sent = [self._hashing.submit(_digest, sink.digest, view[:n]),
                self._disk.submit(sink.put, view, start - sink.start)]
        sink.futures += sent
        if start + ring >= self._end:  # (no later byte of the stream is staged in this slot: a shard starts at one)
            self._freeing.submit(_give_back, self._ring[at:at + self._slot], sent)
        sink.sent = end
        with self._lock:
            self._sent[start // self._slot] = [(f, sink.path) for f in sent]
            self._submitted = -(-end // self._slot)
            self._lock.notify_all()

    def _close(self, sink: _Sink) -> None:
        shard = sink.shard
        if self._sinks.popleft() is not sink:
            raise ConvertError(f"internal order error: {shard.file} finished out of turn")
        sink.close()
        if os.stat(sink.path).st_size != shard.size:
            raise ConvertError(f"{sink.path}: wrote {os.stat(sink.path).st_size} bytes, the plan says {shard.size}")
        os.replace(sink.path, self.root / shard.file)
        digest = sink.digest.hexdigest()
        self.digests[shard.file] = digest
        # whole or absent: a kill while writing it leaves only a temporary file
        write_atomic(self.root / shard.record, json.dumps({"job": self.job, SHARD_HASH: digest, "file": shard.file}))

    # ---- both at once ----

    def write(self, name: str, data, last: bool = True) -> None:
        """Append `data` of tensor `name`; a tensor may come in several pieces, `last` on its final one."""
        with memoryview(data) as view, view.cast("B") as raw:
            step, at = (self._count - 2) * self._slot, 0
            while True:
                self.hand_off()  # (everything before is committed)
                n = min(step, raw.nbytes - at)
                span = self.reserve(name, n, last and at + n == raw.nbytes)
                with raw[at:at + n] as part:
                    self.commit(span, part)
                at += n
                if at >= raw.nbytes:
                    return

    def abort(self) -> None:
        """After a failure: the shards being written are closed unfinished (their .tmp files are the caller's to
        remove) and the disk and hash threads stopped."""
        while self._sinks:
            self._sinks.popleft().discard()
        self._disk.shutdown()
        self._hashing.shutdown()
        self._freeing.shutdown()

    def finish(self) -> None:
        self._disk.shutdown()
        self._hashing.shutdown()
        self._freeing.shutdown()
        if self._sinks:
            raise ConvertError(f"{self._sinks[0].shard.file}: input ended before the shard was full")
        missing = [s.file for s in self.shards if s.file not in self.digests]
        if missing:
            raise ConvertError(f"shards never written: {', '.join(missing)}")
