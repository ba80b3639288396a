"""The converter's pipeline: pieces, mapped reads and background flushes change no byte."""

from __future__ import annotations

import json

import pytest
import torch
from convert_helpers import make_checkpoint, write_contract
from safetensors.torch import load_file, save_file

import pcc.convert.run as run
import pcc.convert.shards as shards
from pcc.cli import main


def _files(d):
    return {p.name: p.read_bytes() for p in sorted(d.iterdir()) if p.is_file()}


@pytest.fixture
def moe(tmp_path):
    src = tmp_path / "src"
    make_checkpoint(src, "tiny_moe")
    return src, write_contract(tmp_path, "fp8_block")


def _convert(src, contract, dst, *extra):
    return main(["convert", str(contract), "--from", str(src), "--to", str(dst), *extra])


def test_pieces_and_background_flushes_give_the_same_bytes(moe, tmp_path, monkeypatch):
    src, contract = moe
    ref = tmp_path / "ref"
    assert _convert(src, contract, ref) == 0
    flushed = []
    monkeypatch.setattr(run, "PIECE_BYTES", 4096)  # embed, lm_head, norms: many pieces each
    monkeypatch.setattr(shards, "_open_direct", lambda path: None)  # through the page cache
    monkeypatch.setattr(shards, "FLUSH_BYTES", 64 << 10)
    monkeypatch.setattr(shards, "STAGE_BYTES", 16 << 10)  # a write each 16 KiB, a flush each four
    monkeypatch.setattr(shards, "_DATASYNC", lambda fd: flushed.append(fd))
    monkeypatch.setattr(run, "_IN_FLIGHT", 1)  # one piece mapped: every tensor waits for the last write
    dst = tmp_path / "dst"
    assert _convert(src, contract, dst, "--max-shard-size", "300KB") == 0
    assert len(flushed) > 5
    assert _tensors(dst) == _tensors(ref)


def test_direct_writes_give_the_bytes_of_buffered_ones(moe, tmp_path, monkeypatch):
    """O_DIRECT shards (ring slots of 8 KiB here: many wraps and bounced spans, a zero-padded last block
    truncated away) are the page cache writer's files byte for byte, and are what the writer used where the
    filesystem offers O_DIRECT; each shard's recorded digest, computed slot by slot on the hash thread
    while the disk thread writes, is BLAKE3 of the whole file (blake3 over the bytes read back)."""
    from blake3 import blake3

    src, contract = moe
    opened = []
    real = shards._open_direct
    monkeypatch.setattr(shards, "_open_direct", lambda path: opened.append(real(path)) or opened[-1])
    monkeypatch.setattr(shards, "STAGE_BYTES", 8192)
    direct = tmp_path / "direct"
    assert _convert(src, contract, direct, "--max-shard-size", "300KB") == 0
    if all(fd is None for fd in opened):
        pytest.skip(f"{tmp_path}: the filesystem offers no O_DIRECT")
    assert len(opened) > 2 and all(fd is not None for fd in opened)
    monkeypatch.setattr(shards, "_open_direct", lambda path: None)
    buffered = tmp_path / "buffered"
    assert _convert(src, contract, buffered, "--max-shard-size", "300KB") == 0
    assert _files(direct) == _files(buffered)
    assert all(p.stat().st_size % 4096 for p in direct.glob("*.safetensors"))  # the padding is gone
    for out in (direct, buffered):
        recorded = json.loads((out / "pcc_convert.json").read_text())["shards"]
        assert recorded == {f: blake3((out / f).read_bytes()).hexdigest() for f in recorded} and len(recorded) > 2


