"""Quantized sources: block FP8 as DeepSeek-V3/R1 and Kimi-K2 publish it, ModelOpt NVFP4, compressed-tensors
INT4, gpt-oss MXFP4. Each is read, dequantized exactly (checked against an independent numpy / ml_dtypes /
compressed-tensors decoding), copied bit for bit when the rollout scheme is the source's own, converted to
other schemes, verified with `verify-checkpoint --source`; malformed sources are errors naming the tensor."""

from __future__ import annotations

import json
import shutil

import ml_dtypes
import numpy as np
import pytest
import torch
from convert_helpers import load_tensors, make_checkpoint, write_contract
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from pcc.cli import main
from pcc.numerics import quantize

DEEPSEEK_QC = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": [128, 128]}
E2M1 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0], np.float32)


# ---- sources ----

def _quantized_by_deepseek(name: str) -> bool:
    """DeepSeek-V3 stores every linear of the decoder layers in FP8 but the router; embed, lm_head, norms BF16."""
    return ".layers." in name and name.endswith(".weight") and "_proj" in name.rsplit(".", 2)[-2]


def _fp8_block_by_hand(w: np.ndarray, r: int = 128, c: int = 128):
    """DeepSeek's weight_quant: per RxC block scale = amax / 448 (float32), codes = RNE(w / scale) as e4m3."""
    n, k = w.shape
    nb, kb = -(-n // r), -(-k // c)
    padded = np.zeros((nb * r, kb * c), np.float32)
    padded[:n, :k] = w
    amax = np.abs(padded).reshape(nb, r, kb, c).max(axis=(1, 3))
    scale = (amax / np.float32(448.0)).astype(np.float32)
    full = np.repeat(np.repeat(scale, r, 0), c, 1)[:n, :k]
    return (w / full).astype(ml_dtypes.float8_e4m3fn), scale


def _write_shards(directory, tensors: dict, shards: int = 2) -> None:
    for old in list(directory.glob("*.safetensors")) + [directory / "model.safetensors.index.json"]:
        old.unlink(missing_ok=True)
    names = list(tensors)
    per = -(-len(names) // shards)
    weight_map = {}
    for s in range(shards):
        part = names[s * per:(s + 1) * per]
        file = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        save_file({n: tensors[n].contiguous() for n in part}, str(directory / file), metadata={"format": "pt"})
        weight_map.update({n: file for n in part})
    (directory / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))


def make_block_fp8(directory, model: str = "tiny_moe", **widen) -> dict[str, np.ndarray]:
    """A checkpoint in DeepSeek-V3's published layout (F8_E4M3 `weight` + F32 `weight_scale_inv`, the
    quantization_config it ships); returns every quantized weight's value, dequantized with numpy."""
    wide = make_checkpoint(directory, model, shards=1, **widen)
    tensors, values = {}, {}
    for name, w in wide.items():
        if not _quantized_by_deepseek(name):
            tensors[name] = w
            continue
        codes, scale = _fp8_block_by_hand(w.float().numpy())
        tensors[name] = torch.from_numpy(codes.view(np.uint8)).view(torch.float8_e4m3fn)
        tensors[name[: -len("weight")] + "weight_scale_inv"] = torch.from_numpy(scale)
        values[name] = _fp8_block_value(codes.view(np.uint8), scale)
    _write_shards(directory, tensors)
    config = json.loads((directory / "config.json").read_text())
    config["quantization_config"] = dict(DEEPSEEK_QC)
    (directory / "config.json").write_text(json.dumps(config, indent=2))
    return values


def _fp8_block_value(code_bytes: np.ndarray, scale: np.ndarray, r: int = 128, c: int = 128) -> np.ndarray:
    """Independent dequantization: ml_dtypes' e4m3 decoding, numpy's float32 block multiply."""
    n, k = code_bytes.shape
    return code_bytes.view(ml_dtypes.float8_e4m3fn).astype(np.float32) * np.repeat(np.repeat(scale, r, 0), c, 1)[:n, :k]


def _same_bytes(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.reshape(-1).view(torch.uint8),
                                                                      b.reshape(-1).view(torch.uint8))


def _contract(tmp_path, name: str, rules: str, hw: str = "H100", model: str = "tiny_moe", schemes: str = ""):
    replay = "  routing replay rollout\n" if "moe" in model else ""
    path = tmp_path / f"{name}.prec"
    path.write_text(f"contract {name} {{\n  model {model}\n  hardware {hw}\n{schemes}"
                    f"  rollout sglang {{\n    {rules}\n  }}\n"
                    "  trainer megatron {\n    gemm : bf16\n    optimizer adam\n  }\n  trainable all\n"
                    "  sync full_weights { schedule colocated bridge bf16 activation atomic }\n"
                    f"{replay}}}\n", encoding="utf-8")
    return path


def _convert(contract, src, dst, capsys, *extra):
    code = main(["convert", str(contract), "--from", str(src), "--to", str(dst), "--json", *extra])
    out = capsys.readouterr()
    assert code == 0, out.err
    return json.loads(out.out)["result"]


def _verify(contract, dst, src, capsys):
    code = main(["verify-checkpoint", str(contract), str(dst), "--source", str(src), "--full", "--json"])
    report = json.loads(capsys.readouterr().out)["result"]
    assert code == 0, report["problems"]
    return report


def _source_bytes(directory) -> int:
    """Bytes of every tensor in the checkpoint's shards, from their headers."""
    header = {}
    for f in directory.glob("*.safetensors"):
        raw = f.read_bytes()
        header.update(json.loads(raw[8:8 + int.from_bytes(raw[:8], "little")]))
    header.pop("__metadata__", None)
    return sum(e["data_offsets"][1] - e["data_offsets"][0] for e in header.values())


@pytest.fixture(scope="module")
def fp8(tmp_path_factory):
    src = tmp_path_factory.mktemp("fp8") / "deepseek-style"
    return src, make_block_fp8(src)


# ---- block FP8 ----

def test_block_fp8_to_block_fp8_is_bit_identical(fp8, tmp_path, capsys):
    src, _ = fp8
    contract = write_contract(tmp_path, "fp8_block")  # linear : fp8_block; embed, lm_head, router, norm wide
    dst = tmp_path / "out"
    summary = _convert(contract, src, dst, capsys)
    assert summary["input_bytes"] == _source_bytes(src)  # every source byte read once
    source, out = load_tensors(src), load_tensors(dst)
    assert set(out) == set(source)  # scales are targets, not extra copies; nothing added or lost
    for name, t in source.items():
        assert _same_bytes(out[name], t), name
    qc = json.loads((dst / "config.json").read_text())["quantization_config"]
    assert qc["quant_method"] == "fp8" and qc["weight_block_size"] == [128, 128]
    report = _verify(contract, dst, src, capsys)
    assert report["values_checked"] == sum(1 for n in source if n.endswith(".weight"))


def test_block_fp8_dequantizes_exactly(fp8):
    from pcc.convert.source import open_source

    src, values = fp8
    s = open_source(src)
    try:
        assert set(s.view.encodings) == set(values)
        assert {e.kind for e in s.view.encodings.values()} == {"fp8_block"}
        for name, want in values.items():
            got = s.weight(name)
            assert got.dtype == torch.float32 and np.array_equal(got.numpy(), want), name
    finally:
        s.close()


def test_block_fp8_to_bf16(fp8, tmp_path, capsys):
    src, values = fp8
    contract = _contract(tmp_path, "wide", "linear : bf16")
    dst = tmp_path / "out"
    _convert(contract, src, dst, capsys)
    out, source = load_tensors(dst), load_tensors(src)
    assert not [n for n in out if "scale" in n]
    assert "quantization_config" not in json.loads((dst / "config.json").read_text())
    for name, want in values.items():
        assert out[name].dtype == torch.bfloat16
        assert torch.equal(out[name], torch.from_numpy(want).to(torch.bfloat16)), name
    norm = "model.layers.1.input_layernorm.weight"
    assert _same_bytes(out[norm], source[norm])
    _verify(contract, dst, src, capsys)


@pytest.mark.parametrize("fmt, scheme, target", [("int4", "int4_g32", "model.layers.2.mlp.down_proj.weight_packed"),
                                                  ("nvfp4", "nvfp4", "model.layers.1.mlp.experts.3.up_proj.weight")])
def test_block_fp8_to_another_scheme(fp8, tmp_path, capsys, fmt, scheme, target):
    """Requantized from the exact dequantized values: the codes are pcc's quantizer applied to them."""
    model = "tiny_dense" if fmt == "int4" else "tiny_moe"
    if model == "tiny_dense":
        src = tmp_path / "dense"
        values = make_block_fp8(src, "tiny_dense")
    else:
        src, values = fp8
    contract = write_contract(tmp_path, fmt)
    dst = tmp_path / "out"
    _convert(contract, src, dst, capsys, "--no-calibrate")
    out = load_tensors(dst)
    name = target.rsplit(".", 1)[0] + ".weight"
    q = quantize(torch.from_numpy(values[name]), scheme, name=name)
    assert _same_bytes(out[target], q.codes)
    _verify(contract, dst, src, capsys)


def test_block_fp8_to_nvfp4_calibrates_from_dequantized_weights(fp8, tmp_path, capsys):
    src, _ = fp8
    contract = write_contract(tmp_path, "nvfp4")
    summary = _convert(contract, src, tmp_path / "out", capsys, "--calibrate")
    assert summary["calibrated_input_scales"] == summary["input_scales"] > 0


def test_compile_model_from_a_block_fp8_directory(fp8, tmp_path, capsys):
    """The plan of a block-FP8 checkpoint: its FP8 weights kept wide are BF16 targets (and BF16 on the bridge)."""
    src, values = fp8
    contract = tmp_path / "ds.prec"
    contract.write_text(f'contract ds {{\n  model from "{src}"\n  hardware H100\n'
                        "  rollout sglang {\n    linear : fp8_block\n    keep bf16 : attn, embed, lm_head, router, norm\n"
                        "  }\n  trainer megatron {\n    gemm : bf16\n    optimizer adam\n  }\n  trainable all\n"
                        "  sync full_weights { schedule colocated bridge bf16 activation atomic }\n"
                        "  routing replay rollout\n}\n", encoding="utf-8")
    bundle = tmp_path / "bundle"
    assert main(["compile", str(contract), "-o", str(bundle)]) == 0, capsys.readouterr().err
    capsys.readouterr()
    doc = json.loads((bundle / "convert" / "plan.json").read_text())
    assert not [e["source"] for e in doc["copied"] if "scale" in e["source"]]  # scales belong to their weights
    by = {e["source"]: e for e in doc["tensors"]}
    q = "model.layers.0.self_attn.q_proj.weight"
    assert by[q]["targets"] == {q: {"dtype": "bfloat16", "shape": [128, 128]}}
    e = "model.layers.0.mlp.experts.0.gate_proj.weight"
    assert by[e]["targets"][e]["dtype"] == "float8_e4m3fn"
    params = sum(v.size for v in values.values()) + sum(
        t.numel() for n, t in load_tensors(src).items() if n.endswith(".weight") and n not in values)
    assert doc["sync"]["bytes_per_version"] == 2 * params  # the BF16 bridge
    # The bundle converts: attention dequantized to BF16, experts copied bit for bit.
    dst = tmp_path / "out"
    _convert(bundle, src, dst, capsys)
    out, source = load_tensors(dst), load_tensors(src)
    assert torch.equal(out[q], torch.from_numpy(values[q]).to(torch.bfloat16))
    assert q[: -len("weight")] + "weight_scale_inv" not in out
    assert _same_bytes(out[e], source[e]) and _same_bytes(out[e + "_scale_inv"], source[e + "_scale_inv"])
    _verify(bundle, dst, src, capsys)


TINY_DEEPSEEK = dict(hidden_size=256, intermediate_size=384, moe_intermediate_size=96, num_hidden_layers=3,
                     num_attention_heads=4, num_key_value_heads=4, q_lora_rank=192, kv_lora_rank=160,
                     qk_nope_head_dim=32, qk_rope_head_dim=16, v_head_dim=32, n_routed_experts=8,
                     num_experts_per_tok=2, first_k_dense_replace=1, n_group=2, topk_group=1, vocab_size=512,
                     num_nextn_predict_layers=0, max_position_embeddings=512)


def test_deepseek_v3_names_mla_shared_experts_and_a_dense_layer(tmp_path, capsys):
    """DeepSeek-V3's own config and tensor names, shrunk: MLA (q_a/q_b, kv_a_proj_with_mqa, kv_b), a dense
    first layer, shared experts; every FP8 linear copied bit for bit, or dequantized to BF16."""
    src = tmp_path / "ds"
    values = make_block_fp8(src, "deepseek_v3", **TINY_DEEPSEEK)
    assert "model.layers.0.self_attn.kv_a_proj_with_mqa.weight" in values
    assert "model.layers.1.mlp.shared_experts.down_proj.weight" in values
    fp8 = _contract(tmp_path, "ds", "linear : fp8_block\n    keep bf16 : embed, lm_head, router, norm", model="deepseek_v3")
    fp8.write_text(fp8.read_text().replace("model deepseek_v3", f'model from "{src}"'))
    _convert(fp8, src, tmp_path / "fp8", capsys)
    source, out = load_tensors(src), load_tensors(tmp_path / "fp8")
    assert set(out) == set(source) and all(_same_bytes(out[n], t) for n, t in source.items())
    _verify(fp8, tmp_path / "fp8", src, capsys)
    wide = _contract(tmp_path, "dsw", "linear : bf16", model="deepseek_v3")
    wide.write_text(wide.read_text().replace("model deepseek_v3", f'model from "{src}"'))
    _convert(wide, src, tmp_path / "wide", capsys)
    out = load_tensors(tmp_path / "wide")
    for name, want in values.items():
        assert torch.equal(out[name], torch.from_numpy(want).to(torch.bfloat16)), name
    _verify(wide, tmp_path / "wide", src, capsys)


def test_partial_edge_blocks_and_ue8m0_scales(tmp_path, capsys):
    """K and N not multiples of 128 (edge blocks), and power-of-two scales (`scale_fmt ue8m0`) copied into a
    pow2 rollout scheme."""
    src = tmp_path / "src"
    wide = make_checkpoint(src, "tiny_dense", shards=1, intermediate_size=200)
    tensors, values = {}, {}
    for name, w in wide.items():
        if not _quantized_by_deepseek(name):
            tensors[name] = w
            continue
        x = w.float().numpy()
        n, k = x.shape
        codes, scale = _fp8_block_by_hand(x)
        scale = np.exp2(np.ceil(np.log2(scale))).astype(np.float32)  # ue8m0: the next power of two
        full = np.repeat(np.repeat(scale, 128, 0), 128, 1)[:n, :k]
        codes = (x / full).astype(ml_dtypes.float8_e4m3fn)
        tensors[name] = torch.from_numpy(codes.view(np.uint8)).view(torch.float8_e4m3fn)
        tensors[name[: -len("weight")] + "weight_scale_inv"] = torch.from_numpy(scale)
        values[name] = _fp8_block_value(codes.view(np.uint8), scale)
    _write_shards(src, tensors, shards=1)
    config = json.loads((src / "config.json").read_text())
    config["quantization_config"] = dict(DEEPSEEK_QC, scale_fmt="ue8m0")
    (src / "config.json").write_text(json.dumps(config))
    assert tensors["model.layers.0.mlp.down_proj.weight_scale_inv"].shape == (1, 2)
    contract = _contract(tmp_path, "ue8m0", "linear : fp8_ue8m0\n    keep bf16 : embed, lm_head, norm",
                         model="tiny_dense", schemes="  scheme fp8_ue8m0 = fp8_e4m3 block 128x128 scale pow2\n")
    dst = tmp_path / "out"
    _convert(contract, src, dst, capsys)
    out = load_tensors(dst)
    for name in tensors:
        assert _same_bytes(out[name], tensors[name]), name
    _verify(contract, dst, src, capsys)
    wide_contract = _contract(tmp_path, "wide", "linear : bf16", model="tiny_dense")
    _convert(wide_contract, src, tmp_path / "wide", capsys)
    out = load_tensors(tmp_path / "wide")
    for name, want in values.items():
        assert torch.equal(out[name], torch.from_numpy(want).to(torch.bfloat16)), name


# ---- malformed sources: errors naming the tensor ----

def _fail(contract, src, dst, capsys) -> str:
    code = main(["convert", str(contract), "--from", str(src), "--to", str(dst)])
    err = capsys.readouterr().err
    assert code in (1, 2) and "Traceback" not in err and "internal error" not in err, err
    assert not dst.exists()
    return err


@pytest.fixture
def fp8_copy(fp8, tmp_path):
    src = tmp_path / "src"
    shutil.copytree(fp8[0], src)
    return src, write_contract(tmp_path, "fp8_block")


def _edit(src, fn) -> None:
    for f in sorted(src.glob("*.safetensors")):
        tensors = load_file(str(f))
        if fn(tensors):
            save_file(tensors, str(f), metadata={"format": "pt"})
    index = src / "model.safetensors.index.json"
    weight_map = {}
    for f in sorted(src.glob("*.safetensors")):
        with safe_open(str(f), framework="pt") as h:
            weight_map.update({n: f.name for n in h.keys()})
    index.write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))


