"""A contract (or a bundle holding one) compiled against the checkpoint it converts."""

from __future__ import annotations

import hashlib
from pathlib import Path

from pcc import __version__
from pcc.bundle import MAX_FILE, BundleError, contract_file, read_bundle
from pcc.convert import ConvertError
from pcc.lang.inputs import InputError, loads_json, read_bytes, read_json
from pcc.models import CatalogError, catalog_from_checkpoint, load_catalog
from pcc.models.builtin import catalog_from_config

CONVERTER_PLAN = "convert/plan.json"  # pcc.lower.converter's file in a bundle


def contract_path(arg: str) -> Path:
    """CONTRACT or BUNDLE -> the contract file (`pcc.bundle.contract_file`: a bundle checked against its
    manifest, so an edited contract.prec never converts)."""
    try:
        return contract_file(arg)
    except BundleError as exc:
        raise ConvertError(str(exc), code=None if exc.missing else exc.code) from None


def bundle_plan(arg: str, source) -> dict | None:
    """The converter plan `pcc compile` wrote into bundle `arg`, where it holds for `source` (an opened
    pcc.convert.source.Source): the bundle matches its manifest, was compiled by this pcc, and for a checkpoint
    of the source's fingerprint (pcc.models.checkpoint.fingerprint: its config and tensors), so compiling the
    contract again against the source would give this plan (docs/convert.md "Start-up"). None for a contract
    file, a bundle compiled by another pcc or for another checkpoint, or a quantized source: the contract is
    compiled against the source then."""
    path = Path(arg)
    if not path.is_dir():
        return None
    try:
        bundle = read_bundle(path)
        digest = bundle.manifest["files"].get(CONVERTER_PLAN)
        if bundle.manifest.get("pcc_version") != __version__ or digest is None:
            return None
        data = read_bytes(path / CONVERTER_PLAN, MAX_FILE, "converter plan")
    except BundleError as exc:
        raise ConvertError(str(exc), code=None if exc.missing else exc.code) from None
    except InputError as exc:
        raise ConvertError(exc.message, code="PCC706") from None
    if hashlib.sha256(data).hexdigest() != digest:  # (changed since read_bundle checked it)
        raise ConvertError(f"{path}: {CONVERTER_PLAN} does not match the manifest (edited after compile?); "
                           "recompile the contract", code="PCC706")
    try:
        doc = loads_json(data)
    except ValueError as exc:
        raise ConvertError(f"{path / CONVERTER_PLAN}: not JSON ({exc})", code="PCC706") from None
    if isinstance(doc, dict) and "source_fingerprint" not in doc:  # written before converter plans named their source
        return None
    if not _well_formed(doc):
        raise ConvertError(f"{path / CONVERTER_PLAN}: malformed converter plan (not as pcc compile writes it); "
                           "recompile the contract", code="PCC706")
    want = doc["source_fingerprint"]
    if want is None or source.view.encodings or want != source.fingerprint:
        return None
    return doc


def _is(value, kind) -> bool:
    return isinstance(value, kind) and not isinstance(value, bool) if kind is int else isinstance(value, kind)