def test_mapped_reads_equal_pread_never_write_the_source_and_fall_back(moe, tmp_path, monkeypatch):
    """Source.map is the source's bytes (safetensors' own loader as the reference), a write into the
    mapped tensor stays private (the file's bytes unchanged), a shard shorter than its checked header
    is an error naming it, and where mmap fails the same bytes are read with pread."""
    import mmap

    from pcc.convert import ConvertError
    from pcc.convert.source import open_source

    src_dir, _ = moe
    name = "model.embed_tokens.weight"
    shard = next(f for f in src_dir.glob("*.safetensors") if name in load_file(str(f)))
    before = shard.read_bytes()
    want = load_file(str(shard))[name]
    src = open_source(src_dir)
    try:
        mapped = src.map(name)
        assert torch.equal(mapped, want)
        piece = src.map(name, (7, 1000))
        assert torch.equal(piece, want.reshape(-1)[7:1007])
        mapped.view(-1)[:64] = 1.0
        del mapped, piece
        assert shard.read_bytes() == before
        monkeypatch.setattr(mmap, "mmap", lambda *a, **k: (_ for _ in ()).throw(OSError("no mmap here")))
        assert torch.equal(src.map(name), want)
    finally:
        src.close()
    monkeypatch.undo()
    src = open_source(src_dir)
    try:
        with shard.open("r+b") as f:
            f.truncate(len(before) - 8)
        with pytest.raises(ConvertError, match="truncated while reading"):
            src.map(next(n for n, f in src.where.items() if f == shard.name and
                          src.entries[n]["data_offsets"][1] + src.data_start[f] > len(before) - 8))
    finally:
        src.close()
        shard.write_bytes(before)


def _mapped_rss(address: int) -> int:
    """Bytes of the mapping holding `address` that are in its page tables (/proc/self/smaps Rss)."""
    lines = open("/proc/self/smaps").read().splitlines()
    for k, line in enumerate(lines):
        head = line.split()[0]
        if "-" in head and all(c in "0123456789abcdef-" for c in head):
            lo, hi = (int(v, 16) for v in head.split("-"))
            if lo <= address < hi:
                rss = next(v for v in lines[k + 1:] if v.startswith("Rss:"))
                return int(rss.split()[1]) * 1024
    raise AssertionError(f"no mapping holds {address:#x}")


def test_a_mapped_piece_has_its_page_tables_filled(tmp_path):
    """Source.map fills the window's page tables in one madvise (through ctypes, without the GIL):
    the whole piece is resident in the mapping before any thread touches it."""
    import os

    from pcc.convert.source import open_source

    release = tuple(int(v) for v in os.uname().release.split(".")[:2]) if hasattr(os, "uname") else (0, 0)
    if not os.path.exists("/proc/self/smaps") or release < (5, 14):
        pytest.skip("MADV_POPULATE_READ and smaps are Linux >= 5.14")
    src_dir = tmp_path / "src"
    src_dir.mkdir()
    save_file({"w": torch.arange(1 << 20, dtype=torch.float32)}, str(src_dir / "model.safetensors"))
    (src_dir / "config.json").write_text('{"architectures": ["LlamaForCausalLM"], "model_type": "llama"}')
    src = open_source(src_dir)
    try:
        w = src.map("w")
        assert _mapped_rss(w.data_ptr()) >= w.numel() * 4
        assert torch.equal(w, torch.arange(1 << 20, dtype=torch.float32))
    finally:
        src.close()


def _tensors(d):
    out = {}
    for f in d.glob("*.safetensors"):
        out.update({k: (str(t.dtype), t.contiguous().view(-1).view(torch.uint8).numpy().tobytes())
                    for k, t in load_file(str(f)).items()})
    return out


def test_nan_in_a_later_piece_names_the_element(moe, tmp_path, capsys, monkeypatch):
    src, contract = moe
    monkeypatch.setattr(run, "PIECE_BYTES", 1024)
    name = "model.embed_tokens.weight"
    shard = next(f for f in src.glob("*.safetensors") if name in load_file(str(f)))
    tensors = load_file(str(shard))
    tensors[name] = tensors[name].clone()
    tensors[name].view(-1)[5000] = float("nan")
    save_file(tensors, str(shard))
    assert _convert(src, contract, tmp_path / "dst") == 1
    err = capsys.readouterr().err
    assert name in err and "NaN or inf (first at flat element 5000)" in err


