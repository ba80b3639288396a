"""`pcc diff A B --format html`: B's precision map with the cells that changed marked, and what
the change means downstream (pcc/diff/consequences.py: what to rebuild, which validation levels to
re-run, the baseline, bytes), then every other section of the diff as tables.

The grid is `pcc.plan.html_map`'s, over B's frozen Plan; a cell is marked from the diff report's
own component rows (`by_layer`: where each row's tensors are), and its tooltip says what changed
there (kind, A -> B, the deciding rules on each side). Nothing is compared again here.
"""

from __future__ import annotations

from pcc.diff.render import _title, sections
from pcc.plan import COMPONENTS
from pcc.plan.explain import explain
from pcc.plan.html_map import (bytes_chart, diagnostics_html, document, esc, grid_data, grids_html, human_bytes,
                               legend_html)

ROW_KEYS = ("family", "kind", "from", "to", "tensors", "layers", "rules_a", "rules_b")


def changed_cells(report: dict, data: dict) -> tuple[dict, dict]:
    """Per component, cell "row,column" -> [[diff row, tensors], ...], and the rows themselves."""
    row = {x: k for k, x in enumerate(data["layers"])}
    col = {f: k for k, f in enumerate(data["families"])}
    cells: dict[str, dict[str, list]] = {}
    rows: dict[str, list[dict]] = {}
    for comp in COMPONENTS:
        mine: dict[str, list] = {}
        for j, r in enumerate(report["components"][comp]):
            for layer, n in r["by_layer"]:
                if layer in row and r["family"] in col:
                    mine.setdefault(f"{row[layer]},{col[r['family']]}", []).append([j, n])
        cells[comp] = mine
        rows[comp] = [{k: r[k] for k in ROW_KEYS} for r in report["components"][comp]]
    return cells, rows


def _list(items: list[str]) -> str:
    return "".join(f"<li>{esc(x)}</li>" for x in items)


def consequences_html(c: dict) -> str:
    a = c["rollout_artifact"]
    out = ['<ul class="consequences">']
    if a["rebuild"]:
        groups = "".join(f'<tr><td>{esc(g["family"])}</td><td>{esc(g["from"])}</td><td>{esc(g["to"])}</td>'
                         f'<td class="num">{g["tensors"]}</td><td>{esc(g["layers"])}</td></tr>' for g in a["groups"])
        table = (f'<table class="changes"><thead><tr><th>family</th><th>A</th><th>B</th><th>tensors</th>'
                 f'<th>layers</th></tr></thead><tbody>{groups}</tbody></table>' if groups else "")
        out.append(f'<li data-consequence="rollout_artifact" class="yes"><b>Rollout artifact: rebuild '
                   f'{a["tensors"]:,} tensors</b><ul>{_list(a["why"])}</ul>{table}</li>')
    else:
        out.append('<li data-consequence="rollout_artifact" class="no"><b>Rollout artifact:</b> unchanged</li>')
    for key, title in (("adapter_mapping", "Adapter mapping"), ("trainer_precision_file", "Trainer precision file")):
        e = c[key]
        files = f' <code>{esc(", ".join(e["files"]))}</code>' if e.get("files") else ""
        out.append(f'<li data-consequence="{key}" class="{"yes" if e["changes"] else "no"}"><b>{title}:</b> '
                   + (f'changes{files}<ul>{_list(e["why"])}</ul>' if e["changes"] else "unchanged") + "</li>")
    b = c["baseline"]
    out.append(f'<li data-consequence="baseline" class="{"yes" if b["invalidated"] else "no"}"><b>Step-0 mismatch '
               f'baseline:</b> ' + (f'invalidated, measure it again<ul>{_list(b["why"])}</ul>' if b["invalidated"]
                                    else "still holds") + "</li>")
    out.append("</ul>")
    levels = c["validation_levels"]
    if levels:
        items = "".join(f'<li data-level="{v["level"]}"><label><input type="checkbox"> <b>{v["level"]}. '
                        f'{esc(v["name"])}</b></label><details><summary>{len(v["why"])} reason'
                        f'{"s" if len(v["why"]) > 1 else ""}</summary><ul>{_list(v["why"])}</ul></details></li>'
                        for v in levels)
        out.append(f'<h3>Validation levels to re-run</h3><ul class="levels">{items}</ul>')
    else:
        out.append('<p class="ok">No validation level to re-run.</p>')
    if c["bytes"]:
        rows = "".join(f'<tr><td>{esc(x["name"])}</td><td class="num">{human_bytes(x["a"])}</td>'
                       f'<td class="num">{human_bytes(x["b"])}</td><td class="num">'
                       f'{"+" if (x["delta"] or 0) > 0 else ""}{human_bytes(x["delta"])}</td></tr>' for x in c["bytes"])
        out.append(f'<h3>Memory and bytes per sync</h3><table class="changes"><thead><tr><th>representation</th>'
                   f'<th>A</th><th>B</th><th>delta</th></tr></thead><tbody>{rows}</tbody></table>')
    return "".join(out)


