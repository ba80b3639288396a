"""pcc.convert.fast, the converter without torch (block FP8 of BF16/float32 weights, the rest copied as stored):
taken where it applies, it never imports torch, writes the torch pipeline's bytes (also
tests/convert/test_convert_bytes.py) and fails with its errors, word for word."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from test_convert_bytes import _contract, make_source

from pcc import fused
from pcc.cli import main
from pcc.convert import fast, run, shards

pytestmark = pytest.mark.skipif(os.environ.get("PCC_FUSED") == "0", reason="PCC_FUSED=0 turns the fused kernel off")


@pytest.fixture
def bf16(tmp_path):
    src = tmp_path / "src"
    make_source(src, "bf16")
    return src, _contract(tmp_path, "fp8", "fp8_block")


def _convert(src, contract, dst, *extra):
    return main(["convert", str(contract), "--from", str(src), "--to", str(dst), "--no-calibrate", *extra])


def _files(d: Path) -> dict:
    return {f.name: f.read_bytes() for f in sorted(d.glob("*.safetensors"))}


def _spy(monkeypatch) -> list:
    taken = []
    real = fast.pipeline
    monkeypatch.setattr(fast, "pipeline", lambda *a: taken.append(1) or real(*a))
    return taken


def test_a_conversion_imports_no_torch(bf16, tmp_path):
    src, contract = bf16
    code = ("import sys\nfrom pcc.convert.run import convert\n"
            f"convert({str(contract)!r}, {str(src)!r}, {str(tmp_path / 'dst')!r})\n"
            "print(json.dumps(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.'))))")
    out = subprocess.run([sys.executable, "-c", "import json\n" + code], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout.splitlines()[-1]) == []


def test_the_gc_is_paused_while_compiling_and_given_back(bf16, tmp_path, monkeypatch):
    """run._start_up: no cyclic collection while the contract compiles, its objects frozen for the pipeline, and
    the GC as it was afterwards, also after an error; a caller's paused GC stays paused."""
    import gc

    src, contract = bf16
    seen = []
    real = run.load_plan
    monkeypatch.setattr(run, "load_plan", lambda *a, **k: seen.append(gc.isenabled()) or real(*a, **k))
    real_pipeline = fast.pipeline
    monkeypatch.setattr(fast, "pipeline", lambda *a: seen.append(gc.get_freeze_count() > 0) or real_pipeline(*a))
    assert _convert(src, contract, tmp_path / "dst") == 0
    assert seen == [False, True] and gc.isenabled() and gc.get_freeze_count() == 0
    assert _convert(src, contract, tmp_path / "dst") == 1  # exists: refused after the compile
    assert gc.isenabled() and gc.get_freeze_count() == 0
    gc.disable()
    try:
        assert _convert(src, contract, tmp_path / "again") == 0
        assert not gc.isenabled() and gc.get_freeze_count() == 0
    finally:
        gc.enable()


@pytest.mark.parametrize("piece, slot", [(None, None), (4096, None), (4096, 8192)])
def test_the_torch_pipelines_bytes(bf16, tmp_path, monkeypatch, piece, slot):
    src, contract = bf16
    taken = _spy(monkeypatch)
    if piece:
        monkeypatch.setattr(run, "PIECE_BYTES", piece)
    if slot:  # the writer's ring of 8 KiB slots: spans wrap its end and are bounced; reads of 4 KiB at a time
        monkeypatch.setattr(shards, "STAGE_BYTES", slot)
        monkeypatch.setattr(fast, "_READ_BYTES", 4096)
    assert _convert(src, contract, tmp_path / "fast", "--max-shard-size", "2MB") == 0 and taken
    monkeypatch.setattr(fast, "eligible", lambda *a: None)
    assert _convert(src, contract, tmp_path / "torch", "--max-shard-size", "2MB") == 0
    assert _files(tmp_path / "fast") == _files(tmp_path / "torch") and len(_files(tmp_path / "fast")) > 3


def _error(capsys, src, contract, dst) -> str:
    assert _convert(src, contract, dst) == 1
    return capsys.readouterr().err


def _with(src: Path, name: str, flat: int, value: float) -> None:
    """Source tensor `name` with `value` at flat element `flat` (BF16 bits written in place)."""
    import numpy as np

    index = json.loads((src / "model.safetensors.index.json").read_text())["weight_map"]
    path = src / index[name]
    raw = bytearray(path.read_bytes())
    n = int.from_bytes(raw[:8], "little")
    begin = json.loads(raw[8:8 + n])[name]["data_offsets"][0] + 8 + n
    bits = np.array([value], dtype=np.float32).view(np.uint32) >> 16
    raw[begin + 2 * flat:begin + 2 * flat + 2] = int(bits[0]).to_bytes(2, "little")
    path.write_bytes(bytes(raw))


@pytest.mark.parametrize("name, flat, piece", [
    ("model.embed_tokens.weight", 5000, 1024),  # copied as stored, in pieces
    ("model.layers.1.self_attn.q_proj.weight", 300 * 384 + 7, None),  # quantized whole
    ("model.layers.2.mlp.experts.3.up_proj.weight", 200 * 384 + 300, 16384),  # quantized in row pieces
])
def test_nan_is_the_torch_pipelines_error(bf16, tmp_path, capsys, monkeypatch, name, flat, piece):
    src, contract = bf16
    _with(src, name, flat, float("nan"))
    if piece:
        monkeypatch.setattr(run, "PIECE_BYTES", piece)
    taken = _spy(monkeypatch)
    got = _error(capsys, src, contract, tmp_path / "fast")
    assert taken and name in got and "NaN or inf" in got
    monkeypatch.setattr(fast, "eligible", lambda *a: None)
    assert _error(capsys, src, contract, tmp_path / "torch") == got.replace(str(tmp_path / "fast"), str(tmp_path / "torch"))


def test_ctrl_c_in_a_kernel_leaves_nothing(bf16, tmp_path, capsys, monkeypatch):
    src, contract = bf16

    def interrupt(*a):
        raise KeyboardInterrupt

    monkeypatch.setattr(fused, "fp8_fp32_blocks", interrupt)
    assert _convert(src, contract, tmp_path / "dst") == 130
    assert "interrupted" in capsys.readouterr().err and not (tmp_path / "dst").exists()


@pytest.mark.parametrize("case", ["fp16", "nvfp4", "fp8_tensor"])
def test_taken_only_where_it_writes_those_bytes(case, tmp_path, monkeypatch):
    """An FP16 source, another rollout format, tensor scaling: the torch pipeline."""
    src = tmp_path / "src"
    make_source(src, "fp16" if case == "fp16" else "bf16")
    rule = {"fp16": "fp8_block", "nvfp4": "nvfp4",
            "fp8_tensor": "linear : fp8_tensor\n    keep bf16 : embed, lm_head, router, norm"}[case]
    taken = _spy(monkeypatch)
    assert _convert(src, _contract(tmp_path, case, rule), tmp_path / "dst") == 0 and not taken
