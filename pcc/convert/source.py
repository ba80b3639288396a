"""Reading a Hugging Face checkpoint safely: safetensors only, every shard checked before use."""

from __future__ import annotations

import functools
import mmap
import os
from dataclasses import dataclass, field
from pathlib import Path

from pcc.convert import ConvertError
from pcc.lang.inputs import InputError, read_json
from pcc.models.base import CatalogError, may_lead_to
from pcc.models.checkpoint import MAX_JSON, read_header
from pcc.models.quantized import ST_ITEM

INDEX = "model.safetensors.index.json"
_MADV_POPULATE_READ = getattr(mmap, "MADV_POPULATE_READ", 22)  # Linux 5.14; Python names it from 3.13
_TORCH_DTYPES = {}  # filled on first use (torch is imported lazily)
# Files a checkpoint directory may hold that the converter never copies: weights (the
# converter writes its own), pickled weights (never read), and the configs it rewrites.
_NOT_COPIED_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".pkl", ".ckpt", ".msgpack", ".h5")
_REWRITTEN = (INDEX, "config.json", "hf_quant_config.json", "pcc_convert.json")


@functools.lru_cache(maxsize=1)
def _madvise():
    """libc's madvise through ctypes (which lets go of the GIL while it runs), or None without one."""
    try:
        import ctypes

        fn = ctypes.CDLL(None).madvise
    except (OSError, AttributeError):
        return None
    fn.argtypes, fn.restype = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int], ctypes.c_int
    return fn


def _populate(address: int, length: int) -> None:
    """Fill the page tables of a mapping in one call (MADV_POPULATE_READ), not by page faults in the
    threads that compute; not mmap.madvise, which holds the GIL (3-5 ms per 64 MiB piece in which no
    other thread of the converter ran Python). A kernel before 5.14 (the call returns -1, EINVAL) or a
    platform without madvise leaves the pages to be faulted in."""
    fn = _madvise()
    if fn is not None:
        fn(address, length, _MADV_POPULATE_READ)


