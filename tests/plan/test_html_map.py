"""The precision map (`pcc explain --format html`, `pcc diff --format html`): what the page embeds
equals what `pcc explain --json` (and the diff report) say, for the shipped contracts; the page is
one self-contained file written through pcc's one writer. The browser side is
test_html_map_browser.py."""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

import pytest

from pcc.cli import main

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "contracts").glob("*.prec"))
TINY = "contracts/tiny_cpu.prec"


def page_data(text: str) -> dict:
    m = re.search(r'<script type="application/json" id="pcc-data">(.*?)</script>', text, re.S)
    assert m, "the page embeds its data"
    return json.loads(m.group(1))


def explain_and_page(capsys, tmp_path, contract: str) -> tuple[dict, str]:
    out = tmp_path / "map.html"
    assert main(["explain", str(ROOT / contract), "--json", "--format", "html", "-o", str(out)]) == 0
    env = json.loads(capsys.readouterr().out)
    assert env["ok"] and env["command"] == "explain"
    return env["result"], out.read_text()


def cell_counts(data: dict, comp: str) -> tuple[Counter, int]:
    """Operators per scheme in one component's grid (the KV cache column apart), and the KV cache's."""
    by, kv = Counter(), 0
    for _, col, parts in data["components"][comp]["cells"]:
        for k, n, _ in parts:
            if col == data["kv"]:
                kv += n
            else:
                by[data["decisions"][k]["s"] or "not run"] += n
    return by, kv


@pytest.mark.parametrize("contract", SHIPPED)
def test_the_legend_and_cell_counts_are_explains(contract, capsys, tmp_path):
    info, text = explain_and_page(capsys, tmp_path, contract)
    data = page_data(text)
    assert [{k: v for k, v in e.items() if k != "color"} for e in data["legend"]] == info["schemes"]
    legend = {e["name"] for e in data["legend"]}
    for comp in ("rollout", "fprop", "dgrad", "wgrad"):
        want = Counter()
        for part in info["trace"][comp]:
            want[part["scheme"]] += part["operators"]
        got, kv = cell_counts(data, comp)
        nobody = got.pop("not run", 0)
        assert got == want, comp
        assert set(got) <= legend
        # every operator is in a cell once: the trace's, the ones a component does not run, the KV cache
        weights = sum(r["tensors"] for r in info["coverage"] if r["family"] != "kv_cache")
        kv_want = sum(r["tensors"] for r in info["coverage"] if r["family"] == "kv_cache")
        assert sum(want.values()) + nobody == weights, comp
        assert kv == (kv_want if comp == "rollout" else 0), comp
    # the rules the trace names are the page's, each with its file:line (a rule `extends` brings: its own file)
    rules = {r["path"]: r for r in data["rules"]}
    for comp in ("rollout", "fprop", "dgrad"):
        for part in info["trace"][comp]:
            if part["rule"]:
                assert re.fullmatch(r"(.*/)?contracts/[\w/]+\.prec:\d+", rules[part["rule"]]["where"]), part
    # the chart is explain's representations, bytes exact
    shown = dict(re.findall(r'<g class="rep(?: sync)?" data-name="([^"]+)" data-bytes="(\d+)"', text))
    assert {k: int(v) for k, v in shown.items()} == {r["name"]: r["bytes"] for r in info["representations"]}


def test_a_cell_says_which_rule_decided_it_and_its_tensors(capsys, tmp_path):
    _, text = explain_and_page(capsys, tmp_path, "contracts/glm52_fp8_rollout.prec")
    data = page_data(text)
    row, col = data["rows"].index("3"), data["families"].index("experts.gate_up")
    cell = next(c for c in data["components"]["rollout"]["cells"] if c[:2] == [row, col])
    [(k, n, names)] = cell[2]
    d = data["decisions"][k]
    rule = data["rules"][d["r"]]
    assert (d["s"], d["g"], rule["path"], rule["source"]) == ("fp8_block", "real", "rollout.rules[0]",
                                                               "linear : fp8_block")
    assert rule["where"] == f"{ROOT}/contracts/glm52_fp8_rollout.prec:17"
    assert n == 2 * 256  # gate and up of 256 routed experts, folded over the expert index
    assert [g[0] for g in data["names"][names]] == ["model.layers.3.mlp.experts.{e}.gate_proj.weight",
                                                    "model.layers.3.mlp.experts.{e}.up_proj.weight"]
    assert all(g[1] == [[0, 255]] for g in data["names"][names])
    kv = next(c for c in data["components"]["rollout"]["cells"] if c[:2] == [row, data["kv"]])
    assert data["decisions"][kv[2][0][0]]["s"] == "fp8_e4m3"
    keep = next(c for c in data["components"]["rollout"]["cells"] if c[:2] == [row, data["families"].index("router")])
    assert data["rules"][data["decisions"][keep[2][0][0]]["r"]]["keep"]
    assert not any(c[1] == data["kv"] for c in data["components"]["fprop"]["cells"])  # the KV cache: rollout only