@pytest.mark.parametrize("fmt", ["fp8_block", "mxfp8", "int4"])
def test_weights_quantized_in_row_pieces_give_the_same_bytes(fmt, tmp_path, monkeypatch, torch_path):
    """A weight larger than PIECE_BYTES is quantized a piece of whole scale blocks at a time
    (pcc.plan.encode.rollout_tensors(rows=)); the checkpoint is the same bytes as in one go."""
    src = tmp_path / "src"
    if fmt == "int4":
        make_checkpoint(src, "tiny_dense")
    else:  # rows not a multiple of 128: fp8_block's last piece of gate/up is a partial block row
        make_checkpoint(src, "tiny_moe", hidden_size=384, moe_intermediate_size=320, num_attention_heads=12)
    contract = write_contract(tmp_path, fmt)
    ref = tmp_path / "ref"
    assert _convert(src, contract, ref) == 0
    monkeypatch.setattr(run, "PIECE_BYTES", 8192)  # every linear weight of the tiny models: several pieces
    pieces = []
    real = run._rows_piece
    monkeypatch.setattr(run, "_rows_piece", lambda *a: pieces.append(a[3]) or real(*a))
    dst = tmp_path / "dst"
    assert _convert(src, contract, dst) == 0
    assert len(pieces) > 10 and any(r0 > 0 for r0 in pieces)
    assert _tensors(dst) == _tensors(ref)
    assert main(["verify-checkpoint", str(contract), str(dst), "--source", str(src), "--full"]) == 0


def test_a_piece_that_is_not_whole_blocks_is_refused():
    from pcc.plan.encode import piece_rows, rollout_tensors
    from pcc.lower import compile_file

    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as d:
        plan = compile_file(str(write_contract(Path(d), "fp8_block"))).plan
    i = next(k for k, op in enumerate(plan.catalog.operators) if op.tensor.endswith("q_proj.weight"))
    assert piece_rows(plan, i) == 128
    n, k = plan.catalog.operators[i].shape
    with pytest.raises(ValueError, match="not whole pieces"):
        rollout_tensors(plan, i, torch.zeros(8, k, dtype=torch.bfloat16), rows=slice(8, 16))


@pytest.mark.parametrize("fmt,model", [("fp8_block", "tiny_moe"), ("nvfp4", "tiny_moe"), ("int4", "tiny_dense")])
def test_recycled_codes_buffers_change_no_byte(fmt, model, tmp_path, monkeypatch, torch_path):
    """Quantized weights' codes go into buffers the writer hands back once written (`_Recycled`): the
    checkpoint is the bytes of fresh codes tensors, buffers are reused (fewer taken new than
    quantized tensors), and one is never handed out again before its bytes are written (every new
    buffer starts as garbage, and a buffer given back early would be overwritten by the next codes)."""
    src = tmp_path / "src"
    make_checkpoint(src, model)
    contract = write_contract(tmp_path, fmt)
    monkeypatch.setattr(run, "_codes_out", lambda *a: None)  # fresh codes tensors
    ref = tmp_path / "ref"
    assert _convert(src, contract, ref) == 0
    monkeypatch.undo()
    taken, fresh = [], []
    real_take = run._Recycled.take

    def take(self, nbytes):
        buf = real_take(self, nbytes)
        if all(buf is not b for b in taken):
            buf.fill_(0xA5)
            fresh.append(buf)
        taken.append(buf)
        return buf

    monkeypatch.setattr(run._Recycled, "take", take)
    monkeypatch.setattr(run, "_RECYCLE_MIN", 1)  # every quantized weight of the tiny model
    monkeypatch.setattr(run, "PIECE_BYTES", 16384)  # and several row pieces of each (fp8_block)
    dst = tmp_path / "dst"
    assert _convert(src, contract, dst, "--max-shard-size", "300KB") == 0
    assert len(taken) > 10 and len(fresh) < len(taken) / 2
    assert _tensors(dst) == _tensors(ref)