@dataclass
class Source:
    """A checked source checkpoint: which shard holds each tensor, and its header entry."""

    root: Path
    config: dict
    where: dict[str, str] = field(default_factory=dict)  # tensor -> shard file name
    entries: dict[str, dict] = field(default_factory=dict)  # tensor -> header entry
    data_start: dict[str, int] = field(default_factory=dict)  # shard file -> offset of its data
    _handles: dict = field(default_factory=dict)
    _view: object = None

    def load(self, name: str):
        """One tensor as stored, read from its checked safetensors header's offsets with a plain pread
        into a fresh buffer: no pickle (`map` for the converter's large reads)."""
        return self._read(name)

    def load_index(self, name: str, j: int):
        """`tensor[j]` of a stored tensor (one expert of a fused [E, ...] tensor), reading only its bytes."""
        return self._read(name, j)

    def load_piece(self, name: str, first: int, count: int):
        """Elements [first, first + count) of a stored tensor, flat (a quantized source's rows)."""
        return self._read(name, piece=(first, count))

    def map(self, name: str, piece: tuple[int, int] | None = None):
        """A stored tensor (or its flat elements [first, first + count)) over a private mapping of just
        its bytes, instead of a copy: the converter's reads of BF16 weights, 4-5x cheaper
        than pread's copy (bench/convert.py). The mapping is copy-on-write (a stray write never reaches
        the source file) and unmapped once the tensor and its views are gone, so RSS holds only the
        pieces in flight. Where the file cannot be mapped, the bytes are read as `load` reads them."""
        return self._read(name, piece=piece, mapped=True)

    def _read(self, name: str, index: int | None = None, piece: tuple[int, int] | None = None,
              mapped: bool = False):
        import torch

        file = self.where.get(name)
        if file is None:
            raise ConvertError(f"{self.root}: no tensor {name} in the checkpoint")
        entry = self.entries[name]
        if not _TORCH_DTYPES:
            _TORCH_DTYPES.update({"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32,
                                  "F64": torch.float64, "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2,
                                  "U8": torch.uint8, "I8": torch.int8, "I16": torch.int16, "I32": torch.int32,
                                  "I64": torch.int64, "BOOL": torch.bool,
                                  "F8_E8M0": torch.uint8})  # E8M0 scale bytes, read as their bytes
        dtype = _TORCH_DTYPES.get(entry["dtype"])
        if dtype is None:
            raise ConvertError(f"{self.root / file}: {name} has unsupported dtype {entry['dtype']}")
        begin, end = entry["data_offsets"]
        shape = entry["shape"]
        if index is not None:
            if not shape or not 0 <= index < shape[0]:
                raise ConvertError(f"{self.root / file}: {name} {shape} has no index {index}")
            row = (end - begin) // shape[0]
            begin, end, shape = begin + index * row, begin + (index + 1) * row, shape[1:]
        if piece is not None:
            item = ST_ITEM[entry["dtype"]]
            first, count = piece
            if not 0 <= first <= first + count <= (end - begin) // item:
                raise ConvertError(f"{self.root / file}: {name} {shape} has no elements [{first}, {first + count})")
            begin, end, shape = begin + first * item, begin + (first + count) * item, [count]
        fd = self._handles.get(file)
        if fd is None:
            fd = self._handles[file] = os.open(self.root / file, os.O_RDONLY)
        if mapped and end > begin:
            window = self._window(fd, file, name, self.data_start[file] + begin, end - begin)
            if window is not None:
                return window.view(dtype).reshape(shape)
        buf = torch.empty(end - begin, dtype=torch.uint8)
        view, done, base = memoryview(buf.numpy()), 0, self.data_start[file] + begin
        while done < end - begin:
            got = os.preadv(fd, [view[done:]], base + done)
            if got <= 0:
                raise ConvertError(f"{self.root / file}: truncated while reading {name}")
            done += got
        return buf.view(dtype).reshape(shape)

    def _window(self, fd: int, file: str, name: str, base: int, size: int):
        """Bytes [base, base + size) of the shard as a uint8 tensor over a mapping, or None where the file
        cannot be mapped. The file must still hold them (a shard truncated since its header was checked
        is an error here; one truncated while mapped would raise SIGBUS, as any mmap reader would)."""
        import torch

        mapped = self._mapping(fd, file, name, base, size)
        if mapped is None:
            return None
        m, skip = mapped
        window = torch.frombuffer(m, dtype=torch.uint8, offset=skip, count=size)
        _populate(window.data_ptr() - skip, skip + size)
        return window

    def _mapping(self, fd: int, file: str, name: str, base: int, size: int):
        """(a private mapping holding bytes [base, base + size) of the shard, where they start in it), or None
        where the file cannot be mapped."""
        skip = base % mmap.ALLOCATIONGRANULARITY
        try:
            if os.fstat(fd).st_size < base + size:
                raise ConvertError(f"{self.root / file}: truncated while reading {name}")
            return mmap.mmap(fd, skip + size, access=mmap.ACCESS_COPY, offset=base - skip), skip
        except (OSError, ValueError):
            return None

    def _bytes_at(self, name: str, first: int, count: int) -> tuple[int, str, int]:
        """(the open shard, its file name, the offset in it) of bytes [first, first + count) of stored tensor `name`."""
        file = self.where[name]
        begin, end = self.entries[name]["data_offsets"]
        if not 0 <= first <= first + count <= end - begin:
            raise ConvertError(f"{self.root / file}: {name} has no bytes [{first}, {first + count})")
        fd = self._handles.get(file)
        if fd is None:  # (two chunk workers may open it at once: one handle is kept, the other closed)
            opened = os.open(self.root / file, os.O_RDONLY)
            fd = self._handles.setdefault(file, opened)
            if fd != opened:
                os.close(opened)
        return fd, file, self.data_start[file] + begin + first

    def read_bytes(self, name: str, first: int, into: memoryview) -> memoryview:
        """Bytes [first, first + into.nbytes) of stored tensor `name`'s data, read with pread into `into`
        (pcc.convert.fast's chunk workers read into the writer's staging ring, or into a buffer their kernel then
        quantizes while it is in the core's cache; thread-safe)."""
        count, done = into.nbytes, 0
        fd, file, base = self._bytes_at(name, first, count)
        while done < count:
            got = os.preadv(fd, [into[done:]], base + done)
            if got <= 0:
                raise ConvertError(f"{self.root / file}: truncated while reading {name}")
            done += got
        return into

    # ---- the logical view of a quantized source (pcc.convert.quantized) ----

    @property
    def view(self):
        """Encoded weights by logical name and the source tensors they consume; empty for a wide source.
        Recognized on first use (a rollout checkpoint opened to be verified never needs it)."""
        if self._view is None:
            from pcc.models.base import CatalogError
            from pcc.models.quantized import read_small_int, recognize

            def small(name):
                return read_small_int(self.root / self.where[name], self.data_start[self.where[name]],
                                      self.entries[name])

            try:
                self._view = recognize(self.root, self.config, self.entries, small)
            except CatalogError as err:  # the converter's error, its code kept
                raise ConvertError(str(err), code=err.code) from None
        return self._view

    @functools.cached_property
    def fingerprint(self) -> str:
        """pcc.models.checkpoint.fingerprint of config.json and the headers: what a converter plan is compiled
        for; computed once (a bundle's check, the kept plans' key and the compile's catalog all ask)."""
        from pcc.models.checkpoint import fingerprint

        return fingerprint(self.config, self.entries)

    def has(self, name: str) -> bool:
        return name in self.view.encodings or name in self.where

    def stored(self, name: str) -> bool:
        """Is `name` read as stored (not a quantized weight's logical tensor)?"""
        return name not in self.view.encodings

    def read(self, name: str):
        """What the converter transforms: an `Encoded` for a quantized weight, else the stored tensor."""
        from pcc.convert.quantized import read

        enc = self.view.encodings.get(name)
        return self.load(name) if enc is None else read(self, enc)

    def weight(self, name: str):
        """A weight's value: a quantized one dequantized to float32, any other as stored."""
        enc = self.view.encodings.get(name)
        return self.load(name) if enc is None else self.read(name).dequantize()

    def file_of(self, name: str) -> Path:
        enc = self.view.encodings.get(name)
        return self.root / self.where[enc.parts[0][1] if enc is not None else name]

    def nbytes(self, name: str) -> int:
        """Bytes read for tensor `name` (a quantized weight's parts; one expert's share of a fused one)."""
        enc = self.view.encodings.get(name)
        if enc is None:
            a, b = self.entries[name]["data_offsets"]
            return b - a
        total = 0
        for _, part in enc.parts:
            a, b = self.entries[part]["data_offsets"]
            share = 1 if enc.expert is None else self.entries[part]["shape"][0] * (1 if enc.rows == "all" else 2)
            total += (b - a) // share
        return total

    def records(self) -> tuple[list, list[str]]:
        """The catalog's view: (`*.weight` records (name, shape, dtype, file), other tensor names), with
        every quantized weight as its logical tensor and the tensors its encoding consumes left out."""
        from pcc.models.quantized import logical_records

        return logical_records(self.root, self.entries, self.where, self.view)

    def close(self) -> None:
        for fd in self._handles.values():
            os.close(fd)
        self._handles.clear()

    def extra_files(self) -> list[Path]:
        """Tokenizer, generation and other side files, copied to the output as they are. A link whose
        target lies outside the checkpoint (or its hub cache's `blobs/`) is refused (PCC714): a
        conversion never copies a file from elsewhere into its output."""
        files = []
        for p in sorted(self.root.iterdir()):
            if p.name.startswith(".") or p.name in _REWRITTEN or p.name.endswith(_NOT_COPIED_SUFFIXES):
                continue
            if p.is_symlink():
                inside(self.root, p.name, "side file")
            if p.is_file():
                files.append(p)
        return files


