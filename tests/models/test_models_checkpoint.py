"""Catalogs read from checkpoint directories that the tests write themselves."""

import json
import re
import struct

import pytest
import torch
from safetensors.torch import save_file

from pcc.models import CatalogError, catalog_from_checkpoint, load_catalog
from pcc.models.builtin import catalog_from_config, tensor_names

INDEX = "model.safetensors.index.json"


def write_checkpoint(root, config, tensors, shards=2, index=True):
    """config.json, ``shards`` safetensors files and (optionally) the index."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "config.json").write_text(json.dumps(config))
    names = list(tensors)
    weight_map = {}
    for shard in range(shards):
        file = f"model-{shard + 1:05d}-of-{shards:05d}.safetensors"
        part = {name: tensors[name] for name in names[shard::shards]}
        save_file(part, str(root / file))
        weight_map.update(dict.fromkeys(part, file))
    if index:
        (root / INDEX).write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return root


def tensors_for(catalog, extra=None):
    """Zero tensors with the catalog's shapes: what a real checkpoint of it holds."""
    tensors = {op.tensor: torch.zeros(op.shape, dtype=torch.bfloat16)
               for op in catalog.operators if op.family != "kv_cache"}
    tensors.update({name: torch.zeros(4, dtype=torch.float32) for name in catalog.extra_tensors})
    tensors.update(extra or {})
    return tensors


@pytest.fixture
def tiny_moe(tmp_path):
    catalog = load_catalog("tiny_moe")
    extra = {"model.layers.0.self_attn.rotary_emb.inv_freq": torch.zeros(16, dtype=torch.float32)}
    return write_checkpoint(tmp_path / "tiny_moe", catalog.config, tensors_for(catalog, extra))


def test_reads_names_shapes_dtypes_and_families(tiny_moe):
    catalog = catalog_from_checkpoint(tiny_moe)
    ops = {op.tensor: op for op in catalog.operators}
    # tiny_moe: hidden 128, 4 heads x 32, 2 kv heads x 32, 8 experts of width 64, vocab 512.
    expected = {
        "model.embed_tokens.weight": ("embed", None, None, (512, 128)),
        "model.layers.2.input_layernorm.weight": ("norm", 2, None, (128,)),
        "model.layers.2.self_attn.q_norm.weight": ("norm", 2, None, (32,)),
        "model.layers.2.self_attn.q_proj.weight": ("attn.q", 2, None, (128, 128)),
        "model.layers.2.self_attn.k_proj.weight": ("attn.kv", 2, None, (64, 128)),
        "model.layers.2.self_attn.v_proj.weight": ("attn.kv", 2, None, (64, 128)),
        "model.layers.2.self_attn.o_proj.weight": ("attn.o", 2, None, (128, 128)),
        "model.layers.2.mlp.gate.weight": ("router", 2, None, (8, 128)),
        "model.layers.2.mlp.experts.7.gate_proj.weight": ("experts.gate_up", 2, 7, (64, 128)),
        "model.layers.2.mlp.experts.7.up_proj.weight": ("experts.gate_up", 2, 7, (64, 128)),
        "model.layers.2.mlp.experts.7.down_proj.weight": ("experts.down", 2, 7, (128, 64)),
        "model.norm.weight": ("norm", None, None, (128,)),
        "lm_head.weight": ("lm_head", None, None, (512, 128)),
        "model.layers.2.self_attn.kv_cache": ("kv_cache", 2, None, (2, 64)),
    }
    for tensor, (family, layer, expert, shape) in expected.items():
        op = ops[tensor]
        assert (op.family, op.layer, op.expert, op.shape, op.dtype) == (
            family, layer, expert, shape, "bf16"), tensor
    assert catalog.extra_tensors == ("model.layers.0.self_attn.rotary_emb.inv_freq",)
    assert catalog.source == str(tiny_moe) and catalog.name == str(tiny_moe)
    assert catalog.architecture == "moe"


