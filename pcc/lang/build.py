"""Give the parse tree meaning: build the canonical contract dict and its source map.

The dict uses exactly the field names of `pcc.contract.model`, so .prec, YAML
and JSON all meet at `Contract.model_validate`. The source map ties each dict
path (e.g. "rollout.rules[2]") to the span of the statement that produced it,
so later stages can point at the source without ever seeing the tree.
"""

from __future__ import annotations

from typing import Any

from lark import Token, Tree

from pcc.lang.diagnostics import Reporter, Span, did_you_mean
from pcc.lang.parser import parse_comments, parse_text

SCALES = {"fp32": "fp32", "pow2": "pow2", "e8m0": "e8m0", "e4m3+fp32": "e4m3_fp32"}
ROLES = ("weights", "activations", "gradients")


class SourceMap(dict):
    """dict path -> Span of the statement that set it."""

    def find(self, path: str) -> Span | None:
        """The span of `path`, or of its nearest enclosing path."""
        while path:
            if path in self:
                return self[path]
            cut = max(path.rfind("."), path.rfind("["))
            path = path[:cut] if cut > 0 else ""
        return None


def _span(file: str, node: Tree | Token) -> Span:
    if isinstance(node, Token):
        return Span(file, node.line, node.column, node.end_line, node.end_column)
    m = node.meta
    if getattr(m, "empty", True):
        return Span(file, 1, 1)
    return Span(file, m.line, m.column, m.end_line, m.end_column)


def _unquote(tok: Token) -> str:
    return bytes(tok[1:-1], "utf-8").decode("unicode_escape") if "\\" in tok else tok[1:-1]


def _number(tok: Token) -> float | int:
    text = str(tok)
    return int(text) if text.lstrip("-").isdigit() else float(text)


def scheme_dict(expr: Tree, file: str, rep: Reporter) -> dict[str, Any]:
    """A `scheme_expr` tree as the scheme dict its author wrote; the scheme model
    (pcc.contract.scheme) checks the format and fills its defaults, as for YAML and JSON."""
    out: dict[str, Any] = {"format": str(expr.children[0])}
    for opt in expr.children[1:]:
        kind = opt.data
        if kind == "role_grouping":
            role = str(opt.children[0])
            if role in out:
                rep.error("PCC106", f"grouping for {role} given twice", _span(file, opt))
            out[role] = _grouping(opt.children[1])
        elif kind.startswith("g_"):
            if "grouping" in out:
                rep.error("PCC106", "scale grouping given twice", _span(file, opt),
                          hint="name the role: 'weights block 128x128 activations tile 1x128'")
            out["grouping"] = _grouping(opt)
        elif kind == "scale":
            text = "+".join(str(c) for c in opt.children)
            if text not in SCALES:
                rep.error("PCC105", f"unknown scale dtype '{text}'", _span(file, opt),
                          hint=did_you_mean(text, SCALES) or "scale dtypes: " + ", ".join(SCALES))
            else:
                out["scale"] = SCALES[text]
        elif kind in ("amax", "rounding", "packing", "scale_rule"):
            out[kind] = str(opt.children[0])
        elif kind in ("symmetric", "asymmetric"):
            out["symmetric"] = kind == "symmetric"
    return out


def _grouping(node: Tree) -> dict[str, Any]:
    kind = node.data[2:]
    if kind in ("block", "tile"):
        rows, cols = (int(x) for x in str(node.children[0]).split("x"))
        return {"kind": kind, "rows": rows, "cols": cols}
    if kind == "group":
        return {"kind": "group", "size": int(node.children[0])}
    return {"kind": kind}


def pattern_text(node: Tree) -> str:
    """A pattern tree in its canonical string form (also the JSON form)."""
    head = node.children[0]
    text = f"name:{_unquote(head)}" if head.type == "STRING" else str(head)
    if len(node.children) > 1:
        ranges = []
        for r in node.children[1].children:
            lo = str(r.children[0])
            ranges.append(lo if len(r.children) == 1 else f"{lo}..{r.children[1]}")
        text += "[" + ",".join(ranges) + "]"
    return text


