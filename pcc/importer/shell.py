"""A launch script's words as bash expands them, without running anything.

Miles' scripts/run-*.sh and verl's examples keep flags in bash arrays (`FP8=(--fp8-format e4m3)`
then `"${FP8[@]}"`), build paths in words (`"${BASE_DIR}/ckpt"`), compute sizes (`$((TP * 2))`)
and echo flags from small functions. The importers read flags from the expanded words, so a flag
is read where bash would pass it. Expanded: scalar and array assignments the script makes,
`$V`/`${V}`/`${V:-default}`/`${A[@]}`/`${A[*]}`/`${#A[@]}` in and out of double quotes, `$((..))`
over integers and assigned names (a small evaluator: + - * / % and parentheses), and `$(f)` for a
function whose body only echoes. Anything else (other command substitutions, `$@`, a variable the
script does not assign) stays as written and is reported (`unexpanded`). Bounded: the script's
size, the words produced and the nesting of substitutions are limited.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from pcc.lang.diagnostics import PccError, Span

MAX_TEXT = 1 << 20  # characters of script read
MAX_WORDS = 100_000  # words produced, all expansions together
MAX_DEPTH = 8  # nested `$(f)` / `$((..))`

_NAME = re.compile(r"[A-Za-z_]\w*")
_ASSIGN = re.compile(r"^([A-Za-z_]\w*)(\+?)=")
_OPS = ("&&", "||", ";;", "|", "&", ";")


class ShellError(PccError, ValueError):
    """The text is not bash this reader can split (an unterminated quote or substitution)."""


@dataclass
class Word:
    """A word as written: its parts (kind, text, quoted) and where it starts in the script."""

    parts: list[tuple[str, str, bool]]
    offset: int
    raw: str = ""

    @property
    def literal(self) -> str | None:
        """The word's text when it has no expansion in it (operators, `(`, names)."""
        return "".join(t for _, t, _ in self.parts) if all(k == "lit" for k, _, _ in self.parts) else None


SEP = "\n"  # a statement separator in the expanded stream (newline or ';')


@dataclass
class Expanded:
    """The script's commands as expanded words: (text, offset of the word it came from); a
    statement ends at a SEP word. `unexpanded` is (what stayed as written, offset)."""

    words: list[tuple[str, int]] = field(default_factory=list)
    unexpanded: list[tuple[str, int]] = field(default_factory=list)


def _lex(text: str) -> list[Word]:
    """Words, operators and separators; an array `NAME=(` ... `)` keeps its newlines inside."""
    if len(text) > MAX_TEXT:
        raise ShellError(f"longer than {MAX_TEXT} characters")
    out: list[Word] = []
    i, n, depth = 0, len(text), 0
    while i < n:
        c = text[i]
        if c in " \t\r":
            i += 1
        elif text.startswith("\\\n", i):
            i += 2
        elif c == "#":
            while i < n and text[i] != "\n":
                i += 1
        elif c == "\n" or c == ";" and not text.startswith(";;", i):
            if not depth:
                out.append(Word([("lit", SEP, False)], i, c))
            i += 1
        elif c in "()":
            depth = max(depth - 1, 0) if c == ")" and depth else depth
            out.append(Word([("lit", c, False)], i, c))
            i += 1
        elif any(text.startswith(op, i) for op in _OPS):
            op = next(op for op in _OPS if text.startswith(op, i))
            out.append(Word([("lit", op, False)], i, op))
            i += len(op)
        else:
            start = i
            parts, i = _word(text, i)
            w = Word(parts, start, text[start:i])
            out.append(w)
            if i < n and text[i] == "(" and len(parts) == 1 and parts[0][0] == "lit" and _ASSIGN.match(parts[0][1]) \
                    and parts[0][1].endswith("="):
                out.append(Word([("lit", "(", False)], i, "("))
                depth += 1
                i += 1
    return out


