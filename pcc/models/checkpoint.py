"""Catalogs read from a Hugging Face checkpoint directory, headers only.

A safetensors file starts with an 8-byte little-endian header length and a
JSON header naming every tensor's dtype and shape; that is all we read, so
a terabyte checkpoint catalogs in milliseconds and torch is never imported.
A pre-quantized checkpoint (block FP8, NVFP4, INT4, gpt-oss MXFP4) is read
through its logical view (pcc.models.quantized): each quantized weight is one
operator of its real shape, its scales are neither operators nor extras.

Nothing outside the directory is read: the index names shard files inside it,
and a file that is a symbolic link must point inside it (or, in a Hugging Face
hub cache snapshot, into that model's `blobs/`). docs/models.md.
"""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path, PurePosixPath

from pcc.lang.inputs import InputError, read_json
from pcc.models.base import READS, SAFETENSORS_DTYPES, CatalogError, check_config, config_dtype, inside, lm_config
from pcc.models.builtin import catalog_from_config
from pcc.models.catalog import Catalog, Record, assemble
from pcc.models.quantized import ST_ITEM, logical_records, read_small_int, recognize, recognize_names
from pcc.models.shapes import KNOWN_MODEL_TYPES

_INDEX = "model.safetensors.index.json"
_MAX_HEADER = 100_000_000  # the safetensors format's own limit
MAX_JSON = 64 << 20  # DeepSeek-V3's index, the largest published, is about 9 MB


def catalog_from_checkpoint(path: str | Path) -> Catalog:
    """The catalog of the checkpoint in directory ``path``.

    Shapes and dtypes come from the shard headers; when only the index is
    present, from config.json; when only config.json is (what a model card links
    before anyone downloads the weights), names, shapes and dtype all come from it,
    as for the built-in catalogs. For known model types a header shape that
    disagrees with config.json is an error.
    """
    root = Path(path)
    if not root.is_dir():
        raise CatalogError(f"{root}: not a checkpoint directory")
    config = _read_json(root, "config.json")
    check_config(config, str(root / "config.json"))
    weight_map = _read_index(root)
    files = sorted(set(weight_map.values())) if weight_map else sorted(
        p.name for p in root.glob("*.safetensors"))
    if not files:
        return _from_config_only(root, config)
    present = [name for name in files if inside(root, name).exists()]
    print_ = None
    if weight_map and not present:
        weights, extras = _index_only(config, weight_map)
    elif len(present) < len(files):
        missing = sorted(set(files) - set(present))
        more = f"; {len(missing) - 1} more of its shard files are missing too" if len(missing) > 1 else ""
        raise CatalogError(f"{root / missing[0]}: shard file missing ({_INDEX} names it{more})", code="PCC210")
    else:
        weights, extras, print_ = _read_shards(root, config, files, weight_map)
    known = lm_config(config).get("model_type") in KNOWN_MODEL_TYPES
    return assemble(str(root), config, weights, extras, source=str(root), check_shapes=known, fingerprint=print_)


def fingerprint(config: dict, entries: dict[str, dict]) -> str:
    """What the catalog of a checkpoint whose tensors are all wide is computed from, hashed: config.json and
    every tensor's name, dtype and shape (not where its bytes lie). A plan compiled for one checkpoint holds
    for another of the same fingerprint (`pcc convert BUNDLE`, docs/convert.md "Start-up")."""
    tensors = sorted([name, e["dtype"], e["shape"]] for name, e in entries.items())
    return hashlib.sha256(json.dumps([config, tensors], sort_keys=True).encode()).hexdigest()


def _from_config_only(root: Path, config: dict) -> Catalog:
    model_type = lm_config(config).get("model_type")
    if model_type not in KNOWN_MODEL_TYPES:
        raise CatalogError(f"{root}: only config.json, and pcc derives tensor names from a config for model types "
                           f"{', '.join(sorted(KNOWN_MODEL_TYPES))}, not {model_type!r}: add the checkpoint's "
                           f"{_INDEX} (it names every tensor)")
    try:
        return catalog_from_config(str(root), config)
    except (KeyError, TypeError, ValueError) as err:
        raise CatalogError(f"{root}: config.json lacks what the {model_type} tensor names need ({err!r})",
                           code="PCC209") from None