@pytest.mark.parametrize("name", ["tiny_dense", "tiny_moe"])
def test_checkpoint_agrees_with_built_in_catalog(tmp_path, name):
    built = load_catalog(name)
    read = catalog_from_checkpoint(write_checkpoint(tmp_path / name, built.config,
                                                    tensors_for(built)))
    assert read.operators == built.operators
    assert read.extra_tensors == built.extra_tensors
    assert read.architecture == built.architecture


def test_mla_checkpoint_agrees_with_config(tmp_path):
    # A shrunken DeepSeek-V3 layout: 3 layers (1 dense), 4 experts, MTP layer 3 on disk.
    cfg = dict(load_catalog("deepseek_v3").config, hidden_size=64, intermediate_size=96,
               moe_intermediate_size=32, num_hidden_layers=3, first_k_dense_replace=1,
               num_attention_heads=2, num_key_value_heads=2, q_lora_rank=48, kv_lora_rank=32,
               qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16, n_routed_experts=4,
               vocab_size=100)
    built = catalog_from_config("small", cfg)
    mtp = {"model.layers.3.eh_proj.weight": torch.zeros(64, 128, dtype=torch.bfloat16),
           "model.layers.3.enorm.weight": torch.zeros(64, dtype=torch.bfloat16),
           "model.layers.3.mlp.experts.1.up_proj.weight": torch.zeros(32, 64, dtype=torch.bfloat16)}
    read = catalog_from_checkpoint(write_checkpoint(tmp_path / "mla", cfg, tensors_for(built, mtp)))
    assert read.operators[:len(built.operators) - 2] == built.operators[:-2]
    mtp_layer = [op for op in read.operators if op.layer == 3]  # the MTP layer: its own families
    assert [(op.tensor, op.family, op.expert) for op in mtp_layer] == [
        ("model.layers.3.eh_proj.weight", "mtp", None), ("model.layers.3.enorm.weight", "norm", None),
        ("model.layers.3.mlp.experts.1.up_proj.weight", "experts.gate_up", 1)]
    assert read.operators[-2:] == built.operators[-2:]  # final norm, lm_head stay last
    assert read.extra_tensors == built.extra_tensors  # e_score_correction_bias x 2
    assert read.architecture == "mla_moe"


def test_index_only_takes_shapes_from_config(tmp_path):
    built = load_catalog("tiny_moe")
    root = write_checkpoint(tmp_path / "ckpt", built.config, tensors_for(built))
    for shard in root.glob("*.safetensors"):
        shard.unlink()
    read = catalog_from_checkpoint(root)
    assert read.operators == built.operators


def test_unknown_tensor_is_other(tmp_path):
    built = load_catalog("tiny_dense")
    extra = {"model.layers.1.adapter.scale_proj.weight": torch.zeros(6, 2, dtype=torch.bfloat16),
             "speech_encoder.proj.weight": torch.zeros(3, 2, dtype=torch.bfloat16)}
    read = catalog_from_checkpoint(
        write_checkpoint(tmp_path / "ckpt", built.config, tensors_for(built, extra)))
    others = [(op.tensor, op.family, op.layer, op.expert, op.shape) for op in read.operators if op.family == "other"]
    assert others == [("model.layers.1.adapter.scale_proj.weight", "other", 1, None, (6, 2)),
                      ("speech_encoder.proj.weight", "other", None, None, (3, 2))]
    assert [op for op in read.operators if op.family != "other"] == list(built.operators)


def test_vision_tower_is_the_vision_family(tmp_path):
    """Qwen-VL's `visual.*` linears are `vision` operators, its norms `norm`, a conv patch embedding `other`;
    all after the language model's tensors."""
    built = load_catalog("tiny_dense")
    extra = {"visual.blocks.0.attn.qkv.weight": torch.zeros(6, 2, dtype=torch.bfloat16),
             "visual.blocks.0.norm1.weight": torch.zeros(2, dtype=torch.bfloat16),
             "visual.patch_embed.proj.weight": torch.zeros(2, 3, 2, 2, dtype=torch.bfloat16)}
    read = catalog_from_checkpoint(
        write_checkpoint(tmp_path / "ckpt", built.config, tensors_for(built, extra)))
    assert read.operators[:len(built.operators)] == built.operators
    assert [(op.tensor, op.family) for op in read.operators[len(built.operators):]] == [
        ("visual.blocks.0.attn.qkv.weight", "vision"), ("visual.blocks.0.norm1.weight", "norm"),
        ("visual.patch_embed.proj.weight", "other")]


