"""`pcc explain --format html`: the precision map, one self-contained page.

Per component (rollout, FProp, DGrad, WGrad) a grid of layers x operator families, each cell
coloured by the scheme that decides it; a legend (format, scale grouping, bytes per parameter);
`keep` exceptions and the KV cache marked; hovering a cell shows its tensor names (count and the
first few, all of them on a click), its scheme and the rule (file:line) that decided it; the bytes
of every representation and the sync payload as an inline SVG chart; `pcc check`'s diagnostics
with their lines.

Everything comes from the frozen Plan (`plan.groups`, `plan.decisions`, `plan.smap`) and
`pcc.plan.explain`'s document: nothing is decided again here. Python aggregates per (layer,
family) cell and emits compact JSON (tensor names folded over the expert index); the page's
script builds each grid when it scrolls into view and a cell's details only when asked, so a
70k-operator model stays a few thousand DOM nodes. `pcc diff --format html` (pcc/diff/html.py)
draws the same grids with the changed cells marked.
"""

from __future__ import annotations

import base64
import html
import json
import math
from collections import defaultdict
from pathlib import Path

from pcc.models import FAMILIES
from pcc.plan.explain import LABEL, explain
from pcc.plan.resolve import COMPONENTS, DEFAULT, Plan

NAMES_SHOWN = 3  # tensor names a tooltip lists before "+N more"
# Colours by format; a second (third) scheme of one format takes the next shade.
PALETTE = {
    "bf16": ("#c8d3df", "#a9b9cc", "#dfe6ee"), "fp16": ("#b9d7c0", "#9cc5a6", "#d4e8d9"),
    "fp32": ("#8e9aa8", "#77838f", "#a7b2bd"), "fp8_e4m3": ("#f28e2b", "#d9741a", "#f7b36b"),
    "fp8_e5m2": ("#e8a33d", "#c9862a", "#f1c27a"), "mxfp8": ("#edc948", "#d4ad22", "#f4dc83"),
    "mxfp4": ("#9c6fb6", "#7e4f9a", "#bd9ad1"), "nvfp4": ("#4e9f50", "#357f3a", "#80bf7f"),
    "int4": ("#d9534f", "#b23a37", "#e88682"), "int8": ("#e377c2", "#c5579f", "#eda5d7"),
}
OTHER = ("#4e79a7", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7", "#9c755f")
NOT_RUN = "not run"
ADAPTER = "trainable"  # WGrad of a LoRA adapter: the trainable set decides it


# -- data ----------------------------------------------------------------------------------------

def _colours(legend: list[dict]) -> None:
    used: dict[str, int] = defaultdict(int)
    for k, entry in enumerate(legend):
        shades = PALETTE.get(entry["format"]) or (OTHER[k % len(OTHER)],)
        entry["color"] = shades[used[entry["format"]] % len(shades)]
        used[entry["format"]] += 1


def _ranges(nums: list[int]) -> list[list[int]]:
    out: list[list[int]] = []
    for x in sorted(nums):
        if out and x == out[-1][1] + 1:
            out[-1][1] = x
        else:
            out.append([x, x])
    return out


class _Names:
    """Tensor names of a cell part, folded over the expert index: `[template, [[a, b], ...]]` is
    template with `{e}` replaced by a..b; `[name]` a name as it is. Interned: the same operators
    (one cell decided alike in several components) are stored once."""

    def __init__(self, ops):
        self.table: list[list] = []
        self._seen: dict[tuple[int, ...], int] = {}
        self._fold: list[tuple[str, int | None]] = []
        for op in ops:
            name, e = op.tensor, op.expert
            if e is not None:
                mark = f".{e}."
                k = name.rfind(mark)
                if k >= 0:
                    self._fold.append((name[:k] + ".{e}." + name[k + len(mark):], e))
                    continue
            self._fold.append((name, None))

    def __call__(self, idx: tuple[int, ...]) -> int:
        hit = self._seen.get(idx)
        if hit is not None:
            return hit
        groups: dict[str, list] = {}
        for i in idx:
            template, e = self._fold[i]
            groups.setdefault(template, []).append(e)
        folded = [[t] if es[0] is None else [t, _ranges(es)] for t, es in groups.items()]
        self._seen[idx] = len(self.table)
        self.table.append(folded)
        return self._seen[idx]


def _where(plan: Plan, path: str, sources: dict[str, str]) -> tuple[str | None, str | None]:
    """file:line of a contract path, and that source line as written."""
    span = plan.smap.find(path)
    if span is None:
        return None, None
    lines = (sources.get(span.file) or "").splitlines()
    text = lines[span.line - 1].strip() if 0 < span.line <= len(lines) else None
    return f"{span.file}:{span.line}", text


def _rules(plan: Plan, sources: dict[str, str]) -> list[dict]:
    """Index 0 the bf16 default, then the contract's rules (rule id + 1), then the trainable set
    (a LoRA adapter's WGrad) and 'not run'."""
    out = [{"path": "default", "where": None, "source": None, "keep": False,
            "text": "no rule matches: the bf16 default"}]
    for ref in plan.rules:
        where, source = _where(plan, ref.path, sources)
        r = ref.rule
        comps = "" if ref.section == "rollout" else ", ".join(r.components) + " "
        out.append({"path": ref.path, "where": where, "source": source, "keep": bool(r.keep),
                    "text": f"{'keep ' if r.keep else ''}{comps}{', '.join(r.patterns)} : {r.scheme}"})
    where, source = _where(plan, "trainable", sources)
    out.append({"path": "trainable", "where": where, "source": source, "keep": False,
                "text": "the LoRA adapter's own WGrad (bf16); the frozen base has none"})
    out.append({"path": NOT_RUN, "where": None, "source": None, "keep": False,
                "text": "this component does not run on these operators"})
    return out


def grid_data(plan: Plan, info: dict | None = None, sources: dict[str, str] | None = None) -> dict:
    """The page's data: rows (layers), columns (families), the legend, the rules, and per component
    the cells `[row, column, [[decision, operators, names], ...]]`, largest part first."""
    info = info if info is not None else explain(plan)
    sources = sources or {}
    ops = plan.catalog.operators
    order = {f: k for k, f in enumerate(FAMILIES)}
    families = sorted({op.family for op in ops}, key=lambda f: (order.get(f, len(order)), f))
    col = {f: k for k, f in enumerate(families)}
    layers = sorted({op.layer for op in ops}, key=lambda x: -1 if x is None else x)
    row = {x: k for k, x in enumerate(layers)}
    n_layers = plan.catalog.num_layers
    rows = ["global" if x is None else f"{x} mtp" if x >= n_layers else str(x) for x in layers]
    where = [(row[op.layer], col[op.family]) for op in ops]
    kv = [op.family == "kv_cache" for op in ops]

    legend = [dict(s) for s in info["schemes"]]
    _colours(legend)
    rules = _rules(plan, sources)
    adapter_rule, not_run_rule = len(rules) - 2, len(rules) - 1
    decisions: list[dict] = []
    decision_ids: dict[tuple, int] = {}

    def decision(comp: str, scheme: str | None, gemm: str | None, rule: int, acc=None, out=None) -> int:
        key = (comp, scheme, gemm, rule, acc, out)
        if key not in decision_ids:
            decision_ids[key] = len(decisions)
            decisions.append({"c": comp, "s": scheme, "g": gemm, "r": rule, "acc": acc, "out": out})
        return decision_ids[key]

    names = _Names(ops)
    kind = plan.contract.trainable.kind
    components = {}
    for comp in COMPONENTS:
        parts: dict[tuple[int, int, int], list[int]] = defaultdict(list)
        if comp == "wgrad" and kind != "all":  # as explain: the adapter's WGrad, or nothing trains
            trains = set(plan.trainable) if kind == "lora" else set()
            d_adapter = decision(comp, "bf16", "wide", adapter_rule)
            d_none = decision(comp, None, None, not_run_rule)
            for i in range(len(ops)):
                if not kv[i]:
                    parts[(*where[i], d_adapter if i in trains else d_none)].append(i)
        else:
            for rid, idx in plan.groups[comp]:
                d = plan.decisions[comp][rid]
                k = decision(comp, d.scheme_name, d.gemm, 0 if rid == DEFAULT else rid + 1, d.accumulate, d.output)
                for i in idx:
                    if comp == "rollout" or not kv[i]:  # the KV cache exists only in rollout
                        parts[(*where[i], k)].append(i)
        cells: dict[tuple[int, int], list] = defaultdict(list)
        for (r, c, k), idx in parts.items():
            cells[(r, c)].append([k, len(idx), names(tuple(idx))])
        components[comp] = {"label": LABEL[comp], "trace": info["trace"][comp],
                            "cells": [[r, c, sorted(p, key=lambda x: -x[1])] for (r, c), p in sorted(cells.items())]}
    return {"contract": info["contract"], "model": info["model"], "operators": info["operators"],
            "rows": rows, "layers": layers, "families": families, "kv": col.get("kv_cache"), "legend": legend,
            "rules": rules,
            "decisions": decisions, "names": names.table, "components": components}


# -- static parts --------------------------------------------------------------------------------

def esc(x) -> str:
    return html.escape("" if x is None else str(x), quote=True)


def human_bytes(n: int | None) -> str:
    if n is None:
        return "-"
    for unit, div in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(n) >= div:
            return f"{n / div:.2f} {unit}"
    return f"{n} B"


def legend_html(legend: list[dict], marks: tuple[tuple[str, str], ...] = ()) -> str:
    rows = "".join(
        f'<tr data-scheme="{esc(e["name"])}"><td><i class="sw" style="background:{e["color"]}"></i></td>'
        f'<td class="name">{esc(e["name"])}</td><td>{esc(e["format"])}</td><td>{esc(e["weights"] or "-")}</td>'
        f'<td>{esc(e["activations"] or "-")}</td><td>{esc(e["gradients"] or "-")}</td>'
        f'<td>{esc(e["scale"] or "-")}</td><td class="num bpp">{e["bytes_per_param"]:g}</td></tr>'
        for e in legend)
    marks = (("cell keep", "decided by a <code>keep</code> rule (an exception)"),
             ("cell kv", "the KV cache (rollout only)"), ("cell mixed", "several schemes in one cell"),
             ("cell off", "not run"), *marks)
    keys = "".join(f'<span class="mark"><i class="{cls}" style="background-color:#c8d3df;--c2:#f28e2b"></i> '
                   f'{text}</span>' for cls, text in marks)
    return (f'<table class="legend"><thead><tr><th></th><th>scheme</th><th>format</th><th>weights</th>'
            f'<th>activations</th><th>gradients</th><th>scale</th><th>bytes / param</th></tr></thead>'
            f'<tbody>{rows}</tbody></table><p class="marks">{keys}</p>')


def _tick(n: int) -> str:
    for unit, div in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= div:
            return f"{n / div:g} {unit}"
    return f"{n} B"


def bytes_chart(reps: list[dict], width: int = 760) -> str:
    """Every representation's bytes as horizontal bars on a log scale (ticks at powers of two),
    the sync payload in red."""
    if not reps:
        return ""
    vals = [max(1, r["bytes"]) for r in reps]
    lo2, hi2 = math.floor(math.log2(min(vals))) - 1, math.ceil(math.log2(max(vals)))
    step = max(1, math.ceil((hi2 - lo2) / 7))
    lo2 -= (hi2 - lo2) % step and step - (hi2 - lo2) % step
    left, right, bar, gap = 300, 110, 18, 8
    span = width - left - right
    height = len(reps) * (bar + gap) + 30

    def x(v):
        return left + span * (math.log2(v) - lo2) / (hi2 - lo2)

    out = [f'<svg class="chart" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'viewBox="0 0 {width} {height}" role="img" aria-label="bytes per representation">']
    for e in range(lo2, hi2 + 1, step):
        px = x(2 ** e)
        out.append(f'<line x1="{px:.1f}" y1="0" x2="{px:.1f}" y2="{height - 22}" class="tick"/>'
                   f'<text x="{px:.1f}" y="{height - 8}" class="axis">{_tick(2 ** e)}</text>')
    for k, (r, v) in enumerate(zip(reps, vals)):
        y = k * (bar + gap)
        sync = r["name"].startswith("sync payload")
        out.append(f'<g class="rep{" sync" if sync else ""}" data-name="{esc(r["name"])}" data-bytes="{r["bytes"]}">'
                   f'<title>{esc(r["name"])}: {r["bytes"]:,} bytes ({esc(r["dtype"])}'
                   f'{", " + esc(r["of"]) if r.get("of") else ""})</title>'
                   f'<text x="{left - 8}" y="{y + bar - 5}" class="label">{esc(r["name"])} '
                   f'<tspan class="dtype">{esc(r["dtype"])}</tspan></text>'
                   f'<rect x="{left}" y="{y}" width="{max(1.0, x(v) - left):.1f}" height="{bar}"/>'
                   f'<text x="{x(v) + 6:.1f}" y="{y + bar - 5}" class="value">'
                   f'{esc(human_bytes(r["bytes"]))}</text></g>')
    out.append("</svg>")
    return "".join(out) + ('<p class="muted">Log scale. Red: the sync payload, what one weight version moves '
                           'from the trainer to the rollout engine.</p>')


def diagnostics_html(diagnostics: list[dict], sources: dict[str, str] | None = None) -> str:
    if not diagnostics:
        return '<p class="ok">pcc check: no errors, no warnings.</p>'
    items = []
    for d in diagnostics:
        where = ":".join(str(d[k]) for k in ("file", "line", "col") if d.get(k) is not None) or d.get("path") or ""
        src = ""
        text = (sources or {}).get(d.get("file") or "")
        if text and d.get("line"):
            lines = text.splitlines()
            if 0 < d["line"] <= len(lines):
                src = (f'<pre class="src"><span class="ln">{d["line"]:>5} | </span>'
                       f'{esc(lines[d["line"] - 1][:200])}</pre>')
        hint = f'<div class="hint">hint: {esc(d["hint"])}</div>' if d.get("hint") else ""
        items.append(f'<li class="diag {esc(d["severity"])}"><code class="where">{esc(where)}</code> '
                     f'<b>{esc(d["severity"])}[{esc(d.get("code") or "-")}]</b>: {esc(d["message"])}{src}{hint}</li>')
    return f'<ul class="diagnostics">{"".join(items)}</ul>'


def rules_html(plan: Plan, data: dict) -> str:
    """The contract's rules with file:line and how many operators each decides per component."""
    ops = plan.catalog.operators
    counts: dict[int, dict[str, int]] = defaultdict(dict)
    for comp in COMPONENTS:
        for rid, idx in plan.groups[comp]:
            n = sum(1 for i in idx if ops[i].family != "kv_cache")
            kvn = len(idx) - n if comp == "rollout" else 0
            if n or kvn:
                counts[rid][comp] = n + kvn
    body = []
    for ref in plan.rules:
        r = data["rules"][ref.id + 1]
        cells = "".join(f'<td class="num">{counts[ref.id].get(c, "") or ""}</td>' for c in COMPONENTS)
        body.append(f'<tr class="{"keep" if r["keep"] else ""}"><td><code>{esc(r["path"])}</code></td>'
                    f'<td><code>{esc(r["where"] or "")}</code></td><td>{esc(r["source"] or r["text"])}</td>'
                    f'{cells}</tr>')
    d = "".join(f'<td class="num">{counts[DEFAULT].get(c, "") or ""}</td>' for c in COMPONENTS)
    body.append(f'<tr><td><code>default</code></td><td></td><td>{esc(data["rules"][0]["text"])}</td>{d}</tr>')
    head = "".join(f"<th>{LABEL[c]}</th>" for c in COMPONENTS)
    return (f'<table class="rules"><thead><tr><th>rule</th><th>where</th><th>as written</th>{head}</tr></thead>'
            f'<tbody>{"".join(body)}</tbody></table>')


def trace_html(info: dict) -> str:
    o, s = info["trace"]["optimizer"], info["trace"]["sync"]
    lines = [f"Optimizer: master {o['master']}, moments {o['moments']}, params {o['params']} "
             f"(state for: {o['state_for']})",
             f"Sync: {s['moves']}, {s['schedule']}, max staleness {s['max_staleness']}, bridge {s['bridge']}, "
             f"activation {s['activation']}: {s['rebuild']}"]
    if info.get("fp8_recipe"):
        lines.append(f"Transformer Engine recipe: {info['fp8_recipe']}")
    return "".join(f"<li>{esc(x)}</li>" for x in lines)


# -- the page ------------------------------------------------------------------------------------

def _json(data: dict) -> str:
    """JSON safe inside <script>: every '<' escaped (no '</script>', no comment opener; '<' occurs only
    inside strings, where \\u003c is the same character)."""
    text = json.dumps(data, separators=(",", ":"), ensure_ascii=False)
    return text.replace("<", "\\u003c").replace("\u2028", "\\u2028").replace("\u2029", "\\u2029")


def document(title: str, data: dict, body: str) -> str:
    """One self-contained page: `body` (static HTML with a `<div id="grids">`), the data as JSON
    and the script that draws the grids. A Content-Security-Policy forbids every fetch."""
    return (
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; style-src 'unsafe-inline'; "
        "script-src 'unsafe-inline'; img-src data:\">"
        "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
        f"<link rel=\"icon\" href=\"data:,\"><title>{esc(title)}</title><style>{CSS}</style></head>\n"
        f"<body>\n{body}\n<div id=\"tip\" role=\"tooltip\" hidden></div>\n"
        f"<script type=\"application/json\" id=\"pcc-data\">{_json(data)}</script>\n"
        f"<script>{JS}</script>\n</body></html>\n")


def grids_html(data: dict) -> str:
    return ('<div id="grids">' + "".join(
        f'<figure class="grid" data-comp="{c}"><figcaption>{esc(data["components"][c]["label"])}'
        f'<span class="summary"></span></figcaption><div class="cells" aria-busy="true"></div></figure>'
        for c in COMPONENTS) + '<aside id="inspector"><p class="muted">Hover a cell for its tensors, '
        'scheme and rule; click it to keep the details here and list every tensor.</p></aside></div>')


def plots_html(folder: Path, titles: dict[str, str]) -> str:
    """The PNG plots a run or validation wrote into `folder`, inlined (the page fetches nothing)."""
    figures = [f'<figure class="plot"><img alt="{esc(titles.get(p.name, p.stem))}" src="data:image/png;base64,'
               f'{base64.b64encode(p.read_bytes()).decode()}"><figcaption>{esc(titles.get(p.name, p.stem))}'
               f' <code>{esc(p.name)}</code></figcaption></figure>' for p in sorted(folder.glob("*.png"))
               if p.is_file() and not p.is_symlink()]
    return "".join(figures) or '<p class="muted">no plots (matplotlib missing, or --no-plots)</p>'


def run_page(plan: Plan, diagnostics: list, folder: Path, titles: dict[str, str], file: str, what: str) -> str:
    """A run's page (`pcc run`/`pcc validate --format html`): the precision map of the plan that ran
    and the PNG plots the run wrote into `folder`."""
    extra = f'<section><h2>Plots: {esc(what)} in <code>{esc(folder)}</code></h2>{plots_html(folder, titles)}</section>'
    return page(plan, None, [d.to_json() for d in diagnostics], None, file, extra)


def page(plan: Plan, info: dict | None = None, diagnostics: list[dict] | None = None,
         sources: dict[str, str] | None = None, file: str | None = None, extra: str = "") -> str:
    """The precision map of one resolved contract; `extra`: sections after it (a run's plots)."""
    info = info if info is not None else explain(plan)
    data = grid_data(plan, info, sources)
    data["kind"] = "explain"
    body = (f'<header><h1>Precision map: <span class="contract">{esc(info["contract"])}</span></h1>'
            f'<p class="sub">model <b>{esc(info["model"])}</b> · {info["operators"]:,} operators · '
            f'{len(data["rows"])} layer rows x {len(data["families"])} families'
            f'{" · " + esc(file) if file else ""} · pcc explain --format html</p>'
            f'<ul class="trace">{trace_html(info)}</ul></header>'
            f'<section><h2>Legend</h2>{legend_html(data["legend"])}</section>'
            f'<section><h2>Layers x operator families, per component</h2>{grids_html(data)}</section>'
            f'<section><h2>One weight version: bytes per representation</h2>{bytes_chart(info["representations"])}'
            f'</section><section><h2>Rules</h2>{rules_html(plan, data)}</section>'
            f'<section><h2>Diagnostics (pcc check)</h2>{diagnostics_html(diagnostics or [], sources)}</section>'
            + extra)
    return document(f"pcc precision map: {info['contract']}", data, body)


CSS = """
:root{--fg:#1d2733;--muted:#6b7785;--line:#d9dee4;--bg:#fff;--cell:12px}
*{box-sizing:border-box}body{font:13px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;color:var(--fg);
background:var(--bg);margin:0;padding:16px 24px}
h1{font-size:20px;margin:0 0 4px}h2{font-size:15px;margin:22px 0 8px;border-bottom:1px solid var(--line);
padding-bottom:3px}.sub,.muted{color:var(--muted)}.trace{margin:6px 0;padding-left:18px;color:var(--muted)}
code,pre{font:12px/1.4 ui-monospace,SFMono-Regular,Menlo,monospace}
table{border-collapse:collapse}td,th{padding:2px 8px;border-bottom:1px solid var(--line);text-align:left;
vertical-align:top}th{font-weight:600;color:var(--muted)}.num{text-align:right;font-variant-numeric:tabular-nums}
.sw{display:inline-block;width:14px;height:14px;border:1px solid #0003;vertical-align:middle}
.marks{color:var(--muted)}.mark{margin-right:18px;white-space:nowrap}.mark i{display:inline-block;
vertical-align:middle}
#grids{display:flex;flex-wrap:wrap;gap:18px;align-items:flex-start}
.plot{display:inline-block;margin:0 18px 18px 0}.plot img{max-width:640px;border:1px solid var(--line)}
.grid{margin:0}.grid figcaption{font-weight:600;margin-bottom:4px}.summary{display:block;font-weight:400;
color:var(--muted);font-size:12px;max-width:calc(var(--cols,14)*var(--cell) + 60px)}
.cells{display:grid;grid-auto-rows:var(--cell);gap:1px;min-height:40px}
.cells .rl{font-size:9px;line-height:var(--cell);color:var(--muted);text-align:right;padding-right:4px;
white-space:nowrap}
.cells .fh{writing-mode:vertical-rl;transform:rotate(180deg);font-size:10px;color:var(--muted);
white-space:nowrap;height:auto;align-self:end;padding:2px 0;line-height:var(--cell)}
.cells .fh.kvh{color:#7a3b00;font-weight:600}
.cell{position:relative;display:block;width:var(--cell);height:var(--cell);border-radius:1px;cursor:pointer}
.cell:hover,.cell.on{outline:2px solid #111;outline-offset:0;z-index:2}
.cell.keep::after{content:"";position:absolute;right:1px;top:1px;width:4px;height:4px;border-radius:50%;
background:#111;box-shadow:0 0 0 1px #fff}
.cell.kv{border-radius:50%}
.cell.mixed{background-image:linear-gradient(135deg,transparent 50%,var(--c2) 50%)}
.cell.off,.sw.off{background:repeating-linear-gradient(45deg,#eef0f3 0 2px,#d5dae0 2px 4px)!important}
.cell.chg{box-shadow:inset 0 0 0 2px #d0021b}.mark i.chg{box-shadow:inset 0 0 0 2px #d0021b}
.na{display:block;width:var(--cell);height:var(--cell)}
#inspector{flex:1 1 300px;min-width:280px;max-width:560px;border:1px solid var(--line);border-radius:6px;
padding:8px 12px;position:sticky;top:8px;max-height:calc(100vh - 16px);overflow:auto}
#tip{position:fixed;z-index:10;max-width:520px;background:#fff;border:1px solid #9aa5b1;border-radius:6px;
box-shadow:0 4px 16px #0002;padding:6px 10px;pointer-events:none;font-size:12px}
.part{margin:4px 0}.part .rule{color:var(--muted)}.part .src{color:#333}.names{margin:2px 0 0 18px;
color:var(--muted);word-break:break-all}.chgline{color:#d0021b}
.list{margin:4px 0 0 0;padding-left:18px;word-break:break-all}
button{font:inherit;font-size:12px;margin-top:4px}
svg.chart text{font:12px system-ui,sans-serif;fill:var(--fg)}svg.chart .label{text-anchor:end}
svg.chart .dtype{fill:var(--muted)}svg.chart .axis{font-size:10px;fill:var(--muted);text-anchor:middle}
svg.chart .tick{stroke:var(--line)}svg.chart rect{fill:#7f9bb8}svg.chart .sync rect{fill:#d0021b}
.diagnostics{padding-left:18px}.diag.error b{color:#b00020}.diag.warning b{color:#9a6700}
.diag .src{margin:2px 0;background:#f6f8fa;padding:2px 6px;display:inline-block}.hint{color:var(--muted)}
.ok{color:#2e7d32}.rules tr.keep td:first-child::before{content:"\\25CF  ";color:#111}
.changes td,.changes th{font-size:12px}.levels li{list-style:none}.verdict{font-weight:600}
"""

JS = r"""
(function(){
"use strict";
var D=JSON.parse(document.getElementById("pcc-data").textContent);
var tip=document.getElementById("tip"),insp=document.getElementById("inspector");
var LEG={};D.legend.forEach(function(l){LEG[l.name]=l;});
var NC=D.families.length,NR=D.rows.length,pinned=null;
function esc(s){return String(s==null?"":s).replace(/[&<>"']/g,function(c){return "&#"+c.charCodeAt(0)+";";});}
function colour(k){var d=D.decisions[k];return d.s===null?"#e4e7eb":(LEG[d.s]?LEG[d.s].color:"#e4e7eb");}
function names(k){var out=[];D.names[k].forEach(function(g){if(g.length===1){out.push(g[0]);return;}
g[1].forEach(function(r){for(var e=r[0];e<=r[1];e++)out.push(g[0].replace("{e}",e));});});return out;}
function first(k,n){var out=[];var t=D.names[k];for(var a=0;a<t.length&&out.length<n;a++){var g=t[a];
if(g.length===1){out.push(g[0]);continue;}for(var b=0;b<g[1].length&&out.length<n;b++){
for(var e=g[1][b][0];e<=g[1][b][1]&&out.length<n;e++)out.push(g[0].replace("{e}",e));}}return out;}
function summary(comp){var c=D.components[comp],by={},kv=0;c.cells.forEach(function(cell){
cell[2].forEach(function(p){var d=D.decisions[p[0]];if(cell[1]===D.kv){kv+=p[1];return;}
var s=d.s===null?"not run":d.s;by[s]=(by[s]||0)+p[1];});});return {by:by,kv:kv};}
function build(fig){
if(fig.dataset.built)return;var comp=fig.dataset.comp,C=D.components[comp],box=fig.querySelector(".cells");
var at=new Int32Array(NR*NC).fill(-1);C.cells.forEach(function(c,k){at[c[0]*NC+c[1]]=k;});
var chg=(D.changed&&D.changed[comp])||{};
var h=['<span></span>'];D.families.forEach(function(f,k){h.push(k===D.kv&&comp!=="rollout"?'<span></span>':'<span class="fh'+
(k===D.kv?' kvh':'')+'" title="'+esc(f)+'">'+esc(f==="kv_cache"?"KV cache":f)+'</span>');});
for(var r=0;r<NR;r++){h.push('<span class="rl">'+esc(D.rows[r])+'</span>');
for(var c=0;c<NC;c++){var k=at[r*NC+c];if(k<0){h.push('<i class="na"></i>');continue;}
var parts=C.cells[k][2],d0=D.decisions[parts[0][0]],cls="cell",st="background-color:"+colour(parts[0][0]);
if(d0.s===null)cls+=" off";if(c===D.kv)cls+=" kv";
for(var p=0;p<parts.length;p++){if(D.rules[D.decisions[parts[p][0]].r].keep){cls+=" keep";break;}}
if(parts.length>1){var s2=null;for(p=1;p<parts.length;p++){if(D.decisions[parts[p][0]].s!==d0.s){
s2=colour(parts[p][0]);break;}}if(s2){cls+=" mixed";st+=";--c2:"+s2;}}
if(chg[r+","+c])cls+=" chg";
h.push('<b class="'+cls+'" data-k="'+k+'" style="'+st+'"></b>');}}
box.style.gridTemplateColumns="max-content repeat("+NC+",var(--cell))";box.style.gridTemplateRows="max-content";fig.style.setProperty("--cols",NC);
box.innerHTML=h.join("");box.removeAttribute("aria-busy");
var sm=summary(comp),parts2=[];Object.keys(sm.by).sort(function(a,b){return sm.by[b]-sm.by[a];}).forEach(function(s){
parts2.push('<span data-scheme="'+esc(s)+'" data-n="'+sm.by[s]+'">'+esc(s)+' x'+sm.by[s]+'</span>');});
if(D.kv!=null&&comp==="rollout")parts2.push('<span data-kv="'+sm.kv+'">KV cache x'+sm.kv+'</span>');
fig.querySelector(".summary").innerHTML=parts2.join(" · ");
fig.dataset.built="1";ready();}
function ready(){var all=document.querySelectorAll(".grid"),n=0;for(var i=0;i<all.length;i++)if(all[i].dataset.built)n++;
if(n===all.length&&!window.pccReady){window.pccReady=performance.now();document.body.dataset.ready="1";
requestAnimationFrame(function(){setTimeout(function(){window.pccPainted=performance.now();});});}}
function partHtml(comp,p,full){var d=D.decisions[p[0]],r=D.rules[d.r],nm=first(p[2],full?0:3);
var sw=d.s===null?'<i class="sw off"></i> ':'<i class="sw" style="background:'+colour(p[0])+'"></i> ';
var what=d.s===null?"not run":esc(d.s)+(d.g?" ("+esc(d.g)+(d.acc?", accumulate "+esc(d.acc):"")+
(d.out?", output "+esc(d.out):"")+")":"");
var o='<div class="part">'+sw+'<b>'+what+'</b> x'+p[1]+'<div class="rule">'+(r.keep?"keep · ":"")+
'<code>'+esc(r.path)+'</code>'+(r.where?' <code class="where">'+esc(r.where)+'</code>':'')+'</div>'+
(r.source?'<div class="src"><code>'+esc(r.source)+'</code></div>':'<div class="src">'+esc(r.text)+'</div>');
if(!full){o+='<div class="names">'+nm.map(esc).join("<br>")+(p[1]>nm.length?'<br>+'+(p[1]-nm.length)+
' more (click the cell to list all)':'')+'</div>';}
else{o+='<button data-names="'+p[2]+'" data-n="'+p[1]+'">list the '+p[1]+' tensor'+(p[1]>1?'s':'')+'</button>';}
return o+'</div>';}
function changes(comp,r,c){var x=D.changed&&D.changed[comp]&&D.changed[comp][r+","+c];if(!x)return "";
return x.map(function(e){var row=D.diff_rows[comp][e[0]];return '<div class="chgline">changed: '+esc(row.kind)+
' · '+esc(row.from)+' → '+esc(row.to)+' x'+e[1]+'<div class="rule">A: '+esc(row.rules_a.join("; "))+
'<br>B: '+esc(row.rules_b.join("; "))+'</div></div>';}).join("");}
function cellHtml(comp,k,full){var cell=D.components[comp].cells[k],n=0;cell[2].forEach(function(p){n+=p[1];});
return '<div><b>'+esc(D.components[comp].label)+'</b> · layer '+esc(D.rows[cell[0]])+' · <b>'+esc(D.families[cell[1]])+
'</b> · '+n+' tensor'+(n>1?'s':'')+'</div>'+changes(comp,cell[0],cell[1])+
cell[2].map(function(p){return partHtml(comp,p,full);}).join("");}
function place(ev){var w=tip.offsetWidth,h=tip.offsetHeight,x=ev.clientX+14,y=ev.clientY+14;
if(x+w>innerWidth-4)x=Math.max(4,ev.clientX-w-14);if(y+h>innerHeight-4)y=Math.max(4,innerHeight-h-4);
tip.style.left=x+"px";tip.style.top=y+"px";}
var cur=null;
function over(ev){var t=ev.target.closest&&ev.target.closest(".cell");if(!t){tip.hidden=true;cur=null;return;}
var comp=t.closest(".grid").dataset.comp,key=comp+":"+t.dataset.k;if(key!==cur){cur=key;
tip.innerHTML=cellHtml(comp,+t.dataset.k,false);tip.hidden=false;}place(ev);}
function click(ev){var t=ev.target.closest&&ev.target.closest(".cell");if(!t)return;
if(pinned)pinned.classList.remove("on");pinned=t;t.classList.add("on");
var comp=t.closest(".grid").dataset.comp;insp.innerHTML=cellHtml(comp,+t.dataset.k,true);}
insp.addEventListener("click",function(ev){var b=ev.target.closest("button[data-names]");if(!b)return;
var all=names(+b.dataset.names),shown=+(b.dataset.shown||0),next=all.slice(shown,shown+500);
var ul=b.nextElementSibling;if(!ul||ul.tagName!=="OL"){ul=document.createElement("ol");ul.className="list";
b.after(ul);}ul.insertAdjacentHTML("beforeend",next.map(function(s){return "<li><code>"+esc(s)+"</code></li>";}).join(""));
b.dataset.shown=shown+next.length;if(shown+next.length>=all.length)b.remove();else b.textContent="show "+
Math.min(500,all.length-shown-next.length)+" more of "+all.length;});
var figs=document.querySelectorAll(".grid");
figs.forEach(function(f){f.addEventListener("mouseover",over);f.addEventListener("mousemove",function(ev){
if(!tip.hidden)place(ev);});f.addEventListener("mouseleave",function(){tip.hidden=true;cur=null;});
f.addEventListener("click",click);});
var io="IntersectionObserver" in window?new IntersectionObserver(function(es){es.forEach(function(e){
if(e.isIntersecting){build(e.target);io.unobserve(e.target);}});},{rootMargin:"400px"}):null;
figs.forEach(function(f){if(!io||f.getBoundingClientRect().top<innerHeight+400)build(f);else io.observe(f);});
window.pccData=D;
})();
"""
