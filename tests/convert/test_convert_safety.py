"""Interrupted, corrupted and contradictory inputs: clear errors, nothing complete-looking left behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch
from convert_helpers import make_checkpoint, write_contract
from safetensors.torch import save_file

from pcc.cli import main
from pcc.convert.run import partial_dir


def _files(d):
    return {p.name: p.read_bytes() for p in sorted(d.iterdir()) if p.is_file()}


def test_kill_9_then_resume_is_byte_identical(tmp_path):
    src = tmp_path / "src"
    make_checkpoint(src, "tiny_dense", shards=3, hidden_size=512, intermediate_size=2048, num_hidden_layers=8,
                    num_attention_heads=8, num_key_value_heads=4, head_dim=64, vocab_size=4096)
    contract = write_contract(tmp_path, "int4")
    args = [str(contract), "--from", str(src), "--max-shard-size", "1MB", "--json"]  # many shards: time to kill
    cmd = [sys.executable, "-m", "pcc.cli", "convert", *args]
    dst = tmp_path / "dst"
    proc = subprocess.Popen([*cmd, "--to", str(dst)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    records = partial_dir(dst) / ".pcc"
    deadline = time.time() + 60
    while time.time() < deadline and proc.poll() is None:
        if records.is_dir() and len(list(records.glob("*.done.json"))) >= 2:
            break
        time.sleep(0.002)
    assert proc.poll() is None, "conversion finished before it could be interrupted"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not dst.exists()  # nothing complete-looking
    assert partial_dir(dst).is_dir()
    done = subprocess.run([*cmd, "--to", str(dst), "--resume"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["result"]["resumed_shards"] >= 2
    ref = tmp_path / "ref"
    assert main(["convert", *args, "--to", str(ref)]) == 0
    assert _files(dst) == _files(ref)
    assert not partial_dir(dst).exists()


@pytest.fixture
def moe(tmp_path):
    src = tmp_path / "src"
    make_checkpoint(src, "tiny_moe")
    return src, write_contract(tmp_path, "fp8_block")


def _convert(src, contract, dst, *extra):
    return main(["convert", str(contract), "--from", str(src), "--to", str(dst), *extra])


def test_existing_destination_needs_force(moe, tmp_path, capsys):
    src, contract = moe
    dst = tmp_path / "dst"
    dst.mkdir()
    (dst / "keep").write_text("x")
    assert _convert(src, contract, dst) == 1
    assert "--force" in capsys.readouterr().err and (dst / "keep").exists()
    (dst / "keep").unlink()
    assert _convert(src, contract, dst) == 0  # empty: written
    (dst / "config.json").write_text("{}")
    assert _convert(src, contract, dst, "--force") == 0  # pcc's own output (pcc_convert.json): replaced
    assert json.loads((dst / "config.json").read_text())["quantization_config"]


def test_truncated_shard_names_file_and_tensor(moe, tmp_path, capsys):
    src, contract = moe
    shard = src / "model-00002-of-00002.safetensors"
    shard.write_bytes(shard.read_bytes()[:-100])
    assert _convert(src, contract, tmp_path / "dst") == 1
    err = capsys.readouterr().err
    assert "model-00002-of-00002.safetensors" in err and "truncated" in err and "model.norm.weight" in err
    assert not (tmp_path / "dst").exists()


def test_corrupted_header(moe, tmp_path, capsys):
    src, contract = moe
    shard = src / "model-00001-of-00002.safetensors"
    raw = bytearray(shard.read_bytes())
    raw[9:30] = b"\xff" * 21
    shard.write_bytes(bytes(raw))
    assert _convert(src, contract, tmp_path / "dst") == 1
    assert "model-00001-of-00002.safetensors: unreadable safetensors header" in capsys.readouterr().err


@pytest.mark.parametrize("tensor", ["model.layers.3.mlp.experts.2.down_proj.weight",
                                    "model.layers.3.post_attention_layernorm.weight"])
def test_nan_weight_names_file_and_tensor(moe, tmp_path, capsys, tensor):
    src, contract = moe
    shard = src / "model-00002-of-00002.safetensors"
    from safetensors.torch import load_file

    tensors = load_file(str(shard))
    tensors[tensor] = tensors[tensor].clone()
    tensors[tensor].view(-1)[5] = float("inf") if "norm" in tensor else float("nan")
    save_file(tensors, str(shard))
    dst = tmp_path / "dst"
    assert _convert(src, contract, dst) == 1
    err = capsys.readouterr().err
    assert "model-00002-of-00002.safetensors" in err and tensor in err and "NaN or inf" in err
    assert not dst.exists()


def test_shape_disagreeing_with_config(moe, tmp_path, capsys):
    src, contract = moe
    shard = src / "model-00001-of-00002.safetensors"
    from safetensors.torch import load_file

    tensors = load_file(str(shard))
    tensors["model.layers.0.self_attn.q_proj.weight"] = torch.zeros(96, 128, dtype=torch.bfloat16)
    save_file(tensors, str(shard))
    assert _convert(src, contract, tmp_path / "dst") == 1
    err = capsys.readouterr().err
    assert "model.layers.0.self_attn.q_proj.weight" in err and "96" in err


def test_verify_reports_tampered_codes_and_config(moe, tmp_path, capsys):
    src, contract = moe
    dst = tmp_path / "dst"
    assert _convert(src, contract, dst) == 0
    from safetensors.torch import load_file

    shard = dst / "model.safetensors"
    tensors = load_file(str(shard))
    name = "model.layers.2.self_attn.o_proj.weight"
    tensors[name] = tensors[name].clone()
    tensors[name].view(torch.uint8).view(-1)[7] ^= 1
    save_file(tensors, str(shard))
    cfg = json.loads((dst / "config.json").read_text())
    cfg["quantization_config"]["modules_to_not_convert"].remove("lm_head")
    (dst / "config.json").write_text(json.dumps(cfg))
    capsys.readouterr()
    assert main(["verify-checkpoint", str(contract), str(dst), "--source", str(src), "--full"]) == 1
    err = capsys.readouterr().err
    assert "attn.o: " + name + ": bytes differ from pcc's quantizer" in err
    assert "config: config.json: quantization_config" in err


@pytest.mark.parametrize("read", ["map", "read_bytes"])  # the torch pipeline's reads, pcc.convert.fast's
def test_a_reader_failure_is_an_error_not_a_hang(moe, tmp_path, capsys, monkeypatch, read):
    """Regression: a tensor that failed to load mid-conversion once left the pipeline waiting forever."""
    from pcc import fused
    from pcc.convert import fast, source

    if read == "read_bytes" and not fused.available():
        pytest.skip("PCC_FUSED=0 turns pcc.convert.fast off")
    src, contract = moe
    real = getattr(source.Source, read)

    def flaky(self, name, *piece):
        if name.endswith("experts.3.down_proj.weight"):
            raise OSError(f"read error in {name}")
        return real(self, name, *piece)

    if read == "map":
        monkeypatch.setattr(fast, "eligible", lambda *a: None)
    monkeypatch.setattr(source.Source, read, flaky)
    assert _convert(src, contract, tmp_path / "dst") == 1
    assert "read error" in capsys.readouterr().err and not (tmp_path / "dst").exists()


def test_header_size_disagreeing_with_shape(moe, tmp_path, capsys):
    src, contract = moe
    shard = src / "model-00001-of-00002.safetensors"
    raw = shard.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:8 + n])
    name = next(k for k in header if k != "__metadata__")
    header[name]["shape"] = [1] + header[name]["shape"][1:]
    text = json.dumps(header, separators=(",", ":")).encode().ljust(n)
    assert len(text) == n
    shard.write_bytes(raw[:8] + text + raw[8 + n:])
    assert _convert(src, contract, tmp_path / "dst") == 1
    assert f"{name} spans" in capsys.readouterr().err


def test_destination_inside_the_source_is_refused(moe, capsys):
    src, contract = moe
    assert _convert(src, contract, src, "--force") == 1
    assert "overlaps the source" in capsys.readouterr().err and any(src.glob("*.safetensors"))


@pytest.mark.parametrize("damage", ["header", "size"])
def test_a_shard_not_as_planned_on_disk_is_refused(moe, tmp_path, capsys, monkeypatch, damage):
    """The last check before DST is installed reads each shard's header back from the file and compares it with
    the planned bytes (and the file's size with the planned size): a shard that reads otherwise is refused."""
    from pcc.convert.shards import ShardWriter

    src, contract = moe
    real = ShardWriter.finish

    def finish(self):
        real(self)
        shard = sorted((self.root).glob("*.safetensors"))[0]
        with shard.open("r+b") as f:
            if damage == "header":
                f.seek(12)
                byte = f.read(1)
                f.seek(12)
                f.write(bytes([byte[0] ^ 0x20]))
            else:
                f.truncate(shard.stat().st_size - 8)

    monkeypatch.setattr(ShardWriter, "finish", finish)
    assert _convert(src, contract, tmp_path / "dst") == 1
    assert "written header does not match the plan" in capsys.readouterr().err
    assert not (tmp_path / "dst").exists()