def test_lora_wgrad_is_the_adapter_and_the_base_does_not_run(capsys, tmp_path):
    info, text = explain_and_page(capsys, tmp_path, "contracts/qwen38_nvfp4_lora.prec")
    data = page_data(text)
    got, _ = cell_counts(data, "wgrad")
    assert got["bf16"] == info["trace"]["wgrad"][0]["operators"] and got["not run"] > 0
    rules = {data["rules"][d["r"]]["path"] for d in data["decisions"] if d["c"] == "wgrad"}
    assert rules == {"trainable", "not run"}


def test_the_page_is_self_contained(capsys, tmp_path):
    _, text = explain_and_page(capsys, tmp_path, TINY)
    assert text.startswith("<!doctype html>") and "default-src 'none'" in text
    assert not re.search(r"<(script|img|iframe)[^>]*\ssrc=|<link[^>]*stylesheet|@import|url\(\s*['\"]?https?:", text)
    assert re.findall(r"https?://[^\s\"'<]+", text) == ["http://www.w3.org/2000/svg"]  # the SVG namespace only


def test_embedded_json_cannot_close_its_script():
    from pcc.plan.html_map import _json

    text = _json({"x": "</script><script>alert(1)</script><!--", "y": "\u2028"})
    assert "</" not in text and "<!--" not in text and json.loads(text)["x"].startswith("</script>")


def test_explain_writes_text_or_html_to_out_or_stdout(capsys, tmp_path):
    f = str(ROOT / TINY)
    assert main(["explain", f]) == 0
    shown = capsys.readouterr().out
    assert main(["explain", f, "-o", str(tmp_path / "e.txt")]) == 0
    assert capsys.readouterr().out == "" and (tmp_path / "e.txt").read_text() == shown
    assert main(["explain", f, "--format", "html"]) == 0
    assert capsys.readouterr().out.startswith("<!doctype html>")
    assert main(["explain", f, "--format", "html", "--out", str(tmp_path / "m.html")]) == 0
    assert capsys.readouterr().out == ""
    assert page_data((tmp_path / "m.html").read_text())["contract"] == "tiny-cpu"
    assert main(["explain", f, "--json"]) == 0
    plain = json.loads(capsys.readouterr().out)["result"]
    assert main(["explain", f, "--json", "--format", "html", "-o", str(tmp_path / "m2.html")]) == 0
    assert json.loads(capsys.readouterr().out)["result"] == plain
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_an_unwritable_out_is_pcc709(capsys, tmp_path):
    (tmp_path / "file").write_text("")
    assert main(["explain", str(ROOT / TINY), "--format", "html", "-o", str(tmp_path / "file" / "m.html"),
                 "--json"]) == 1
    assert json.loads(capsys.readouterr().out)["diagnostics"][-1]["code"] == "PCC709"


def test_diff_html_marks_the_changed_cells_and_lists_the_consequences(capsys, tmp_path):
    a, b = str(ROOT / "tests/diff/pairs/tiny_a.prec"), str(ROOT / "tests/diff/pairs/tiny_attn_kv.prec")
    assert main(["diff", a, b, "--json"]) == 1
    report = json.loads(capsys.readouterr().out)["result"]
    out = tmp_path / "d.html"
    assert main(["diff", a, b, "--format", "html", "-o", str(out)]) == 1
    assert capsys.readouterr().out == ""
    text = out.read_text()
    data = page_data(text)
    for comp, rows in report["components"].items():
        marked = sum(n for cell in data["changed"][comp].values() for _, n in cell)
        assert marked == sum(r["tensors"] for r in rows), comp
        assert [r["kind"] for r in data["diff_rows"][comp]] == [r["kind"] for r in rows]
    assert any(data["changed"].values())
    for level in report["consequences"]["validation_levels"]:
        assert f'data-level="{level["level"]}"' in text
    assert 'data-consequence="rollout_artifact"' in text
    # an unchanged pair: exit 0, a page that says so
    assert main(["diff", a, a, "--format", "html", "-o", str(out)]) == 0
    assert page_data(out.read_text())["changed"] == {c: {} for c in ("rollout", "fprop", "dgrad", "wgrad")}
    assert "no semantic change" in out.read_text()


def test_diff_out_writes_every_format(capsys, tmp_path):
    a, b = str(ROOT / "tests/diff/pairs/tiny_a.prec"), str(ROOT / "tests/diff/pairs/tiny_attn_kv.prec")
    assert main(["diff", a, b, "--format", "markdown"]) == 1
    shown = capsys.readouterr().out
    assert main(["diff", a, b, "--format", "markdown", "-o", str(tmp_path / "d.md")]) == 1
    assert capsys.readouterr().out == "" and (tmp_path / "d.md").read_text() == shown
