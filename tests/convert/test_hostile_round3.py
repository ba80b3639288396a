"""Hostile input, round 3 (issue 27), the converting class: FP8 block scales that are not finite and positive,
a diverged trainer adapter, a config.json that counts other layers than the tensors hold, a weight dtype pcc
does not read, a missing shard, two conversions into one destination, Ctrl-C and a full disk. Each is one
coded line (exit 1; 130 when interrupted) and nothing is written to the destination."""

from __future__ import annotations

import errno
import fcntl
import json
import os
import shutil

import pytest
import torch
from convert_helpers import make_checkpoint, write_contract
from safetensors.torch import load_file, save_file
from test_convert_quantized_sources import make_block_fp8

from pcc.cli import main
from pcc.convert import run, shards
from pcc.convert.run import partial_dir
from pcc.models import CatalogError, catalog_from_checkpoint

RULES = {"copied": "linear : fp8_block\n    keep bf16 : embed, lm_head, router, norm",
         "dequantized": "linear : bf16"}


def _contract(directory, rules: str, model: str = "tiny_moe"):
    """A contract for `model` (a catalog name, or `from "DIR"`) with these rollout rules."""
    path = directory / "c.prec"
    path.write_text(f"contract round3 {{\n  model {model}\n  hardware H100\n  rollout sglang {{\n    {rules}\n  }}\n"
                    "  trainer megatron {\n    gemm : bf16\n    optimizer adam\n  }\n  trainable all\n"
                    "  sync full_weights { schedule colocated bridge bf16 activation atomic }\n"
                    "  routing replay rollout\n}\n", encoding="utf-8")
    return path


def _run(capsys, *argv) -> tuple[int, list[dict]]:
    """`pcc ARGV --json` in this process: its exit code and diagnostics."""
    code = main([*argv, "--json"])
    return code, json.loads(capsys.readouterr().out)["diagnostics"]


def _convert(capsys, contract, src, dst, *extra):
    return _run(capsys, "convert", str(contract), "--source", str(src), "-o", str(dst), *extra)


def _convert_text(capsys, contract, src, dst, *extra) -> tuple[int, list[str]]:
    """The same without --json: the exit code and the lines on stderr."""
    code = main(["convert", str(contract), "--source", str(src), "-o", str(dst), *extra])
    return code, capsys.readouterr().err.strip().splitlines()


def _nothing_written(dst) -> None:
    assert not dst.exists() and not partial_dir(dst.resolve()).exists()


def _edit(src, name: str, fn) -> None:
    """Replace tensor `name` in the shard of `src` that holds it by `fn(tensor)`."""
    for f in sorted(src.glob("*.safetensors")):
        tensors = load_file(str(f))
        if name in tensors:
            tensors[name] = fn(tensors[name].clone())
            save_file(tensors, str(f), metadata={"format": "pt"})
            return
    raise AssertionError(f"no {name} in {src}")


ADAPTER_CONTRACT = """contract lora-round3 {
  model tiny_dense
  hardware H100
  rollout sglang { linear : fp8_block }
  trainer megatron { gemm : bf16 optimizer adam }
  trainable lora rank 8 alpha 16 targets attn.q
  sync adapter { schedule colocated activation atomic }
}
"""


