"""`model from DIR` on the checkpoints transformers itself writes, for the model types issue 12 lists.

Each model is built by transformers from its real config (shrunk widths, two or three layers, four experts;
sources below) and saved with `save_pretrained` in shards with an index: the tensor names, dtypes and shape
relations are transformers' own. pcc reads the directory three ways, as users have it: config.json only, config +
index, config + shards. All three give the same operators (names, families, shapes) and extras, and a one-line
contract checks and compiles on it. Sources: pcc/models/configs (meta-llama/Meta-Llama-3-8B, Qwen/Qwen3-8B,
Qwen/Qwen3-30B-A3B, deepseek-ai/DeepSeek-V3, moonshotai/Kimi-K2-Instruct, moonshotai/Moonlight-16B-A3B,
Qwen/Qwen3.5-35B-A3B,
Qwen/Qwen3.5-27B, MiniMaxAI/MiniMax-M2.5); GLM-4.5: zai-org/GLM-4.5 as vLLM's tests/config/base_model_arch_groundtruth.json records it
(hidden 5120, 92 layers, 96 heads, 8 KV heads, head_dim 128, 160 experts, vocab 151552) with attention_bias, 1 shared
expert, 3 dense layers and moe_intermediate_size 1536. Qwen2-MoE: Qwen/Qwen1.5-MoE-A2.7B as transformers'
Qwen2MoeConfig defaults record it (its docstring checkpoint: 60 experts, top-4, moe_intermediate_size 1408, one gated
shared expert of 5632), which pcc's config-only catalog must name (mlp.shared_expert.*, mlp.shared_expert_gate).

Qwen3.5-MoE is built twice: as published (Qwen3_5MoeForConditionalGeneration, model_type qwen3_5_moe, the language
model under text_config and `model.language_model.`, a vision tower under `model.visual.`) and in its text form
(Qwen3_5MoeForCausalLM, qwen3_5_moe_text, `model.`). pcc derives the language model from the config; the vision tower
it reads from the index and shards only, so the config-only catalog of the multimodal model is the others' without
`model.visual.*`. The dense Qwen3.5 (Qwen3.5-27B, Qwen3_5ForConditionalGeneration / qwen3_5_text) is built the same
two ways. Its Gated DeltaNet layers' in_proj_b, in_proj_a and conv1d are `other` (the engines keep them wide:
targets/sglang.yaml `gated_deltanet`).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pcc.lower import compile_file
from pcc.models import catalog_from_checkpoint
from model_helpers import partial_copies

transformers = pytest.importorskip("transformers")

CONFIGS = Path(__file__).resolve().parents[2] / "pcc" / "models" / "configs"
GLM45 = {"architectures": ["Glm4MoeForCausalLM"], "model_type": "glm4_moe", "hidden_size": 5120,
         "intermediate_size": 12288, "moe_intermediate_size": 1536, "num_hidden_layers": 92, "num_attention_heads": 96,
         "num_key_value_heads": 8, "head_dim": 128, "n_routed_experts": 160, "n_shared_experts": 1,
         "num_experts_per_tok": 8, "first_k_dense_replace": 3, "vocab_size": 151552, "attention_bias": True,
         "partial_rotary_factor": 0.5, "n_group": 1, "topk_group": 1, "num_nextn_predict_layers": 1,
         "torch_dtype": "bfloat16"}
QWEN2_MOE = {"architectures": ["Qwen2MoeForCausalLM"], "model_type": "qwen2_moe", "hidden_size": 2048,
             "intermediate_size": 5632, "moe_intermediate_size": 1408, "shared_expert_intermediate_size": 5632,
             "num_hidden_layers": 24, "num_attention_heads": 16, "num_key_value_heads": 16, "num_experts": 60,
             "num_experts_per_tok": 4, "vocab_size": 151936, "torch_dtype": "bfloat16"}
SMALL = {"hidden_size": 128, "intermediate_size": 256, "num_attention_heads": 4, "num_key_value_heads": 2,
         "head_dim": 32, "vocab_size": 256, "num_hidden_layers": 2, "pad_token_id": 0, "bos_token_id": 1,
         "eos_token_id": 2, "tie_word_embeddings": False}
MOE = {"moe_intermediate_size": 64, "num_experts_per_tok": 2}
MLA = {"q_lora_rank": 64, "kv_lora_rank": 64, "qk_nope_head_dim": 32, "qk_rope_head_dim": 16, "v_head_dim": 32,
       "n_group": 1, "topk_group": 1, "first_k_dense_replace": 1, "n_routed_experts": 4, "num_hidden_layers": 3}
# Qwen3.5-MoE shrunk: four layers (three Gated DeltaNet, one full attention), 2 key and 4 value heads of 16 in the
# linear attention, four experts and a shared expert.
QWEN35 = dict(MOE, num_experts=4, shared_expert_intermediate_size=64, linear_num_key_heads=2, linear_num_value_heads=4,
              linear_key_head_dim=16, linear_value_head_dim=16, num_hidden_layers=4,
              layer_types=["linear_attention", "linear_attention", "linear_attention", "full_attention"])
QWEN35_DENSE = {k: v for k, v in QWEN35.items() if k not in MOE and k not in ("num_experts", "shared_expert_intermediate_size")}
QWEN35_VISION = {"depth": 1, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2, "out_hidden_size": 128,
                 "patch_size": 4, "num_position_embeddings": 16}
# model: (config, transformers config class, shrink, rule[, transformers auto class]); a config with text_config is
# shrunk there, its vision tower to QWEN35_VISION.
MODELS = {
    "Llama-3": ("llama3_8b", "LlamaConfig", {}, "linear : fp8_block"),
    "Qwen3": ("qwen3_8b", "Qwen3Config", {}, "linear : fp8_block"),
    "Qwen3-MoE": ("qwen3_30b_a3b", "Qwen3MoeConfig", dict(MOE, num_experts=4), "experts : fp8_block"),
    "DeepSeek-V3": ("deepseek_v3", "DeepseekV3Config", dict(MOE, **MLA), "linear : fp8_block"),
    "Kimi-K2": ("kimi_k2", "DeepseekV3Config", dict(MOE, **MLA), "experts : int4_g32"),
    # Moonlight keeps q_lora_rank null (one q_proj, no q_a_layernorm) and two shared experts.
    "Moonlight": ("moonlight_16b_a3b", "DeepseekV3Config", dict(MOE, **dict(MLA, q_lora_rank=None), n_shared_experts=2),
                  "experts : fp8_block"),
    "GLM-4.5": (GLM45, "Glm4MoeConfig", dict(MOE, n_routed_experts=4, first_k_dense_replace=1, num_hidden_layers=3),
                "linear : fp8_block"),
    "Qwen2-MoE": (QWEN2_MOE, "Qwen2MoeConfig", dict(MOE, num_experts=4, shared_expert_intermediate_size=64),
                  "linear : fp8_block"),
    "Qwen3.5-MoE": ("qwen3_5_35b_a3b", "Qwen3_5MoeConfig", QWEN35, "linear : fp8_block", "AutoModelForImageTextToText"),
    "Qwen3.5-MoE-text": ("qwen3_5_35b_a3b:text", "Qwen3_5MoeTextConfig", QWEN35, "attn.linear : fp8_block"),
    "Qwen3.5": ("qwen3_5_27b", "Qwen3_5Config", QWEN35_DENSE, "linear : fp8_block", "AutoModelForImageTextToText"),
    "Qwen3.5-text": ("qwen3_5_27b:text", "Qwen3_5TextConfig", QWEN35_DENSE, "linear : fp8_block"),
    "MiniMax-M2": ("minimax_m2", "MiniMaxM2Config", dict(MOE, num_local_experts=4, intermediate_size=64),
                   "linear : fp8_block"),
}
# Tensors of a multimodal model's vision tower: read from the index and shards, not derived from the config.
VISION = "model.visual."
# The Gated DeltaNet tensors the engines keep wide (family other): the only `other` operators expected.
WIDE_GDN = ("linear_attn.in_proj_b.weight", "linear_attn.in_proj_a.weight", "linear_attn.conv1d.weight")


def _config(source) -> dict:
    if isinstance(source, dict):
        return dict(source)
    name, _, part = source.partition(":")
    config = json.loads((CONFIGS / f"{name}.json").read_text(encoding="utf-8"))
    config.pop("_source", None)
    return config["text_config"] if part == "text" else config


def _hf_config(cls: str, config: dict, shrink: dict):
    """transformers' config object of `config` shrunk: flat, or with its text_config shrunk."""
    if "text_config" in config:
        text = {k: v for k, v in {**config["text_config"], **SMALL, **shrink}.items() if k != "model_type"}
        vision = {**{k: v for k, v in config["vision_config"].items() if k != "model_type"}, **QWEN35_VISION}
        top = {k: v for k, v in config.items() if k not in ("model_type", "text_config", "vision_config")}
        return getattr(transformers, cls)(**top, text_config=text, vision_config=vision)
    config = {**config, **SMALL, **shrink}
    return getattr(transformers, cls)(**{k: v for k, v in config.items() if k != "model_type"})


