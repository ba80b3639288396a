"""A launch script's words as bash expands them, without running anything.

Miles' scripts/run-*.sh and verl's examples keep flags in bash arrays (`FP8=(--fp8-format e4m3)`
then `"${FP8[@]}"`), build paths in words (`"${BASE_DIR}/ckpt"`), compute sizes (`$((TP * 2))`)
and echo flags from small functions. The importers read flags from the expanded words, so a flag
is read where bash would pass it. Expanded: scalar and array assignments the script makes,
`$V`/`${V}`/`${V:-default}`/`${A[@]}`/`${A[*]}`/`${#A[@]}` in and out of double quotes, `$((..))`
over integers and assigned names (a small evaluator: + - * / % and parentheses), and `$(f)` for a
function whose body only echoes; a function's body where it is called (`run_mode "$MODE"`: the
statements run with the call's arguments as `$1`..); of an `if`, the branch a `[ ]`/`test` of known
values picks (every branch, reported, when the test needs the running script); the word of `${V:-word}`, `${V:=word}`, `${V:+word}` is itself
expanded. The script is read as run without arguments: `"$@"` gives no word, `$1` is unset.
Anything else (other command substitutions, a variable the script does not assign) stays as
written and is reported (`unexpanded`). Bounded: the script's size, the words produced and the
nesting of substitutions are limited.
"""

from __future__ import annotations

import re
from bisect import bisect_right
from dataclasses import dataclass, field
from functools import lru_cache

from pcc.lang.diagnostics import PccError, Span

MAX_TEXT = 1 << 20  # characters of script read
MAX_WORDS = 100_000  # words produced, all expansions together
MAX_DEPTH = 8  # nested `$(f)` / `$((..))`
MAX_CALLS = 1000  # calls of the script's functions

_NAME = re.compile(r"[A-Za-z_]\w*")
_ASSIGN = re.compile(r"^([A-Za-z_]\w*)(\+?)=")
_OPS = ("&&", "||", ";;", "|", "&", ";")
_HEREDOC = re.compile(r"<<(-?)[ \t]*(['\"]?)([A-Za-z_]\w*)\2")


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
    heredocs: list[tuple[str, bool]] = []  # (delimiter, `<<-`) of here-documents whose body comes next
    while i < n:
        c = text[i]
        if c == "\n" and heredocs:  # the bodies are text for the command, not the script's words
            i = _skip_heredocs(text, i + 1, heredocs)
            heredocs = []
            out.append(Word([("lit", SEP, False)], i - 1, "\n"))
        elif (m := _HEREDOC.match(text, i)) is not None:
            heredocs.append((m[3], bool(m[1])))
            out.append(Word([("lit", m[0], False)], i, m[0]))
            i = m.end()
        elif c in " \t\r":
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


def _skip_heredocs(text: str, i: int, heredocs: list[tuple[str, bool]]) -> int:
    """Where the script goes on after the here-document bodies that start at i."""
    for delim, tabs in heredocs:
        while i < len(text):
            end = text.find("\n", i)
            end = len(text) if end < 0 else end
            line = text[i:end]
            i = end + 1
            if (line.lstrip("\t") if tabs else line) == delim:
                break
        else:
            raise ShellError(f"a here-document without its closing {delim}")
    return min(i, len(text))