def _json_object(path: Path, what: str) -> dict:
    """A JSON object of the checkpoint, through pcc's one input layer (a regular file, bounded, strict)."""
    try:
        doc = read_json(path, MAX_JSON, what)
    except InputError as err:
        raise ConvertError(err.message) from None
    if not isinstance(doc, dict):
        raise ConvertError(f"{path}: not a JSON object")
    return doc


def open_source(root: str | Path) -> Source:
    """Check every shard's header and length against its file, and the index against the shards."""
    root = Path(root)
    if not root.is_dir():
        raise ConvertError(f"{root}: not a checkpoint directory")
    if not (root / "config.json").exists():
        raise ConvertError(f"{root}: missing config.json")
    config = _json_object(inside(root, "config.json", "model config"), "model config")
    if (root / INDEX).exists():
        weight_map = _json_object(inside(root, INDEX, "checkpoint index"), "checkpoint index").get("weight_map")
        if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
            raise ConvertError(f"{root / INDEX}: weight_map must map each tensor name to a shard file name")
        odd = next((f for f in weight_map.values() if not f.endswith(".safetensors")), None)
        if odd is not None:  # (the compile's rule: pcc.models.checkpoint._read_index)
            raise ConvertError(f"{root / INDEX}: names the shard {odd!r}; shards are .safetensors files (no other is "
                               "read, nor copied as a side file)", code="PCC211")
        files = sorted(set(weight_map.values()))
    else:
        weight_map, files = None, sorted(p.name for p in root.glob("*.safetensors"))
    if not files:
        raise ConvertError(f"{root}: no *.safetensors files (pickled checkpoints are not read)")
    src = Source(root, config)
    for file in files:
        path = inside(root, file, "shard")
        if not path.is_file():
            what = "not a regular file" if path.exists() else "shard file missing"
            raise ConvertError(f"{path}: {what} ({INDEX} names it)")
        header, src.data_start[file] = checked_header(path)
        for name, entry in header.items():
            if name in src.where:
                raise ConvertError(f"{path}: tensor {name} is also in {src.where[name]}")
            src.where[name], src.entries[name] = file, entry
    for name, file in (weight_map or {}).items():
        if src.where.get(name) != file:
            raise ConvertError(f"{root / INDEX}: places {name} in {file}, whose header lacks it")
    return src