@pytest.fixture(scope="module", params=sorted(MODELS))
def saved(request, tmp_path_factory):
    """(the shards transformers wrote, config-only copy, index-only copy, rule) for one model."""
    source, cls, shrink, rule, *auto = MODELS[request.param]
    hf = _hf_config(cls, _config(source), shrink)
    model = getattr(transformers, (auto or ["AutoModelForCausalLM"])[0]).from_config(hf)
    root = tmp_path_factory.mktemp(request.param)
    shards = root / "shards"
    model.save_pretrained(str(shards), max_shard_size="200KB")
    saved_config = json.loads((shards / "config.json").read_text())
    assert (shards / "model.safetensors.index.json").exists()  # more than one shard
    copies = partial_copies(shards, root)
    return shards, copies, rule, saved_config


def _view(catalog) -> tuple:
    """Names, families, shapes, dtypes and extras of the language model (a vision tower aside); a router's dtype
    aside too: transformers keeps DeepSeek's and GLM's router weight in float32 (`TopkRouter`) and saves it so,
    where the published checkpoints store BF16."""
    return ([(op.tensor, op.family, op.shape, None if op.family == "router" else op.dtype) for op in catalog.operators
             if not op.tensor.startswith(VISION)],
            tuple(t for t in catalog.extra_tensors if not t.startswith(VISION)))


