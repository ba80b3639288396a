"""The human report: one table of levels, then, for each level that failed, what it compares,
what its failure localizes (seed Table 6), what this run's figures point at, and what to look
at next (Section 6.1)."""

from __future__ import annotations

PLOT_TITLES = {"dlogp_hist.png": "|dlogp| histogram (level 4)", "dlogp_by_position.png": "|dlogp| by position",
               "routes_by_layer.png": "route agreement by layer (level 5)", "version_age.png": "version age (level 8)"}


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return "not measured" if v is None else str(v)


def _key(lv: dict) -> str:
    bits = [f"{c['metric']} {_fmt(c['observed'])}" for c in lv["checks"] if c["source"] != "pcc validate"]
    return "; ".join(bits[:2]) or "; ".join(f"{c['metric']} {_fmt(c['observed'])}" for c in lv["checks"][:1])


def markdown(r: dict) -> str:
    done = [lv for lv in r["levels"] if lv["status"] != "skipped"]
    verdict = "PASSED" if r["ok"] else f"FAILED at level {r['first_failure']}"
    lines = [f"# pcc validate: {r['contract'] or r['target']} on {r['model'] or '?'}: {verdict}", "",
             f"- target: `{r['target']}`" + (f" (re-resolved on `{r['model_override']}`)" if r["model_override"] else ""),
             f"- engine: {r['engine']}; regime: {r['regime']}; run directory: `{r['out']}`"]
    if r["injected_faults"]:
        lines.append(f"- injected faults (ladder self-test): {', '.join(r['injected_faults'])}")
    l1 = next((lv for lv in done if lv["level"] == 1), None)
    if l1 and "versions" in l1["figures"]:
        vs = ", ".join(f"{k} {v}" for k, v in l1["figures"]["versions"].items() if v)
        lines.append(f"- versions: {vs}")
    lines += ["", "| level | name | status | figures | seconds |", "|---|---|---|---|---|"]
    for lv in r["levels"]:
        status = {"pass": "pass", "fail": "**FAIL**", "error": "**ERROR**", "skipped": "skipped"}[lv["status"]]
        lines.append(f"| {lv['level']} | {lv['name']} | {status} | {_key(lv) if lv['checks'] else ''} | "
                     f"{lv['seconds']:.1f} |")
    for lv in done:
        if lv["status"] == "pass":
            continue
        lines += ["", f"## Level {lv['level']}, {lv['name']}: {lv['status'].upper()}", ""]
        if lv["compares"]:
            lines.append(f"Compares: {lv['compares']}.")
        if lv["localizes"]:
            lines.append(f"A failure here localizes: **{lv['localizes']}**.")
        if lv["error"]:
            lines += ["", f"The level could not finish: `{lv['error']}`"]
        if lv["checks"]:
            lines += ["", "| check | bound | observed | ok | source |", "|---|---|---|---|---|"]
            for c in lv["checks"]:
                ok = {True: "yes", False: "**no**", None: "not measured"}[c["ok"]]
                lines.append(f"| {c['metric']} | {c['op']} {_fmt(c['value'])} | {_fmt(c['observed'])} | {ok} | "
                             f"{c['source']} |")
        if lv["findings"]:
            lines += ["", "What this run points at:"] + [f"- {f}" for f in lv["findings"]]
        if lv["look"]:
            lines += ["", "Look next:"] + [f"- {x}" for x in lv["look"]]
    if r["plots"]:
        lines += ["", "## Plots", ""] + [f"![{PLOT_TITLES.get(p, p)}]({p})" for p in r["plots"]]
    lines += ["", "Figures per level, the checks and the plotted series: `report.json`."]
    return "\n".join(lines) + "\n"