def _well_formed(doc) -> bool:
    """The fields of a converter plan (pcc.lower.converter) a conversion reads, of the kinds it reads them as: a
    bundle edited with its manifest to match converts with a PCC706, never a KeyError."""
    from pcc.convert.shards import ST_DTYPES

    def ints(v, n=None):
        return isinstance(v, list) and (n is None or len(v) == n) and all(_is(x, int) and x >= 0 for x in v)

    def recipe(r):
        return (isinstance(r, dict) and isinstance(r.get("steps"), list) and all(_is(x, str) for x in r["steps"])
                and "piece_rows" in r and (r["piece_rows"] is None or _is(r["piece_rows"], int) and r["piece_rows"] > 0)
                and isinstance(r.get("global_scale"), bool)
                and "fp8_block" in r
                and (r["fp8_block"] is None or ints(r["fp8_block"], 2) and 0 not in r["fp8_block"]))

    def tensor(e, recipes):
        return (isinstance(e, dict) and _is(e.get("source"), str)
                and _is(e.get("recipe"), str) and e["recipe"] in recipes
                and isinstance(e.get("targets"), dict) and e["targets"]
                and all(isinstance(t, dict) and _is(t.get("dtype"), str) and t["dtype"] in ST_DTYPES
                        and ints(t.get("shape")) for t in e["targets"].values())
                and ("fuse" not in e or isinstance(e["fuse"], dict) and _is(e["fuse"].get("parts"), int))
                and ("scale_group" not in e or isinstance(e["scale_group"], list)))

    if not (isinstance(doc, dict) and all(_is(doc.get(k), str) for k in ("contract", "layout"))
            and all(k in doc and (doc[k] is None or isinstance(doc[k], dict))
                    for k in ("quantization_config", "hf_quant_config"))
            and "source_fingerprint" in doc
            and (doc["source_fingerprint"] is None or _is(doc["source_fingerprint"], str))
            and isinstance(doc.get("recipes"), dict) and isinstance(doc.get("tensors"), list)
            and isinstance(doc.get("copied"), list)):
        return False
    return (all(recipe(r) for r in doc["recipes"].values())
            and all(tensor(e, doc["recipes"]) for e in doc["tensors"])
            and all(isinstance(e, dict) and _is(e.get("source"), str) for e in doc["copied"]))


def load_plan(arg: str, checkpoint: Path | None = None, config: dict | None = None, source=None):
    """The Plan of contract `arg` over the tensors of `source` (an opened pcc.convert.source.Source: a
    quantized source's weights as their logical tensors) or of `checkpoint` (headers), or of a model with
    `config`, or of the contract's own model when none is given. The contract's own model must be the same
    architecture (sizes may differ: a contract for a family applies to its smaller and larger members)."""
    from pcc.lower import compile_file

    path = contract_path(arg)
    try:
        if source is not None:
            catalog = _catalog_of(source)
        elif checkpoint is not None:
            catalog = catalog_from_checkpoint(checkpoint)
        elif config is not None:
            catalog = catalog_from_config(str(path), config)
        else:
            catalog = None  # the contract's own model
    except CatalogError as err:  # its own code (PCC208-PCC211) kept; the default, "model not found", is PCC702 here
        raise ConvertError(str(err), code=None if err.code == CatalogError.code else err.code) from None
    compiled = compile_file(str(path), catalog=catalog)
    if not compiled.ok:
        msgs = [d.render(compiled.sources) for d in compiled.diagnostics if d.is_error]
        raise ConvertError(f"{path}: the contract does not compile:\n" + "\n".join(msgs))
    ref = compiled.loaded.contract.model
    if catalog is not None and ref is not None and ref.catalog is not None:
        want = load_catalog(ref.catalog).config.get("model_type")
        have = catalog.config.get("model_type")
        if want != have:
            raise ConvertError(f"{path}: the contract is for {ref.catalog} (model_type {want}), "
                               f"the checkpoint is model_type {have}")
    return compiled.plan


def _catalog_of(src):
    """The catalog of an opened source from the headers `open_source` checked, not read again: each encoded
    weight of a quantized one the operator of its logical tensor (shape [N, K], dtype its encoding's), the
    scale tensors an encoding consumes no extras to copy; a wide one with its fingerprint, as
    catalog_from_checkpoint gives it (a kept or bundled converter plan is taken for that fingerprint)."""
    from pcc.models.base import lm_config
    from pcc.models.catalog import assemble
    from pcc.models.shapes import KNOWN_MODEL_TYPES

    weights, extras = src.records()
    known = lm_config(src.config).get("model_type") in KNOWN_MODEL_TYPES
    return assemble(str(src.root), src.config, weights, extras, source=str(src.root), check_shapes=known,
                    fingerprint=None if src.view.encodings else src.fingerprint)


def config_of(directory: Path) -> dict:
    """config.json through the bounded input layer (a regular file, strict JSON, a mapping)."""
    try:
        config = read_json(directory / "config.json", what="model config")
    except InputError as err:
        raise ConvertError(f"{directory}: cannot read config.json ({err.message})") from None
    if not isinstance(config, dict):
        raise ConvertError(f"{directory / 'config.json'}: not a JSON object")
    return config
