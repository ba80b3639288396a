"""Load a contract from .prec, YAML or JSON; resolve `extends`; export the canonical form.

`extends` merges at the dict level, from what each file states:
- sections (rollout, trainer, trainable, sync, correction, model...) merge key by key,
  the child's value winning;
- rules are appended after the parent's, so a child rule wins over a parent rule
  on the operators both match (docs/language.md, "Precedence");
- schemes merge by name; expectations merge by (metric, stat, op).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from pcc.contract.model import Contract
from pcc.lang.build import SourceMap, build
from pcc.lang.diagnostics import Diagnostic, DiagnosticError, Reporter, Span
from pcc.lang.parser import read_source

SUFFIXES = (".prec", ".yaml", ".yml", ".json")
MAX_EXTENDS_DEPTH = 32


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
    text = read_source(path)
    sources[path] = text
    if path.endswith(".prec"):
        return build(text, path, rep)
    try:
        doc = json.loads(text) if path.endswith(".json") else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as exc:
        line, col = 1, 1
        if isinstance(exc, json.JSONDecodeError):
            line, col = exc.lineno, exc.colno
        elif getattr(exc, "problem_mark", None) is not None:
            line, col = exc.problem_mark.line + 1, exc.problem_mark.column + 1
        msg = exc.msg if isinstance(exc, json.JSONDecodeError) else str(getattr(exc, "problem", exc))
        raise DiagnosticError([Diagnostic("PCC108", "error", f"invalid document: {msg}", Span(path, line, col))]) from None
    except RecursionError:
        raise DiagnosticError([Diagnostic("PCC108", "error", "document nests too deeply", Span(path, 1, 1))]) from None
    if not isinstance(doc, dict):
        raise DiagnosticError([Diagnostic("PCC108", "error", "a contract document is a mapping at the top level",
                                          Span(path, 1, 1))])
    return doc, _yaml_spans(text, path)


def _yaml_spans(text: str, path: str) -> SourceMap:
    """Spans for every key path of a YAML/JSON document, so its errors are positioned too."""
    smap = SourceMap()
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except (yaml.YAMLError, RecursionError):
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


def _resolve(path: str, rep: Reporter, sources: dict[str, str], stack: list[str],
             ref: Span | None) -> tuple[dict[str, Any], SourceMap]:
    real = str(Path(path).resolve())
    if real in stack:
        cycle = " -> ".join(Path(p).name for p in stack[stack.index(real):] + [real])
        raise DiagnosticError([Diagnostic("PCC107", "error", f"cyclic extends: {cycle}", ref or Span(path, 1, 1))])
    if len(stack) >= MAX_EXTENDS_DEPTH:
        raise DiagnosticError([Diagnostic("PCC107", "error", f"extends chain deeper than {MAX_EXTENDS_DEPTH}",
                                          ref or Span(path, 1, 1))])
    if ref is not None and not Path(path).is_file():
        raise DiagnosticError([Diagnostic("PCC107", "error", f"extended contract not found: {path}", ref)])
    doc, smap = _read_doc(path, rep, sources)
    parent_ref = doc.get("extends")
    if not parent_ref:
        return doc, smap
    if not isinstance(parent_ref, str):
        raise DiagnosticError([Diagnostic("PCC105", "error", "'extends' must be a path string", file=path,
                                          path="extends")])
    parent_path = str(Path(path).parent / parent_ref)
    parent, parent_smap = _resolve(parent_path, rep, sources, stack + [real], smap.get("extends") or Span(path, 1, 1))
    child = {k: v for k, v in doc.items() if k != "extends"}
    # The merged contract stands alone: exporting it and loading the export gives the same Plan.
    merged = _merge({k: v for k, v in parent.items() if k not in ("name", "extends")}, child)
    return merged, _shift(smap, parent_smap, parent, child)


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
        if err["type"] == "literal_error":
            msg = f"invalid value {err.get('input')!r}: {msg.lower()}"
        elif err["type"] == "extra_forbidden":
            msg = f"unknown field '{loc.rsplit('.', 1)[-1]}'"
        span = smap.find(loc)
        out.append(Diagnostic("PCC105", "error", msg, span, path=None if span else loc or "<top>",
                              file=None if span else path))
    return out


def load(path: str) -> Loaded:
    """Load and validate one contract file; raise DiagnosticError on any error."""
    rep = Reporter()
    sources: dict[str, str] = {}
    if not path.endswith(SUFFIXES):
        raise DiagnosticError([Diagnostic("PCC104", "error", f"unknown contract suffix (use {', '.join(SUFFIXES)})",
                                          file=path)])
    doc, smap = _resolve(path, rep, sources, [], None)
    rep.fail_if_errors()
    try:
        contract = Contract.model_validate(doc)
    except ValidationError as exc:
        raise DiagnosticError(rep.diagnostics + _validation_diagnostics(exc, path, smap)) from None
    return Loaded(contract, path, smap, sources, rep.diagnostics)


def canonical(contract: Contract) -> dict[str, Any]:
    """The canonical dict: defaults written out, so two equal contracts dump equal."""
    return contract.model_dump(mode="json")


def export(contract: Contract, fmt: str) -> str:
    data = canonical(contract)
    if fmt == "json":
        return json.dumps(data, indent=2, sort_keys=False) + "\n"
    return yaml.safe_dump(data, sort_keys=False, default_flow_style=False)
