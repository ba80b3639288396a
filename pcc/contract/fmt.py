"""`pcc fmt`: print a contract's own statements in the canonical layout, keeping comments.

The printer reads the builder's dict (what this file states, before `extends`
is merged), so formatting never copies a parent into a child. Canonical means:
fixed statement order, one statement per line, two-space indent, format
defaults omitted, rule order kept (it is precedence). fmt(fmt(x)) == fmt(x).
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import ValidationError

from pcc.contract.scheme import Scheme
from pcc.lang.build import ROLES, SourceMap, build
from pcc.lang.diagnostics import Reporter

Line = tuple[str | None, str]  # (source-map path or None, text)


def _num(v: Any) -> str:
    """Numbers as written, except that whole floats print without ".0"."""
    if isinstance(v, float) and v.is_integer():
        return str(int(v))
    return str(v)


def _pattern(p: str) -> str:
    head, sep, rest = p.partition("[")
    if head.startswith("name:"):
        head = json.dumps(head[5:])
    return head + (sep + rest.replace(",", ", ") if sep else "")


def _grouping(g: dict) -> str:
    if g["kind"] in ("block", "tile"):
        return f"{g['kind']} {g['rows']}x{g['cols']}"
    if g["kind"] == "group":
        return f"group {g['size']}"
    return g["kind"]


def scheme_text(spec: dict) -> str:
    """A scheme dict as the expression that builds it back (defaults it states are printed)."""
    out = [spec["format"]]
    if spec.get("grouping"):
        out.append(_grouping(spec["grouping"]))
    out += [f"{r} {_grouping(spec[r])}" for r in ROLES if spec.get(r)]
    if spec.get("scale"):
        out.append("scale " + spec["scale"].replace("_", "+"))
    if spec.get("packing"):
        out.append(f"packing {spec['packing']}")
    for key, default in (("amax", "current"), ("scale_rule", "ocp"), ("rounding", "nearest_even")):
        if spec.get(key, default) != default:
            out.append(f"{key} {spec[key]}")
    if spec.get("symmetric", True) is False:
        out.append("asymmetric")
    return " ".join(out)


def _rule(r: dict, trainer: bool) -> str:
    pats = ", ".join(_pattern(p) for p in r["patterns"])
    if r.get("keep"):
        return f"keep {r['scheme']} : {pats}"
    head = ""
    if trainer:
        comps = r["components"]
        head = "gemm" if sorted(comps) == ["dgrad", "fprop", "wgrad"] else ", ".join(comps)
        head += " " if pats != "linear" else ""
        if pats == "linear":
            pats = ""
    text = f"{head}{pats} : {r['scheme']}"
    for key in ("gemm", "accumulate", "output"):
        if r.get(key):
            text += f" {r[key]}" if key == "gemm" else f" {key} {r[key]}"
    return text


def _rules(block: dict, section: str, trainer: bool) -> list[Line]:
    return [(f"{section}.rules[{i}]", _rule(r, trainer)) for i, r in enumerate(block.get("rules", []))]


def _parallel(block: dict, section: str) -> list[Line]:
    par = block.get("parallel")
    if not par:
        return []
    return [(f"{section}.parallel", "parallel " + " ".join(f"{k} {v}" for k, v in par.items()))]


def _shortest(spec: dict) -> dict:
    """A scheme dict with its format's defaults left out; as written when it does not validate
    (fmt formats contracts that do not check, too)."""
    try:
        return Scheme.model_validate(spec).minimal()
    except ValidationError:
        return spec


def lines(d: dict) -> list[Line]:
    head = f"contract {d['name']}" + (f" extends {json.dumps(d['extends'])}" if d.get("extends") else "") + " {"
    out: list[Line] = [("name", head)]
    body: list[list[Line]] = []
    top: list[Line] = []
    if "model" in d:
        m = d["model"]
        top.append(("model", f"model {m['catalog']}" if m.get("catalog") else f"model from {json.dumps(m['path'])}"))
    if "hardware" in d:
        top.append(("hardware", f"hardware {d['hardware']}"))
    if "framework" in d:
        top.append(("framework", f"framework {d['framework']}"))
    body.append(top)
    body.append([(f"schemes.{k}", f"scheme {k} = {scheme_text(_shortest(v))}") for k, v in d.get("schemes", {}).items()])
    if "rollout" in d:
        r = d["rollout"]
        inner: list[Line] = []
        if "hardware" in r:
            inner.append(("rollout.hardware", f"hardware {r['hardware']}"))
        inner += _rules(r, "rollout", False) + _parallel(r, "rollout")
        if r.get("deterministic"):
            inner.append(("rollout.deterministic", "deterministic"))
        if "max_tokens" in r:
            inner.append(("rollout.max_tokens", f"max_tokens {r['max_tokens']}"))
        if "record" in r:
            inner.append(("rollout.record", "record " + ", ".join(r["record"])))
        body.append(_block("rollout", "rollout" + (f" {r['engine']}" if "engine" in r else ""), inner))
    if "trainer" in d:
        t = d["trainer"]
        inner = []
        for key in ("impl", "hardware"):
            if key in t:
                inner.append((f"trainer.{key}", f"{key} {t[key]}"))
        inner += _rules(t, "trainer", True)
        for key in ("params", "master", "moments", "grads", "param_gather"):
            if key in t:
                inner.append((f"trainer.{key}", f"{key} {t[key]}"))
        if "optimizer" in t:
            o = t["optimizer"]
            flags = [k for k in ("distributed", "offload", "precision_aware") if o.get(k)]
            inner.append(("trainer.optimizer", " ".join(["optimizer", o.get("kind", "adam"), *flags])))
        inner += _parallel(t, "trainer")
        body.append(_block("trainer", f"trainer {t.get('engine', 'megatron')}", inner))
    tail: list[Line] = []
    if "trainable" in d:
        t = d["trainable"]
        text = f"trainable {t['kind']}"
        for key in ("rank", "alpha", "dropout"):
            if key in t:
                text += f" {key} {_num(t[key])}"
        if t.get("targets"):
            text += " targets " + ", ".join(_pattern(p) for p in t["targets"])
        tail.append(("trainable", text))
    if "sync" in d:
        s = d["sync"]
        opts = " ".join(f"{k} {_num(v)}" for k, v in s.items() if k != "moves")
        tail.append(("sync", f"sync {s.get('moves', 'full_weights')}" + (f" {{ {opts} }}" if opts else "")))
    if "correction" in d:
        c = d["correction"]
        tail.append(("correction", " ".join([f"correction {c['kind']}"] +
                                            [f"{k} {_num(v)}" for k, v in c.items() if k != "kind"])))
    if "routing_replay" in d:
        word = {"r3": "rollout", "r2": "trainer"}.get(d["routing_replay"], d["routing_replay"])
        tail.append(("routing_replay", f"routing replay {word}"))
    body.append(tail)
    if "expect" in d:
        inner = [(f"expect[{i}]", " ".join([e["metric"]] + ([e["stat"]] if e.get("stat") else [])
                                          + [e["op"], _num(e["value"])])) for i, e in enumerate(d["expect"])]
        body.append(_block("expect", "expect", inner))
    first = True
    for chunk in body:
        if not chunk:
            continue
        if not first:
            out.append((None, ""))
        first = False
        out += [(p, "  " + t if t else t) for p, t in chunk]
    out.append((None, "}"))
    return out


def _block(path: str, head: str, inner: list[Line]) -> list[Line]:
    return [(path, head + " {")] + [(p, "  " + t) for p, t in inner] + [(None, "}")]


def format_source(text: str, file: str = "<string>") -> str:
    """The canonical text of one .prec source. Raises DiagnosticError on bad input."""
    rep = Reporter()
    comments: list = []
    d, smap = build(text, file, rep, comments)
    rep.fail_if_errors()
    return _with_comments(lines(d), smap, comments)


def _with_comments(printed: list[Line], smap: SourceMap, comments: list) -> str:
    """Leading comments go before the statement that follows them, trailing ones stay on
    their statement's line; the rest close the contract, before its final brace."""
    pending = sorted(comments, key=lambda c: (c.line, c.column))
    out: list[str] = []
    for path, text in printed[:-1]:
        span = smap.get(path) if path else None
        if span is not None:
            indent = text[: len(text) - len(text.lstrip())]
            while pending and pending[0].line < span.line:
                out.append(indent + str(pending.pop(0)).rstrip())
            trailing = [c for c in pending if c.line == span.line]
            pending = [c for c in pending if c.line != span.line]
            if trailing:
                text += "  " + "  ".join(str(c).rstrip() for c in trailing)
        out.append(text)
    out += ["  " + str(c).rstrip() for c in pending]
    out.append(printed[-1][1])
    return "\n".join(out) + "\n"