def _hold(dst) -> int:
    """Take the destination's lock as a running `pcc convert` holds it (docs/safety.md)."""
    fd = os.open(dst.with_name(f".{dst.name}.pcc-lock"), os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    os.pwrite(fd, b"4242\n", 0)
    return fd


def _interrupt(*args, **kwargs):
    raise KeyboardInterrupt


@pytest.fixture
def moe(tmp_path):
    src = tmp_path / "src"
    make_checkpoint(src, "tiny_moe")
    return src, write_contract(tmp_path, "fp8_block")


# ---- 1. FP8 block scales: finite and positive, checked before use ----

SCALE = "model.layers.1.self_attn.o_proj.weight_scale_inv"  # o_proj [256, 128] in 128x128 blocks: scales [2, 1]


@pytest.fixture(scope="module")
def fp8_source(tmp_path_factory):
    src = tmp_path_factory.mktemp("fp8") / "src"
    make_block_fp8(src, hidden_size=256)
    return src


@pytest.mark.parametrize("value", [0.0, -0.5, float("nan"), float("inf")])
@pytest.mark.parametrize("path", ["copied", "dequantized"])
@pytest.mark.parametrize("piece", [None, 4096], ids=["whole", "in pieces"])  # pieces: the scale rows from row 1
def test_an_fp8_block_scale_that_is_not_finite_and_positive_is_refused(fp8_source, tmp_path, capsys, monkeypatch,
                                                                       value, path, piece):
    if piece:
        monkeypatch.setattr(run, "PIECE_BYTES", piece)
    src = tmp_path / "src"
    shutil.copytree(fp8_source, src)

    def spoil(t):
        t[1, 0] = value
        return t
    _edit(src, SCALE, spoil)
    dst = tmp_path / "dst"
    code, diags = _convert(capsys, _contract(tmp_path, RULES[path]), src, dst)
    assert code == 1 and diags[0]["code"] == "PCC702", diags
    message = diags[0]["message"]
    assert SCALE in message and "[1, 0]" in message and "finite and positive" in message, message
    assert message.startswith(f"{src}/model-0000"), message  # the file that holds the scale
    _nothing_written(dst)


# ---- 2. a trainer adapter holding NaN or inf ----

@pytest.mark.parametrize("part, value", [("lora_A", float("nan")), ("lora_B", float("inf")), ("lora_B", -float("inf"))])
def test_an_adapter_holding_nan_or_inf_is_refused(tmp_path, capsys, part, value):
    contract = tmp_path / "c.prec"
    contract.write_text(ADAPTER_CONTRACT)
    tensors = {}
    for layer in range(4):
        m = f"model.layers.{layer}.self_attn.q_proj"
        tensors[m + ".lora_A.weight"] = torch.randn(8, 128).to(torch.bfloat16)
        tensors[m + ".lora_B.weight"] = torch.randn(128, 8).to(torch.bfloat16)
    bad = f"model.layers.2.self_attn.q_proj.{part}.weight"
    tensors[bad][3, 5] = value
    src = tmp_path / "adapter.safetensors"
    save_file(tensors, str(src))
    dst = tmp_path / "peft"
    code, diags = _run(capsys, "convert", str(contract), "--adapter", str(src), "-o", str(dst))
    assert code == 1 and diags[0]["code"] == "PCC713", diags
    assert bad in diags[0]["message"] and "NaN or inf" in diags[0]["message"] and "[3, 5]" in diags[0]["message"]
    _nothing_written(dst)


# ---- 3. config.json counting other layers than the tensors hold ----

def _layers(directory, count: int, index_only: bool) -> None:
    config = json.loads((directory / "config.json").read_text())
    config["num_hidden_layers"] = count
    (directory / "config.json").write_text(json.dumps(config))
    if index_only:
        for f in directory.glob("*.safetensors"):
            f.unlink()


@pytest.mark.parametrize("count, index_only", [(10**7, True), (6, True), (6, False)])
def test_config_layers_must_be_the_tensors_layers(tmp_path, capsys, count, index_only):
    ckpt = tmp_path / "ckpt"
    make_checkpoint(ckpt, "tiny_moe")  # 4 layers
    _layers(ckpt, count, index_only)
    with pytest.raises(CatalogError) as info:
        catalog_from_checkpoint(ckpt)
    assert info.value.code == "PCC209" and str(count) in str(info.value) and "4" in str(info.value)
    code, diags = _run(capsys, "check", str(_contract(tmp_path, RULES["copied"], 'from "ckpt"')))
    assert code == 1 and [d["code"] for d in diags if d["severity"] == "error"] == ["PCC209"], diags
    if not index_only:
        dst = tmp_path / "dst"
        code, diags = _convert(capsys, write_contract(tmp_path, "fp8_block"), ckpt, dst)
        assert code == 1 and diags[0]["code"] == "PCC209" and str(count) in diags[0]["message"], diags
        _nothing_written(dst)


def test_mtp_layers_past_the_count_are_still_read(tmp_path):
    """A layer at or past num_hidden_layers is an MTP layer (DeepSeek-V3's 61): more layers than counted is no error."""
    ckpt = tmp_path / "ckpt"
    make_checkpoint(ckpt, "tiny_moe")
    _layers(ckpt, 3, index_only=True)
    config = json.loads((ckpt / "config.json").read_text())
    config["num_nextn_predict_layers"] = 1
    (ckpt / "config.json").write_text(json.dumps(config))
    assert {op.layer for op in catalog_from_checkpoint(ckpt).operators} >= {0, 1, 2, 3}


# ---- 4. weight dtypes pcc does not read ----

@pytest.mark.parametrize("tensor", ["model.layers.0.self_attn.q_proj.weight", "model.norm.weight"])
@pytest.mark.parametrize("dtype, stored", [(torch.int16, "int16"), (torch.uint16, "U16"), (torch.float64, "fp64")])
def test_a_weight_dtype_pcc_does_not_read_says_which_it_does(moe, tmp_path, capsys, tensor, dtype, stored):
    src, contract = moe
    _edit(src, tensor, lambda t: (t.float() * 100).to(dtype))
    dst = tmp_path / "dst"
    code, diags = _convert(capsys, contract, src, dst)
    assert code == 1 and diags[0]["code"] in ("PCC210", "PCC710"), diags
    message = diags[0]["message"]
    assert tensor in message and stored in message and "BF16, F16 or F32" in message, message
    assert "I16" not in message.split("BF16, F16 or F32")[0], message  # never listed as what pcc reads
    _nothing_written(dst)
    code, diags = _run(capsys, "check", str(_contract(tmp_path, RULES["copied"], 'from "src"')))
    assert code == 1 and [d["code"] for d in diags if d["severity"] == "error"] == ["PCC210"], diags
    assert "BF16, F16 or F32" in diags[0]["message"]


# ---- 8. a shard the index names is missing ----

def test_a_missing_shard_is_named_as_missing(moe, tmp_path, capsys):
    src, contract = moe
    shard = src / "model-00002-of-00002.safetensors"
    shard.unlink()
    dst = tmp_path / "dst"
    code, diags = _convert(capsys, contract, src, dst)
    assert code == 1 and diags[0]["code"] == "PCC702", diags
    assert f"{shard}: shard file missing" in diags[0]["message"], diags
    _nothing_written(dst)
    code, diags = _run(capsys, "check", str(_contract(tmp_path, RULES["copied"], 'from "src"')))
    errors = [d for d in diags if d["severity"] == "error"]
    assert code == 1 and [d["code"] for d in errors] == ["PCC210"], diags
    assert f"{shard}: shard file missing" in errors[0]["message"], errors


# ---- 5. one conversion at a time into a destination ----

def _adapter_argv(tmp_path, dst) -> list[str]:
    contract = tmp_path / "lora.prec"
    contract.write_text(ADAPTER_CONTRACT)
    src = tmp_path / "adapter.safetensors"
    save_file({f"model.layers.{k}.self_attn.q_proj.lora_{p}.weight": torch.zeros(*s, dtype=torch.bfloat16)
               for k in range(4) for p, s in (("A", (8, 128)), ("B", (128, 8)))}, str(src))
    return ["convert", str(contract), "--adapter", str(src), "-o", str(dst)]


@pytest.mark.parametrize("verb", ["convert", "adapter"])
def test_a_second_conversion_into_a_locked_destination_is_refused(moe, tmp_path, capsys, verb):
    src, contract = moe
    dst = tmp_path / "dst"
    argv = (["convert", str(contract), "--source", str(src), "-o", str(dst)] if verb == "convert"
            else _adapter_argv(tmp_path, dst))
    fd = _hold(dst)
    try:
        code, diags = _run(capsys, *argv)
    finally:
        os.close(fd)
    lock = str(dst.with_name(".dst.pcc-lock"))
    assert code == 1 and diags[0]["code"] == "PCC711", diags
    assert lock in diags[0]["message"] and "4242" in diags[0]["message"], diags
    assert not dst.exists()
    assert _run(capsys, *argv)[0] == 0  # the holder has gone: written


def _boom(*args, **kwargs):
    raise RuntimeError("a bug")


@pytest.mark.parametrize("how", ["success", "refusal", "exception", "interrupt"])
def test_the_lock_is_released_however_the_conversion_ends(moe, tmp_path, capsys, monkeypatch, how):
    src, contract = moe
    dst = tmp_path / "dst"
    if how == "refusal":
        dst.mkdir()
        (dst / "keep").write_text("x")
    if how in ("exception", "interrupt"):
        monkeypatch.setattr(run, "_finish", _boom if how == "exception" else _interrupt)
    code, _ = _convert(capsys, contract, src, dst)
    assert code == {"success": 0, "refusal": 1, "exception": 3, "interrupt": 130}[how]
    os.close(_hold(dst))  # free again


# ---- 6. Ctrl-C ----

@pytest.mark.parametrize("step, shard_size, kept", [("_compute", "5GB", False), ("_finish", "100KB", True)])
def test_ctrl_c_exits_130_saying_what_it_left(moe, tmp_path, capsys, monkeypatch, step, shard_size, kept,
                                             torch_path):
    src, contract = moe
    dst = tmp_path / "dst"
    monkeypatch.setattr(run, step, _interrupt)
    code, lines = _convert_text(capsys, contract, src, dst, "--max-shard-size", shard_size)
    assert code == 130 and len(lines) == 1, lines
    assert "interrupted" in lines[0] and f"nothing was written to {dst.resolve()}" in lines[0], lines
    assert not dst.exists() and partial_dir(dst.resolve()).exists() == kept
    if not kept:
        return
    assert "--resume" in lines[0], lines
    monkeypatch.undo()
    code = main(["convert", str(contract), "--source", str(src), "-o", str(dst), "--max-shard-size", shard_size,
                 "--resume", "--json"])
    assert code == 0 and json.loads(capsys.readouterr().out)["result"]["resumed_shards"] > 1


# ---- 7. a full disk ----

def _enospc(*args):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


class _FullDisk:
    """The os module as the shard writer sees it on a full disk: every write and fsync fails with ENOSPC."""

    write = fsync = staticmethod(_enospc)

    def __getattr__(self, name):
        return getattr(os, name)


@pytest.mark.parametrize("sink", ["direct", "buffered"])
def test_a_full_disk_is_one_line_naming_the_file(moe, tmp_path, capsys, monkeypatch, sink):
    src, contract = moe
    monkeypatch.setattr(shards, "os", _FullDisk())
    if sink == "buffered":
        monkeypatch.setattr(shards, "_open_direct", lambda path: None)
    dst = tmp_path / "dst"
    code, diags = _convert(capsys, contract, src, dst)
    assert code == 1 and diags[0]["code"] == "PCC709", diags
    shard = str(partial_dir(dst.resolve()) / "model.safetensors")
    assert diags[0]["message"].startswith(f"{shard}.tmp: cannot write: No space left on device"), diags
    _nothing_written(dst)
    code, lines = _convert_text(capsys, contract, src, dst)
    assert code == 1 and len(lines) == 1 and "No space left on device" in lines[0], lines
    os.close(_hold(dst))  # released
