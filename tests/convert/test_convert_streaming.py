"""Weights whose scale needs the whole tensor, and quantized sources, stream in row pieces: an amax pass
over the pieces first (FP8 tensor scaling, NVFP4's global scale, a fused group's shared scale), then the
pieces are quantized; the checkpoint is the same bytes as converting each weight in one go."""

from __future__ import annotations

import pytest
import torch
from convert_helpers import make_checkpoint
from safetensors.torch import load_file

import pcc.convert.run as run
from pcc.cli import main

# down_proj [128, 80]: 4 KiB pieces of 24 or 25 BF16 rows (12 or 8 as float32) end on a partial one
WIDE = dict(moe_intermediate_size=80)
# block-FP8 sources stream in whole 128-row scale blocks: 320 rows end on a partial piece of 64
BLOCKS = dict(hidden_size=384, moe_intermediate_size=320, num_attention_heads=12)


def _contract(directory, name, rules, hw="B200", schemes=""):
    text = (f"contract stream-{name.replace('_', '-')} {{\n  model tiny_moe\n  hardware {hw}\n{schemes}"
            f"  rollout sglang {{\n    {rules}\n  }}\n"
            "  trainer megatron {\n    gemm : bf16\n    optimizer adam\n  }\n  trainable all\n"
            "  sync full_weights { schedule colocated bridge bf16 activation atomic }\n}\n")
    path = directory / f"{name}.prec"
    path.write_text(text, encoding="utf-8")
    return path


def _rule(scheme):
    return f"linear : {scheme}\n    keep bf16 : embed, lm_head, router, norm"


def _convert(contract, src, dst):
    assert main(["convert", str(contract), "--from", str(src), "--to", str(dst), "--no-calibrate"]) == 0


def _tensors(d):
    out = {}
    for f in d.glob("*.safetensors"):
        out.update({k: (str(t.dtype), list(t.shape), t.contiguous().view(-1).view(torch.uint8).numpy().tobytes())
                    for k, t in load_file(str(f)).items()})
    return out


def _streamed(monkeypatch, contract, src, dst, piece=4096) -> dict:
    """Convert with pieces of `piece` bytes; returns weight -> [(first row, rows, encoded?)] of its row pieces."""
    pieces = {}
    real = run._rows_piece

    def spy(plan, source, it, r0, rows, out=None):
        n = rows.enc.shape[0] if hasattr(rows, "enc") else rows.shape[0]
        pieces.setdefault(it["source"], []).append((r0, n, hasattr(rows, "enc")))
        return real(plan, source, it, r0, rows, out)

    monkeypatch.setattr(run, "PIECE_BYTES", piece)
    monkeypatch.setattr(run, "_rows_piece", spy)
    _convert(contract, src, dst)
    monkeypatch.undo()
    return pieces


def _partial_last(pieces: dict) -> bool:
    """Some weight streamed in several pieces whose last is shorter than the others."""
    return any(len(p) > 1 and p[-1][1] < p[0][1] for p in pieces.values())


@pytest.mark.parametrize("scheme", ["fp8_tensor", "nvfp4"])
def test_tensor_and_global_scales_stream_with_an_amax_pass(scheme, tmp_path, monkeypatch):
    src = tmp_path / "src"
    make_checkpoint(src, "tiny_moe", **WIDE)
    contract = _contract(tmp_path, scheme, _rule(scheme), hw="H100" if scheme == "fp8_tensor" else "B200")
    _convert(contract, src, tmp_path / "whole")
    pieces = _streamed(monkeypatch, contract, src, tmp_path / "pieces")
    assert len(pieces) > 50 and all(len(p) > 1 for p in pieces.values()) and _partial_last(pieces)
    whole, streamed = _tensors(tmp_path / "whole"), _tensors(tmp_path / "pieces")
    assert len(whole) > 200 and streamed == whole
    if scheme == "nvfp4":  # a fused group streamed piece by piece still shares its one global scale
        p = "model.layers.2.mlp.experts.3."
        assert streamed[p + "gate_proj.weight_scale_2"] == streamed[p + "up_proj.weight_scale_2"]
        assert streamed[p + "gate_proj.weight_scale_2"] != streamed[p + "down_proj.weight_scale_2"]
    assert main(["verify-checkpoint", str(contract), str(tmp_path / "pieces"), "--source", str(src), "--full"]) == 0


def _source(tmp_path, name, scheme, widen, hw="B200", schemes=""):
    """A quantized source checkpoint: the BF16 model converted by pcc into `scheme` (every linear)."""
    wide = tmp_path / f"{name}-bf16"
    make_checkpoint(wide, "tiny_moe", **widen)
    rules = ("experts : mxfp4\n    keep bf16 : attn, router, embed, lm_head, norm" if scheme == "mxfp4"
             else _rule(scheme))
    src = tmp_path / name
    _convert(_contract(tmp_path, f"make-{name}", rules, hw=hw, schemes=schemes), wide, src)
    return src


