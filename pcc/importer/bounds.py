"""What a source may make `pcc import` do (issue 27, round 3; docs/safety.md, "Round 3: importing").

A source is data someone else wrote: its lists must be lists of names, its numbers numbers, its
nesting shallow, and matching its patterns against a model's module names must end. Exact names
are looked up, never matched one by one (the importers index them); patterns (compressed-tensors
`re:`, ModelOpt globs, TE matchers) are counted against MAX_MATCHES and run under a wall-clock
Budget that interrupts even a regular expression stuck backtracking. Past a bound is PCC811
naming the file, the entry and the bound; a malformed entry is PCC801 naming the file and the key.
"""

from __future__ import annotations

import re
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from pcc.importer import ImportFailed

MAX_PATTERN = 1024  # characters of one pattern; published ones are tens
MAX_MATCHES = 10_000_000  # patterns x module names of one list (seconds of matching)
MATCH_SECONDS = 30.0  # wall clock for matching one source's patterns
MAX_DEPTH = 64  # nesting of a JSON or YAML source, or of a Hydra override value (they nest a few levels)
MAX_INT = 2**31 - 1  # the largest count (lengths, sizes) an import reads


class OverBound(ImportFailed):
    """A source past one of the import's bounds (PCC811): the message names the entry and the bound."""

    code = "PCC811"


def kind_of(value) -> str:
    """What a JSON or YAML value is, in words (never the value itself, which may be huge or deep)."""
    if isinstance(value, bool) or value is None:
        return {True: "true", False: "false", None: "null"}[value]
    for types, word in ((str, "a string"), ((int, float), "a number"), (dict, "a mapping"), (list, "a list")):
        if isinstance(value, types):
            return word
    return type(value).__name__


def shown(text: str, most: int = 60) -> str:
    """`text` quoted for a message, cut to `most` characters (a value may be a megabyte)."""
    return repr(text) if len(text) <= most else f"{text[:most]!r}... ({len(text)} characters)"


def said(value) -> str:
    """A source value for a message: a short one as written, another by its kind (it may be huge)."""
    text = repr(value) if isinstance(value, (list, str, int, float, bool)) or value is None else ""
    return text if 0 < len(text) <= 80 else kind_of(value)


def names(value, key: str, file: str, what: str) -> list[str]:
    """A source's list of module names or patterns (`ignore`, `targets`, `exclude_modules`) as its
    tool reads it: null or a list of strings. A string where the list goes would be read character by
    character (`"lm_head"` as `l`, `m`, ...), so it is refused like any other non-list (PCC801)."""
    if value is None:
        return []
    if not isinstance(value, list):
        hint = f"write [{shown(value)}]" if isinstance(value, str) else None
        raise ImportFailed(f"{file}: {key} is {kind_of(value)}; {what} is a list of strings", path=key, file=file,
                           hint=hint)
    for k, e in enumerate(value):
        if not isinstance(e, str):
            raise ImportFailed(f"{file}: {key}[{k}] is {kind_of(e)}; {what} is a list of strings", path=f"{key}[{k}]",
                               file=file)
    return value


def pattern(entry: str, key: str, file: str, compile_: Callable[[str], re.Pattern], regex: str) -> re.Pattern:
    """`compile_(regex)`, the source's `entry` as its tool compiles it: at most MAX_PATTERN characters (PCC811),
    and a regular expression Python reads (PCC801: the tool itself would fail on it)."""
    if len(entry) > MAX_PATTERN:
        raise OverBound(f"{file}: {key} {shown(entry)} is longer than the {MAX_PATTERN} characters pcc matches in "
                        "one pattern", path=key, file=file)
    try:
        return compile_(regex)
    except (re.error, RecursionError, OverflowError) as exc:
        raise ImportFailed(f"{file}: {key} {shown(entry)} is not a regular expression ({exc})", path=key,
                           file=file) from None


