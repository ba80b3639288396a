"""What the language server answers, as plain functions of a contract's text (no LSP types here):
diagnostics, hovers, completions, definitions and quick fixes, all from the same compile `pcc check`
runs, so an editor says exactly what the command line says."""

from __future__ import annotations

import math
import re
from collections import Counter
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from pcc.contract.scheme import PRESETS
from pcc.lang.diagnostics import Diagnostic, Span
from pcc.lower import compile_file
from pcc.plan import COMPONENTS, Compiled, Plan
from pcc.plan.patterns import ALIASES, VOCABULARY, PatternError, parse_pattern
from pcc.resources import data_dir

_WORD = re.compile(r"[A-Za-z0-9_.*\-]+")


@dataclass(frozen=True)
class Checked:
    """One compile of an editor's text: the result and the text it came from."""

    path: str
    text: str
    compiled: Compiled

    @property
    def plan(self) -> Plan | None:
        return self.compiled.plan


def check(path: str, text: str) -> Checked:
    """The contract as `pcc check` sees it, from the editor's (unsaved) text."""
    return Checked(path, text, compile_file(path, text=text))


def diagnostics(checked: Checked) -> list[Diagnostic]:
    """The diagnostics of this file (a parent's are reported at the `extends` line)."""
    out = []
    for d in checked.compiled.diagnostics:
        if d.span is not None and d.span.file != checked.path:
            ext = checked.compiled.loaded.smap.get("extends") if checked.compiled.loaded else None
            d = Diagnostic(d.code, d.severity, f"{Path(d.span.file).name}:{d.span.line}: {d.message}",
                           ext or Span(checked.path, 1, 1), d.hint, d.path, checked.path)
        out.append(d)
    return out


def _word_at(text: str, line: int, col: int) -> tuple[str, int, int] | None:
    """The word under (0-based) line/col and its columns."""
    lines = text.splitlines()
    if not 0 <= line < len(lines):
        return None
    for m in _WORD.finditer(lines[line]):
        if m.start() <= col <= m.end():
            return m.group(), m.start(), m.end()
    return None


def _rule_at(plan: Plan, path: str, line: int) -> int | None:
    """The rule (its id) written on 1-based `line` of file `path`."""
    for ref in plan.rules:
        span = plan.smap.get(ref.path)
        if span is not None and span.file == path and span.line <= line <= (span.end_line or span.line):
            return ref.id
    return None


def hover(checked: Checked, line: int, col: int) -> str | None:
    """Markdown for what is under the cursor: a rule (the operators it decides per component),
    a family or alias (what it covers in the model), a scheme (what it stores)."""
    plan = checked.plan
    if plan is None:
        return None
    rid = _rule_at(plan, checked.path, line + 1)
    word = _word_at(checked.text, line, col)
    if word and (word[0] in VOCABULARY or "." in word[0] or word[0] == "*") and rid is not None:
        pattern = _pattern_hover(plan, word[0])
        if pattern:
            return pattern
    if rid is not None:
        return _rule_hover(plan, rid)
    if word and word[0] in plan.schemes:
        return _scheme_hover(plan, word[0])
    if word and word[0] in VOCABULARY:
        return _pattern_hover(plan, word[0])
    return None


def _params(plan: Plan, ops) -> int:
    return sum(math.prod(plan.catalog.operators[i].shape) for i in ops)


def _rule_hover(plan: Plan, rid: int) -> str:
    ref = plan.rules[rid]
    rows = []
    for comp in COMPONENTS:
        owned = [i for i, r in enumerate(plan.owner[comp]) if r == rid]
        if not owned:
            continue
        d = plan.decisions[comp][rid]
        stored = sum(d.scheme.weight_bytes(plan.catalog.operators[i].shape) for i in owned)
        fams = Counter(plan.catalog.operators[i].family for i in owned)
        top = ", ".join(f"{f} {n}" for f, n in fams.most_common(4))
        rows.append(f"| {comp} | {d.scheme_name} | {len(owned):,} | {_params(plan, owned):,} | {stored:,} | {top} |")
    if not rows:
        return f"**{ref.path}** decides no operator of {plan.catalog.name}: a later rule owns all it matches"
    return "\n".join([f"**{ref.path}** on {plan.catalog.name}", "",
                      "| component | scheme | operators | parameters | bytes | families |",
                      "|---|---|---:|---:|---:|---|", *rows])