class _Builder:
    def __init__(self, file: str, rep: Reporter):
        self.file, self.rep = file, rep
        self.smap = SourceMap()
        self.out: dict[str, Any] = {}
        self.seen: dict[str, Span] = {}

    def span(self, node) -> Span:
        return _span(self.file, node)

    def once(self, key: str, node, what: str) -> bool:
        """Record a statement that may appear once; report a duplicate."""
        sp = self.span(node)
        if key in self.seen:
            self.rep.error("PCC106", f"duplicate {what}", sp, hint=f"first given at {self.seen[key]}")
            return False
        self.seen[key] = sp
        self.smap[key] = sp
        return True

    def contract(self, tree: Tree) -> dict[str, Any]:
        node = tree.children[0]
        name, *rest = node.children
        self.out["name"] = str(name)
        self.smap["name"] = self.span(name)
        for stmt in rest:
            if stmt.data == "extends":
                self.out["extends"] = _unquote(stmt.children[0])
                self.smap["extends"] = self.span(stmt)
            else:
                getattr(self, "s_" + stmt.data)(stmt)
        return self.out

    # ---- top-level statements
    def s_model_catalog(self, n: Tree) -> None:
        if self.once("model", n, "'model' statement"):
            self.out["model"] = {"catalog": str(n.children[0])}

    def s_model_path(self, n: Tree) -> None:
        if self.once("model", n, "'model' statement"):
            self.out["model"] = {"path": _unquote(n.children[0])}

    def s_hardware(self, n: Tree, prefix: str = "") -> None:
        if self.once(prefix + "hardware", n, "'hardware' statement"):
            target = self.out.setdefault(prefix[:-1], {}) if prefix else self.out
            target["hardware"] = str(n.children[0])

    def s_framework(self, n: Tree) -> None:
        if self.once("framework", n, "'framework' statement"):
            self.out["framework"] = str(n.children[0])

    def s_scheme_def(self, n: Tree) -> None:
        name, expr = n.children
        key = f"schemes.{name}"
        if self.once(key, n, f"scheme '{name}'"):
            self.smap[key + ".format"] = _span(self.file, expr.children[0])
            self.out.setdefault("schemes", {})[str(name)] = scheme_dict(expr, self.file, self.rep)

    def s_rollout(self, n: Tree) -> None:
        if not self.once("rollout", n, "'rollout' block"):
            return
        block = self.out.setdefault("rollout", {})
        children = list(n.children)
        if children and isinstance(children[0], Token):
            block["engine"] = str(children.pop(0))
        for st in children:
            kind = st.data
            if kind in ("rule", "keep"):
                self._rule(block, st, "rollout", ["rollout"])
            elif kind == "parallel":
                self._parallel(block, st, "rollout")
            elif kind == "hardware":
                self.s_hardware(st, "rollout.")
            elif kind == "deterministic":
                if self.once("rollout.deterministic", st, "'deterministic'"):
                    block["deterministic"] = True
            elif kind == "max_tokens":
                if self.once("rollout.max_tokens", st, "'max_tokens'"):
                    block["max_tokens"] = int(st.children[0])
            elif kind == "record":
                if self.once("rollout.record", st, "'record'"):
                    block["record"] = [str(c) for c in st.children]

    def s_trainer(self, n: Tree) -> None:
        if not self.once("trainer", n, "'trainer' block"):
            return
        block = self.out.setdefault("trainer", {})
        engine, *children = n.children
        block["engine"] = str(engine)
        self.smap["trainer.engine"] = self.span(engine)
        for st in children:
            kind = st.data
            if kind == "trainer_rule":
                comps = [c for c in st.children if isinstance(c, Token) and c.type == "COMPONENT"]
                names = []
                for c in comps:
                    names.extend(["fprop", "dgrad", "wgrad"] if c == "gemm" else [str(c)])
                rest = Tree("rule", st.children[len(comps):], st.meta)
                if not any(isinstance(c, Tree) and c.data == "patterns" for c in rest.children):
                    rest.children.insert(0, Tree("patterns", [Tree("pattern", [Token("IDENT", "linear")])]))
                self._rule(block, rest, "trainer", list(dict.fromkeys(names)))
            elif kind == "keep":
                self._rule(block, st, "trainer", ["fprop", "dgrad", "wgrad"])
            elif kind == "parallel":
                self._parallel(block, st, "trainer")
            elif kind == "hardware":
                self.s_hardware(st, "trainer.")
            elif kind == "state":
                key, value = (str(c) for c in st.children)
                if self.once(f"trainer.{key}", st, f"'{key}'"):
                    block[key] = value
            elif kind == "impl":
                if self.once("trainer.impl", st, "'impl'"):
                    block["impl"] = str(st.children[0])
            elif kind == "optimizer":
                if self.once("trainer.optimizer", st, "'optimizer'"):
                    opt: dict[str, Any] = {"kind": str(st.children[0])}
                    for flag in st.children[1:]:
                        opt[str(flag)] = True
                    block["optimizer"] = opt

    def _rule(self, block: dict, st: Tree, section: str, components: list[str]) -> None:
        rules = block.setdefault("rules", [])
        path = f"{section}.rules[{len(rules)}]"
        self.smap[path] = self.span(st)
        if st.data == "keep":
            scheme, pats = st.children
            rule: dict[str, Any] = {"components": components, "keep": True, "scheme": str(scheme)}
        else:
            pats, scheme, *opts = st.children
            rule = {"components": components, "scheme": str(scheme)}
            for o in opts:
                if o.data in rule and o.data != "components":
                    self.rep.error("PCC106", f"'{o.data}' given twice in one rule", self.span(o))
                rule[o.data if o.data in ("accumulate", "output") else "gemm"] = (
                    str(o.children[0]) if o.children else o.data)
        self.smap[path + ".scheme"] = self.span(scheme)
        rule["patterns"] = [pattern_text(p) for p in pats.children]
        for i, p in enumerate(pats.children):
            self.smap[f"{path}.patterns[{i}]"] = self.span(p)
        rules.append(rule)

    def _parallel(self, block: dict, st: Tree, section: str) -> None:
        if not self.once(f"{section}.parallel", st, "'parallel' statement"):
            return
        par: dict[str, int] = {}
        for opt in st.children:
            key, value = str(opt.children[0]), int(opt.children[1])
            if key in par:
                self.rep.error("PCC106", f"'{key}' given twice", self.span(opt))
            par[key] = value
            self.smap[f"{section}.parallel.{key}"] = self.span(opt)
        block["parallel"] = par

    def s_trainable(self, n: Tree) -> None:
        if not self.once("trainable", n, "'trainable' statement"):
            return
        kind, *opts = n.children
        out: dict[str, Any] = {"kind": str(kind)}
        self.smap["trainable.kind"] = self.span(kind)
        for o in opts:
            if o.data in out:
                self.rep.error("PCC106", f"'{o.data}' given twice", self.span(o))
            if o.data == "targets":
                out["targets"] = [pattern_text(p) for p in o.children[0].children]
                for i, p in enumerate(o.children[0].children):
                    self.smap[f"trainable.targets[{i}]"] = self.span(p)
            else:
                out[o.data] = _number(o.children[0])
                self.smap[f"trainable.{o.data}"] = self.span(o)
        self.out["trainable"] = out

    def s_sync(self, n: Tree) -> None:
        self._keyed(n, "sync", "moves")

    def s_correction(self, n: Tree) -> None:
        self._keyed(n, "correction", "kind")

    def _keyed(self, n: Tree, section: str, head: str) -> None:
        """`section HEAD key value ...`: one word, then key-value options."""
        if not self.once(section, n, f"'{section}' statement"):
            return
        word, *opts = n.children
        out: dict[str, Any] = {head: str(word)}
        self.smap[f"{section}.{head}"] = self.span(word)
        for o in opts:
            key, value = str(o.children[0]), o.children[1]
            if key in out:
                self.rep.error("PCC106", f"'{key}' given twice", self.span(o))
            out[key] = _number(value) if value.type == "NUMBER" else str(value)
            self.smap[f"{section}.{key}"] = self.span(o)
        self.out[section] = out

    def s_routing(self, n: Tree) -> None:
        if self.once("routing_replay", n, "'routing replay' statement"):
            word = str(n.children[0])
            self.out["routing_replay"] = {"rollout": "r3", "trainer": "r2"}.get(word, word)

    def s_expect(self, n: Tree) -> None:
        if not self.once("expect", n, "'expect' block"):
            return
        items = self.out.setdefault("expect", [])
        keys: dict[str, Span] = {}
        for e in n.children:
            *words, op, value = e.children
            names = [str(w) for w in words]
            item: dict[str, Any] = {"metric": names[0], "op": str(op), "value": _number(value)}
            if len(names) > 1:
                item["stat"] = " ".join(names[1:])
            key = " ".join(names) + " " + str(op)
            sp = self.span(e)
            if key in keys:
                self.rep.error("PCC106", f"duplicate expectation '{key}'", sp, hint=f"first given at {keys[key]}")
            keys[key] = sp
            self.smap[f"expect[{len(items)}]"] = sp
            items.append(item)


def build(text: str, file: str, rep: Reporter, comments: list | None = None) -> tuple[dict[str, Any], SourceMap]:
    """Parse and build; syntax errors raise DiagnosticError, others go to `rep`.

    When `comments` is a list, the source's comments are appended to it.
    """
    if comments is None:
        tree = parse_text(text, file)
    else:
        tree, found = parse_comments(text, file)
        comments.extend(found)
    b = _Builder(file, rep)
    return b.contract(tree), b.smap


def parse_scheme(text: str) -> dict[str, Any]:
    """The scheme dict (as written) of a scheme expression such as
    ``fp8_e4m3 weights block 128x128 activations tile 1x128 scale fp32``."""
    rep = Reporter()
    tree = parse_text(text, "<scheme>", start="scheme_expr")
    spec = scheme_dict(tree, "<scheme>", rep)
    rep.fail_if_errors()
    return spec