def count(key: str, file: str, patterns: int, targets: int, pairs: int | None = None) -> None:
    """Refuse matching `patterns` against `targets` module names when the pairs matched (every pattern
    against every name unless `pairs` says how many) pass MAX_MATCHES."""
    pairs = patterns * targets if pairs is None else pairs
    if pairs > MAX_MATCHES:
        raise OverBound(f"{file}: {key}: {patterns} patterns matched against {targets} module names is {pairs} "
                        f"matches, over the {MAX_MATCHES} pcc makes for one list", path=key, file=file,
                        hint="list module names (looked up, not matched) instead of patterns")


def integer(value, what: str, file: str, path: str, low: int = 0, span=None) -> int:
    """A count the source gives (a length, a size): an int (a bool is none) in [low, MAX_INT], else PCC801
    naming `what` without printing a 400-digit number back."""
    if isinstance(value, int) and not isinstance(value, bool) and low <= value <= MAX_INT:
        return value
    text = shown(str(value), 20) if isinstance(value, (int, str)) and not isinstance(value, bool) else kind_of(value)
    raise ImportFailed(f"{file}: {what} {text} is not an integer from {low} to {MAX_INT}", path=path, file=file,
                       span=span)


def depth(doc, file: str) -> None:
    """Refuse a document nested deeper than MAX_DEPTH (PCC811 naming the first key too deep), walked
    without recursion so that no later walk of it can run out of stack."""
    todo = [(doc, None, 0)]
    while todo:
        node, trail, level = todo.pop()
        if level > MAX_DEPTH:
            path = _path(trail)
            raise OverBound(f"{file}: {path} nests deeper than the {MAX_DEPTH} levels pcc reads", path=path, file=file)
        items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
        todo += [(v, (k, trail), level + 1) for k, v in items if isinstance(v, (dict, list))]


def _path(trail) -> str:
    """`a.b[3].c` from a (key, parent) chain; keys cut to 40 characters."""
    out = ""
    while trail is not None:
        key, trail = trail
        out = (f"[{key}]" if isinstance(key, int) else f".{key[:40]}") + out
    return out.lstrip(".")


class Budget:
    """MATCH_SECONDS of wall clock for matching one source's patterns, spent by `matching(entry)`
    blocks (looking up exact names costs none of it). A SIGALRM timer interrupts even a regular
    expression stuck backtracking (CPython's matcher checks for signals as it runs), and the PCC811
    names the entry. Only the main thread takes signals (the `pcc` command runs there); elsewhere
    MAX_PATTERN and MAX_MATCHES are the bound."""

    def __init__(self, file: str, seconds: float | None = None):
        self.file = file
        self.seconds = MATCH_SECONDS if seconds is None else seconds
        self.spent = 0.0

    def _over(self, entry: str) -> OverBound:
        return OverBound(f"{self.file}: matching {entry} against the model's module names ran past the "
                         f"{self.seconds:g} s budget of an import", file=self.file,
                         hint="a pattern that backtracks (nested or many repeats) does not end in its own tool "
                              "either; list the module names instead")

    @contextmanager
    def matching(self, entry: str) -> Iterator[None]:
        left = self.seconds - self.spent
        if left <= 0:
            raise self._over(entry)
        start, armed = time.monotonic(), [False]

        def expire(signum, frame):
            if armed[0]:
                armed[0] = False
                raise self._over(entry)

        timed = threading.current_thread() is threading.main_thread() and hasattr(signal, "setitimer")
        if timed:
            handler = signal.signal(signal.SIGALRM, expire)
            outer, interval = signal.setitimer(signal.ITIMER_REAL, left)
            armed[0] = True
        try:
            yield
        finally:
            armed[0] = False
            elapsed = time.monotonic() - start
            self.spent += elapsed
            if timed:
                signal.setitimer(signal.ITIMER_REAL, 0)
                signal.signal(signal.SIGALRM, signal.SIG_DFL if handler is None else handler)  # None: set in C
                if outer:  # someone else's timer keeps running
                    signal.setitimer(signal.ITIMER_REAL, max(outer - elapsed, 1e-3), interval)