def _word(text: str, i: int) -> tuple[list[tuple[str, str, bool]], int]:
    parts: list[tuple[str, str, bool]] = []
    quoted = False
    n = len(text)

    def lit(s: str, q: bool):
        if parts and parts[-1][0] == "lit" and parts[-1][2] == q:
            parts[-1] = ("lit", parts[-1][1] + s, q)
        else:
            parts.append(("lit", s, q))

    while i < n:
        c = text[i]
        if not quoted and c in " \t\r\n;&|()<>":
            fd = parts[0][1] if len(parts) == 1 and parts[0][0] == "lit" and not parts[0][2] else ""
            if c in "<>" and (not parts or fd.isdigit()):  # a redirection (`>`, `2>&1`): one word
                j = i
                while j < n and text[j] not in " \t\r\n;":
                    j += 1
                return [("lit", fd + text[i:j], False)], j
            break
        if c == "\\" and i + 1 < n:
            nxt = text[i + 1]
            if nxt == "\n":
                i += 2
            elif not quoted or nxt in '"\\$`':
                lit(nxt, quoted)
                i += 2
            else:
                lit(c, quoted)
                i += 1
        elif c == "'" and not quoted:
            j = text.find("'", i + 1)
            if j < 0:
                raise ShellError("unterminated single quote")
            lit(text[i + 1:j], True)
            i = j + 1
        elif c == '"':
            quoted = not quoted
            if quoted and text.find('"', i + 1) < 0:
                raise ShellError("unterminated double quote")
            lit("", True)
            i += 1
        elif c == "$" and i + 1 < n:
            kind, j = _dollar(text, i)
            if kind == "lit":
                lit("$", quoted)
            else:
                parts.append((kind, text[i:j], quoted))
            i = j
        elif c == "`":
            j = text.find("`", i + 1)
            if j < 0:
                raise ShellError("unterminated backquote")
            parts.append(("cmd", text[i:j + 1], quoted))
            i = j + 1
        else:
            lit(c, quoted)
            i += 1
    if quoted:
        raise ShellError("unterminated double quote")
    return parts, i


def _close(text: str, i: int, open_: str, close: str, depth: int = 1) -> int:
    """The index just past the bracket that closes the `depth` open ones before i (quotes skipped)."""
    n = len(text)
    while i < n:
        c = text[i]
        if c in "'\"":
            j = text.find(c, i + 1)
            i = n if j < 0 else j + 1
            continue
        if c == "\\":
            i += 2
            continue
        if text.startswith(open_, i):
            depth += 1
            i += len(open_)
            continue
        if text.startswith(close, i):
            depth -= 1
            i += len(close)
            if not depth:
                return i
            continue
        i += 1
    raise ShellError(f"unterminated {open_}")


def _dollar(text: str, i: int) -> tuple[str, int]:
    """The kind of the expansion at text[i] ('$') and where it ends."""
    if text.startswith("$((", i):
        return "arith", _close(text, i + 3, "(", ")", 2)
    if text.startswith("$(", i):
        return "cmd", _close(text, i + 2, "(", ")")
    if text.startswith("${", i):
        return "var", _close(text, i + 2, "{", "}")
    m = _NAME.match(text, i + 1)
    if m:
        return "var", m.end()
    if text[i + 1] in "@*#?$!0123456789-":
        return "var", i + 2
    return "lit", i + 1


