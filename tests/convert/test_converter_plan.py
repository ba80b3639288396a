"""The converter plan and quantization_config of the shipped contracts, checked by hand and by the
engines' own config parsers where they are installed (compressed-tensors)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pcc.lower import lower
from pcc.lower.checkpoint_config import quantization_config
from pcc.plan import compile_file

CONTRACTS = Path(__file__).resolve().parents[2] / "contracts"


def _plan(name):
    c = compile_file(str(CONTRACTS / name))
    assert c.ok
    return c.plan


def _doc(name):
    return json.loads(lower(_plan(name), "converter").files["convert/plan.json"])


def test_unified_fp8_block_config_and_targets():
    doc = _doc("tiny_cpu.prec")
    qc = doc["quantization_config"]
    assert qc["quant_method"] == "fp8" and qc["weight_block_size"] == [128, 128]
    assert qc["modules_to_not_convert"] == ["model.embed_tokens"] + [f"model.layers.{i}.mlp.gate" for i in range(4)] \
        + ["lm_head"]
    q = next(e for e in doc["tensors"] if e["source"] == "model.layers.0.self_attn.k_proj.weight")
    assert q["targets"] == {"model.layers.0.self_attn.k_proj.weight": {"dtype": "float8_e4m3fn", "shape": [64, 128]},
                            "model.layers.0.self_attn.k_proj.weight_scale_inv": {"dtype": "float32", "shape": [1, 1]}}
    assert "quantize" in doc["recipes"][q["recipe"]]["steps"]
    assert "model.norm.weight" in doc["skip"] and "lm_head.weight" in doc["skip"]


def test_sync_bytes_full_weights_count_the_bf16_bridge():
    plan = _plan("tiny_cpu.prec")
    doc = _doc("tiny_cpu.prec")
    ops = [op for op in plan.catalog.operators if op.family != "kv_cache"]
    assert doc["sync"]["bytes_per_version"] == sum(2 * __import__("math").prod(op.shape) for op in ops)
    assert doc["sync"]["buckets"] == 1


def test_lora_sync_moves_adapter_bytes_only():
    doc = _doc("qwen38_nvfp4_lora.prec")
    s = doc["sync"]
    # qwen3_30b_a3b: 48 layers, hidden 2048, q 32x128 heads, k/v 4x128, rank 16, BF16.
    per_layer = 16 * 2 * ((2048 + 4096) + (2048 + 512) * 2 + (4096 + 2048))
    assert s["moves"] == "adapter" and s["bytes_per_version"] == 48 * per_layer
    assert len(s["adapter"]) == 48 * 4 and "bucket" not in doc["tensors"][0]
    assert doc["quantization_config"]["quant_algo"] == "NVFP4"


def test_int4_group_size_matches_trainer_and_compressed_tensors_parses_it():
    from compressed_tensors.quantization import QuantizationConfig

    plan = _plan("int4_qat_w4a16.prec")
    qc = quantization_config(plan)
    parsed = QuantizationConfig.model_validate(qc)
    group = plan.scheme("fprop", next(i for i, op in enumerate(plan.catalog.operators) if op.family == "attn.q"))
    assert parsed.config_groups["group_0"].weights.group_size == group.weights.size == 128
    assert parsed.format == "pack-quantized"


def test_mxfp8_and_mxfp4_layouts():
    qc = quantization_config(_plan("mxfp8_blackwell.prec"))
    assert qc["quant_method"] == "mxfp8" and qc["weight_block_size"] == [1, 32]
    doc = _doc("k3_mxfp4_lora.prec")
    assert doc["quantization_config"]["quant_method"] == "mxfp4"
    e = next(e for e in doc["tensors"] if e["source"] == "model.layers.3.mlp.experts.7.up_proj.weight")
    assert e["fuse"] == {"expert": 7, "parts": 768, "rows": "odd"}
    assert "fuse" in doc["recipes"][e["recipe"]]["steps"]


@pytest.mark.parametrize("name", ["unified_fp8.prec", "selective_nvfp4.prec"])
def test_plan_json_is_deterministic(name):
    a = lower(_plan(name), "converter").files["convert/plan.json"]
    b = lower(_plan(name), "converter").files["convert/plan.json"]
    assert a == b and json.loads(a)["tensors"]
