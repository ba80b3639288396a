"""Qwen3.5/3.6 MoE as Qwen publishes it: the language model under `model.language_model.`, each layer's routed experts
fused (`mlp.experts.gate_up_proj` [E, 2 x inter, hidden], gate rows first, and `mlp.experts.down_proj`
[E, hidden, inter], no `.weight`: transformers 5's own layout, which its Qwen3_5MoeForConditionalGeneration loads as
it is), a vision tower under `model.visual.` and an MTP layer under `mtp.`. With the index, pcc reads the fused
experts by name as the per-expert operators the config-only catalog lists (shapes from config.json); from shards
the same operators, their shapes checked against config.json (tests/convert/test_convert_qwen3_5_fused_experts.py
converts them). The vision tower and the MTP layer's tensors (its fused experts as stored) are extras."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pcc.models import CatalogError, catalog_from_checkpoint
from pcc.models.builtin import catalog_from_config

CONFIGS = Path(__file__).resolve().parents[2] / "pcc" / "models" / "configs"
TEXT = dict(hidden_size=64, num_attention_heads=2, num_key_value_heads=1, head_dim=32, vocab_size=128,
            num_hidden_layers=2, layer_types=["linear_attention", "full_attention"], num_experts=4,
            moe_intermediate_size=32, shared_expert_intermediate_size=32, linear_num_key_heads=2,
            linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=16)


def _config() -> dict:
    config = json.loads((CONFIGS / "qwen3_5_35b_a3b.json").read_text(encoding="utf-8"))
    config.pop("_source")
    config["text_config"].update(TEXT)
    return config


def _published_names(config: dict) -> list[str]:
    """The tensor names of the published layout: the catalog's, each layer's experts fused, plus the vision tower
    and the MTP layer."""
    names = []
    for op in catalog_from_config("c", config).operators:
        if op.family == "kv_cache":
            continue
        if ".mlp.experts." in op.tensor:
            base = op.tensor.split(".mlp.experts.")[0] + ".mlp.experts."
            names += [base + "gate_up_proj", base + "down_proj"]
        else:
            names.append(op.tensor)
    names += [t for t in catalog_from_config("c", config).extra_tensors]
    names += ["model.visual.patch_embed.proj.weight", "model.visual.blocks.0.attn.qkv.weight",
              "model.visual.merger.linear_fc1.weight", "mtp.fc.weight", "mtp.layers.0.mlp.experts.gate_up_proj",
              "mtp.norm.weight"]
    return list(dict.fromkeys(names))


def _write(directory: Path, config: dict, weight_map: dict) -> Path:
    directory.mkdir()
    (directory / "config.json").write_text(json.dumps(config))
    if weight_map:
        (directory / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return directory


def _view(catalog) -> list:
    return [(op.tensor, op.family, op.shape, op.dtype) for op in catalog.operators]


def test_index_with_fused_experts_reads_as_the_config(tmp_path):
    config = _config()
    names = _published_names(config)
    assert "model.language_model.layers.1.mlp.experts.gate_up_proj" in names
    config_only = catalog_from_checkpoint(_write(tmp_path / "config-only", config, {}))
    index_only = catalog_from_checkpoint(_write(tmp_path / "index", config,
                                                dict.fromkeys(names, "model-00001-of-00002.safetensors")))
    assert _view(index_only) == _view(config_only)
    extras = set(index_only.extra_tensors) - set(config_only.extra_tensors)
    # The MTP layer (`mtp.`, no decoder layer; the engines load it as their own draft model) is carried as stored,
    # its fused experts too, like the vision tower.
    assert extras == {n for n in names if n.startswith(("model.visual.", "mtp."))}
    ops = {op.tensor: op for op in index_only.operators}
    assert ops["model.language_model.layers.1.mlp.experts.3.gate_proj.weight"].shape == (32, 64)
    assert ops["model.language_model.layers.1.mlp.experts.3.down_proj.weight"].shape == (64, 32)
    assert ops["model.language_model.layers.0.linear_attn.in_proj_qkv.weight"].family == "attn.linear"


def test_fused_experts_in_shards_read_as_the_index(tmp_path):
    """From shards the fused experts are the same per-expert operators as by name; the MTP layer's stay stored."""
    torch = pytest.importorskip("torch")
    from safetensors.torch import save_file

    config = _config()
    config["text_config"].update(num_hidden_layers=1, layer_types=["linear_attention"])
    d = tmp_path / "shards"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(config))
    e = "model.language_model.layers.0.mlp.experts."
    save_file({e + "gate_up_proj": torch.zeros(4, 64, 64, dtype=torch.bfloat16),
               e + "down_proj": torch.zeros(4, 64, 32, dtype=torch.bfloat16),
               "mtp.layers.0.mlp.experts.gate_up_proj": torch.zeros(4, 64, 64, dtype=torch.bfloat16)},
              str(d / "model.safetensors"))
    cat = catalog_from_checkpoint(d)
    ops = {op.tensor: op for op in cat.operators if op.tensor.startswith(e)}
    assert sorted(ops) == sorted(f"{e}{j}.{p}.weight" for j in range(4) for p in ("gate_proj", "up_proj", "down_proj"))
    assert {ops[f"{e}3.{p}.weight"].shape for p in ("gate_proj", "up_proj")} == {(32, 64)}
    assert ops[f"{e}3.down_proj.weight"].shape == (64, 32)
    assert "mtp.layers.0.mlp.experts.gate_up_proj" in cat.extra_tensors


@pytest.mark.parametrize("layer_types", [["linear_attention"], "linear_attention", ["full_attention", 3]])
def test_layer_types_must_name_every_layer(tmp_path, layer_types):
    config = _config()
    config["text_config"]["layer_types"] = layer_types
    with pytest.raises(CatalogError, match="layer_types") as err:
        catalog_from_checkpoint(_write(tmp_path / "c", config, {}))
    assert err.value.code == "PCC209"


def test_without_layer_types_every_fourth_layer_is_full_attention():
    """transformers' Qwen3_5MoeTextConfig: layer_types from full_attention_interval (default 4)."""
    config = _config()
    del config["text_config"]["layer_types"]
    config["text_config"]["num_hidden_layers"] = 8
    full = {op.layer for op in catalog_from_config("c", config).operators if op.family == "attn.q"}
    assert full == {3, 7}
    config["text_config"]["full_attention_interval"] = 2
    assert {op.layer for op in catalog_from_config("c", config).operators if op.family == "attn.q"} == {1, 3, 5, 7}