def _word(text: str, i: int, whole: bool = False) -> tuple[list[tuple[str, str, bool]], int]:
    """The parts of the word at text[i]; `whole`: all of text is one word (the word of `${V:-word}`,
    where blanks and operators are text)."""
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
        if not quoted and not whole and c in " \t\r\n;&|()<>":
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
        self.bodies: dict[str, list[Word]] = {}  # every function's body, run where it is called
        self.args: list[tuple[str, int]] = []  # `$1`..: the arguments of the function being run
        self.calls = 0
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
        if lit in self.bodies:
            return self._call(lit, words, k)
        if lit == "if":
            return self._if(words, k)
        j, prefix = k, True  # prefix: only assignments (and export ...) so far, so a NAME=v word assigns
        while j < len(words) and words[j].literal != SEP:
            w = words[j]
            m = _ASSIGN.match(w.parts[0][1]) if w.parts and w.parts[0][0] == "lit" and not w.parts[0][2] else None
            if m and prefix and j + 1 < len(words) and words[j + 1].literal == "(" and w.raw.endswith("="):
                j = self._array(m[1], bool(m[2]), words, j + 2)
                continue
            seen = len(self.out.unexpanded)
            texts = self._expand(w, 0, assignment=bool(m and prefix))
            if m and prefix and texts:
                name, value = m[1], texts[0][0][len(m[0]):]
                self.vars[name] = self.vars.get(name, "") + value if m[2] else value
                self.arrays.pop(name, None)
                if len(self.out.unexpanded) > seen:  # computed when the script runs: `$name` stays as written
                    del self.vars[name]
            for t, at in texts:
                self._emit(t, w.offset if at < 0 else at)
            prefix = prefix and bool(m or w.literal in ("export", "local", "declare", "readonly"))
            j += 1
        return j

    def _call(self, name: str, words: list[Word], k: int) -> int:
        """A call of a function the script defines: its body's statements, `$1`.. the call's words."""
        end = k + 1
        while end < len(words) and words[end].literal != SEP:
            end += 1
        self.calls += 1
        if self.calls > MAX_CALLS:
            raise ShellError(f"more than {MAX_CALLS} function calls")
        args = [x for w in words[k + 1:end] for x in self._expand(w, 0)]
        saved, self.args = self.args, args
        body, m = self.bodies.pop(name), 0  # a function calling itself: its name is a command there
        try:
            while m < len(body):
                m = self._statement(body, m)
        finally:
            self.bodies[name], self.args = body, saved
        return end

    def _if(self, words: list[Word], k: int) -> int:
        """`if C; then B; [elif C; then B;]... [else B;] fi`: the branch bash takes when every test
        before it is decided here; else every branch from the first undecided test on, and the test
        is reported (`unexpanded`)."""
        clauses, depth, i, start, cut = [], 0, k + 1, True, k + 1
        cond: list[Word] | None = None
        while i < len(words):
            lit = words[i].literal
            if start and lit == "if":
                depth += 1
            elif start and lit == "fi" and depth:
                depth -= 1
            elif start and not depth and lit in ("then", "elif", "else", "fi"):
                part = [w for w in words[cut:i] if w.literal != SEP or lit != "then"]
                if lit == "then":
                    cond = part
                else:
                    clauses.append((cond, part))
                    cond = None
                cut = i + 1
                if lit == "fi":
                    break
            start = lit in (SEP, "then", "else", "do", "&&", "||", "|", "elif")
            i += 1
        else:
            raise ShellError("an `if` without its `fi`")
        for cond, body in clauses:
            decided = True if cond is None else self._test(cond)
            if decided is False:
                continue
            if decided is None:
                self.out.unexpanded.append(("if " + " ".join(w.raw for w in cond), cond[0].offset if cond else k))
            self._run(body)
            if decided is True:
                break
        return i + 1

    def _run(self, body: list[Word]) -> None:
        m = 0
        while m < len(body):
            m = self._statement(body, m)
        self._emit(SEP, body[-1].offset if body else 0)

    def _test(self, cond: list[Word]) -> bool | None:
        """A `[ ]`, `[[ ]]` or `test` of known values (-n -z = == != -eq -ne -lt -le -gt -ge, `!`);
        None when it runs a command or reads what the running script computes."""
        seen = len(self.out.unexpanded)
        args = [t for w in cond for t, _ in self._expand(w, 0)]
        grew = len(self.out.unexpanded) > seen
        del self.out.unexpanded[seen:]
        outer = bool(args) and args[0] == "!"  # `! test ..`, `! [ .. ]`
        args = args[1:] if outer else args
        if grew or not args:
            return None
        if args[0] in ("[", "[[") and args[-1] == {"[": "]", "[[": "]]"}[args[0]]:
            args = args[1:-1]
        elif args[0] == "test":
            args = args[1:]
        else:
            return None
        negate = bool(args) and args[0] == "!"
        args = args[1:] if negate else args
        result = _compare(args)
        return None if result is None else result != (negate != outer)

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
        self.bodies[name] = body
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
        empty_each = False  # `"${A[@]}"` of no elements: with only empty quotes around it, no word
        for kind, body, quoted in w.parts:
            if kind == "lit":
                fields[-1][0] += body
                started = started or bool(body) or quoted and not empty_each
                continue
            value = self._part(kind, body, depth, w.offset)
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
                empty_each = empty_each or each
                if each and not fields[-1][0] and len(fields) == 1:
                    started = False
                continue
            if fields[-1][0] == "":
                fields[-1][1] = items[0][1]
            fields[-1][0] += items[0][0]
            fields += [[t, at] for t, at in items[1:]]
            started = True
        if sum(len(t) for t, _ in fields) > MAX_TEXT:
            raise ShellError(f"a word expands to more than {MAX_TEXT} characters")
        return [(t, at) for t, at in fields] if started or fields[0][0] else []

    def _part(self, kind: str, raw: str, depth: int, at: int) -> tuple[list[tuple[str, int]], bool] | None:
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
        if body in ("@", "*"):  # the script's arguments (none) or the running function's
            return list(self.args), body == "@"
        if body == "#":
            return [(str(len(self.args)), -1)], False
        m = re.fullmatch(r"(#?)([A-Za-z_]\w*|\d+)(?:\[([@*])\])?(?:(:?[-=+])(.*))?", body, re.S)
        if m is None:
            return None
        count, name, sub, op, word = m.groups()
        if name in self.arrays:
            items = self.arrays[name]
            if count:
                return [(str(len(items)), -1)], False
            return (items, sub == "@") if sub else (items[:1] or [("", -1)], False)
        if name.isdigit():  # `$0` is the script; `$1`..: the running function's arguments
            value = self.args[int(name) - 1][0] if 0 < int(name) <= len(self.args) else ""
            is_set = 0 < int(name) <= len(self.args)
        else:
            value, is_set = self.vars.get(name), name in self.vars
        if count and value is not None:
            return [(str(len(value)), -1)], False
        if op and op.endswith("+"):  # the word when set (and, with ':', not empty)
            use = is_set and (op == "+" or value != "")
            value = self._word_of(word, depth, at) if use else ""
        elif op and (not is_set or op.startswith(":") and value == ""):
            value = self._word_of(word, depth, at)
            if op.endswith("=") and value is not None:
                self.vars[name] = value
        return None if value is None else ([(value, -1)], False)

    def _word_of(self, text: str, depth: int, at: int) -> str | None:
        """The word of `${V:-word}` expanded (one string: the caller splits it where bash would);
        None when part of it stays as written (then the whole `${..}` does, as one piece)."""
        parts, _ = _word(text, 0, whole=True)
        seen = len(self.out.unexpanded)
        words = self._expand(Word(parts, at, text), depth + 1, assignment=True)
        if len(self.out.unexpanded) > seen:
            del self.out.unexpanded[seen:]
            return None
        return " ".join(t for t, _ in words)


