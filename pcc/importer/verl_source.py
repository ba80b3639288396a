"""A verl job as written: a Hydra YAML config, or Hydra overrides (`key=value`) in a launch script
or an argument file (pcc.lower.verl writes verl/overrides.txt and verl/launch.sh). Read into dotted
keys with their values and positions; nothing is run.

Override values follow Hydra's override grammar (hydra/core/override_parser: quoted strings,
null, true/false in any case, ints and floats with `_` separators, lists `[..]`, dicts `{k: v}`,
`${...}` interpolations kept as text; anything else a string, trimmed). A sweep (`a,b`) is refused:
a job composes one value. tests/importer/test_verl.py holds this parser to Hydra's own.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from pcc.importer import ImportFailed
from pcc.importer.yamlsource import load, read_text
from pcc.lang.diagnostics import Span
from pcc.lower.engine_table import table

ENTRY = re.compile(r"(^|[/.])main_ppo(\.py)?$")
_OVERRIDE = re.compile(r"^(~|\+\+|\+)?([A-Za-z_][\w\-]*(?:[.@/][A-Za-z_0-9][\w\-]*)*)(?:=(.*))?$", re.S)
_INT = re.compile(r"^[+-]?(?:0|[1-9](?:_?\d)*)$")
_FLOAT = re.compile(r"^[+-]?(?:(?:\d(?:_?\d)*)?\.\d(?:_?\d)*(?:[eE][+-]?\d(?:_?\d)*)?|\d(?:_?\d)*\.(?:[eE][+-]?\d(?:_?\d)*)?"
                    r"|\d(?:_?\d)*[eE][+-]?\d(?:_?\d)*|inf|nan)$", re.I)
_REF = re.compile(r"\$(?:\{(\w+)\}|(\w+))")
_ASSIGN = re.compile(r"^([A-Za-z_]\w*)=(.*)$", re.S)


@dataclass
class Entry:
    value: object
    span: Span | None
    op: str = "set"  # set (key=v), add (+key=v), force (++key=v), delete (~key); yaml (a config file's key)


@dataclass
class Job:
    """The keys a job sets (dotted path -> Entry), its config name, environment and files."""

    file: str
    text: str
    entries: dict[str, Entry] = field(default_factory=dict)
    config: str | None = None  # --config-name, or the YAML's defaults list
    defaults: list[tuple[str, Span | None]] = field(default_factory=list)  # other defaults-list entries
    exports: dict[str, tuple[str, Span | None]] = field(default_factory=dict)
    unread: list[tuple[str, Span | None]] = field(default_factory=list)  # `$@`, `$EXTRA`: expanded at run time


class _Value:
    """Hydra's override value grammar, for one value string."""

    def __init__(self, text: str):
        self.s, self.i = text, 0

    def fail(self, msg: str):
        raise ValueError(f"{msg} at character {self.i + 1} of {self.s!r}")

    def ws(self):
        while self.i < len(self.s) and self.s[self.i] in " \t":
            self.i += 1

    def parse(self):
        self.ws()
        v = self.element(top=True)
        self.ws()
        if self.i < len(self.s):
            if self.s[self.i] == ",":
                self.fail("a sweep (several values) cannot be composed into one job")
            self.fail("unexpected text")
        return v

    def element(self, top: bool = False):
        self.ws()
        c = self.s[self.i] if self.i < len(self.s) else ""
        if c == "[":
            self.i += 1
            out = []
            self.ws()
            if self.s[self.i:self.i + 1] == "]":
                self.i += 1
                return out
            while True:
                out.append(self.element())
                self.ws()
                c = self.s[self.i:self.i + 1]
                self.i += 1
                if c == "]":
                    return out
                if c != ",":
                    self.fail("expected ',' or ']'")
        if c == "{":
            self.i += 1
            out = {}
            self.ws()
            if self.s[self.i:self.i + 1] == "}":
                self.i += 1
                return out
            while True:
                self.ws()
                m = re.compile(r"[\w\-./]+").match(self.s, self.i)
                if not m:
                    self.fail("expected a dictionary key")
                self.i = m.end()
                self.ws()
                if self.s[self.i:self.i + 1] != ":":
                    self.fail("expected ':'")
                self.i += 1
                out[m.group()] = self.element()
                self.ws()
                c = self.s[self.i:self.i + 1]
                self.i += 1
                if c == "}":
                    return out
                if c != ",":
                    self.fail("expected ',' or '}'")
        if c in ("'", '"'):
            return self.quoted(c)
        return self.primitive(top)

    def quoted(self, q: str) -> str:
        self.i += 1
        out = []
        while self.i < len(self.s):
            c = self.s[self.i]
            if c == "\\" and self.i + 1 < len(self.s) and self.s[self.i + 1] in (q, "\\"):
                out.append(self.s[self.i + 1])
                self.i += 2
                continue
            if c == q:
                self.i += 1
                return "".join(out)
            out.append(c)
            self.i += 1
        self.fail("unterminated quoted string")

    def primitive(self, top: bool):
        start, depth = self.i, 0
        while self.i < len(self.s):
            c = self.s[self.i]
            if self.s.startswith("${", self.i):
                depth += 1
                self.i += 2
                continue
            if c == "}" and depth:
                depth -= 1
            elif not depth and (c in ",]}" or (c in "[{'\"" and self.i > start)):
                break
            self.i += 1
        raw = self.s[start:self.i].strip()
        if not top and raw == "":
            self.fail("expected a value")
        low = raw.lower()
        if low == "null":
            return None
        if low in ("true", "false"):
            return low == "true"
        if _INT.match(raw):
            return int(raw.replace("_", ""))
        if _FLOAT.match(raw):
            return float(raw.replace("_", ""))
        return raw


