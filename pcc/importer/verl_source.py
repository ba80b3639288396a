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

from pcc.importer import ImportFailed, bundle_file
from pcc.importer.bounds import MAX_DEPTH, OverBound
from pcc.importer.shell import SEP, ShellError, expand, span_at
from pcc.importer.yamlsource import load, read_text
from pcc.lang.diagnostics import Span
from pcc.lower.engine_table import table

ENTRY = re.compile(r"(^|[/.])main_ppo(\.py)?$")
_OVERRIDE = re.compile(r"^(~|\+\+|\+)?([A-Za-z_][\w\-]*(?:[.@/][A-Za-z_0-9][\w\-]*)*)(?:=(.*))?$", re.S)
_INT = re.compile(r"^[+-]?(?:0|[1-9](?:_?\d)*)$")
_FLOAT = re.compile(r"^[+-]?(?:(?:\d(?:_?\d)*)?\.\d(?:_?\d)*(?:[eE][+-]?\d(?:_?\d)*)?|\d(?:_?\d)*\.(?:[eE][+-]?\d(?:_?\d)*)?"
                    r"|\d(?:_?\d)*[eE][+-]?\d(?:_?\d)*|inf|nan)$", re.I)
_PYTHON = re.compile(r"(^|[\s/(])(python[\d.]*|torchrun)\s+(-\S+\s+)*(-m\s+)?\S")
# verl entrypoints that run no RL job: its SFT trainers, generation server and evaluator (verl/trainer/).
NOT_RL = re.compile(r"(^|[/.])(sft_trainer|sft_trainer_ray|fsdp_sft_trainer|main_generation_server|main_generation"
                    r"|main_eval)(\.py)?$")
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
    unread: list[tuple[str, Span | None]] = field(default_factory=list)  # `$@`, `$(..)`: computed at run time
    entrypoint: str | None = None  # the module or script the launch runs
    config_path: str | None = None  # --config-path
    own: set[str] = field(default_factory=set)  # keys the entrypoint's own config sets (over verl's trainer config)


class _Value:
    """Hydra's override value grammar, for one value string."""

    def __init__(self, text: str):
        self.s, self.i, self.depth = text, 0, 0

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
        self.depth += 1
        try:
            return self._element(top)
        finally:
            self.depth -= 1

    def _element(self, top: bool):
        if self.depth > MAX_DEPTH:
            raise OverBound(f"nests deeper than the {MAX_DEPTH} levels pcc reads, at character {self.i + 1}")
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
    except (ValueError, OverBound) as exc:
        raise ImportFailed(f"{job.file}: {key}: {exc}", code=getattr(exc, "code", None), file=job.file, span=span,
                           path=key) from None
    job.entries.pop(key, None)  # re-insert: the order of entries is the order they take effect
    job.entries[key] = Entry(value, span, op)


def read_overrides(path: str) -> Job:
    """A script (`python3 -m verl.trainer.main_ppo [--config-name N] OVERRIDES`, or another entrypoint
    whose config derives from verl's trainer configs) or an argument file (one override a line, as pcc
    writes verl/overrides.txt)."""
    text = read_text(path, "verl job")
    job = Job(path, text)
    first = next((line.strip() for line in text.splitlines() if line.strip()), "")
    if first.startswith("#!") or _PYTHON.search(text) or any(ENTRY.search(w) for w in text.split()):
        _script(job)
        return job
    for offset, line in _logical_lines(text):
        try:
            words = shlex.split(line, comments=True)
        except ValueError as exc:
            raise ImportFailed(f"{path}: cannot split into shell words ({exc})", file=path,
                               span=span_at(path, text, offset)) from None
        if words:
            word = line.strip()
            add_override(job, word, span_at(path, text, offset + line.index(word[:1])))
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


def _entry(words: list[str]) -> tuple[int, str] | None:
    """(index, name) of the Python entrypoint a command runs: `python3 -m MODULE` or `python3 SCRIPT.py`
    (interpreter options skipped), or a word naming main_ppo."""
    for i, w in enumerate(words):
        if ENTRY.search(w):
            return i, w
        if re.fullmatch(r"python[\d.]*|torchrun", Path(w).name):
            j = i + 1
            while j < len(words) and words[j].startswith("-") and words[j] != "-m":
                # torchrun's options take values (`--nnodes 1`, or `--nnodes=1`); python's few do not
                j += 1 + (Path(w).name == "torchrun" and "=" not in words[j] and j + 1 < len(words)
                          and not words[j + 1].startswith("-") and words[j] not in ("--standalone", "--no-python"))
            if j + 1 < len(words) and words[j] == "-m":
                return j + 1, words[j + 1]
            if j < len(words) and words[j].endswith(".py"):
                return j, words[j]
    return None


