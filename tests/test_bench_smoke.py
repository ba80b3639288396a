"""The bench scripts run: each, at its smallest, prints its table and the machine lines (a bench that
stops, as bench/compile.py did when a target did not apply to a contract, is caught here, not when
someone re-measures). What they measure is their own business (docs/*.md "Speed")."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from pcc import fused

BENCH = Path(__file__).resolve().parents[1] / "bench"


def _run(script: str, *args: str) -> str:
    out = subprocess.run([sys.executable, str(BENCH / script), *args], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "cores (" in out.stdout and "load average" in out.stdout and "after: " in out.stdout
    return out.stdout


def test_compile_bench_skips_targets_a_contract_has_not():
    out = _run("compile.py", "--repeat", "1", "--contracts", "*/tiny_cpu.prec")
    rows = {line.split()[0]: line.split() for line in out.splitlines() if "tiny_cpu" in line}
    assert set(rows) == {"fsdp/tiny_cpu", "verl/tiny_cpu", "vllm/tiny_cpu"}
    assert all("-" in r for r in rows.values())  # e.g. no Megatron lowering of an FSDP contract


def test_quantize_bench_compares_codes_of_every_format():
    out = _run("quantize.py", "--sizes", "256", "--rounds", "1")
    rows = [line.split() for line in out.splitlines() if line.split()[:1] in
            (["fp8_block"], ["mxfp8"], ["mxfp4"], ["nvfp4"], ["int4_g128"])]
    assert len(rows) == 5 and all(r[-1] == "True" for r in rows)  # pcc's codes are the straightforward ones


def test_kernel_bench_times_the_reads_around_the_kernel():
    if not fused.available():
        pytest.skip("bench/kernel.py times pcc.fused's kernel, which needs llvmlite")
    out = _run("kernel.py", "--experts", "24", "--rounds", "1")
    rows = [line for line in out.splitlines() if line.startswith(("kernel", "pread"))]
    assert len(rows) == 5 and all(float(r.split()[-1]) > 0 for r in rows)


def test_resolve_bench_beside_compressed_tensors():
    pytest.importorskip("compressed_tensors")
    out = _run("resolve.py", "--layers", "2", "--rounds", "1")
    assert any(line.split()[:1] == ["2"] and line.endswith("x") for line in out.splitlines())


def test_html_map_bench_renders_both_pages(tmp_path):
    import os
    import shutil

    if not any(shutil.which(b) for b in ("chromium", "chromium-browser", "google-chrome")):
        if os.environ.get("CI") == "true":
            pytest.fail("chromium is not installed (.ci/run installs it): bench/html_map.py cannot run")
        pytest.skip("chromium is not installed (Debian: apt-get install -y chromium): bench/html_map.py needs it")
    shot = tmp_path / "map.png"
    tiny = str(BENCH.parent / "contracts" / "tiny_cpu.prec")
    out = _run("html_map.py", "--repeat", "1", "--contract", tiny, "--screenshot", str(shot))
    rows = {line.split("  ")[0] for line in out.splitlines()}
    assert {"precision map (pcc)", "per-tensor table (baseline)"} <= rows and "render (painted): " in out
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_lsp_bench_beside_a_check_process():
    out = _run("lsp.py", "--rounds", "1", "contracts/tiny_cpu.prec")
    assert any(line.startswith("tiny_cpu.prec") and line.count("s") >= 2 for line in out.splitlines())


def test_convert_bench_prints_both_floors_for_both_checkpoints():
    pytest.importorskip("transformers")  # the MoE checkpoint is written by its save_pretrained
    out = _run("convert.py", "--tiny", "--rounds", "1", "--skip", "straightforward")
    tables = out.split("\nLLaMA")[1].split("\nQwen3-MoE")
    assert len(tables) == 2
    for table in tables:
        rows = {line[:36].strip(): line[36:].split() for line in table.splitlines()[2:] if line[:1] not in ("", "a")}
        assert rows["physical floor (read, write out)"][2] == "1.00"  # x physical
        assert rows["copy floor (safetensors)"][3] == "1.00"  # x copy
        assert rows["physical floor (read, write out)"][4] == "1.00"  # x phys, rounds (paired by round)
        assert any(k.startswith("pcc convert") for k in rows) and rows["llm-compressor model_free_ptq"]
        if fused.available():  # converted from the bundle's converter plan (the bench fails where it was not)
            assert rows["the same, BUNDLE (compiled for it)"]


def test_convert_benchs_again_row_takes_its_plan_whatever_ran_between():
    """On odd rounds the order is reversed: the torch row, a first conversion too, runs between the first and
    the again rows, and must not empty the plans the again row takes (the bench stops where it is not taken)."""
    if not fused.available():
        pytest.skip("no converter plan is kept without the kernels")
    out = _run("convert.py", "--tiny", "--rounds", "2", "--only", "llama", "--skip", "straightforward",
               "llm-compressor")
    assert "  the same again (its plan kept)" in out and "  the same, PCC_FUSED=0 (torch)" in out


def test_convert_bench_shows_where_pccs_time_goes():
    if not fused.available():
        pytest.skip("--threads times pcc.convert.fast, which needs llvmlite")
    out = _run("convert.py", "--tiny", "--threads", "--rounds", "1", "--only", "llama")
    head, row = out.split("\nLLaMA")[1].splitlines()[1:3]
    times = dict(zip(head.replace("CPU s", "CPU").split(), map(float, row.split())))
    assert {"main", "write_all", "pcc-fast", "pcc-hash", "pcc-disk"} <= set(times)
    assert 0 < times["start"] < times["seconds"] and times["disk"] > 0 and times["pcc-fast"] > 0


def test_convert_bench_shows_where_the_first_conversion_compiles():
    out = _run("convert.py", "--tiny", "--compile", "--rounds", "1", "--only", "moe")
    rows = {line[:52].strip(): float(line[52:].split()[0]) for line in out.splitlines() if line.startswith("  ")}
    assert {"import pydantic, lark, PyYAML", "lower every target the contract names", "total"} <= set(rows)
    assert rows["total"] == pytest.approx(sum(v for k, v in rows.items() if k != "total"), abs=len(rows))


def test_model_code_bench_times_both_model_codes():
    pytest.importorskip("transformers")
    from pcc.runtime import hf_model

    if hf_model.unavailable():
        pytest.skip(hf_model.unavailable())
    out = _run("model_code.py", "--rounds", "1", "--models", "tiny_dense")
    rows = [line.split() for line in out.splitlines() if line.startswith("tiny_dense")]
    assert len(rows) == 3 and all(float(r[-1]) > 0 for r in rows)
