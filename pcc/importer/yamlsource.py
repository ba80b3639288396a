"""Safe YAML with positions: a source's values and where each one is written, so that every
diagnostic about a YAML source (a verl job, a TE precision file) carries file:line:col.

Only YAML's safe constructors run (no tags that build objects); a syntax error, a duplicate key
or a non-scalar key is a positioned PCC801.
"""

from __future__ import annotations

import os

import yaml

from pcc.importer import ImportFailed, input_failed
from pcc.importer.bounds import MAX_DEPTH, OverBound
from pcc.lang.diagnostics import Span
from pcc.lang.inputs import InputError, read_bytes


MAX_BYTES = 1 << 20  # a verl job or a TE precision file is kilobytes; a larger one is not a source
MAX_NODES = 100_000  # YAML nodes walked, aliases expanded (pcc.contract.io's bound for YAML contracts)


def read_text(path: str, what: str) -> str:
    """The UTF-8 text of regular file `path` (at most MAX_BYTES, read once through pcc.lang.inputs: a
    FIFO or a link to /dev/zero is refused before a byte is read, PCC109)."""
    if not os.path.lexists(path):
        raise ImportFailed(f"{path}: no such file ({what})", file=path)
    try:
        return read_bytes(path, MAX_BYTES, what).decode("utf-8")
    except InputError as exc:
        raise input_failed(exc, path) from None
    except UnicodeDecodeError as exc:
        raise ImportFailed(f"{path}: unreadable {what} ({exc})", file=path) from None


def span_at(file: str, mark) -> Span:
    return Span(file, mark.line + 1, mark.column + 1)


class _Loader(yaml.SafeLoader):
    """The safe loader, refusing nesting past bounds.MAX_DEPTH as it composes (PCC811 at the node): its
    composer recurses once per level, so a deep document would otherwise end in a RecursionError."""

    def __init__(self, text: str, file: str, what: str):
        super().__init__(text)
        self.file, self.what, self.depth = file, what, 0

    def compose_node(self, parent, index):
        self.depth += 1
        try:
            if self.depth > MAX_DEPTH:
                raise OverBound(f"{self.file}: nests deeper than the {MAX_DEPTH} levels pcc reads ({self.what})",
                                file=self.file, span=span_at(self.file, self.peek_event().start_mark))
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1


def load(text: str, file: str, what: str) -> tuple[object, dict[str, Span]]:
    """(the document as plain Python values, dotted path -> Span of its value; list items `a[0]`)."""
    loader = _Loader(text, file, what)
    try:
        node = loader.get_single_node()
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        raise ImportFailed(f"{file}: not valid YAML ({what}): {exc.problem or exc.context}", file=file,
                           span=span_at(file, mark) if mark else None) from None
    except yaml.YAMLError as exc:
        raise ImportFailed(f"{file}: not valid YAML ({what}): {exc}", file=file) from None
    finally:
        loader.dispose()
    spans: dict[str, Span] = {}
    if node is None:
        return None, spans

    walked, open_ = [0], set()

    def walk(n, path: str, level: int = 0):
        walked[0] += 1
        if level > MAX_DEPTH:  # aliases nest what each definition does not
            raise OverBound(f"{file}: {path} nests deeper than the {MAX_DEPTH} levels pcc reads ({what})", file=file,
                            span=span_at(file, n.start_mark), path=path)
        if walked[0] > MAX_NODES or id(n) in open_:
            why = (f"YAML aliases expand the document past {MAX_NODES} nodes" if walked[0] > MAX_NODES
                   else "a YAML alias refers to the node that contains it")
            raise ImportFailed(f"{file}: {why} ({what})", file=file, span=span_at(file, n.start_mark))
        open_.add(id(n))
        try:
            return _walk(n, path, level + 1)
        finally:
            open_.discard(id(n))

    def _walk(n, path: str, level: int):
        spans[path] = span_at(file, n.start_mark)
        plain = {yaml.MappingNode: "tag:yaml.org,2002:map", yaml.SequenceNode: "tag:yaml.org,2002:seq"}.get(type(n))
        if plain is not None and n.tag != plain:
            raise ImportFailed(f"{file}: could not determine a constructor for the tag {n.tag!r} ({what}; only plain "
                               "YAML is read)", file=file, span=span_at(file, n.start_mark))
        if isinstance(n, yaml.MappingNode):
            written = sum(k.tag != "tag:yaml.org,2002:merge" for k, _ in n.value)
            loader.flatten_mapping(n)  # YAML merge keys (<<), as the safe loader reads them: merged pairs first
            merged = len(n.value) - written
            out, own = {}, set()
            for i, (k, v) in enumerate(n.value):
                if not isinstance(k, yaml.ScalarNode):
                    raise ImportFailed(f"{file}: a mapping key must be a scalar ({what})", file=file,
                                       span=span_at(file, k.start_mark))
                key = str(loader.construct_object(k))
                sub = f"{path}.{key}" if path else key
                if key in own:
                    raise ImportFailed(f"{file}: key {key!r} written twice (YAML keeps one silently)", file=file,
                                       span=span_at(file, k.start_mark), path=f"{path}.{key}".lstrip("."))
                if i >= merged:
                    own.add(key)
                if key in out:  # a key written beside a merge (<<) replaces the merged one, as YAML says
                    for gone in [s for s in spans if s.startswith((sub + ".", sub + "["))]:
                        del spans[gone]
                spans[sub + "@key"] = span_at(file, k.start_mark)
                out[key] = walk(v, sub, level)
            return out
        if isinstance(n, yaml.SequenceNode):
            return [walk(v, f"{path}[{i}]", level) for i, v in enumerate(n.value)]
        try:
            return loader.construct_object(n)
        except yaml.constructor.ConstructorError as exc:
            raise ImportFailed(f"{file}: {exc.problem} ({what})", file=file, span=span_at(file, n.start_mark)) from None

    try:
        return walk(node, ""), spans
    except RecursionError:  # YAML merge keys (<<) chained through many anchors
        raise OverBound(f"{file}: merges or aliases nest deeper than pcc reads ({what})", file=file) from None