def test_missing_scale_names_the_tensor(fp8_copy, tmp_path, capsys):
    src, contract = fp8_copy
    name = "model.layers.1.self_attn.o_proj.weight"
    _edit(src, lambda t: t.pop(name + "_scale_inv", None) is not None)
    err = _fail(contract, src, tmp_path / "dst", capsys)
    assert name in err and "weight_scale_inv" in err


def test_misshapen_scale_names_the_tensor(fp8_copy, tmp_path, capsys):
    src, contract = fp8_copy
    name = "model.layers.2.mlp.experts.4.down_proj.weight_scale_inv"

    def grow(t):
        if name in t:
            t[name] = torch.ones(3, 3)
            return True
        return False
    _edit(src, grow)
    err = _fail(contract, src, tmp_path / "dst", capsys)
    assert name in err and "[3, 3]" in err


def test_nan_scale_names_the_tensor(fp8_copy, tmp_path, capsys):
    src, contract = fp8_copy
    name = "model.layers.3.mlp.experts.1.up_proj.weight"

    def poison(t):
        if name + "_scale_inv" in t:
            t[name + "_scale_inv"] = torch.full_like(t[name + "_scale_inv"], float("nan"))
            return True
        return False
    _edit(src, poison)
    err = _fail(contract, src, tmp_path / "dst", capsys)  # copied: its scales are checked
    assert name in err and "NaN" in err
    wide = _contract(tmp_path, "wide", "linear : bf16")
    err = _fail(wide, src, tmp_path / "dst2", capsys)  # dequantized: the value is checked
    assert name in err and "NaN" in err