def inside(root: Path, name: str, what: str) -> Path:
    """`root/name`, refused (PCC714) unless it is a plain name in the directory whose target, if it is a
    link, lies inside the directory or, for a Hugging Face hub cache snapshot, in that model's `blobs/`
    (`pcc.models.base.may_lead_to`, the compile's rule)."""
    if not name or "/" in name or "\\" in name or name in (".", "..") or "\0" in name:
        raise ConvertError(f"{root}: {what} {name!r} is not a file name in the checkpoint directory", code="PCC714")
    path = root / name
    real = path.resolve()
    if not any(real.is_relative_to(a) for a in may_lead_to(root)):
        raise ConvertError(f"{path}: the {what} links to {real}, outside the checkpoint directory; copy the file "
                           "in or remove the link", code="PCC714")
    return path


def checked_header(path: Path) -> tuple[dict, int]:
    """The header of one shard and where its data starts, refused (PCC710) unless every tensor has a known
    dtype, a shape of whole numbers and offsets that tile the data exactly: from 0, in order, without overlap
    or gap, ending at the file's end (safetensors' own rule; pcc.models.checkpoint.read_header, whole). So no
    byte is read as two tensors, and none is left unaccounted."""
    try:
        return read_header(path, whole=True)
    except CatalogError as err:
        raise ConvertError(str(err), code="PCC710") from None
