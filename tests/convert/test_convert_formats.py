"""Each shipped rollout format converts, loads as safetensors, and verifies against its source."""

from __future__ import annotations

import json

import ml_dtypes
import numpy as np
import pytest
import torch
from convert_helpers import FORMATS, load_tensors, make_checkpoint, write_contract

from pcc.cli import main

SHARD = "400KB"


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    root = tmp_path_factory.mktemp("src")
    out = {}
    for model in ("tiny_moe", "tiny_dense"):
        out[model] = (root / model, make_checkpoint(root / model, model))
    return out


def _run(args, capsys):
    code = main(args)
    return code, json.loads(capsys.readouterr().out)["result"]


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_format_converts_and_verifies(fmt, sources, tmp_path, capsys):
    src, written = sources[FORMATS[fmt][0]]
    contract = write_contract(tmp_path, fmt)
    dst = tmp_path / "out"
    code, summary = _run(["convert", str(contract), "--from", str(src), "--to", str(dst),
                          "--max-shard-size", SHARD, "--json"], capsys)
    assert code == 0 and summary["shards"] > 1
    code, report = _run(["verify-checkpoint", str(contract), str(dst), "--source", str(src), "--full", "--json"],
                        capsys)
    assert code == 0, report["problems"]
    assert report["values_checked"] == len(written)  # --full: every operator
    out = load_tensors(dst)
    index = json.loads((dst / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"]) == set(out)
    assert (dst / "tokenizer.json").read_text() == (src / "tokenizer.json").read_text()
    assert (dst / "generation_config.json").is_file()
    config = json.loads((dst / "config.json").read_text())
    qc = config["quantization_config"]
    # Exceptions are copied bit for bit.
    norm = "model.layers.1.input_layernorm.weight"
    assert torch.equal(out[norm].view(torch.int16), written[norm].view(torch.int16))
    assert "model.embed_tokens" in (qc.get("modules_to_not_convert") or qc.get("ignore"))
    if fmt == "mxfp4":
        assert out["model.layers.0.mlp.experts.gate_up_proj_blocks"].shape == (8, 128, 4, 16)
        assert "model.layers.0.mlp.experts.0.gate_proj.weight" not in out


def test_block_fp8_matches_an_independent_computation(sources, tmp_path, capsys):
    """amax per 128x128 block, scale = amax / 448, codes = RNE cast (ml_dtypes), padded edges."""
    src, written = sources["tiny_moe"]
    contract = write_contract(tmp_path, "fp8_block")
    dst = tmp_path / "out"
    assert main(["convert", str(contract), "--from", str(src), "--to", str(dst), "--json"]) == 0
    capsys.readouterr()
    out = load_tensors(dst)
    config = json.loads((dst / "config.json").read_text())["quantization_config"]
    assert config["quant_method"] == "fp8" and config["weight_block_size"] == [128, 128]
    assert config["activation_scheme"] == "dynamic"
    for name in ("model.layers.0.self_attn.q_proj.weight", "model.layers.2.self_attn.k_proj.weight",
                 "model.layers.3.mlp.experts.5.down_proj.weight"):
        w = written[name].float().numpy()
        n, k = w.shape
        nb, kb = -(-n // 128), -(-k // 128)
        padded = np.zeros((nb * 128, kb * 128), np.float32)
        padded[:n, :k] = w
        amax = np.abs(padded).reshape(nb, 128, kb, 128).max(axis=(1, 3))
        scale = (amax / np.float32(448.0)).astype(np.float32)
        full = np.repeat(np.repeat(scale, 128, 0), 128, 1)[:n, :k]
        codes = (w / full).astype(ml_dtypes.float8_e4m3fn)
        prefix = name[: -len(".weight")]
        assert np.array_equal(out[prefix + ".weight_scale_inv"].numpy(), scale)
        assert np.array_equal(out[name].view(torch.uint8).numpy(), codes.view(np.uint8))


def test_int4_config_is_valid_compressed_tensors(sources, tmp_path, capsys):
    from compressed_tensors.quantization import QuantizationConfig

    src, _ = sources["tiny_dense"]
    contract = write_contract(tmp_path, "int4")
    dst = tmp_path / "out"
    assert main(["convert", str(contract), "--from", str(src), "--to", str(dst), "--json"]) == 0
    capsys.readouterr()
    qc = json.loads((dst / "config.json").read_text())["quantization_config"]
    parsed = QuantizationConfig.model_validate(qc)
    assert parsed.model_dump(mode="json") == qc
    assert parsed.config_groups["group_0"].weights.group_size == 32
    out = load_tensors(dst)
    assert out["model.layers.0.mlp.down_proj.weight_packed"].dtype == torch.int32
    assert out["model.layers.0.mlp.down_proj.weight_shape"].tolist() == [128, 256]


def test_nvfp4_scales_follow_modelopt(sources, tmp_path, capsys):
    src, written = sources["tiny_moe"]
    contract = write_contract(tmp_path, "nvfp4")
    dst = tmp_path / "out"
    assert main(["convert", str(contract), "--from", str(src), "--to", str(dst), "--json"]) == 0
    capsys.readouterr()
    out = load_tensors(dst)
    p = "model.layers.1.mlp.experts.3.up_proj"
    amax = written[p + ".weight"].float().abs().max()
    assert torch.allclose(out[p + ".weight_scale_2"], amax / (448 * 6), rtol=1e-6)
    assert out[p + ".weight_scale"].dtype == torch.float8_e4m3fn and out[p + ".weight"].shape == (64, 64)
    assert "model.layers.0.mlp.experts.0.gate_proj.weight" in out  # experts[0] kept wide
    hf = json.loads((dst / "hf_quant_config.json").read_text())["quantization"]
    assert "model.layers.0.mlp.experts" in hf["exclude_modules"]
