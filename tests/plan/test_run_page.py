"""`pcc run|validate --format html`: DIR/index.html is the contract's precision map with the PNG plots
the run wrote, inlined (the page fetches nothing), and a run started again with --force replaces it."""

from __future__ import annotations

import base64
import re
from pathlib import Path

import pytest

from pcc.cli import main

ROOT = Path(__file__).resolve().parents[2]


def test_a_run_page_inlines_every_plot_the_run_wrote(tmp_path):
    pytest.importorskip("matplotlib")
    out = tmp_path / "run"
    assert main(["run", str(ROOT / "contracts" / "tiny_cpu.prec"), "--steps", "2", "-o", str(out),
                 "--format", "html"]) == 0
    html = (out / "index.html").read_text()
    pngs = sorted(p.name for p in out.glob("*.png"))
    assert pngs and all(f"<code>{p}</code>" in html for p in pngs)
    images = re.findall(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', html)
    assert sorted(base64.b64decode(i) for i in images) == sorted(p.read_bytes() for p in out.glob("*.png"))
    assert "Precision map" in html and "default-src 'none'" in html
    assert main(["run", str(ROOT / "contracts" / "tiny_cpu.prec"), "--steps", "2", "-o", str(out), "--force"]) == 0
    assert not (out / "index.html").exists()  # --force starts the run again: no stale page


def test_a_validation_page_holds_the_ladders_plots(tmp_path):
    pytest.importorskip("matplotlib")
    out = tmp_path / "val"
    main(["validate", str(ROOT / "contracts" / "tiny_cpu.prec"), "--levels", "4", "-o", str(out), "--format", "html"])
    html = (out / "index.html").read_text()
    pngs = sorted(p.name for p in out.glob("*.png"))
    assert "dlogp_hist.png" in pngs and all(f"<code>{p}</code>" in html for p in pngs)
    assert "|dlogp| histogram (level 4)" in html