def test_single_file_without_index(tmp_path):
    built = load_catalog("tiny_dense")
    root = write_checkpoint(tmp_path / "ckpt", built.config, tensors_for(built), shards=1,
                            index=False)
    assert catalog_from_checkpoint(root).operators == built.operators


def test_fp8_dtype_comes_from_the_header(tmp_path):
    built = load_catalog("tiny_dense")
    tensors = tensors_for(built)
    name = "model.layers.1.self_attn.o_proj.weight"
    tensors[name] = tensors[name].to(torch.float8_e4m3fn)
    read = catalog_from_checkpoint(write_checkpoint(tmp_path / "ckpt", built.config, tensors))
    assert {op.tensor: op.dtype for op in read.operators}[name] == "fp8_e4m3"


def test_truncated_header_names_the_file(tmp_path):
    built = load_catalog("tiny_dense")
    root = write_checkpoint(tmp_path / "ckpt", built.config, tensors_for(built))
    shard = sorted(root.glob("*.safetensors"))[1]
    length = struct.unpack("<Q", shard.read_bytes()[:8])[0]
    shard.write_bytes(shard.read_bytes()[:8 + length // 2])
    with pytest.raises(CatalogError, match=f"{shard.name}.*truncated safetensors header"):
        catalog_from_checkpoint(root)
    shard.write_bytes(b"\x01\x02")
    with pytest.raises(CatalogError, match=f"{shard.name}.*truncated safetensors header"):
        catalog_from_checkpoint(root)


def test_garbage_header_names_the_file(tmp_path):
    built = load_catalog("tiny_dense")
    root = write_checkpoint(tmp_path / "ckpt", built.config, tensors_for(built))
    shard = sorted(root.glob("*.safetensors"))[0]
    shard.write_bytes(struct.pack("<Q", 4) + b"{{{{")
    with pytest.raises(CatalogError, match=f"{shard.name}.*unreadable safetensors header"):
        catalog_from_checkpoint(root)


def test_shape_mismatch_names_tensor_file_and_both_shapes(tmp_path):
    built = load_catalog("tiny_moe")
    tensors = tensors_for(built)
    name = "model.layers.1.mlp.experts.3.down_proj.weight"
    tensors[name] = torch.zeros(128, 65, dtype=torch.bfloat16)
    root = write_checkpoint(tmp_path / "ckpt", built.config, tensors)
    with pytest.raises(CatalogError) as err:
        catalog_from_checkpoint(root)
    message = str(err.value)
    assert name in message and "[128, 65]" in message and "[128, 64]" in message
    assert ".safetensors" in message


def test_unknown_model_type_trusts_headers_and_infers_architecture(tmp_path):
    built = load_catalog("tiny_moe")
    cfg = dict(built.config, model_type="mystery_moe")
    tensors = tensors_for(built)
    tensors["model.layers.1.mlp.experts.3.down_proj.weight"] = torch.zeros(
        128, 65, dtype=torch.bfloat16)
    read = catalog_from_checkpoint(write_checkpoint(tmp_path / "ckpt", cfg, tensors))
    assert read.architecture == "moe"
    assert [op.family for op in read.operators] == [op.family for op in built.operators]


def test_missing_config(tmp_path):
    built = load_catalog("tiny_dense")
    root = write_checkpoint(tmp_path / "ckpt", built.config, tensors_for(built))
    (root / "config.json").unlink()
    with pytest.raises(CatalogError, match="missing config.json"):
        catalog_from_checkpoint(root)


@pytest.mark.parametrize("name", ["qwen3_30b_a3b", "deepseek_v3", "llama3_8b", "kimi_k2"])
def test_config_only_directory_is_the_config_catalog(tmp_path, name):
    """What a model card links before anyone downloads 1 TB: config.json alone."""
    built = load_catalog(name)
    (tmp_path / "config.json").write_text(json.dumps(built.config))
    cat = catalog_from_checkpoint(tmp_path)
    assert [(op.tensor, op.family, op.shape, op.dtype) for op in cat.operators] == \
        [(op.tensor, op.family, op.shape, op.dtype) for op in built.operators]


def test_config_only_of_an_unknown_model_type_asks_for_the_index(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "mamba", "num_hidden_layers": 2}))
    with pytest.raises(CatalogError, match="model.safetensors.index.json"):
        catalog_from_checkpoint(tmp_path)


