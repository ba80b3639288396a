"""`model from DIR` on the checkpoints transformers itself writes, for the model types issue 12 lists.

Each model is built by transformers from its real config (shrunk widths, two or three layers, four experts;
sources below) and saved with `save_pretrained` in shards with an index: the tensor names, dtypes and shape
relations are transformers' own. pcc reads the directory three ways, as users have it: config.json only, config +
index, config + shards. All three give the same operators (names, families, shapes) and extras, and a one-line
contract checks and compiles on it. Sources: pcc/models/configs (meta-llama/Meta-Llama-3-8B, Qwen/Qwen3-8B,
Qwen/Qwen3-30B-A3B, deepseek-ai/DeepSeek-V3, moonshotai/Kimi-K2-Instruct); GLM-4.5: zai-org/GLM-4.5 as vLLM's
tests/config/base_model_arch_groundtruth.json records it (hidden 5120, 92 layers, 96 heads, 8 KV heads, head_dim
128, 160 experts, vocab 151552) with attention_bias, 1 shared expert, 3 dense layers and moe_intermediate_size 1536.
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
SMALL = {"hidden_size": 128, "intermediate_size": 256, "num_attention_heads": 4, "num_key_value_heads": 2,
         "head_dim": 32, "vocab_size": 256, "num_hidden_layers": 2, "pad_token_id": 0, "bos_token_id": 1,
         "eos_token_id": 2, "tie_word_embeddings": False}
MOE = {"moe_intermediate_size": 64, "num_experts_per_tok": 2}
MLA = {"q_lora_rank": 64, "kv_lora_rank": 64, "qk_nope_head_dim": 32, "qk_rope_head_dim": 16, "v_head_dim": 32,
       "n_group": 1, "topk_group": 1, "first_k_dense_replace": 1, "n_routed_experts": 4, "num_hidden_layers": 3}
# model: (config, transformers config class, shrink, rule)
MODELS = {
    "Llama-3": ("llama3_8b", "LlamaConfig", {}, "linear : fp8_block"),
    "Qwen3": ("qwen3_8b", "Qwen3Config", {}, "linear : fp8_block"),
    "Qwen3-MoE": ("qwen3_30b_a3b", "Qwen3MoeConfig", dict(MOE, num_experts=4), "experts : fp8_block"),
    "DeepSeek-V3": ("deepseek_v3", "DeepseekV3Config", dict(MOE, **MLA), "linear : fp8_block"),
    "Kimi-K2": ("kimi_k2", "DeepseekV3Config", dict(MOE, **MLA), "experts : int4_g32"),
    "GLM-4.5": (GLM45, "Glm4MoeConfig", dict(MOE, n_routed_experts=4, first_k_dense_replace=1, num_hidden_layers=3),
                "linear : fp8_block"),
}


def _config(source) -> dict:
    if isinstance(source, dict):
        return dict(source)
    config = json.loads((CONFIGS / f"{source}.json").read_text(encoding="utf-8"))
    config.pop("_source", None)
    return config


@pytest.fixture(scope="module", params=sorted(MODELS))
def saved(request, tmp_path_factory):
    """(the shards transformers wrote, config-only copy, index-only copy, rule) for one model."""
    source, cls, shrink, rule = MODELS[request.param]
    config = {**_config(source), **SMALL, **shrink}
    hf = getattr(transformers, cls)(**{k: v for k, v in config.items() if k != "model_type"})
    model = getattr(transformers, "AutoModelForCausalLM").from_config(hf)
    root = tmp_path_factory.mktemp(request.param)
    shards = root / "shards"
    model.save_pretrained(str(shards), max_shard_size="200KB")
    saved_config = json.loads((shards / "config.json").read_text())
    assert (shards / "model.safetensors.index.json").exists()  # more than one shard
    copies = partial_copies(shards, root)
    return shards, copies, rule, saved_config


def _view(catalog) -> tuple:
    """Names, families, shapes, dtypes and extras; a router's dtype aside: transformers keeps DeepSeek's and GLM's
    router weight in float32 (`TopkRouter`) and saves it so, where the published checkpoints store BF16."""
    return ([(op.tensor, op.family, op.shape, None if op.family == "router" else op.dtype) for op in catalog.operators],
            catalog.extra_tensors)


def test_config_only_index_only_and_shards_agree(saved):
    shards, copies, _, config = saved
    full = catalog_from_checkpoint(shards)
    assert _view(catalog_from_checkpoint(copies["index-only"])) == _view(full)
    assert _view(catalog_from_checkpoint(copies["config-only"])) == _view(full)
    assert not [op.tensor for op in full.operators if op.family == "other"]
    experts = config.get("num_local_experts") or config.get("n_routed_experts") or 0  # transformers 5's keys
    assert full.num_experts == experts and full.is_moe == (experts > 0)


def test_one_line_contract_checks_and_compiles(saved, tmp_path):
    shards, copies, rule, _ = saved
    for directory in (shards, copies["config-only"]):
        path = tmp_path / "c.prec"
        moe = catalog_from_checkpoint(directory).is_moe
        path.write_text(f'contract c {{\n  model from "{directory}"\n  hardware H100\n  rollout sglang {{\n    {rule}\n'
                        f"  }}\n{'  routing replay rollout' if moe else ''}\n}}\n", encoding="utf-8")
        compiled = compile_file(str(path))
        assert compiled.ok, [d.render(compiled.sources) for d in compiled.diagnostics if d.is_error]