def parse_value(text: str) -> object:
    """One override value as Hydra reads it; ValueError with the reason when it is not one value."""
    return _Value(text).parse()


def _span(file: str, text: str, offset: int) -> Span:
    line = text.count("\n", 0, offset) + 1
    col = offset - (text.rfind("\n", 0, offset) + 1) + 1
    return Span(file, line, col)


def add_override(job: Job, word: str, span: Span | None) -> None:
    """One Hydra override `[+|++|~]key[=value]` into the job (a later one wins, as in Hydra)."""
    m = _OVERRIDE.match(word)
    if not m or (m[3] is None and m[1] != "~"):
        raise ImportFailed(f"{job.file}: {word!r} is not a Hydra override (key=value, +key=value, ~key)",
                           file=job.file, span=span)
    prefix, key, raw = m[1] or "", m[2], m[3]
    op = {"": "set", "+": "add", "++": "force", "~": "delete"}[prefix]
    try:
        value = parse_value(raw) if raw is not None else None
    except ValueError as exc:
        raise ImportFailed(f"{job.file}: {key}: {exc}", file=job.file, span=span, path=key) from None
    job.entries.pop(key, None)  # re-insert: the order of entries is the order they take effect
    job.entries[key] = Entry(value, span, op)


def read_overrides(path: str) -> Job:
    """A script (`python3 -m verl.trainer.main_ppo [--config-name N] OVERRIDES`) or an argument
    file (one override a line, as pcc writes verl/overrides.txt)."""
    text = read_text(path, "verl job")
    job = Job(path, text)
    logical = _logical_lines(text)
    is_script = any(ENTRY.search(w) for _, line in logical for w in line.split())
    assigned: dict[str, str] = {}
    for offset, line in logical:
        try:
            words = shlex.split(line, comments=True)
        except ValueError as exc:
            raise ImportFailed(f"{path}: cannot split into shell words ({exc})", file=path,
                               span=_span(path, text, offset)) from None
        if not is_script:
            if words:
                word = line.strip()
                add_override(job, word, _span(path, text, offset + line.index(word[:1])))
            continue
        _script_line(job, words, line, offset, assigned)
    if is_script and not job.entries and job.config is None:
        raise ImportFailed(f"{path}: no main_ppo command with Hydra overrides found", file=path)
    return job


def _logical_lines(text: str) -> list[tuple[int, str]]:
    """(offset, line) with backslash continuations joined (the offset is the first line's)."""
    out, start, buf = [], 0, []
    pos = 0
    for raw in text.splitlines(keepends=True):
        if not buf:
            start = pos
        body = raw.rstrip("\r\n")
        pos += len(raw)
        if body.endswith("\\"):  # blanks as long as the backslash and line end: offsets stay the file's
            buf.append(body[:-1] + " " * (len(raw) - len(body) + 1))
            continue
        buf.append(body)
        out.append((start, "".join(buf)))
        buf = []
    if buf:
        out.append((start, "".join(buf)))
    return out