def sections_html(report: dict) -> str:
    out = []
    for title, header, rows, lines in sections(report):
        if title == "Consequences":
            continue
        table = ""
        if rows:
            table = (f'<table class="changes"><thead><tr>{"".join(f"<th>{esc(h)}</th>" for h in header)}</tr></thead>'
                     f'<tbody>{"".join("<tr>" + "".join(f"<td>{esc(x)}</td>" for x in r) + "</tr>" for r in rows)}'
                     f'</tbody></table>')
        if lines and lines[0].endswith(":"):
            detail = f'<details><summary>{esc(lines[0][:-1])}</summary><ul>{_list(lines[1:])}</ul></details>'
        else:
            detail = f"<ul>{_list(lines)}</ul>" if lines else ""
        out.append(f'<section class="diff-section"><h3>{esc(title)}</h3>{table}{detail}</section>')
    return "".join(out) or '<p class="ok">No semantic change.</p>'


def page(report: dict, ca, cb) -> str:
    """The diff page: `ca`, `cb` the two checked sides (pcc.plan.Compiled) `report` compared."""
    pb = cb.plan
    info = explain(pb)
    data = grid_data(pb, info, cb.sources)
    data["kind"] = "diff"
    data["changed"], data["diff_rows"] = changed_cells(report, data)
    n = sum(len(v) for v in data["changed"].values())
    verdict = (f'semantic changes: {n} cell{"s" if n != 1 else ""} of the map changed' if report["changed"]
               else "no semantic change")
    diags = [d.to_json() for d in ca.diagnostics] + [d.to_json() for d in cb.diagnostics]
    sources = {**ca.sources, **cb.sources}
    notes = "".join(f'<li>{esc(x)}</li>' for x in report.get("notes", []))
    body = (f'<header><h1>pcc diff</h1><p class="sub">{esc(_title(report))}</p>'
            f'<p class="verdict" data-changed="{int(bool(report["changed"]))}">{esc(verdict)}</p>'
            + (f'<ul class="notes">{notes}</ul>' if notes else "") + '</header>'
            f'<section><h2>Consequences</h2>{consequences_html(report["consequences"])}</section>'
            f'<section><h2>B\'s precision map, changed cells marked</h2>'
            f'{legend_html(data["legend"], (("cell chg", "changed from A (hover: what and why)"),))}'
            f'{grids_html(data)}</section>'
            f'<section><h2>Every change</h2>{sections_html(report)}</section>'
            f'<section><h2>B: bytes per representation</h2>{bytes_chart(info["representations"])}</section>'
            f'<section><h2>Diagnostics (pcc check, both sides)</h2>{diagnostics_html(diags, sources)}</section>')
    return document(f"pcc diff: {report['a']['contract']} -> {report['b']['contract']}", data, body)