def _index_only(config: dict, weight_map: dict[str, str]) -> tuple[list[Record], list[str]]:
    """Names from the index, logical quantized weights by name (pcc.models.quantized), shapes later from
    config.json."""
    logical, consumed = recognize_names(config, weight_map)
    dtype = config_dtype(config)
    weights: list[Record] = [(name, None, d, None) for name, d in logical.items()]
    extras: list[str] = []
    for name in weight_map:
        if name in consumed or name in logical:
            continue
        if name.endswith(".weight"):
            weights.append((name, None, dtype, None))
        else:
            extras.append(name)
    return weights, extras


def read_header(path: Path, whole: bool = False) -> tuple[dict[str, dict], int]:
    """(the tensor entries of one safetensors file's header, ``__metadata__`` dropped; the offset where
    its data starts). Every entry has a dtype pcc knows (PCC210), a shape and data offsets; with `whole`
    (the converter's reads) the tensors' bytes also end where the file does."""
    size = path.stat().st_size
    with path.open("rb") as f:
        prefix = f.read(8)
        if len(prefix) < 8:
            raise CatalogError(f"{path}: truncated safetensors header ({size} bytes, "
                               f"fewer than the 8 that hold the header length)")
        length = int.from_bytes(prefix, "little")
        if length > min(size - 8, _MAX_HEADER):
            raise CatalogError(f"{path}: truncated safetensors header (declares {length} bytes, "
                               f"the file has {size - 8} after the length)")
        raw = f.read(length)
    try:
        header = json.loads(raw)
    except (UnicodeDecodeError, ValueError) as err:
        raise CatalogError(f"{path}: unreadable safetensors header ({err})") from None
    if not isinstance(header, dict):
        raise CatalogError(f"{path}: unreadable safetensors header (not a JSON object)")
    header.pop("__metadata__", None)
    for tensor, entry in header.items():
        if not (isinstance(entry, dict) and isinstance(entry.get("dtype"), str)
                and isinstance(entry.get("shape"), list)
                and all(isinstance(dim, int) and not isinstance(dim, bool) and dim >= 0 for dim in entry["shape"])):
            raise CatalogError(f"{path}: unreadable safetensors header entry for {tensor}", code="PCC210")
        if entry["dtype"] not in SAFETENSORS_DTYPES:
            raise CatalogError(f"{path}: {tensor} has dtype {entry['dtype']!r}: {READS}", code="PCC210")
    _check_offsets(path, header, size - 8 - length, whole)
    return header, 8 + length


def _check_offsets(path: Path, header: dict[str, dict], data: int, whole: bool) -> None:
    """Every tensor's bytes are its dtype x shape, and together they tile the data from 0 with no gap or
    overlap (as the safetensors format requires), within the file (to its end with `whole`): one tensor's
    bytes are never read as another's, none is left unaccounted. PCC210; a file shorter than its header says
    is "truncated"."""
    spans = []
    for tensor, entry in header.items():
        offsets = entry.get("data_offsets")
        if not (isinstance(offsets, list) and len(offsets) == 2 and all(
                isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in offsets) and offsets[0] <= offsets[1]):
            raise CatalogError(f"{path}: {tensor} has data_offsets {offsets!r}; a safetensors entry has [begin, end] "
                               f"with 0 <= begin <= end", code="PCC210")
        need = ST_ITEM[entry["dtype"]] * math.prod(entry["shape"])
        if offsets[1] - offsets[0] != need:
            raise CatalogError(f"{path}: {tensor} spans {offsets[1] - offsets[0]} bytes, but {entry['dtype']} "
                               f"{entry['shape']} needs {need}: the header is corrupt", code="PCC210")
        spans.append((offsets[0], offsets[1], tensor))
    spans.sort()
    at, last = 0, None
    for begin, end, tensor in spans:
        if begin != at:
            what = f"overlaps {last}" if begin < at else f"leaves a gap of {begin - at} bytes after {last or 'the header'}"
            raise CatalogError(f"{path}: {tensor} at bytes [{begin}, {end}) {what}: the header is corrupt",
                               code="PCC210")
        at, last = end, tensor
    if at > data:
        raise CatalogError(f"{path}: truncated: tensor {last} ends at byte {at} of the data, the file holds {data}",
                           code="PCC210")
    if whole and at < data:
        raise CatalogError(f"{path}: {data - at} bytes after the last tensor ({last or 'none'}) that no header entry "
                           "accounts for; the header is corrupt", code="PCC210")