def _script_line(job: Job, words: list[str], line: str, offset: int, assigned: dict[str, str]) -> None:
    """Shell assignments (`NAME=v`, `export NAME=v`) and the main_ppo command's overrides; a word
    `key=$NAME` takes what the script assigned to NAME (computed values stay as written)."""
    k = 0
    cursor = 0
    in_array = False  # `cmd=(python3 -m verl.trainer.main_ppo ...)`: the array's `)` ends the command
    has_entry = any(ENTRY.search(w) for w in words)

    def locate(word: str) -> Span:
        nonlocal cursor
        probe = word.split("=", 1)[0]
        at = line.find(probe, cursor)
        if at < 0:
            at = cursor
        cursor = at + len(probe)
        return _span(job.file, job.text, offset + at)

    while k < len(words):
        w = words[k]
        if ENTRY.search(w):
            break
        m = _ASSIGN.match(w)
        if m and m[2].startswith("("):
            in_array = True
        elif m:
            assigned[m[1]] = m[2]
            if (k > 0 and words[k - 1] == "export") or has_entry:  # exported, or the command's own prefix
                job.exports[m[1]] = (m[2], locate(w))
        k += 1
    else:
        return
    k += 1
    while k < len(words):
        w = words[k]
        if w in ("&&", "||", ";", "|", "&", "2>&1", ")") or w.startswith((">", "2>")):
            break
        last = in_array and w.endswith(")")
        w = w[:-1] if last else w
        if w in ("--config-name", "-cn") and k + 1 < len(words):
            job.config = words[k + 1]
            k += 2
            continue
        if w.startswith("--config-name="):
            job.config = w.split("=", 1)[1]
        elif w in ("--config-path", "-cp"):
            k += 2
            continue
        elif w.startswith("$") and "=" not in w:
            job.unread.append((w, locate(w)))
        elif not w.startswith("-"):
            w = _REF.sub(lambda r: assigned.get(r[1] or r[2], r[0]), w) if "$" in w else w
            add_override(job, w, locate(w))
        if last:
            break
        k += 1


def read_yaml(path: str) -> Job:
    """A Hydra config file: its `defaults` list (the trainer config it extends, model_engine) and
    every leaf key with its position; the `hydra` section is Hydra's own."""
    text = read_text(path, "verl job")
    doc, spans = load(text, path, "verl job config")
    job = Job(path, text)
    if doc is None:
        doc = {}
    if not isinstance(doc, dict):
        raise ImportFailed(f"{path}: a verl config is a mapping of keys", file=path, span=spans.get(""))
    for i, d in enumerate(doc.pop("defaults", None) or []):
        at = spans.get(f"defaults[{i}]")
        if isinstance(d, str) and table("verl").config(d):
            job.config = table("verl").config(d)
        elif isinstance(d, dict) and len(d) == 1:
            (k, v), = d.items()
            key = k.removeprefix("override ").strip()
            if key == "model_engine":
                job.entries["model_engine"] = Entry(v, at, "yaml")
            else:
                job.defaults.append((f"{k}: {v}", at))
        elif d != "_self_":
            job.defaults.append((str(d), at))
    doc.pop("hydra", None)

    def walk(node, path_: str):
        if isinstance(node, dict) and node:
            for k, v in node.items():
                walk(v, f"{path_}.{k}" if path_ else str(k))
        else:
            job.entries[path_] = Entry(node, spans.get(path_) or spans.get(path_ + "@key"), "yaml")

    walk(doc, "")
    job.entries.pop("", None)
    return job


def read_job(source: str) -> Job:
    """A YAML config (.yaml/.yml), a folder holding verl/overrides.txt (a pcc bundle, or a verl job
    pcc wrote; its launch.sh names the config), a script or an argument file."""
    p = Path(source)
    if p.is_dir():
        over = next((c for c in (p / "verl" / "overrides.txt", p / "overrides.txt") if c.is_file()), None)
        if over is None:
            raise ImportFailed(f"{source}: no verl/overrides.txt here (a pcc bundle of a 'framework verl' contract "
                               "has one); pass the YAML config, script or argument file instead", file=source)
        job = read_overrides(str(over))
        launch = over.parent / "launch.sh"
        if launch.is_file():
            job.config = read_overrides(str(launch)).config
        return job
    if p.suffix in (".yaml", ".yml"):
        return read_yaml(source)
    return read_overrides(source)