def _pattern_hover(plan: Plan, text: str) -> str | None:
    try:
        pat = parse_pattern(text)
    except PatternError:
        return None
    if not pat.families:
        return None
    ops = [op for op in plan.catalog.operators if op.family in pat.families]
    alias = f" = {', '.join(ALIASES[text])}" if text in ALIASES else ""
    names = ", ".join(f"`{op.tensor}`" for op in ops[:3]) + (" ..." if len(ops) > 3 else "")
    params = sum(math.prod(op.shape) for op in ops)
    return f"**{text}**{alias}: {len(ops):,} operators of {plan.catalog.name} ({params:,} parameters)\n\n{names}"


def _scheme_hover(plan: Plan, name: str) -> str:
    s = plan.schemes[name]
    preset = " (a preset)" if name in PRESETS else ""
    return f"**{name}**{preset}: {s.format}, {s.bits} bits per code\n\n```\n{s.text()}\n```"


@lru_cache(maxsize=1)
def keywords() -> tuple[str, ...]:
    """The statement keywords, read from the grammar itself (one source)."""
    text = (data_dir("grammar") / "prec.lark").read_text(encoding="utf-8")
    words = set(re.findall(r'"([a-z_]+)"', text))
    for m in re.finditer(r"^[A-Z_]+\.2: /\(([a-z_|]+)\)", text, re.M):
        words.update(m[1].split("|"))
    return tuple(sorted(words))


def completions(checked: Checked) -> list[tuple[str, str]]:
    """(label, kind) candidates: keywords, scheme presets and the contract's schemes, family names
    and aliases, and the tensor-name patterns of the contract's model (one per layer-free name)."""
    out = [(k, "keyword") for k in keywords()]
    out += [(p, "scheme") for p in sorted(PRESETS)]
    if checked.plan is not None:
        out += [(s, "scheme") for s in sorted(checked.plan.schemes) if s not in PRESETS]
        fams = sorted({op.family for op in checked.plan.catalog.operators})
        out += [(f, "family") for f in fams] + [(a, "alias") for a in sorted(ALIASES)]
    else:
        out += [(f, "family") for f in VOCABULARY]
    return out


def definition(checked: Checked, line: int, col: int) -> Span | None:
    """Where what is under the cursor is defined: the file `extends` names, or `scheme NAME =`."""
    lines = checked.text.splitlines()
    here = lines[line] if 0 <= line < len(lines) else ""
    m = re.search(r'extends\s+"([^"]+)"', here)
    if m and m.start(1) - 1 <= col <= m.end(1) + 1:
        target = (Path(checked.path).parent / m[1]).resolve()
        return Span(str(target), 1, 1) if target.is_file() else None
    word = _word_at(checked.text, line, col)
    loaded = checked.compiled.loaded
    if word and loaded is not None:
        span = loaded.smap.get(f"schemes.{word[0]}")
        if span is not None:
            return span
    return None


def quick_fixes(diag: Diagnostic, text: str) -> list[tuple[str, Span]]:
    """(replacement, where) for a diagnostic whose hint says "did you mean 'X'": the word at its span
    becomes X (each suggestion one fix)."""
    if not diag.hint or diag.span is None:
        return []
    lines = text.splitlines()
    if not 0 < diag.span.line <= len(lines):
        return []
    word = _word_at(text, diag.span.line - 1, diag.span.col - 1)
    if word is None:
        return []
    at = Span(diag.span.file, diag.span.line, word[1] + 1, diag.span.line, word[2] + 1)
    return [(s, at) for s in re.findall(r"'([^']+)'", diag.hint.split("did you mean", 1)[-1])]


__all__ = ["Checked", "check", "completions", "definition", "diagnostics", "hover", "keywords",
           "quick_fixes"]