def read_safetensors_header(path: Path) -> dict[str, dict]:
    """The tensor entries of one safetensors file's header (``__metadata__`` dropped)."""
    return read_header(path)[0]


def _read_shards(root: Path, config: dict, files: list[str], weight_map: dict[str, str]
                 ) -> tuple[list[Record], list[str], str | None]:
    """The weights and other tensors, and the checkpoint's `fingerprint` (None for a quantized one: its catalog
    also reads tensor values)."""
    entries: dict[str, dict] = {}
    where: dict[str, str] = {}
    starts: dict[str, int] = {}
    for name in files:
        path = inside(root, name)
        if not path.is_file():
            raise CatalogError(f"{root / name}: not a regular file", code="PCC210")
        header, starts[name] = read_header(path)
        for tensor, entry in header.items():
            if tensor in where:
                raise CatalogError(f"{tensor}: in both {where[tensor]} and {name}")
            where[tensor], entries[tensor] = name, entry
    for tensor, name in weight_map.items():
        if where.get(tensor) != name:
            raise CatalogError(f"{tensor}: {_INDEX} places it in {name}, whose header lacks it")

    def small(tensor: str) -> list[int]:
        file = where[tensor]
        return read_small_int(inside(root, file), starts[file], entries[tensor])

    view = recognize(root, config, entries, small)
    return (*logical_records(root, entries, where, view), None if view.encodings else fingerprint(config, entries))


def _read_index(root: Path) -> dict[str, str]:
    """The index's tensor -> shard file map; empty when there is no index. Every value names a file
    in the directory itself (PCC211 otherwise: nothing outside the checkpoint is read)."""
    if not (root / _INDEX).exists():
        return {}
    path = root / _INDEX
    weight_map = _read_json(root, _INDEX).get("weight_map")
    if not isinstance(weight_map, dict):
        raise CatalogError(f"{path}: no weight_map object", code="PCC210")
    for tensor, file in weight_map.items():
        if not isinstance(file, str):
            raise CatalogError(f"{path}: weight_map[{tensor!r}] is {file!r} ({type(file).__name__}); each "
                               f"value is the name of a .safetensors file", code="PCC210")
        parts = PurePosixPath(file).parts
        if (not parts or PurePosixPath(file).is_absolute() or "\\" in file or ".." in parts
                or not file.endswith(".safetensors")):
            raise CatalogError(f"{path}: weight_map[{tensor!r}] is {file!r}; shards are .safetensors files "
                               f"inside {root}, and pcc reads nothing outside it", code="PCC211")
    return weight_map


def _read_json(root: Path, name: str) -> dict:
    """config.json or the index, through pcc's one input layer (regular file, bounded, strict JSON)."""
    path = root / name
    if not path.exists() and not path.is_symlink():
        raise CatalogError(f"{root}: missing {name}")
    inside(root, name)
    try:
        data = read_json(path, MAX_JSON, name)
    except InputError as err:
        raise CatalogError(str(err), code=err.code) from None
    if not isinstance(data, dict):
        raise CatalogError(f"{path}: {name} is not a JSON object", code="PCC210")
    return data
