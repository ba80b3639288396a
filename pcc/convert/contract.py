"""A contract (or a bundle holding one) compiled against the checkpoint it converts."""

from __future__ import annotations

from pathlib import Path

from pcc.bundle import BundleError, contract_file
from pcc.convert import ConvertError
from pcc.lang.inputs import InputError, read_json
from pcc.models import CatalogError, catalog_from_checkpoint, load_catalog
from pcc.models.builtin import catalog_from_config


def contract_path(arg: str) -> Path:
    """CONTRACT or BUNDLE -> the contract file (`pcc.bundle.contract_file`: a bundle checked against its
    manifest, so an edited contract.prec never converts)."""
    try:
        return contract_file(arg)
    except BundleError as exc:
        raise ConvertError(str(exc), code=None if exc.missing else exc.code) from None


def load_plan(arg: str, checkpoint: Path | None = None, config: dict | None = None, source=None):
    """The Plan of contract `arg` over the tensors of `source` (an opened pcc.convert.source.Source: a
    quantized source's weights as their logical tensors) or of `checkpoint` (headers), or of a model with
    `config`, or of the contract's own model when none is given. The contract's own model must be the same
    architecture (sizes may differ: a contract for a family applies to its smaller and larger members)."""
    from pcc.lower import compile_file

    path = contract_path(arg)
    try:
        if source is not None and source.view.encodings:
            catalog = _catalog_of(source)
        elif source is not None:
            catalog = catalog_from_checkpoint(source.root)
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
    """The catalog of a quantized source: each encoded weight is the operator of its logical tensor (shape
    [N, K], dtype its encoding's), and the scale tensors an encoding consumes are no extras to copy."""
    from pcc.models.base import lm_config
    from pcc.models.catalog import assemble
    from pcc.models.shapes import KNOWN_MODEL_TYPES

    weights, extras = src.records()
    known = lm_config(src.config).get("model_type") in KNOWN_MODEL_TYPES
    return assemble(str(src.root), src.config, weights, extras, source=str(src.root), check_shapes=known)


def config_of(directory: Path) -> dict:
    """config.json through the bounded input layer (a regular file, strict JSON, a mapping)."""
    try:
        config = read_json(directory / "config.json", what="model config")
    except InputError as err:
        raise ConvertError(f"{directory}: cannot read config.json ({err.message})") from None
    if not isinstance(config, dict):
        raise ConvertError(f"{directory / 'config.json'}: not a JSON object")
    return config
