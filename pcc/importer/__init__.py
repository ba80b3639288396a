"""`pcc import`: a contract from the precision configuration a team already has.

    imported = import_source("checkpoint", "Qwen3-30B-A3B-FP8/", model=None)
    imported.text()         # canonical .prec (pcc.contract.fmt), checked to resolve as the source decides
    imported.diagnostics    # PCC801-PCC810 (docs/checks.md)

Kinds: `checkpoint` (a checkpoint's own quantization config: HF block FP8, compressed-tensors,
ModelOpt, gpt-oss MXFP4; checkpoint.py), `miles` (a Miles launch: a script, an argument file
or a pcc bundle; miles.py), `verl` (a verl job: a Hydra YAML config, or Hydra overrides in a
script or an argument file; verl.py), `nemo_rl` (a NeMo RL GRPO recipe YAML, `defaults:` resolved;
nemo_rl.py) and `te` (a Transformer Engine per-module precision file;
te.py). Each source's own matching rules are reproduced (matching.py), the
result is written as pcc rules + exceptions (rules.py), and everything the source says that pcc
states differently, or cannot state, is a coded warning. docs/import.md.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from pcc.lang import inputs
from pcc.lang.diagnostics import Diagnostic, PccError, Span

KINDS = ("checkpoint", "miles", "verl", "nemo_rl", "te")


class ImportFailed(PccError):
    """The source cannot be imported (unreadable, or a setting pcc cannot state); PCC801 unless
    the raise names another code."""

    code = "PCC801"

    def __init__(self, message: str, code: str | None = None, path: str | None = None, hint: str | None = None,
                 file: str | None = None, span: Span | None = None):
        super().__init__(message, code, path, hint)
        self.file, self.span = file, span

    def to_diagnostic(self) -> Diagnostic:
        return Diagnostic(self.code, "error", self.message, self.span, self.hint, self.path, self.file)


@dataclass
class Imported:
    """An imported contract (the builder's dict form) and what the import has to say about it."""

    contract: dict
    diagnostics: list[Diagnostic] = field(default_factory=list)
    source: str = ""
    decided: object = None  # checkpoint imports: what the source decides per operator (checkpoint.Decided)

    def warn(self, code: str, message: str, path: str | None = None, hint: str | None = None,
             file: str | None = None, span: Span | None = None) -> None:
        self.diagnostics.append(Diagnostic(code, "warning", message, span, hint, path, file or self.source))

    def text(self) -> str:
        """The canonical .prec text (the formatter's own layout, so `pcc fmt --check` passes)."""
        from pcc.contract.fmt import format_source, lines

        raw = "\n".join(text for _, text in lines(self.contract)) + "\n"
        return format_source(raw, "<import>")


def contract_name(source: str) -> str:
    """A contract name from the source's file or directory name."""
    p = Path(source)
    stem = p.name if p.is_dir() else p.stem
    if stem in ("config", "hf_quant_config", "quantization_config", "launch", "args", "miles", "overrides",
                "te_precision", "verl", ""):
        stem = p.resolve().parent.name if not p.is_dir() else stem
    slug = re.sub(r"[^A-Za-z0-9_\-]+", "-", stem).strip("-") or "imported"
    return slug if re.match(r"[A-Za-z_]", slug) else f"imported-{slug}"


def read_json(path: Path, what: str) -> dict:
    """A JSON object from regular file `path`, through pcc.lang.inputs (bounded; a duplicate key or NaN is
    refused) and nested at most bounds.MAX_DEPTH deep; ImportFailed naming the file otherwise: PCC109
    where it is no regular file, PCC811 past a bound (as read_text)."""
    from pcc.importer.bounds import depth

    if not os.path.lexists(path):
        raise ImportFailed(f"{path}: no such file ({what})", file=str(path))
    try:
        data = inputs.read_json(path, what=what)
    except inputs.InputError as exc:
        raise input_failed(exc, str(path)) from None
    if not isinstance(data, dict):
        raise ImportFailed(f"{path}: {what} is not a JSON object", file=str(path))
    depth(data, str(path))
    return data


def input_failed(exc: inputs.InputError, file: str) -> ImportFailed:
    """pcc.lang.inputs' refusal as the import's: PCC109 for no regular file, PCC811 over the size
    limit (a gigabyte sparse file is refused on its stated size), else PCC801."""
    return ImportFailed(exc.message, code={"kind": exc.code, "size": "PCC811"}.get(exc.reason), file=file)


def bundle_file(bundle: Path, name: str) -> Path | None:
    """`bundle/name` where it exists (a FIFO or a device exists too: reading it is PCC109), None where
    not; refused (PCC812) when it, or a folder on the way, is a link that leaves the bundle: pcc reads
    a bundle's own files, never what a link in it points at, and names the link without reading it."""
    path = bundle / name
    if not os.path.lexists(path):
        return None
    if not path.resolve().is_relative_to(bundle.resolve()):
        raise ImportFailed(f"{path}: a link out of the bundle {bundle}; pcc reads only the bundle's own files",
                           code="PCC812", file=str(path), hint="copy the file into the bundle, or remove the link")
    return path


def import_source(kind: str, source: str, model: str | None = None, hardware: str | None = None) -> Imported:
    """Import `source` of `kind`; raises ImportFailed (or pcc.models.CatalogError) when it cannot: a value
    the contract's model refuses (a parallel size 0, a clip -1) is PCC801 naming the field."""
    from pydantic import ValidationError

    try:
        return _import(kind, source, model, hardware)
    except ValidationError as exc:
        err = exc.errors()[0]
        field = ".".join(map(str, err["loc"]))
        raise ImportFailed(f"{source}: the source gives {field} {err.get('input')!r}, which a contract cannot state: "
                           f"{err['msg']}", path=field, file=source) from None


def _import(kind: str, source: str, model: str | None, hardware: str | None) -> Imported:
    if kind == "checkpoint":
        from pcc.importer.checkpoint import import_checkpoint

        return import_checkpoint(source, model, hardware)
    if kind == "miles":
        from pcc.importer.miles import import_miles

        return import_miles(source, model, hardware)
    if kind == "verl":
        from pcc.importer.verl import import_verl

        return import_verl(source, model, hardware)
    if kind == "nemo_rl":
        from pcc.importer.nemo_rl import import_nemo_rl

        return import_nemo_rl(source, model, hardware)
    if kind == "te":
        from pcc.importer.te import import_te

        return import_te(source, model, hardware)
    raise ImportFailed(f"unknown import kind {kind!r} (known: {', '.join(KINDS)})")