@pytest.mark.parametrize("qc, named", [({"quant_method": "gptq", "bits": 4}, "'gptq'"),
                                       ({"quant_method": "fp8", "activation_scheme": "dynamic"}, "weight_block_size")])
def test_unknown_or_incomplete_quantization_config(fp8_copy, tmp_path, capsys, qc, named):
    src, contract = fp8_copy
    config = json.loads((src / "config.json").read_text())
    config["quantization_config"] = qc
    (src / "config.json").write_text(json.dumps(config))
    err = _fail(contract, src, tmp_path / "dst", capsys)
    assert named in err and "config.json" in err


# ---- NVFP4 (ModelOpt), INT4 (compressed-tensors), MXFP4 (gpt-oss) ----

@pytest.fixture(scope="module")
def wide_moe(tmp_path_factory):
    src = tmp_path_factory.mktemp("wide") / "moe"
    make_checkpoint(src, "tiny_moe")
    return src


def _unpack_e2m1(packed: np.ndarray) -> np.ndarray:
    """uint8 [..., K/2] -> E2M1 values [..., K], element 2i in the low nibble."""
    both = np.stack((packed & 0xF, packed >> 4), axis=-1).reshape(*packed.shape[:-1], -1)
    return E2M1[both]


def test_nvfp4_source(wide_moe, tmp_path, capsys):
    contract = write_contract(tmp_path, "nvfp4")  # experts : nvfp4, experts[0] wide
    src = tmp_path / "modelopt"
    made = _convert(contract, wide_moe, src, capsys, "--calibrate")  # a ModelOpt layout with calibrated scales
    assert made["calibrated_input_scales"] > 0
    source = load_tensors(src)
    # Same scheme: every tensor bit for bit, the calibrated input_scales carried over.
    dst = tmp_path / "same"
    summary = _convert(contract, src, dst, capsys)
    assert summary["carried_input_scales"] == summary["input_scales"] and summary["calibrated_input_scales"] == 0
    out = load_tensors(dst)
    assert set(out) == set(source) and all(_same_bytes(out[n], t) for n, t in source.items())
    _verify(contract, dst, src, capsys)
    # To BF16: the independent dequantization, rounded to BF16.
    wide = _contract(tmp_path, "wide", "linear : bf16")
    _convert(wide, src, tmp_path / "wide", capsys)
    out = load_tensors(tmp_path / "wide")
    assert not [n for n in out if "scale" in n]
    p = "model.layers.2.mlp.experts.5.down_proj"
    codes = source[p + ".weight"].numpy()
    block = source[p + ".weight_scale"].view(torch.uint8).numpy().view(ml_dtypes.float8_e4m3fn).astype(np.float32)
    value = _unpack_e2m1(codes) * np.repeat(block, 16, 1) * source[p + ".weight_scale_2"].numpy()
    assert torch.equal(out[p + ".weight"], torch.from_numpy(value.astype(np.float32)).to(torch.bfloat16))
    _verify(wide, tmp_path / "wide", src, capsys)
    # To block FP8.
    fp8 = write_contract(tmp_path, "fp8_block")
    _convert(fp8, src, tmp_path / "fp8", capsys)
    _verify(fp8, tmp_path / "fp8", src, capsys)