def test_config_only_index_only_and_shards_agree(saved):
    shards, copies, _, config = saved
    full = catalog_from_checkpoint(shards)
    assert _view(catalog_from_checkpoint(copies["index-only"])) == _view(full)
    config_only = catalog_from_checkpoint(copies["config-only"])
    assert _view(config_only) == _view(full)
    # What the config does not describe is the vision tower, and only that: every other tensor transformers wrote
    # is an operator or extra of the config-only catalog, of the same shape.
    written = {name: entry["shape"] for f in shards.glob("*.safetensors") for name, entry in _header(f).items()}
    derived = {op.tensor: list(op.shape) for op in config_only.operators if op.family != "kv_cache"}
    assert {n: s for n, s in written.items() if n not in config_only.extra_tensors and not n.startswith(VISION)} == derived
    assert set(config_only.extra_tensors) <= set(written)
    other = [op.tensor for op in full.operators if op.family == "other" and not op.tensor.startswith(VISION)]
    assert all(t.endswith(WIDE_GDN) for t in other), other
    text = config.get("text_config") or config
    experts = text.get("num_local_experts") or text.get("n_routed_experts") or text.get("num_experts") or 0
    assert full.num_experts == experts and full.is_moe == (experts > 0)


def _header(path: Path) -> dict:
    from pcc.models.checkpoint import read_safetensors_header

    return read_safetensors_header(path)


def test_one_line_contract_checks_and_compiles(saved, tmp_path):
    shards, copies, rule, _ = saved
    for directory in (shards, copies["config-only"]):
        path = tmp_path / "c.prec"
        moe = catalog_from_checkpoint(directory).is_moe
        path.write_text(f'contract c {{\n  model from "{directory}"\n  hardware H100\n  rollout sglang {{\n    {rule}\n'
                        f"  }}\n{'  routing replay rollout' if moe else ''}\n}}\n", encoding="utf-8")
        compiled = compile_file(str(path))
        assert compiled.ok, [d.render(compiled.sources) for d in compiled.diagnostics if d.is_error]
