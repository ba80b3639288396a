"""Output shards planned up front, then written front to back.

Every target's dtype and shape is known from the converter plan before any data is read, so
shard assignment and each shard's safetensors header are fixed first: data then streams into
place, the output is the same bytes on every run, and `--resume` can trust a shard whose
completion record's digest matches the file.

Shards are digested with BLAKE3 (`SHARD_HASH`): a cryptographic hash like SHA-256, but 4-5x faster
on one core (5.0 against 1.1 GB/s here, docs/convert.md "Speed"); a shard written with O_DIRECT is hashed on
a thread of its own, each staging buffer while the disk thread writes it. A record written with SHA-256
(before) still verifies with SHA-256.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import hashlib
import json
import math
import mmap
import os
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
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
        shards.append(Shard(file, [t[0] for t in group], blob, len(blob) + offset))
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
STAGE_BYTES = 16 << 20  # one direct write
STAGE_COUNT = 3  # staging buffers per shard: one filled, one written, one hashed (or waiting)
# O_DIRECT wants offsets, lengths and buffer addresses aligned to the device's logical block size;
# 4096 is a multiple of every size in use, and the staging buffers (mmap) are page-aligned.
_ALIGN = 4096


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


def _digest(digest, buf, filled: int) -> None:
    """A staging buffer's first `filled` bytes into the shard's digest (on the hash thread, in order)."""
    with memoryview(buf) as whole, whole[:filled] as data:
        digest.update(data)


def _write_all(fd: int, buf, length: int) -> None:
    """The views are released when a write fails too: one left in the error's traceback would keep the staging
    buffer from closing, and its BufferError would stand in for the disk's error."""
    done = 0
    with memoryview(buf) as whole:
        while done < length:
            with whole[done:length] as view:
                done += os.write(fd, view)


@contextlib.contextmanager
def writing(path: Path):
    """A write the disk refuses (full, read-only, gone) is one line naming the file and the system's reason (PCC709)."""
    try:
        yield
    except OSError as err:
        raise refused(err, path) from err


def refused(err: OSError, path: Path) -> ConvertError:
    return ConvertError(f"{err.filename or path}: cannot write: {err.strerror or err}", code="PCC709")


class _Sink:
    """One shard's file being written; at most one write or flush of it runs on the disk thread."""

    def __init__(self, pool: ThreadPoolExecutor, digest):
        self._pool = pool
        self._digest = digest  # the shard's hash object, fed every byte written, in order
        self._pending: Future | None = None
        self.written = 0  # bytes given to write(): the shard's size once it is complete

    def _wait(self) -> None:
        """The disk thread's work on this file has finished (its error is raised here)."""
        if self._pending is not None:
            pending, self._pending = self._pending, None
            pending.result()


def buffer_address(buf) -> int | None:
    """The address of a writable buffer's first byte (a numpy array, a bytearray, a writable mapping, a
    memoryview of one), or None for a read-only or empty one. The caller keeps `buf` alive while it uses it."""
    try:
        return ctypes.addressof(ctypes.c_char.from_buffer(buf))
    except (TypeError, ValueError):
        return None


