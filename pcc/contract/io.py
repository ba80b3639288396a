"""Load a contract from .prec, YAML or JSON; resolve `extends`; export the canonical form.

Every file is read once through pcc.lang.inputs (regular files, bounded); YAML through a loader
that refuses duplicate keys and alias expansion past MAX_YAML_NODES, JSON without duplicate keys
or NaN/Infinity; numbers are validated strictly (no bool or string coercion) and finite.

`extends` names a parent relative to the file that names it; the parent must lie inside an
allowed root (`allowed_roots`, docs/safety.md). A parent's relative `model from` stays relative
to the parent's own folder.

`extends` merges at the dict level, from what each file states:
- sections (rollout, trainer, trainable, sync, correction, model...) merge key by key,
  the child's value winning;
- rules are appended after the parent's, so a child rule wins over a parent rule
  on the operators both match (docs/language.md, "Precedence");
- schemes merge by name; expectations merge by (metric, stat, op).
"""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from pcc.contract.model import Contract
from pcc.lang.build import SourceMap, build
from pcc.lang.diagnostics import Diagnostic, DiagnosticError, PccError, Reporter, Span, did_you_mean
from pcc.lang.inputs import DuplicateKey, loads_json
from pcc.lang.parser import read_source
from pcc.resources import ROOTS_ENV

SUFFIXES = (".prec", ".yaml", ".yml", ".json")
MAX_EXTENDS_DEPTH = 32
MAX_YAML_NODES = 100_000  # nodes after alias expansion: a contract has hundreds; an alias bomb, billions


class _Refused(PccError):
    """A YAML document the strict loader refuses: (code, message, mark)."""

    def __init__(self, code: str, message: str, mark):
        super().__init__(message, code)
        self.mark = mark


class _StrictLoader(yaml.SafeLoader):
    """yaml.safe_load, but a duplicate key is an error (not last-wins) and aliases may not expand the
    document past MAX_YAML_NODES nodes (a 600-byte alias bomb expands to billions), or refer to
    themselves."""

    def compose_document(self):
        node = super().compose_document()
        _expanded_size(node, {}, set())
        return node


def _expanded_size(node, sizes: dict[int, int], open_: set[int]) -> int:
    """Nodes of `node` with every alias expanded, memoized per node (the composed graph is shared)."""
    key = id(node)
    if key in sizes:
        return sizes[key]
    if key in open_:
        raise _Refused("PCC111", "a YAML alias refers to the node that contains it", node.start_mark)
    open_.add(key)
    n = 1
    if isinstance(node, yaml.MappingNode):
        seen = set()
        for k, v in node.value:
            if isinstance(k, yaml.ScalarNode) and k.tag != "tag:yaml.org,2002:merge":
                if (k.tag, k.value) in seen:
                    raise _Refused("PCC110", f"duplicate key '{k.value}'", k.start_mark)
                seen.add((k.tag, k.value))
            n += _expanded_size(k, sizes, open_) + _expanded_size(v, sizes, open_)
    elif isinstance(node, yaml.SequenceNode):
        for item in node.value:
            n += _expanded_size(item, sizes, open_)
    open_.discard(key)
    if n > MAX_YAML_NODES:
        raise _Refused("PCC111", f"YAML aliases expand the document past {MAX_YAML_NODES} nodes",
                       node.start_mark)
    sizes[key] = n
    return n


@dataclass
class Loaded:
    """A validated contract with where it came from."""

    contract: Contract
    path: str
    smap: SourceMap
    sources: dict[str, str] = field(default_factory=dict)  # file -> text, for carets
    diagnostics: list[Diagnostic] = field(default_factory=list)
    chain: list[str] = field(default_factory=list)  # the files merged, parent first