class Arith:
    """Bash's integer arithmetic, the part launch scripts use: + - * / % (truncating, as bash),
    unary +/-, parentheses, integer literals and names (a name's value, itself arithmetic)."""

    _TOKEN = re.compile(r"\s*(?:(\d+)|([A-Za-z_]\w*)|(\$\{?[A-Za-z_]\w*\}?)|(.))")

    def __init__(self, expr: str, names: dict[str, str], depth: int = 0):
        if len(expr) > 200 or depth > MAX_DEPTH:
            raise ValueError("too long")
        self.toks = self._TOKEN.findall(expr.strip())
        self.names, self.depth, self.i = names, depth, 0

    def value(self) -> int:
        v = self.sum()
        if self.i != len(self.toks):
            raise ValueError("unexpected text")
        return v

    def peek(self) -> str:
        return self.toks[self.i][3] if self.i < len(self.toks) else ""

    def sum(self) -> int:
        v = self.product()
        while self.peek() in ("+", "-"):
            op = self.peek()
            self.i += 1
            v = v + self.product() if op == "+" else v - self.product()
        return self._bound(v)

    def product(self) -> int:
        v = self.unary()
        while self.peek() in ("*", "/", "%"):
            op = self.peek()
            self.i += 1
            r = self.unary()
            if op == "*":
                v = self._bound(v * r)
            elif r == 0:
                raise ValueError("division by zero")
            else:
                q = abs(v) // abs(r) * (1 if (v >= 0) == (r >= 0) else -1)
                v = q if op == "/" else v - q * r
        return v

    def unary(self) -> int:
        if self.peek() in ("+", "-"):
            op = self.peek()
            self.i += 1
            return self.unary() if op == "+" else -self.unary()
        if self.peek() == "(":
            self.i += 1
            v = self.sum()
            if self.peek() != ")":
                raise ValueError("expected ')'")
            self.i += 1
            return v
        if self.i >= len(self.toks):
            raise ValueError("expected a value")
        num, name, ref, _ = self.toks[self.i]
        self.i += 1
        if num:
            return self._bound(int(num))
        name = name or ref.strip("${}")
        if not name or name not in self.names:
            raise ValueError(f"unknown {name or 'operator'}")
        text = self.names[name].strip()
        return Arith(text, self.names, self.depth + 1).value() if text else 0

    @staticmethod
    def _bound(v: int) -> int:
        if abs(v) >= 1 << 63:
            raise ValueError("out of range")
        return v