def _script(job: Job) -> None:
    """The script as bash expands it (pcc.importer.shell); the exports and the entrypoint command's
    overrides. What bash would compute at run time is kept as written and listed in job.unread."""
    try:
        out = expand(job.text)
    except ShellError as exc:
        raise ImportFailed(f"{job.file}: cannot split into shell words ({exc})", file=job.file) from None
    statements: list[list[tuple[str, int]]] = [[]]
    for word, at in out.words:
        if word == SEP:
            statements.append([])
        else:
            statements[-1].append((word, at))
    entries, used = [], set()
    for stmt in statements:
        words = [w for w, _ in stmt]
        found = _entry(words)
        head = words[:found[0]] if found else words[:2]
        for i, w in enumerate(head):
            m = _ASSIGN.match(w)
            if m and (found or (i == 1 and words[0] == "export")):
                job.exports[m[1]] = (m[2], span_at(job.file, job.text, stmt[i][1]))
        if found is None:
            continue
        entries.append(found[1])
        k = found[0] + 1
        while k < len(stmt):
            w, at = stmt[k]
            if w in ("&&", "||", "|", "&", ";;") or w.startswith((">", "<", "2>", "1>")):
                break
            used.add(at)
            span = span_at(job.file, job.text, at)
            if w in ("--config-name", "-cn", "--config-path", "-cp") and k + 1 < len(stmt):
                if w in ("--config-name", "-cn"):
                    job.config = stmt[k + 1][0]
                else:
                    job.config_path = stmt[k + 1][0]
                k += 2
                continue
            if w.startswith(("--config-name=", "--config-path=")):
                setattr(job, "config" if w.startswith("--config-name=") else "config_path", w.split("=", 1)[1])
            elif not w.startswith("-") and not (w.startswith("$") and "=" not in w):
                add_override(job, w, span)
            k += 1
    job.unread = [(raw, span_at(job.file, job.text, at)) for raw, at in out.unexpanded if at in used]
    if not entries:
        raise ImportFailed(f"{job.file}: runs no Python entrypoint (python3 -m verl.trainer.main_ppo ...): not a verl "
                           "RL launch", code="PCC805", file=job.file)
    job.entrypoint = entries[-1]
    if NOT_RL.search(job.entrypoint):
        raise ImportFailed(f"{job.file}: runs {job.entrypoint}, which is no RL trainer (verl's SFT trainer, generation "
                           "server or evaluator): a contract states a rollout, a trainer and the sync between them",
                           code="PCC805", path="entrypoint", file=job.file)
    if not ENTRY.search(job.entrypoint):
        _derived(job)
    elif not job.entries and job.config is None:
        raise ImportFailed(f"{job.file}: no main_ppo command with Hydra overrides found", file=job.file)


def _derived(job: Job) -> None:
    """An entrypoint other than main_ppo (a recipe's, the fully async trainer): read when the config it
    composes (`--config-name`, else its `@hydra.main` config_name) is one of verl's trainer configs, or a
    YAML (under `--config-path` beside the script, or the entrypoint's own config folder, in the
    installed verl or beside the script) whose defaults list extends one: its keys first, the overrides
    win. Refused otherwise: what the entrypoint's own config composes is unknown."""
    from pcc.lower.verify_verl import engine_dir

    here = Path(job.file).parent
    mod = job.entrypoint.removesuffix(".py").replace(".", "/") if not job.entrypoint.endswith(".py") else None
    sources = [r / f"{mod}.py" for r in (here, engine_dir())] if mod else [here / job.entrypoint]
    source = next((p for p in sources if p.is_file()), None)
    main = re.search(r"@hydra\.main\(([^)]*)\)", read_text(str(source), "verl entrypoint")) if source else None
    declared = dict(re.findall(r"(config_path|config_name)\s*=\s*[\"']([^\"']*)[\"']", main[1])) if main else {}
    name = job.config or declared.get("config_name")
    if table("verl").config(name):
        job.config = table("verl").config(name)
        return
    file = name and (name if name.endswith((".yaml", ".yml")) else name + ".yaml")
    folders = ([here / job.config_path] if job.config_path else []) + (
        [source.parent / declared.get("config_path", "config")] if source else []) + [here / "config"]
    path = next((d / file for d in folders if file and (d / file).is_file()), None)
    base = read_yaml(str(path)) if path else None
    if base is None or base.config is None:
        raise ImportFailed(
            f"{job.file}: entrypoint {job.entrypoint} composes {'config ' + name if name else 'a config pcc cannot find'}"
            f"{', which pcc cannot find' if name and path is None else ''}"
            f"{', which does not extend a verl trainer config' if path else ''}: pcc reads jobs whose config is or "
            "extends verl's trainer configs (ppo_trainer, ppo_megatron_trainer)",
            path="entrypoint", file=job.file,
            hint="import the trainer config the entrypoint extends, or the job's overrides for main_ppo")
    job.config = base.config
    job.own = set(base.entries)
    job.defaults = base.defaults + job.defaults
    job.entries = {**base.entries, **job.entries}


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
        folder = next((f for f in ("verl/", "") if bundle_file(p, f + "overrides.txt")), None)
        if folder is None:
            raise ImportFailed(f"{source}: no verl/overrides.txt here (a pcc bundle of a 'framework verl' contract "
                               "has one); pass the YAML config, script or argument file instead", file=source)
        job = read_overrides(str(p / folder / "overrides.txt"))
        launch = bundle_file(p, folder + "launch.sh")
        if launch is not None:
            job.config = read_overrides(str(launch)).config
        return job
    if p.suffix in (".yaml", ".yml"):
        return read_yaml(source)
    return read_overrides(source)
