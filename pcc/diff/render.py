"""A diff report as text (a terminal), Markdown (a pull-request comment) or JSON.

Both text forms are built from the same sections: a title, a table and lines.
"""

from __future__ import annotations

import json

from pcc.diff.compare import show as _show

LABEL = {"rollout": "Rollout", "fprop": "FProp", "dgrad": "DGrad", "wgrad": "WGrad"}


def _bytes(n: int | None, sign: bool = False) -> str:
    if n is None:
        return "-"
    s = "+" if sign and n > 0 else "-" if n < 0 else ""
    m = abs(n)
    for unit, div in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if m >= div:
            return f"{s}{m / div:.2f} {unit}"
    return f"{s}{m} B"


def _short(v, keep: int = 4) -> str:
    """An engine value in a table cell: a long list (a module list of a whole model) as its length
    and first items; the JSON report keeps it whole."""
    if isinstance(v, list) and len(v) > keep:
        return f"{len(v)} items: {_show(v[:keep])}, ..."
    return _show(v)


def _fields(changes: list[dict]) -> tuple[list[str], list[list[str]]]:
    return ["field", "A", "B"], [[c["field"], _show(c["from"]), _show(c["to"])] for c in changes]


def _groups(groups: list[dict]) -> list[list[str]]:
    return [[g["family"], str(g["tensors"]), g["layers"], g["examples"][0] if g["examples"] else ""] for g in groups]


def sections(r: dict) -> list[tuple[str, list[str], list[list[str]], list[str]]]:
    """(title, table header, table rows, lines) for every part of the report that changed;
    a first line ending in ':' heads the others."""
    out = []
    m = r["model"]
    if m and (m["only_a"] or m["only_b"]):
        rows = [["only in A", *g] for g in _groups(m["only_a"])] + [["only in B", *g] for g in _groups(m["only_b"])]
        out.append(("Model", ["side", "family", "tensors", "layers", "example"], rows,
                    [f"A: {r['a']['name']} ({r['a']['operators']} operators, {r['a']['layers']} layers, "
                     f"{r['a']['experts']} experts); B: {r['b']['name']} ({r['b']['operators']} operators, "
                     f"{r['b']['layers']} layers, {r['b']['experts']} experts)"]))
    for comp, rows in r["components"].items():
        if rows:
            table = [[e["family"], e["kind"], e["from"], e["to"], str(e["tensors"]), e["layers"], e["examples"][0]]
                     for e in rows]
            lines = sorted({f"{e['family']}: A {'; '.join(e['rules_a'])} | B {'; '.join(e['rules_b'])}"
                            for e in rows})
            out.append((LABEL[comp], ["family", "change", "A", "B", "tensors", "layers", "example"], table,
                        ["decided by:"] + lines))
    for key, title in (("optimizer", "Optimizer"), ("sync", "Convert and synchronize")):
        if r[key]:
            out.append((title, *_fields(r[key]), []))
    t = r["trainable"]
    if t["fields"] or t["gained"] or t["lost"]:
        rows = [["gained", *g] for g in _groups(t["gained"])] + [["lost", *g] for g in _groups(t["lost"])]
        lines = [f"{c['field']}: {_show(c['from'])} -> {_show(c['to'])}" for c in t["fields"]]
        if t["targets_a"] != t["targets_b"]:
            lines.append(f"targets: {_show(t['targets_a'])} -> {_show(t['targets_b'])}")
        lines.append(f"trainable tensors: {t['tensors_a']} -> {t['tensors_b']}")
        out.append(("Trainable set", ["", "family", "tensors", "layers", "example"], rows, lines))
    if r["correction"]:
        out.append(("Corrections and routing replay", *_fields(r["correction"]), []))
    if r["expect"]:
        out.append(("Expectations", ["expectation", "A", "B", "change"],
                    [[e["expectation"], _show(e["from"]), _show(e["to"]), e["change"]] for e in r["expect"]], []))
    if r["placement"]:
        out.append(("Hardware and placement", *_fields(r["placement"]), []))
    rows, lines = [], []
    for name, e in r.get("engines", {}).items():
        if not e["available"]:
            lines.append(f"{name}: {e['note']}")
            continue
        if e["lowered_by"] != "both":
            lines.append(f"{name}: lowered for {e['lowered_by']} (the other bundle has no {name} files)")
        rows += [[name, "arg " + c["field"], *("(set)" if v == "" else _short(v) for v in (c["from"], c["to"]))]
                 for c in e["args"]]  # "": a switch given without a value
        rows += [[name, "env " + c["field"], _short(c["from"]), _short(c["to"])] for c in e["env"]]
        for f in e["files"]:
            rows.append([name, "file " + f["path"], "", f["change"]])
            rows += [[name, f"  {c['field']}", _short(c["from"]), _short(c["to"])] for c in f.get("fields", [])
                     if f["change"] == "changed"]
    if rows or lines:
        out.append(("Engine arguments", ["target", "what", "A", "B"], rows, lines))
    if r["changed"]:
        out.append(_consequences(r["consequences"]))
    return out