def _read_doc(path: str, rep: Reporter, sources: dict[str, str]) -> tuple[dict[str, Any], SourceMap]:
    text = sources[path] if path in sources else read_source(path)  # an editor's unsaved text is given
    sources[path] = text
    if path.endswith(".prec"):
        return build(text, path, rep)
    try:
        doc = loads_json(text) if path.endswith(".json") else yaml.load(text, Loader=_StrictLoader)
    except _Refused as exc:
        m = exc.mark
        raise DiagnosticError([Diagnostic(exc.code, "error", exc.message, Span(path, m.line + 1, m.column + 1))],
                              sources) from None
    except DuplicateKey as exc:  # JSON: find the key's position with the YAML composer (JSON is YAML)
        raise DiagnosticError([Diagnostic("PCC110", "error", str(exc), _json_key_span(text, path))],
                              sources) from None
    except (json.JSONDecodeError, yaml.YAMLError) as exc:
        line, col = 1, 1
        if isinstance(exc, json.JSONDecodeError):
            line, col = exc.lineno, exc.colno
        elif getattr(exc, "problem_mark", None) is not None:
            line, col = exc.problem_mark.line + 1, exc.problem_mark.column + 1
        msg = exc.msg if isinstance(exc, json.JSONDecodeError) else str(getattr(exc, "problem", exc))
        raise DiagnosticError([Diagnostic("PCC108", "error", f"invalid document: {msg}", Span(path, line, col))],
                              sources) from None
    except ValueError as exc:  # loads_json: NaN or Infinity
        raise DiagnosticError([Diagnostic("PCC105", "error", str(exc), Span(path, 1, 1))], sources) from None
    except RecursionError:
        raise DiagnosticError([Diagnostic("PCC108", "error", "document nests too deeply", Span(path, 1, 1))],
                              sources) from None
    if not isinstance(doc, dict):
        raise DiagnosticError([Diagnostic("PCC108", "error", "a contract document is a mapping at the top level",
                                          Span(path, 1, 1))], sources)
    return doc, _yaml_spans(text, path)


def _json_key_span(text: str, path: str) -> Span:
    try:
        yaml.load(text, Loader=_StrictLoader)
    except _Refused as exc:
        return Span(path, exc.mark.line + 1, exc.mark.column + 1)
    except (yaml.YAMLError, RecursionError):
        pass
    return Span(path, 1, 1)


def _yaml_spans(text: str, path: str) -> SourceMap:
    """Spans for every key path of a YAML/JSON document, so its errors are positioned too."""
    smap = SourceMap()
    try:
        root = yaml.compose(text, Loader=_StrictLoader)
    except (yaml.YAMLError, RecursionError, _Refused):
        return smap
    stack = [("", root)]
    while stack:
        prefix, node = stack.pop()
        if isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                p = f"{prefix}.{key.value}" if prefix else str(key.value)
                m = key.start_mark
                smap[p] = Span(path, m.line + 1, m.column + 1)
                stack.append((p, value))
        elif isinstance(node, yaml.SequenceNode):
            for i, item in enumerate(node.value):
                p = f"{prefix}[{i}]"
                m = item.start_mark
                smap[p] = Span(path, m.line + 1, m.column + 1)
                stack.append((p, item))
    return smap


def _merge(parent: dict[str, Any], child: dict[str, Any]) -> dict[str, Any]:
    out = dict(parent)
    for key, value in child.items():
        old = out.get(key)
        if key == "rules" and isinstance(old, list) and isinstance(value, list):
            out[key] = old + value
        elif key == "expect" and isinstance(old, list) and isinstance(value, list):
            merged = {(e.get("metric"), e.get("stat"), e.get("op")): e for e in old + value if isinstance(e, dict)}
            out[key] = list(merged.values())
        elif isinstance(old, dict) and isinstance(value, dict) and key != "model":
            out[key] = _merge(old, value)
        else:
            out[key] = value
    return out


def _shift(smap: SourceMap, parent_smap: SourceMap, parent: dict, child: dict) -> SourceMap:
    """Child rule paths move past the parent's rules after merging."""
    out = SourceMap(parent_smap)
    offsets = {sec: len(parent.get(sec, {}).get("rules", [])) for sec in ("rollout", "trainer")}
    for path, span in smap.items():
        for sec, off in offsets.items():
            prefix = f"{sec}.rules["
            if path.startswith(prefix):
                idx, rest = path[len(prefix):].split("]", 1)
                path = f"{prefix}{int(idx) + off}]{rest}"
        out[path] = span
    return out