def test_int4_source_with_bf16_scales_and_zero_points(tmp_path, capsys):
    """compressed-tensors pack-quantized, asymmetric, scales in BF16 as its exports store them."""
    from compressed_tensors.compressors.pack_quantized.helpers import unpack_from_int32

    wide = tmp_path / "wide_src"
    make_checkpoint(wide, "tiny_dense")
    schemes = "  scheme int4a = int4 weights group 32 asymmetric\n"
    contract = _contract(tmp_path, "int4a", "linear : int4a\n    keep bf16 : embed, lm_head, norm",
                         model="tiny_dense", schemes=schemes)
    src = tmp_path / "ct"
    _convert(contract, wide, src, capsys)
    tensors = load_tensors(src)
    for n in [n for n in tensors if n.endswith(".weight_scale")]:
        tensors[n] = tensors[n].to(torch.bfloat16)
    _write_shards(src, tensors)
    qc = json.loads((src / "config.json").read_text())["quantization_config"]
    assert qc["format"] == "pack-quantized" and qc["config_groups"]["group_0"]["weights"]["symmetric"] is False
    # Same scheme: codes and zero points bit for bit, scales widened exactly to the layout's float32.
    dst = tmp_path / "same"
    _convert(contract, src, dst, capsys)
    out = load_tensors(dst)
    for n, t in tensors.items():
        if n.endswith(".weight_scale"):
            assert out[n].dtype == torch.float32 and torch.equal(out[n], t.float()), n
        else:
            assert _same_bytes(out[n], t), n
    _verify(contract, dst, src, capsys)
    # To BF16: compressed-tensors' own unpacking, (q - zp) * scale.
    wide_contract = _contract(tmp_path, "wide", "linear : bf16", model="tiny_dense")
    _convert(wide_contract, src, tmp_path / "wide", capsys)
    out = load_tensors(tmp_path / "wide")
    p = "model.layers.3.mlp.gate_proj"
    n, k = tensors[p + ".weight_shape"].tolist()
    q = unpack_from_int32(tensors[p + ".weight_packed"], 4, torch.Size([n, k])).numpy().astype(np.float32)
    zp = unpack_from_int32(tensors[p + ".weight_zero_point"], 4, torch.Size([n, k // 32]), packed_dim=0)
    value = (q - np.repeat(zp.numpy().astype(np.float32), 32, 1)) * np.repeat(tensors[p + ".weight_scale"].float().numpy(), 32, 1)
    assert torch.equal(out[p + ".weight"], torch.from_numpy(value).to(torch.bfloat16))
    _verify(wide_contract, tmp_path / "wide", src, capsys)
    # To another group size: requantized.
    g128 = _contract(tmp_path, "g128", "linear : int4_g128\n    keep bf16 : embed, lm_head, norm", model="tiny_dense")
    _convert(g128, src, tmp_path / "g128", capsys)
    _verify(g128, tmp_path / "g128", src, capsys)


def test_mxfp4_source_in_the_gpt_oss_layout(wide_moe, tmp_path, capsys):
    contract = write_contract(tmp_path, "mxfp4")
    src = tmp_path / "gpt-oss-style"
    _convert(contract, wide_moe, src, capsys)
    source = load_tensors(src)
    dst = tmp_path / "same"
    summary = _convert(contract, src, dst, capsys)
    assert summary["input_bytes"] == _source_bytes(src)  # one expert's slice at a time, each byte counted once
    out = load_tensors(dst)
    assert set(out) == set(source) and all(_same_bytes(out[n], t) for n, t in source.items())
    _verify(contract, dst, src, capsys)
    wide = _contract(tmp_path, "wide", "linear : bf16")
    _convert(wide, src, tmp_path / "wide", capsys)
    out = load_tensors(tmp_path / "wide")
    base = "model.layers.1.mlp.experts"
    blocks = source[base + ".gate_up_proj_blocks"].numpy()  # [E, 2I, K/32, 16]
    scales = source[base + ".gate_up_proj_scales"].numpy().astype(np.int32)  # [E, 2I, K/32]
    value = _unpack_e2m1(blocks) * np.exp2(scales - 127).astype(np.float32)[..., None]  # [E, 2I, K/32, 32]
    value = value.reshape(blocks.shape[0], blocks.shape[1], -1)
    for j, (proj, rows) in enumerate([("gate_proj", slice(0, None, 2)), ("up_proj", slice(1, None, 2))]):
        name = f"{base}.6.{proj}.weight"
        assert torch.equal(out[name], torch.from_numpy(np.ascontiguousarray(value[6, rows])).to(torch.bfloat16)), name
    _verify(wide, tmp_path / "wide", src, capsys)


def test_per_tensor_fp8_source(wide_moe, tmp_path, capsys):
    """`P.weight` F8_E4M3 + `P.weight_scale` F32 [] (quant_method fp8 without blocks): copied into an FP8
    per-tensor rollout, dequantized as code x scale for BF16."""
    contract = _contract(tmp_path, "fp8t", "linear : fp8_tensor\n    keep bf16 : embed, lm_head, router, norm")
    src = tmp_path / "fp8t-src"
    _convert(contract, wide_moe, src, capsys)
    source = load_tensors(src)
    assert "weight_block_size" not in json.loads((src / "config.json").read_text())["quantization_config"]
    dst = tmp_path / "same"
    _convert(contract, src, dst, capsys)
    out = load_tensors(dst)
    assert set(out) == set(source) and all(_same_bytes(out[n], t) for n, t in source.items())
    _verify(contract, dst, src, capsys)
    wide = _contract(tmp_path, "wide", "linear : bf16")
    _convert(wide, src, tmp_path / "wide", capsys)
    out = load_tensors(tmp_path / "wide")
    p = "model.layers.0.self_attn.v_proj"
    codes = source[p + ".weight"].view(torch.uint8).numpy().view(ml_dtypes.float8_e4m3fn).astype(np.float32)
    value = codes * source[p + ".weight_scale"].numpy()
    assert torch.equal(out[p + ".weight"], torch.from_numpy(value).to(torch.bfloat16))


def test_a_compressed_tensors_format_it_does_not_read(tmp_path, capsys):
    wide = tmp_path / "wide_src"
    make_checkpoint(wide, "tiny_dense")
    contract = write_contract(tmp_path, "int4")
    src = tmp_path / "ct"
    _convert(contract, wide, src, capsys)
    config = json.loads((src / "config.json").read_text())
    config["quantization_config"]["format"] = "nvfp4-pack-quantized"
    (src / "config.json").write_text(json.dumps(config))
    err = _fail(contract, src, tmp_path / "dst", capsys)
    assert "nvfp4-pack-quantized" in err and "config.json" in err


def _ct_fp8_config(strategy: str, block=None) -> dict:
    """llm-compressor's FP8_DYNAMIC (channel) / FP8_BLOCK quantization_config, as compressed-tensors writes it."""
    weights = {"num_bits": 8, "type": "float", "symmetric": True, "strategy": strategy, "dynamic": False,
               "group_size": None, "block_structure": block, "actorder": None, "observer": "minmax"}
    acts = {"num_bits": 8, "type": "float", "symmetric": True, "strategy": "token" if block is None else "group",
            "dynamic": True, "group_size": None if block is None else 128}
    return {"quant_method": "compressed-tensors", "format": "float-quantized", "quantization_status": "compressed",
            "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights, "input_activations": acts,
                                          "output_activations": None, "format": "float-quantized"}},
            "ignore": ["lm_head"], "kv_cache_scheme": None}


@pytest.mark.parametrize("strategy, block", [("channel", None), ("block", [128, 128])])
def test_compressed_tensors_fp8_source(wide_moe, tmp_path, capsys, strategy, block):
    """compressed-tensors float-quantized FP8 (per channel: `weight_scale` [N, 1]; per block: [N/128, K/128]):
    `model from` it checks with no scale extras, and it converts to BF16 as code x scale exactly."""
    wide = load_tensors(wide_moe)
    tensors, values = {}, {}
    for name, w in wide.items():
        if not _quantized_by_deepseek(name):
            tensors[name] = w
            continue
        x = w.float().numpy()
        if block is None:
            scale = (np.abs(x).max(axis=1, keepdims=True) / np.float32(448.0)).astype(np.float32)
            codes = (x / scale).astype(ml_dtypes.float8_e4m3fn)
            values[name] = codes.astype(np.float32) * scale
        else:
            codes, scale = _fp8_block_by_hand(x)
            values[name] = _fp8_block_value(codes.view(np.uint8), scale)
        tensors[name] = torch.from_numpy(codes.view(np.uint8)).view(torch.float8_e4m3fn)
        tensors[name[: -len("weight")] + "weight_scale"] = torch.from_numpy(scale).to(torch.bfloat16 if block is None else torch.float32)
        if block is None:  # BF16 scales: their value is what the checkpoint holds
            values[name] = codes.astype(np.float32) * torch.from_numpy(scale).to(torch.bfloat16).float().numpy()
    src = tmp_path / "ct-fp8"
    shutil.copytree(wide_moe, src)
    _write_shards(src, tensors)
    config = json.loads((src / "config.json").read_text())
    config["quantization_config"] = _ct_fp8_config(strategy, block)
    (src / "config.json").write_text(json.dumps(config))
    from pcc.models import catalog_from_checkpoint

    cat = catalog_from_checkpoint(src)
    assert not [t for t in cat.extra_tensors if "scale" in t]
    assert {op.dtype for op in cat.operators if op.tensor in values} == {"fp8_e4m3"}
    wide_contract = _contract(tmp_path, "wide", "linear : bf16")
    _convert(wide_contract, src, tmp_path / "wide", capsys)
    out = load_tensors(tmp_path / "wide")
    for name, want in values.items():
        assert torch.equal(out[name], torch.from_numpy(want).to(torch.bfloat16)), name
    _verify(wide_contract, tmp_path / "wide", src, capsys)