def _consequences(c: dict) -> tuple[str, list[str], list[list[str]], list[str]]:
    a = c["rollout_artifact"]
    lines = []
    if a["rebuild"]:
        fams = ", ".join(f"{g['family']} x{g['tensors']}" for g in a["groups"])
        lines.append(f"rollout artifact: REBUILD {a['tensors']} tensors" + (f" ({fams})" if fams else "")
                     + "; " + "; ".join(a["why"]))
    else:
        lines.append("rollout artifact: unchanged")
    for key, title in (("adapter_mapping", "adapter mapping"), ("trainer_precision_file", "trainer precision file")):
        e = c[key]
        files = f" [{', '.join(e['files'])}]" if e.get("files") else ""
        lines.append(f"{title}: " + (f"CHANGES{files}: " + "; ".join(e["why"]) if e["changes"] else "unchanged"))
    b = c["baseline"]
    lines.append("step-0 mismatch baseline: " + ("INVALIDATED, measure it again: " + "; ".join(b["why"])
                                                  if b["invalidated"] else "still holds"))
    lines.append("validation levels to re-run:")
    lines += [f"  [ ] {v['level']}. {v['name']}: {'; '.join(v['why'][:3])}"
              + (f" (+{len(v['why']) - 3} more)" if len(v["why"]) > 3 else "") for v in c["validation_levels"]]
    rows = [[x["name"], _bytes(x["a"]), _bytes(x["b"]), _bytes(x["delta"], sign=True)] for x in c["bytes"]]
    return ("Consequences", ["memory / bytes per sync", "A", "B", "delta"], rows, lines)


def _title(r: dict) -> str:
    a, b = r["a"], r["b"]
    return (f"{a.get('file', a['contract'])} ({a['contract']}, {a['name']}) -> "
            f"{b.get('file', b['contract'])} ({b['contract']}, {b['name']})")


def text(r: dict) -> str:
    out = [f"pcc diff: {_title(r)}", "no semantic change" if not r["changed"] else "semantic changes:"]
    for title, header, rows, lines in sections(r):
        out += ["", title]
        if title == "Consequences":
            out += ["  " + line for line in lines]
            lines = []
        if rows:
            widths = [max(len(str(x)) for x in col) for col in zip(header, *rows)]
            for row in [header, *rows]:
                out.append("  " + "  ".join(str(x).ljust(w) for x, w in zip(row, widths)).rstrip())
        out += ["  " + line for line in lines]
    out += [f"note: {n}" for n in r.get("notes", [])]
    return "\n".join(out) + "\n"


def _md(x: str) -> str:
    return str(x).replace("|", "\\|")


def markdown(r: dict) -> str:
    verdict = "no semantic change" if not r["changed"] else "**semantic changes**"
    out = [f"### pcc diff: {_md(_title(r))}", "", verdict]
    for title, header, rows, lines in sections(r):
        out += ["", f"#### {title}", ""]
        if title == "Consequences":
            out += [_md_line(line) for line in lines] + [""]
            lines = []
        if rows:
            out.append("| " + " | ".join(_md(h) for h in header) + " |")
            out.append("|" + "---|" * len(header))
            out += ["| " + " | ".join(_md(x) for x in row) + " |" for row in rows]
            out.append("")
        if lines and lines[0].endswith(":"):  # long supporting detail: folded
            out += [f"<details><summary>{_md(lines[0][:-1])}</summary>", ""]
            out += [f"- {_md(x)}" for x in lines[1:]] + ["", "</details>"]
        else:
            out += [f"- {_md(x)}" for x in lines]
    out += [f"> note: {_md(n)}" for n in r.get("notes", [])]
    return "\n".join(out) + "\n"


def _md_line(line: str) -> str:
    if line.startswith("  [ ] "):
        return "- [ ] " + _md(line[6:])
    return f"\n**{_md(line[:-1])}**\n" if line.endswith(":") else "- " + _md(line)


def render(r: dict, fmt: str) -> str:
    if fmt == "json":
        return json.dumps(r, indent=1, sort_keys=True) + "\n"
    return markdown(r) if fmt == "markdown" else text(r)