def allowed_roots(top: str) -> list[Path]:
    """The folders an `extends` may reach from the contract `top` (docs/safety.md): the top contract's
    own folder, the working directory, the contracts pcc ships, and each folder in $PCC_CONTRACT_ROOTS
    (what `pcc --allow-root DIR` adds)."""
    from pcc.resources import data_dir

    roots = [_real(top, Span(top, 1, 1)).parent, Path.cwd().resolve()]
    try:
        roots.append(data_dir("contracts").resolve())
    except FileNotFoundError:
        pass
    roots += [Path(p).resolve() for p in os.environ.get(ROOTS_ENV, "").split(os.pathsep) if p]
    return list(dict.fromkeys(roots))


def _parent(path: str, ref: str, span: Span, roots: list[Path]) -> str:
    """The file `extends ref` in `path` names: relative to `path`'s folder, a contract suffix, inside a root."""
    parent = str(Path(path).parent / ref)
    real = _real(parent, span)
    if not any(real.is_relative_to(r) for r in roots):
        raise DiagnosticError([Diagnostic(
            "PCC112", "error", f"extends {ref!r} resolves to {real}, outside the folders a contract may extend from",
            span, hint=f"allowed: {', '.join(str(r) for r in roots)}; add a folder with "
                       f"`pcc --allow-root DIR` or ${ROOTS_ENV}")])
    if not parent.endswith(SUFFIXES):
        raise DiagnosticError([Diagnostic("PCC107", "error", f"extends {ref!r}: not a contract file name",
                                          span, hint=f"a contract ends in {', '.join(SUFFIXES)}")])
    if not real.exists():
        raise DiagnosticError([Diagnostic("PCC107", "error", f"extended contract not found: {parent}", span)])
    return parent


def _real(path: str, span: Span) -> Path:
    """`path` with every link followed; a link loop or a NUL byte is a PCC107, not a traceback."""
    try:
        return Path(path).resolve()
    except (OSError, RuntimeError, ValueError) as exc:
        raise DiagnosticError([Diagnostic("PCC107", "error", f"cannot resolve {path!r}: {exc}", span)]) from None


def _rebase_model(parent: dict[str, Any], parent_file: str, child_file: str) -> dict[str, Any]:
    """A parent's relative `model from` is relative to the parent's folder; restate it relative to the
    child's, which is where the merged contract's paths are read from."""
    model = parent.get("model")
    if not (isinstance(model, dict) and isinstance(model.get("path"), str) and not os.path.isabs(model["path"])):
        return parent
    src, dst = os.path.abspath(os.path.dirname(parent_file)), os.path.abspath(os.path.dirname(child_file))
    if src == dst:
        return parent
    return {**parent, "model": {**model, "path": os.path.relpath(os.path.join(src, model["path"]), dst)}}


def _resolve(path: str, rep: Reporter, sources: dict[str, str], stack: list[str],
             ref: Span | None, roots: list[Path]) -> tuple[dict[str, Any], SourceMap]:
    real = str(_real(path, ref or Span(path, 1, 1)))
    if real in stack:
        cycle = " -> ".join(Path(p).name for p in stack[stack.index(real):] + [real])
        raise DiagnosticError([Diagnostic("PCC107", "error", f"cyclic extends: {cycle}", ref or Span(path, 1, 1))])
    if len(stack) >= MAX_EXTENDS_DEPTH:
        raise DiagnosticError([Diagnostic("PCC107", "error", f"extends chain deeper than {MAX_EXTENDS_DEPTH}",
                                          ref or Span(path, 1, 1))])
    doc, smap = _read_doc(path, rep, sources)
    parent_ref = doc.get("extends")
    if not parent_ref:
        return doc, smap
    if not isinstance(parent_ref, str):
        raise DiagnosticError([Diagnostic("PCC105", "error", "'extends' must be a path string", file=path,
                                          path="extends")])
    span = smap.get("extends") or Span(path, 1, 1)
    parent_path = _parent(path, parent_ref, span, roots)
    parent, parent_smap = _resolve(parent_path, rep, sources, stack + [real], span, roots)
    parent = _rebase_model(parent, parent_path, path)
    child = {k: v for k, v in doc.items() if k != "extends"}
    # The merged contract stands alone: exporting it and loading the export gives the same Plan.
    merged = _merge({k: v for k, v in parent.items() if k not in ("name", "extends")}, child)
    return merged, _shift(smap, parent_smap, parent, child)


