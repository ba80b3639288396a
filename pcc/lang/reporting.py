"""The CI forms of a verb's diagnostics (`--output-format github|sarif`, docs/cli.md), as ruff writes
them: GitHub Actions workflow commands, one line each, so a pull request shows each error on its line;
and one SARIF 2.1.0 document for code-scanning tools, its rules from the table of codes.

Both take the diagnostics as the `--json` envelope holds them (dicts: code, severity, message and, when
known, file, line, col, path, hint), so every verb reports through one shape.
"""

from __future__ import annotations

from pathlib import PurePath
from urllib.parse import quote

from pcc.lang.codes import CODES

SARIF_SCHEMA = "https://json.schemastore.org/sarif-2.1.0.json"


def _text(d: dict) -> str:
    """The message, with the contract path when there is no line to point at, and the hint."""
    text = d["message"]
    if d.get("path") and d.get("line") is None:
        text = f"{d['path']}: {text}"
    return text + (f"\n= hint: {d['hint']}" if d.get("hint") else "")


def _escape(text: str, prop: bool = False) -> str:
    """Workflow-command escaping (@actions/core): data escapes % CR LF; a property also : and ,."""
    text = text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")
    return text.replace(":", "%3A").replace(",", "%2C") if prop else text


def github(diagnostics: list[dict]) -> str:
    """`::error file=F,line=L,col=C,title=PCCnnn::message`, one line per diagnostic (warnings as ::warning)."""
    lines = []
    for d in diagnostics:
        props = [f"{key}={_escape(str(d[field]), prop=True)}"
                 for key, field in (("file", "file"), ("line", "line"), ("col", "col")) if d.get(field) is not None]
        props.append(f"title={_escape(d['code'] or 'pcc', prop=True)}")
        level = "warning" if d["severity"] == "warning" else "error"
        lines.append(f"::{level} {','.join(props)}::{_escape(_text(d))}")
    return "".join(line + "\n" for line in lines)


def _uri(file: str) -> str:
    path = PurePath(file)
    return path.as_uri() if path.is_absolute() else quote(path.as_posix())


def sarif(diagnostics: list[dict], version: str) -> dict:
    """One SARIF 2.1.0 log: a run of tool `pcc` whose rules are the codes its results name (from
    pcc.lang.codes); a diagnostic with no code (a usage error, an unreadable input) has no ruleId."""
    named = sorted({d["code"] for d in diagnostics if d.get("code")})
    index = {code: i for i, code in enumerate(named)}
    rules = []
    for code in named:
        entry = CODES.get(code)
        rule = {"id": code, "shortDescription": {"text": entry.title if entry else code}}
        if entry:
            rule["defaultConfiguration"] = {"level": entry.severity}
        rules.append(rule)
    results = []
    for d in diagnostics:
        result = {"level": "warning" if d["severity"] == "warning" else "error", "message": {"text": _text(d)}}
        if d.get("code"):
            result = {"ruleId": d["code"], "ruleIndex": index[d["code"]]} | result
        if d.get("file"):
            location: dict = {"artifactLocation": {"uri": _uri(d["file"])}}
            if d.get("line") is not None:
                location["region"] = {"startLine": d["line"], "startColumn": d.get("col") or 1}
            result["locations"] = [{"physicalLocation": location}]
        results.append(result)
    return {"$schema": SARIF_SCHEMA, "version": "2.1.0",
            "runs": [{"tool": {"driver": {"name": "pcc", "version": version, "rules": rules}}, "results": results}]}