class Shell:
    """Expands a script statement by statement, keeping what it assigns."""

    def __init__(self):
        self.vars: dict[str, str] = {}
        self.arrays: dict[str, list[tuple[str, int]]] = {}
        self.funcs: dict[str, list[Word] | None] = {}  # None: a body that does more than echo
        self.out = Expanded()

    def run(self, text: str) -> Expanded:
        words = _lex(text)
        k = 0
        while k < len(words):
            k = self._statement(words, k)
        return self.out

    def _emit(self, text: str, offset: int) -> None:
        if len(self.out.words) >= MAX_WORDS:
            raise ShellError(f"expands to more than {MAX_WORDS} words")
        self.out.words.append((text, offset))

    def _statement(self, words: list[Word], k: int) -> int:
        first = words[k]
        lit = first.literal
        nxt = [w.literal for w in words[k + 1:k + 4]]
        if lit == SEP:
            self._emit(SEP, first.offset)
            return k + 1
        if lit == "function" and k + 1 < len(words) and words[k + 1].literal:
            return self._function(words[k + 1].literal, words, k + 2 + (nxt[1:3] == ["(", ")"]) * 2)
        if lit and _NAME.fullmatch(lit) and nxt[:2] == ["(", ")"]:
            return self._function(lit, words, k + 3)
        j, prefix = k, True  # prefix: only assignments (and export ...) so far, so a NAME=v word assigns
        while j < len(words) and words[j].literal != SEP:
            w = words[j]
            m = _ASSIGN.match(w.parts[0][1]) if w.parts and w.parts[0][0] == "lit" and not w.parts[0][2] else None
            if m and prefix and j + 1 < len(words) and words[j + 1].literal == "(" and w.raw.endswith("="):
                j = self._array(m[1], bool(m[2]), words, j + 2)
                continue
            texts = self._expand(w, 0, assignment=bool(m and prefix))
            if m and prefix and texts:
                name, value = m[1], texts[0][0][len(m[0]):]
                self.vars[name] = self.vars.get(name, "") + value if m[2] else value
                self.arrays.pop(name, None)
            for t, at in texts:
                self._emit(t, w.offset if at < 0 else at)
            prefix = prefix and bool(m or w.literal in ("export", "local", "declare", "readonly"))
            j += 1
        return j

    def _array(self, name: str, append: bool, words: list[Word], j: int) -> int:
        items: list[tuple[str, int]] = []
        while j < len(words) and words[j].literal != ")":
            if words[j].literal != SEP:
                items += [(t, words[j].offset if at < 0 else at) for t, at in self._expand(words[j], 0)]
            j += 1
        items = (self.arrays.get(name, []) if append else []) + items
        if len(items) > MAX_WORDS:
            raise ShellError(f"an array of more than {MAX_WORDS} words")
        self.arrays[name] = items
        self.vars.pop(name, None)
        return j + 1

    def _function(self, name: str, words: list[Word], j: int) -> int:
        """`name() { echo ...; }`: the echoed words, expanded where it is called."""
        while j < len(words) and words[j].literal == SEP:
            j += 1
        if j >= len(words) or words[j].literal != "{":
            self.funcs[name] = None
            return j
        body, depth, j = [], 1, j + 1
        while j < len(words) and depth:
            depth += {"{": 1, "}": -1}.get(words[j].literal or "", 0)
            if depth:
                body.append(words[j])
            j += 1
        echoes: list[Word] | None = []
        start = True
        for w in body:
            if w.literal == SEP:
                start = True
                continue
            if start and w.literal != "echo":
                echoes = None
                break
            if not start:
                echoes.append(w)
            start = False
        self.funcs[name] = echoes
        return j

    def _expand(self, w: Word, depth: int, assignment: bool = False) -> list[tuple[str, int]]:
        """The words bash makes of w, each with the offset it was written at (an array element's or
        an echoed word's own): unquoted expansions split on blanks (not in an assignment),
        `"${A[@]}"` one word per element."""
        if depth > MAX_DEPTH:
            raise ShellError("substitutions nested too deep")
        fields: list[list] = [["", w.offset]]
        started = False  # a quoted part makes a word even when empty
        for kind, body, quoted in w.parts:
            if kind == "lit":
                fields[-1][0] += body
                started = started or quoted or bool(body)
                continue
            value = self._part(kind, body, depth)
            if value is None:  # stays as written
                self.out.unexpanded.append((body, w.offset))
                fields[-1][0] += body
                started = True
                continue
            items, each = value
            if quoted and not each:
                items = [(" ".join(t for t, _ in items), w.offset)]
            elif not quoted and not assignment:
                items = [(piece, at) for t, at in items for piece in t.split()]
            if not items:
                started = started or (quoted and not each)
                continue
            if fields[-1][0] == "":
                fields[-1][1] = items[0][1]
            fields[-1][0] += items[0][0]
            fields += [[t, at] for t, at in items[1:]]
            started = True
        if sum(len(t) for t, _ in fields) > MAX_TEXT:
            raise ShellError(f"a word expands to more than {MAX_TEXT} characters")
        return [(t, at) for t, at in fields] if started or fields[0][0] else []

    def _part(self, kind: str, raw: str, depth: int) -> tuple[list[tuple[str, int]], bool] | None:
        """What one expansion (its text as written) gives: its words (with offsets; -1 where the
        word it is in gives the offset) and whether each is a word of its own in quotes (`"${A[@]}"`);
        None: it stays as written."""
        if kind == "arith":
            try:
                return [(str(Arith(raw[3:-2], self.vars, depth).value()), -1)], False
            except ValueError:
                return None
        if kind == "cmd":
            name = (raw[1:-1] if raw.startswith("`") else raw[2:-1]).strip()
            if self.funcs.get(name) is None:
                return None
            return [x for w in self.funcs[name] for x in self._expand(w, depth + 1)], False
        body = raw[2:-1] if raw.startswith("${") else raw[1:]
        m = re.fullmatch(r"(#?)([A-Za-z_]\w*)(?:\[([@*])\])?(?:(:?-)(.*))?", body, re.S)
        if m is None:
            return None
        count, name, sub, dflt, alt = m.groups()
        if name in self.arrays:
            items = self.arrays[name]
            if count:
                return [(str(len(items)), -1)], False
            return (items, sub == "@") if sub else (items[:1] or [("", -1)], False)
        if name in self.vars:
            value = self.vars[name]
            if count:
                value = str(len(value))
            elif dflt == ":-" and value == "":
                value = alt
            return [(value, -1)], False
        return ([(alt, -1)], False) if dflt else None


def expand(text: str) -> Expanded:
    """The script's words as bash would pass them (see the module's docstring); ShellError when
    the text cannot be split."""
    return Shell().run(text)


def span_at(file: str, text: str, offset: int) -> Span:
    """The line and column of a character offset of the script."""
    line = text.count("\n", 0, offset) + 1
    return Span(file, line, offset - (text.rfind("\n", 0, offset) + 1) + 1)