def _nonfinite(doc: Any, prefix: str = ""):
    """Contract paths of NaN and infinite numbers (YAML's .nan/.inf, or a .prec literal like 1e999)."""
    if isinstance(doc, float) and not math.isfinite(doc):
        yield prefix, doc
    elif isinstance(doc, dict):
        for k, v in doc.items():
            yield from _nonfinite(v, f"{prefix}.{k}" if prefix else str(k))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            yield from _nonfinite(v, f"{prefix}[{i}]")


def _validation_diagnostics(exc: ValidationError, path: str, smap: SourceMap) -> list[Diagnostic]:
    out = []
    for err in exc.errors(include_url=False):
        loc = ""
        for part in err["loc"]:
            if isinstance(part, int):
                loc += f"[{part}]"
            elif part in ("function-after", "literal_error") or "[" in str(part):
                continue
            else:
                loc += ("." if loc else "") + str(part)
        msg = err["msg"].removeprefix("Value error, ")
        hint = None
        if err["type"] == "literal_error":
            msg = f"invalid value {err.get('input')!r}: {msg.lower()}"
            if isinstance(err.get("input"), str):  # pydantic names the choices as "'a', 'b' or 'c'"
                hint = did_you_mean(err["input"], re.findall(r"'([^']*)'", err.get("ctx", {}).get("expected", "")))
        elif err["type"] == "extra_forbidden":
            msg = f"unknown field '{loc.rsplit('.', 1)[-1]}'"
        span = smap.find(loc)
        out.append(Diagnostic("PCC105", "error", msg, span, path=None if span else loc or "<top>",
                              file=None if span else path, hint=hint))
    return out


def load(path: str, text: str | None = None) -> Loaded:
    """Load and validate one contract file (`text`: its contents as an editor holds them, unsaved);
    raise DiagnosticError on any error."""
    rep = Reporter()
    sources: dict[str, str] = {} if text is None else {path: text}
    if not path.endswith(SUFFIXES):
        raise DiagnosticError([Diagnostic("PCC104", "error", f"unknown contract suffix (use {', '.join(SUFFIXES)})",
                                          file=path)])
    try:
        doc, smap = _resolve(path, rep, sources, [], None, allowed_roots(path))
    except DiagnosticError as exc:
        raise DiagnosticError(rep.diagnostics + exc.diagnostics, sources) from None
    for where, value in _nonfinite(doc):
        span = smap.find(where)
        rep.error("PCC105", f"{value} is not a finite number", span, path=None if span else where,
                  hint="bounds and sizes are finite numbers")
    if rep.has_errors:
        raise DiagnosticError(rep.diagnostics, sources)
    try:
        contract = Contract.model_validate(doc, strict=True)  # `tp: true` or "2" is an error, not 1 or 2
    except ValidationError as exc:
        raise DiagnosticError(rep.diagnostics + _validation_diagnostics(exc, path, smap), sources) from None
    return Loaded(contract, path, smap, sources, rep.diagnostics)


def canonical(contract: Contract) -> dict[str, Any]:
    """The canonical dict: defaults written out, so two equal contracts dump equal."""
    return contract.model_dump(mode="json")


def export(contract: Contract, fmt: str) -> str:
    data = canonical(contract)
    if fmt == "json":
        return json.dumps(data, indent=2, sort_keys=False) + "\n"
    return yaml.safe_dump(data, sort_keys=False, default_flow_style=False)