# source scheme -> (rollout scheme it is requantized into, widening, the source's hardware, scheme definitions,
# piece bytes); K a multiple of 32 for INT4 g32 and MXFP4, whose 20 KiB pieces are 40 float32 rows of K=128
# (INT4 zero points: 8-row units), so gate/up's 96 rows end on a partial piece of 16
SOURCES = {
    "fp8_block": ("nvfp4", BLOCKS, "H100", "", 4096),
    "nvfp4": ("fp8_block", BLOCKS, "B200", "", 4096),
    "int4a": ("int4_g32", dict(moe_intermediate_size=96), "H100", "  scheme int4a = int4 weights group 32 asymmetric\n",
              20480),
    "fp8_tensor": ("nvfp4", WIDE, "H100", "", 12288),  # 24 rows of K=128: gate/up 80 = 3 x 24 + 8
    "mxfp4": ("bf16", dict(moe_intermediate_size=96), "GB300", "", 4096),
}


@pytest.mark.parametrize("kind", list(SOURCES))
def test_quantized_sources_stream_in_row_pieces(kind, tmp_path, monkeypatch):
    rollout, widen, hw, schemes, piece = SOURCES[kind]
    src = _source(tmp_path, kind, kind, widen, hw, schemes)
    if rollout == "bf16":
        contract = _contract(tmp_path, "to-bf16", "linear : bf16")
    else:
        contract = _contract(tmp_path, f"to-{rollout}", _rule(rollout), hw="H100" if rollout != "nvfp4" else "B200")
    _convert(contract, src, tmp_path / "whole")
    pieces = _streamed(monkeypatch, contract, src, tmp_path / "pieces", piece)
    assert len(pieces) > 20 and all(enc for p in pieces.values() for _, _, enc in p)
    assert sum(len(p) > 1 for p in pieces.values()) > 20 and _partial_last(pieces)
    whole, streamed = _tensors(tmp_path / "whole"), _tensors(tmp_path / "pieces")
    assert len(whole) > 100 and streamed == whole
    assert main(["verify-checkpoint", str(contract), str(tmp_path / "pieces"), "--source", str(src), "--full"]) == 0


def test_mxfp4_fused_experts_stream_an_expert_at_a_time(tmp_path, monkeypatch):
    """Each layer's `_blocks` tensors are written an expert's slice at a time (gate and up rows interleaved),
    the `_scales` whole; the bytes are what the live sync assembles whole (place_fused)."""
    import pcc.convert.shards as shards
    from pcc.lower import compile_file
    from pcc.runtime.weights import convert_full

    src = tmp_path / "src"
    weights = make_checkpoint(src, "tiny_moe")  # the catalog's own sizes: the live sync compiles the contract alone
    contract = _contract(tmp_path, "mxfp4", "experts : mxfp4\n    keep bf16 : attn, router, embed, lm_head, norm",
                         hw="GB300")
    writes = {}
    real = shards.ShardWriter.write

    def spy(self, name, data, last=True):
        writes.setdefault(name, []).append(last)
        return real(self, name, data, last)

    monkeypatch.setattr(shards.ShardWriter, "write", spy)
    _convert(contract, src, tmp_path / "out")
    monkeypatch.undo()
    blocks = [n for n in writes if n.endswith("_blocks")]
    assert len(blocks) == 8  # 4 layers x gate_up, down
    assert all(writes[n] == [False] * 7 + [True] for n in blocks)  # 8 experts, one piece each
    assert all(writes[n] == [True] for n in writes if n.endswith("_scales"))
    live = convert_full(compile_file(str(contract)).plan, weights)
    out = _tensors(tmp_path / "out")
    for n in blocks + [n for n in writes if n.endswith("_scales")]:
        assert out[n][2] == live[n].contiguous().view(-1).view(torch.uint8).numpy().tobytes(), n
    assert main(["verify-checkpoint", str(contract), str(tmp_path / "out"), "--source", str(src), "--full"]) == 0


@pytest.mark.parametrize("kind", ["fp8_block", "nvfp4", "int4a", "fp8_tensor"])
def test_copied_encodings_stream_their_codes(kind, tmp_path, monkeypatch):
    """A quantized source converted into its own scheme: its codes are written as stored in 4 KiB pieces,
    then its scales; every tensor is the source's, bit for bit."""
    import pcc.convert.shards as shards

    _, widen, hw, schemes, _ = SOURCES[kind]
    src = _source(tmp_path, kind, kind, widen, hw, schemes)
    scheme = {"int4a": "int4a"}.get(kind, kind)
    contract = _contract(tmp_path, f"same-{kind}", _rule(scheme), hw=hw, schemes=schemes)
    writes = {}
    real = shards.ShardWriter.write

    def spy(self, name, data, last=True):
        writes.setdefault(name, []).append(last)
        return real(self, name, data, last)

    monkeypatch.setattr(run, "PIECE_BYTES", 4096)
    monkeypatch.setattr(shards.ShardWriter, "write", spy)
    _convert(contract, src, tmp_path / "out")
    monkeypatch.undo()
    codes = [n for n, w in writes.items() if len(w) > 1 and n.endswith((".weight", ".weight_packed"))]
    assert len(codes) > 20 and all(writes[n][-1] and not any(writes[n][:-1]) for n in codes)
    source, out = _tensors(src), _tensors(tmp_path / "out")
    assert set(out) == set(source) and all(out[n] == source[n] for n in source if "input_scale" not in n)
    assert main(["verify-checkpoint", str(contract), str(tmp_path / "out"), "--source", str(src), "--full"]) == 0