class _Direct(_Sink):
    """A shard written with O_DIRECT from STAGE_COUNT page-aligned staging buffers: one is filled while the disk
    thread writes another and the hash thread digests it (both only read it), so the disk works while the next
    tensors are computed, the hash does not delay the writes (on the disk thread it made that thread the
    bench MoE's bottleneck: 0.6-0.8 s busy for 0.79 GB, 0.13-0.24 of it hashing), and no page cache is filled
    and written back. On ext4 here buffered writes cost 0.4-2.6 s of system time per GB, varying with the state
    of the page cache, direct ones about 0.05 (docs/convert.md "Speed"). The last partial block is written
    zero-padded and the file truncated to its size. Data is copied into them with ctypes' memmove, which lets go
    of the GIL (a memoryview copy holds it: 1.2 GB of copies stalled the quantizing threads, most on a busy
    machine), and without numpy, whose import the torch-free conversion (pcc.convert.fast) does not pay."""

    def __init__(self, fd: int, pool: ThreadPoolExecutor, digest, hashing: ThreadPoolExecutor):
        super().__init__(pool, digest)
        self._fd, self._hashing = fd, hashing
        self._bufs = [mmap.mmap(-1, STAGE_BYTES) for _ in range(STAGE_COUNT)]
        self._at = [buffer_address(b) for b in self._bufs]  # (valid until the mapping is closed)
        self._busy: list[list[Future]] = [[] for _ in self._bufs]  # each buffer's hash and write in flight
        self._k, self._fill = 0, 0

    def write(self, data) -> None:
        with memoryview(data) as view:
            total = view.nbytes
            src = buffer_address(data) if total else None
            pos = 0
            while pos < total:
                n = min(STAGE_BYTES - self._fill, total - pos)
                if src is not None:
                    ctypes.memmove(self._at[self._k] + self._fill, src + pos, n)
                else:  # read-only (a header's bytes): copied holding the GIL
                    with memoryview(self._bufs[self._k]) as dst, view.cast("B") as raw:
                        dst[self._fill:self._fill + n] = raw[pos:pos + n]
                self._fill += n
                pos += n
                if self._fill == STAGE_BYTES:
                    self._submit(STAGE_BYTES)
            self.written += total

    def _submit(self, length: int) -> None:
        buf = self._bufs[self._k]
        self._busy[self._k] = [self._hashing.submit(_digest, self._digest, buf, self._fill),
                               self._pool.submit(_write_all, self._fd, buf, length)]
        self._k, self._fill = (self._k + 1) % len(self._bufs), 0
        self._free(self._k)

    def _free(self, k: int) -> None:
        """Buffer k's hash and write have finished (a write's error is raised here)."""
        busy, self._busy[k] = self._busy[k], []
        for f in busy:
            f.result()

    def _wait(self) -> None:
        for k in range(len(self._bufs)):
            self._free(k)

    def close(self) -> None:
        try:
            if self._fill:
                padded = -(-self._fill // _ALIGN) * _ALIGN
                ctypes.memset(self._at[self._k] + self._fill, 0, padded - self._fill)
                self._submit(padded)
            self._wait()
            os.ftruncate(self._fd, self.written)
            os.fsync(self._fd)
        finally:
            self._release()

    def discard(self) -> None:
        """Closed unfinished after a failure, which this does not raise again."""
        for k in range(len(self._bufs)):
            with contextlib.suppress(OSError):
                self._free(k)
        self._release()

    def _release(self) -> None:
        os.close(self._fd)
        for b in self._bufs:
            b.close()


class _Buffered(_Sink):
    """A shard written through the page cache where O_DIRECT is not offered (tmpfs, macOS): its data
    is fdatasynced in the background each FLUSH_BYTES, so the final fsync writes only the tail
    instead of the whole shard while nothing else runs."""

    def __init__(self, path: Path, pool: ThreadPoolExecutor, digest):
        super().__init__(pool, digest)
        self._f = path.open("wb")
        self._since = 0

    def write(self, data) -> None:
        self._f.write(data)
        self._digest.update(data)
        n = memoryview(data).nbytes
        self.written += n
        self._since += n
        if self._since >= FLUSH_BYTES and (self._pending is None or self._pending.done()):
            self._wait()
            self._f.flush()
            self._pending = self._pool.submit(_DATASYNC, self._f.fileno())
            self._since = 0

    def close(self) -> None:
        try:
            self._f.flush()
            self._wait()
            os.fsync(self._f.fileno())
        finally:
            self._f.close()

    def discard(self) -> None:
        """Closed unfinished after a failure, which this does not raise again."""
        with contextlib.suppress(OSError):
            self._wait()
        with contextlib.suppress(OSError):
            self._f.close()


class ShardWriter:
    """Receives (name, bytes) in plan order and writes each shard as it fills (`_Direct`, else
    `_Buffered`); a finished shard is fsynced, renamed from its .tmp name and recorded with its digest."""

    def __init__(self, root: Path, shards: list[Shard], done: set[str], job: str):
        self.root, self.job = root, job
        self.shards = [s for s in shards if s.file not in done]
        self.owner = {n: s for s in self.shards for n in s.names}
        self.digests = {}
        self._k, self._pos, self._f, self._h = -1, 0, None, None
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="pcc-disk")
        self._hashing = ThreadPoolExecutor(1, thread_name_prefix="pcc-hash")

    def wanted(self, name: str) -> bool:
        return name in self.owner

    def write(self, name: str, data, last: bool = True) -> None:
        """Append `data` of tensor `name`; a tensor may come in several pieces, `last` on its final one."""
        shard = self.owner[name]
        try:  # (no `writing` context here: a MoE's thousands of pieces each paid for it and the path)
            if self._f is None or shard is not self.shards[self._k]:
                self._open(shard)
            expect = shard.names[self._pos]
            if name != expect:
                raise ConvertError(f"internal order error: got {name}, {shard.file} expects {expect}")
            self._f.write(data)
            if not last:
                return
            self._pos += 1
            if self._pos == len(shard.names):
                self._close()
        except OSError as err:
            raise refused(err, self.root / (shard.file + ".tmp")) from err

    def _open(self, shard: Shard) -> None:
        if self._f is not None:
            raise ConvertError(f"{self.shards[self._k].file}: left incomplete")
        self._k = self.shards.index(shard)
        self._pos = 0
        path = self.root / (shard.file + ".tmp")
        fd = _open_direct(path)
        self._h = hasher(SHARD_HASH)
        self._f = _Buffered(path, self._pool, self._h) if fd is None else _Direct(fd, self._pool, self._h,
                                                                                  self._hashing)
        self._f.write(shard.header)

    def _close(self) -> None:
        shard = self.shards[self._k]
        f, self._f = self._f, None
        f.close()
        tmp = self.root / (shard.file + ".tmp")
        if f.written != shard.size or tmp.stat().st_size != shard.size:
            raise ConvertError(f"{tmp}: wrote {f.written} bytes, the plan says {shard.size}")
        os.replace(tmp, self.root / shard.file)
        digest = self._h.hexdigest()
        self.digests[shard.file] = digest
        # whole or absent: a kill while writing it leaves only a temporary file
        write_atomic(self.root / shard.record, json.dumps({"job": self.job, SHARD_HASH: digest, "file": shard.file}))

    def abort(self) -> None:
        """After a failure: the shard being written is closed unfinished (its .tmp is the caller's to remove) and
        the disk thread stopped."""
        f, self._f = self._f, None
        if f is not None:
            f.discard()
        self._pool.shutdown()
        self._hashing.shutdown()

    def finish(self) -> None:
        self._pool.shutdown()
        self._hashing.shutdown()
        if self._f is not None:
            raise ConvertError(f"{self.shards[self._k].file}: input ended before the shard was full")
        missing = [s.file for s in self.shards if s.file not in self.digests]
        if missing:
            raise ConvertError(f"shards never written: {', '.join(missing)}")