def _compare(args: list[str]) -> bool | None:
    if len(args) == 1:
        return args[0] != ""
    if len(args) == 2 and args[0] in ("-n", "-z"):
        return (args[1] != "") == (args[0] == "-n")
    if len(args) != 3:
        return None
    a, op, b = args
    if op in ("=", "=="):
        return a == b if not any(c in b for c in "*?[") else None
    if op == "!=":
        return a != b if not any(c in b for c in "*?[") else None
    ints = {"-eq": int.__eq__, "-ne": int.__ne__, "-lt": int.__lt__, "-le": int.__le__, "-gt": int.__gt__,
            "-ge": int.__ge__}
    if op in ints and re.fullmatch(r"-?\d{1,18}", a) and re.fullmatch(r"-?\d{1,18}", b):
        return ints[op](int(a), int(b))
    return None


def expand(text: str) -> Expanded:
    """The script's words as bash would pass them (see the module's docstring); ShellError when
    the text cannot be split."""
    return Shell().run(text)


def span_at(file: str, text: str, offset: int) -> Span:
    """The line and column of a character offset of the script: a search of the text's line starts,
    found once per text (a 1 MiB file of 262k overrides asks for a position per line)."""
    starts = _line_starts(text)
    line = bisect_right(starts, offset)
    return Span(file, line, offset - starts[line - 1] + 1)


@lru_cache(maxsize=4)
def _line_starts(text: str) -> list[int]:
    return [0, *(m.end() for m in re.finditer("\n", text))]