def test_partly_downloaded_shards(tmp_path):
    built = load_catalog("tiny_dense")
    root = write_checkpoint(tmp_path / "ckpt", built.config, tensors_for(built))
    missing = sorted(root.glob("*.safetensors"))[0]
    missing.unlink()
    with pytest.raises(CatalogError, match=re.escape(f"{missing}: shard file missing")) as info:
        catalog_from_checkpoint(root)
    assert info.value.code == "PCC210"


def test_index_pointing_at_the_wrong_shard(tmp_path):
    built = load_catalog("tiny_dense")
    root = write_checkpoint(tmp_path / "ckpt", built.config, tensors_for(built))
    index = json.loads((root / INDEX).read_text())
    files = sorted(set(index["weight_map"].values()))
    name = "lm_head.weight"
    index["weight_map"][name] = files[0] if index["weight_map"][name] == files[1] else files[1]
    (root / INDEX).write_text(json.dumps(index))
    with pytest.raises(CatalogError, match=f"{name}.*header lacks it"):
        catalog_from_checkpoint(root)


def test_tensor_names_cover_the_built_catalog():
    cfg = load_catalog("tiny_moe").config
    weights, extras = tensor_names(cfg)
    assert len(weights) == len(set(weights)) == 139 - 4  # operators minus the 4 kv caches
    assert extras == []
    assert catalog_from_config("x", cfg).operators == load_catalog("tiny_moe").operators


def test_index_only_carries_unshaped_other_tensors_as_copied_extras(tmp_path):
    """An index without shards: tensors the config cannot shape and no rule can quantize
    (a vision tower) do not make the whole model unreadable."""
    from pcc.models.builtin import tensor_names

    built = load_catalog("tiny_dense")
    weights, extras = tensor_names(built.config)
    weight_map = {n: "model-00001-of-00002.safetensors" for n in weights + extras}
    weight_map["model.visual.blocks.0.attn.qkv.weight"] = "model-00002-of-00002.safetensors"
    (tmp_path / "config.json").write_text(json.dumps(built.config))
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    cat = catalog_from_checkpoint(tmp_path)
    assert len(cat.operators) == len(built.operators)
    assert "model.visual.blocks.0.attn.qkv.weight" in cat.extra_tensors


def test_the_order_is_the_names_whatever_the_headers():
    """Names the natural order reads alike (`extra.01`, `extra.1`) are ordered by the name itself: two checkpoints
    of the same names (one fingerprint) give one catalog whatever order their headers list them in, so a converter
    plan kept for one is the other's (pcc.convert.plan_cache)."""
    from pcc.models.catalog import assemble

    built = load_catalog("tiny_moe")
    weights = [(op.tensor, op.shape, op.dtype, "x") for op in built.operators if op.family != "kv_cache"]
    names = ["model.extra.01.bias", "model.extra.1.bias", "model.extra.001.bias", "model.extra.2.bias"]
    one = assemble("m", built.config, weights, names)
    other = assemble("m", built.config, weights[::-1], names[::-1])
    assert one.extra_tensors == other.extra_tensors and one.operators == other.operators
    assert one.extra_tensors[-1] == "model.extra.2.bias"
