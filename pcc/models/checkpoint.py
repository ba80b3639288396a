"""Catalogs read from a Hugging Face checkpoint directory, headers only.

A safetensors file starts with an 8-byte little-endian header length and a
JSON header naming every tensor's dtype and shape; that is all we read, so
a terabyte checkpoint catalogs in milliseconds and torch is never imported.
"""

from __future__ import annotations

import json
from pathlib import Path

from pcc.models.base import SAFETENSORS_DTYPES, CatalogError, config_dtype, lm_config
from pcc.models.builtin import catalog_from_config
from pcc.models.catalog import Catalog, Record, assemble
from pcc.models.shapes import KNOWN_MODEL_TYPES

_INDEX = "model.safetensors.index.json"
_MAX_HEADER = 100_000_000  # the safetensors format's own limit


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
    config = _read_json(root / "config.json", "config.json")
    weight_map = _read_index(root)
    files = sorted(set(weight_map.values())) if weight_map else sorted(
        p.name for p in root.glob("*.safetensors"))
    if not files:
        return _from_config_only(root, config)
    present = [name for name in files if (root / name).is_file()]
    if weight_map and not present:
        dtype = config_dtype(config)
        tensors = [(name, None, dtype, None) for name in weight_map]
    elif len(present) < len(files):
        missing = sorted(set(files) - set(present))
        raise CatalogError(
            f"{root}: {_INDEX} lists shard files that are missing: {', '.join(missing)}")
    else:
        tensors = _read_shards(root, files, weight_map)
    weights = [record for record in tensors if record[0].endswith(".weight")]
    extras = [record[0] for record in tensors if not record[0].endswith(".weight")]
    known = lm_config(config).get("model_type") in KNOWN_MODEL_TYPES
    return assemble(str(root), config, weights, extras, source=str(root), check_shapes=known)


def _from_config_only(root: Path, config: dict) -> Catalog:
    model_type = lm_config(config).get("model_type")
    if model_type not in KNOWN_MODEL_TYPES:
        raise CatalogError(f"{root}: only config.json, and pcc derives tensor names from a config for model types "
                           f"{', '.join(sorted(KNOWN_MODEL_TYPES))}, not {model_type!r}: add the checkpoint's "
                           f"{_INDEX} (it names every tensor)")
    try:
        return catalog_from_config(str(root), config)
    except (KeyError, TypeError, ValueError) as err:
        raise CatalogError(f"{root}: config.json lacks what the {model_type} tensor names need ({err!r})") from None


def read_safetensors_header(path: Path) -> dict[str, dict]:
    """The tensor entries of one safetensors file's header (``__metadata__`` dropped)."""
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
                and all(isinstance(dim, int) for dim in entry["shape"])):
            raise CatalogError(f"{path}: unreadable safetensors header entry for {tensor}")
    return header


def _read_shards(root: Path, files: list[str], weight_map: dict[str, str]) -> list[Record]:
    records: list[Record] = []
    seen: dict[str, str] = {}
    for name in files:
        header = read_safetensors_header(root / name)
        for tensor, entry in header.items():
            if tensor in seen:
                raise CatalogError(f"{tensor}: in both {seen[tensor]} and {name}")
            seen[tensor] = name
            dtype = SAFETENSORS_DTYPES.get(entry["dtype"], entry["dtype"].lower())
            records.append((tensor, tuple(entry["shape"]), dtype, str(root / name)))
    for tensor, name in weight_map.items():
        if seen.get(tensor) != name:
            raise CatalogError(f"{tensor}: {_INDEX} places it in {name}, whose header lacks it")
    return records


def _read_index(root: Path) -> dict[str, str]:
    """The index's tensor -> shard file map; empty when there is no index."""
    path = root / _INDEX
    if not path.is_file():
        return {}
    weight_map = _read_json(path, _INDEX).get("weight_map")
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise CatalogError(f"{path}: no valid weight_map")
    return weight_map


def _read_json(path: Path, what: str) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise CatalogError(f"{path.parent}: missing {what}") from None
    except (OSError, UnicodeDecodeError, ValueError) as err:
        raise CatalogError(f"{path}: unreadable {what} ({err})") from None
    if not isinstance(data, dict):
        raise CatalogError(f"{path}: {what} is not a JSON object")
    return data
