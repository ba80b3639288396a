"""Built-in catalogs: operator counts per family, worked out by hand from each config."""

import json
import subprocess
import sys
from collections import Counter

import pytest

from pcc.models import FAMILIES, CatalogError, catalog_names, load_catalog
from pcc.models.builtin import _CONFIGS, catalog_from_config

NAMES = ("deepseek_v3", "glm5", "gpt_oss_20b", "kimi_k2", "llama3_2_1b", "llama3_8b", "minimax_m2", "moonlight_16b_a3b",
         "qwen2_5_0_5b", "qwen2_5_14b", "qwen2_5_1_5b", "qwen2_5_32b", "qwen2_5_3b", "qwen2_5_72b", "qwen2_5_7b",
         "qwen3_0_6b", "qwen3_1_7b", "qwen3_235b_a22b", "qwen3_30b_a3b", "qwen3_32b", "qwen3_4b", "qwen3_5_122b_a10b",
         "qwen3_5_27b", "qwen3_5_35b_a3b", "qwen3_5_397b_a17b", "qwen3_8b", "tiny_dense", "tiny_moe", "tiny_moe_128", "tiny_shared_moe")


def counts(catalog):
    found = Counter(op.family for op in catalog.operators)
    return {family: found[family] for family in FAMILIES if found[family]}


def config(name):
    return json.loads((_CONFIGS / f"{name}.json").read_text())


def test_catalog_names_sorted_and_complete():
    assert catalog_names() == NAMES


def test_every_config_states_its_source():
    for name in NAMES:
        assert config(name)["_source"]


def dense_counts(layers, qk_norm, tied=False):
    """embed + final norm + lm_head (none when the embeddings are tied); per layer 2 norms (+ q_norm, k_norm),
    q, k+v, o, kv_cache, gate+up, down."""
    result = {
        "embed": 1, "attn.q": layers, "attn.kv": 2 * layers, "attn.o": layers,
        "mlp.gate_up": 2 * layers, "mlp.down": layers,
        "norm": (4 if qk_norm else 2) * layers + 1, "lm_head": 1, "kv_cache": layers,
    }
    if tied:
        del result["lm_head"]
    return result


@pytest.mark.parametrize("name, layers, qk_norm", [
    ("llama3_8b", 32, False), ("qwen3_8b", 36, True), ("tiny_dense", 4, False),
    ("qwen2_5_32b", 64, False), ("qwen2_5_14b", 48, False), ("qwen2_5_72b", 80, False),
])
def test_dense_counts(name, layers, qk_norm):
    catalog = load_catalog(name)
    assert counts(catalog) == dense_counts(layers, qk_norm)
    assert catalog.architecture == "dense" and not catalog.is_moe and catalog.num_experts == 0


# Tied input and output embeddings (tie_word_embeddings): no lm_head of their own.
@pytest.mark.parametrize("name, layers, qk_norm", [
    ("llama3_2_1b", 16, False), ("qwen3_0_6b", 28, True), ("qwen3_1_7b", 28, True), ("qwen2_5_1_5b", 28, False),
])
def test_tied_dense_counts(name, layers, qk_norm):
    catalog = load_catalog(name)
    assert counts(catalog) == dense_counts(layers, qk_norm, tied=True)
    assert catalog.architecture == "dense" and not catalog.is_moe and catalog.num_experts == 0


@pytest.mark.parametrize("name, layers, experts", [("qwen3_30b_a3b", 48, 128), ("tiny_moe", 4, 8),
                                                        ("qwen3_235b_a22b", 94, 128)])
def test_qwen3_moe_counts(name, layers, experts):
    # Every layer is MoE (decoder_sparse_step 1, no mlp_only_layers); no shared experts.
    catalog = load_catalog(name)
    assert counts(catalog) == {
        "embed": 1, "attn.q": layers, "attn.kv": 2 * layers, "attn.o": layers,
        "router": layers, "experts.gate_up": layers * experts * 2,
        "experts.down": layers * experts, "norm": 4 * layers + 1, "lm_head": 1,
        "kv_cache": layers,
    }
    assert catalog.architecture == "moe" and catalog.num_experts == experts


def mla_counts(layers, dense, experts, indexer):
    """DeepSeek-V3 style: per layer 4 norms (input, post-attention, q_a, kv_a),
    q_a + q_b, kv_a + kv_b, o, kv_cache; dense layers gate+up+down, MoE layers
    router, experts x (gate+up, down) and one fused shared expert. The DSA
    indexer adds wq_b, wk ("attn.indexer"), weights_proj ("other") and a k_norm per layer."""
    moe = layers - dense
    result = {
        "embed": 1, "attn.q": 2 * layers, "attn.kv": 2 * layers, "attn.o": layers,
        "kv_cache": layers, "mlp.gate_up": 2 * dense, "mlp.down": dense,
        "router": moe, "experts.gate_up": moe * experts * 2, "experts.down": moe * experts,
        "shared_experts.gate_up": 2 * moe, "shared_experts.down": moe,
        "norm": (5 if indexer else 4) * layers + 1, "lm_head": 1,
    }
    if indexer:
        result["attn.indexer"], result["other"] = 2 * layers, layers
    return result


def test_deepseek_v3_counts():
    catalog = load_catalog("deepseek_v3")
    assert counts(catalog) == mla_counts(layers=61, dense=3, experts=256, indexer=False)
    # 58 MoE layers x 256 experts x 3 projections; no MTP layer 61.
    assert len(catalog.family_index()["experts.gate_up"]) + len(
        catalog.family_index()["experts.down"]) == 58 * 256 * 3 == 44544
    assert max(op.layer for op in catalog.operators if op.layer is not None) == 60
    assert len(catalog.extra_tensors) == 58  # one e_score_correction_bias per router


def test_moonlight_counts():
    # DeepSeek-V3's layout without a q LoRA (q_lora_rank null): one q_proj and no q_a_layernorm per layer; one dense
    # layer, 26 MoE layers of 64 experts and 2 shared experts (fused: one shared_experts MLP of 2 x 1408).
    catalog = load_catalog("moonlight_16b_a3b")
    expected = mla_counts(layers=27, dense=1, experts=64, indexer=False)
    expected["attn.q"], expected["norm"] = 27, 3 * 27 + 1
    assert counts(catalog) == expected
    shared = [op for op in catalog.operators if op.family == "shared_experts.down"]
    assert shared[0].shape == (2048, 2 * 1408)
    assert len(catalog.extra_tensors) == 26  # one e_score_correction_bias per router


def test_kimi_k2_counts():
    catalog = load_catalog("kimi_k2")
    assert counts(catalog) == mla_counts(layers=61, dense=1, experts=384, indexer=False)
    # 61 layers - 1 dense = 60 MoE layers x 384 experts x 3 projections.
    expert_ops = [op for op in catalog.operators if op.family.startswith("experts.")]
    assert len(expert_ops) == 60 * 384 * 3 == 69120
    assert catalog.architecture == "mla_moe"


def test_glm5_counts():
    catalog = load_catalog("glm5")
    assert counts(catalog) == mla_counts(layers=78, dense=3, experts=256, indexer=True)
    # extras: 75 e_score_correction_bias + 78 indexer k_norm biases
    assert len(catalog.extra_tensors) == 75 + 78


def test_qwen3_5_moe_counts():
    """Qwen3.5-35B-A3B: 40 layers, every fourth (3, 7, ..., 39) full attention (q/k norms, q, k+v, o, kv_cache),
    the other 30 Gated DeltaNet (in_proj_qkv, in_proj_z, out_proj: attn.linear; in_proj_b, in_proj_a, conv1d:
    other; a gated norm); every layer MoE: router + shared_expert_gate, 256 experts, one shared expert. The
    language model sits under model.language_model. (the published Qwen3_5MoeForConditionalGeneration)."""
    catalog = load_catalog("qwen3_5_35b_a3b")
    full, linear, experts = 10, 30, 256
    assert counts(catalog) == {
        "embed": 1, "attn.q": full, "attn.kv": 2 * full, "attn.o": full, "attn.linear": 3 * linear,
        "router": 2 * 40, "experts.gate_up": 40 * experts * 2, "experts.down": 40 * experts,
        "shared_experts.gate_up": 2 * 40, "shared_experts.down": 40, "other": 3 * linear,
        "norm": 2 * 40 + 2 * full + linear + 1, "lm_head": 1, "kv_cache": full}
    assert catalog.architecture == "moe" and catalog.num_experts == 256 and catalog.num_layers == 40
    assert sorted({op.layer for op in catalog.operators if op.family == "attn.q"}) == list(range(3, 40, 4))
    assert len(catalog.extra_tensors) == 2 * linear  # A_log and dt_bias
    ops = {op.tensor: op for op in catalog.operators}
    lm = "model.language_model."
    assert ops[lm + "embed_tokens.weight"].shape == (248320, 2048) and "lm_head.weight" in ops
    layer0, layer3 = lm + "layers.0.", lm + "layers.3."
    assert ops[layer0 + "linear_attn.in_proj_qkv.weight"].shape == (2 * 16 * 128 + 32 * 128, 2048)
    assert ops[layer0 + "linear_attn.in_proj_z.weight"].shape == (32 * 128, 2048)
    assert ops[layer0 + "linear_attn.in_proj_b.weight"].shape == (32, 2048)
    assert ops[layer0 + "linear_attn.conv1d.weight"].shape == (8192, 1, 4)
    assert ops[layer0 + "linear_attn.out_proj.weight"].shape == (2048, 32 * 128)
    assert ops[layer3 + "self_attn.q_proj.weight"].shape == (2 * 16 * 256, 2048)  # query and output gate
    assert ops[layer3 + "self_attn.o_proj.weight"].shape == (2048, 16 * 256)
    assert ops[layer3 + "self_attn.kv_cache"].shape == (2, 2 * 256)
    assert ops[layer3 + "mlp.experts.255.down_proj.weight"].shape == (2048, 512)
    assert ops[layer3 + "mlp.shared_expert_gate.weight"].shape == (1, 2048)


def test_qwen3_5_dense_counts():
    """Qwen3.5-27B: 64 layers, every fourth (3, 7, ..., 63) full attention with an output gate, the other 48 Gated
    DeltaNet (as the MoE model's), every layer a dense SwiGLU MLP 17408 wide, under model.language_model."""
    catalog = load_catalog("qwen3_5_27b")
    full, linear, layers = 16, 48, 64
    assert counts(catalog) == {
        "embed": 1, "attn.q": full, "attn.kv": 2 * full, "attn.o": full, "attn.linear": 3 * linear,
        "mlp.gate_up": 2 * layers, "mlp.down": layers, "other": 3 * linear,
        "norm": 2 * layers + 2 * full + linear + 1, "lm_head": 1, "kv_cache": full}
    assert catalog.architecture == "dense" and catalog.num_layers == layers
    ops = {op.tensor: op for op in catalog.operators}
    layer0, layer3 = "model.language_model.layers.0.", "model.language_model.layers.3."
    assert ops[layer0 + "linear_attn.in_proj_qkv.weight"].shape == (2 * 16 * 128 + 48 * 128, 5120)
    assert ops[layer3 + "self_attn.q_proj.weight"].shape == (2 * 24 * 256, 5120)  # query and output gate
    assert ops[layer3 + "mlp.down_proj.weight"].shape == (5120, 17408)


def test_minimax_m2_counts():
    """MiniMax-M2.5: 62 layers, all MoE with Mixtral's names (block_sparse_moe.gate, experts.J.w1/w3/w2), the
    router's correction bias on the MoE block, q/k norms over all heads."""
    catalog = load_catalog("minimax_m2")
    layers, experts = 62, 256
    assert counts(catalog) == {
        "embed": 1, "attn.q": layers, "attn.kv": 2 * layers, "attn.o": layers, "kv_cache": layers,
        "router": layers, "experts.gate_up": layers * experts * 2, "experts.down": layers * experts,
        "norm": 4 * layers + 1, "lm_head": 1}
    ops = {op.tensor: op for op in catalog.operators}
    assert ops["model.layers.0.self_attn.q_norm.weight"].shape == (48 * 128,)
    assert ops["model.layers.0.self_attn.k_norm.weight"].shape == (8 * 128,)
    assert ops["model.layers.61.block_sparse_moe.experts.255.w2.weight"].shape == (3072, 1536)
    assert ops["model.layers.0.block_sparse_moe.gate.weight"].shape == (256, 3072)
    assert catalog.extra_tensors[:1] == ("model.layers.0.block_sparse_moe.e_score_correction_bias",)
    assert len(catalog.extra_tensors) == layers


def test_load_catalog_is_cached():
    assert load_catalog("tiny_moe") is load_catalog("tiny_moe")


def test_unknown_name_suggests():
    with pytest.raises(CatalogError, match="did you mean 'kimi_k2'"):
        load_catalog("kimi-k2")
    with pytest.raises(CatalogError, match="known: deepseek_v3"):
        load_catalog("gpt5")


def test_shapes_follow_the_config():
    ops = {op.tensor: op for op in load_catalog("deepseek_v3").operators}
    layer3 = "model.layers.3."
    assert ops["model.embed_tokens.weight"].shape == (129280, 7168)
    assert ops[layer3 + "self_attn.q_a_proj.weight"].shape == (1536, 7168)
    assert ops[layer3 + "self_attn.q_b_proj.weight"].shape == (128 * (128 + 64), 1536)
    assert ops[layer3 + "self_attn.kv_a_proj_with_mqa.weight"].shape == (512 + 64, 7168)
    assert ops[layer3 + "self_attn.kv_b_proj.weight"].shape == (128 * (128 + 128), 512)
    assert ops[layer3 + "self_attn.o_proj.weight"].shape == (7168, 128 * 128)
    assert ops[layer3 + "self_attn.kv_cache"].shape == (512 + 64,)
    assert ops[layer3 + "mlp.gate.weight"].shape == (256, 7168)
    assert ops[layer3 + "mlp.experts.255.down_proj.weight"].shape == (7168, 2048)
    assert ops[layer3 + "mlp.shared_experts.up_proj.weight"].shape == (2048, 7168)
    assert ops["model.layers.0.mlp.down_proj.weight"].shape == (7168, 18432)
    llama = {op.tensor: op for op in load_catalog("llama3_8b").operators}
    assert llama["model.layers.0.self_attn.k_proj.weight"].shape == (8 * 128, 4096)
    assert llama["model.layers.0.self_attn.kv_cache"].shape == (2, 8 * 128)
    assert all(op.dtype == "bf16" for op in llama.values())


def test_canonical_order():
    ops = load_catalog("tiny_moe").operators
    assert ops[0].family == "embed"
    assert [op.family for op in ops[-2:]] == ["norm", "lm_head"]
    layer0 = [op.tensor.removeprefix("model.layers.0.") for op in ops if op.layer == 0]
    assert layer0[:9] == [
        "input_layernorm.weight", "post_attention_layernorm.weight", "self_attn.q_norm.weight",
        "self_attn.k_norm.weight", "self_attn.q_proj.weight", "self_attn.k_proj.weight",
        "self_attn.v_proj.weight", "self_attn.o_proj.weight", "self_attn.kv_cache",
    ]
    assert layer0[9:13] == ["mlp.gate.weight", "mlp.experts.0.gate_proj.weight",
                            "mlp.experts.0.up_proj.weight", "mlp.experts.0.down_proj.weight"]
    assert [op.layer for op in ops[1:-2]] == sorted(op.layer for op in ops[1:-2])


def test_family_index_covers_every_operator_once():
    catalog = load_catalog("glm5")
    index = catalog.family_index()
    assert set(index) == set(FAMILIES)
    flat = sorted(i for indices in index.values() for i in indices)
    assert flat == list(range(len(catalog.operators)))
    assert all(catalog.operators[i].family == "router" for i in index["router"])
    assert catalog.family_index() is index


def test_properties():
    catalog = load_catalog("qwen3_30b_a3b")
    assert (catalog.num_layers, catalog.num_experts, catalog.hidden_size, catalog.vocab_size) == (
        48, 128, 2048, 151936)
    assert (catalog.num_attention_heads, catalog.num_key_value_heads) == (32, 4)
    assert catalog.tie_word_embeddings is False and catalog.source is None


def test_qwen_sparse_step_and_mlp_only_layers():
    cfg = dict(config("tiny_moe"), decoder_sparse_step=2, mlp_only_layers=[3])
    catalog = catalog_from_config("t", cfg)
    # (layer + 1) % 2 == 0 -> layers 1 and 3 sparse; layer 3 forced dense.
    assert sorted({op.layer for op in catalog.operators if op.family == "router"}) == [1]
    assert sorted({op.layer for op in catalog.operators if op.family == "mlp.down"}) == [0, 2, 3]
    assert catalog.operators[0].shape == (512, 128)


def test_mla_without_q_lora_and_tied_embeddings():
    cfg = dict(config("deepseek_v3"), q_lora_rank=None, num_hidden_layers=4, n_routed_experts=4,
               tie_word_embeddings=True)
    catalog = catalog_from_config("t", cfg)
    q = [op for op in catalog.operators if op.family == "attn.q"]
    assert [op.tensor for op in q] == [
        f"model.layers.{i}.self_attn.q_proj.weight" for i in range(4)]
    assert q[0].shape == (128 * 192, 7168)
    assert not catalog.family_index()["lm_head"]


def test_importing_pcc_models_does_not_import_torch():
    code = ("import sys, pcc.models; pcc.models.load_catalog('tiny_moe'); "
            "print('torch' in sys.modules, 'numpy' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]


def test_tiny_shared_moe_counts():
    """4 layers, the first dense; 3 MoE layers x 8 experts; MLA (q_a/q_b, kv_a/kv_b, two extra norms)."""
    assert counts(load_catalog("tiny_shared_moe")) == {
        "embed": 1, "attn.q": 4 * 2, "attn.kv": 4 * 2, "attn.o": 4, "mlp.gate_up": 1 * 2, "mlp.down": 1,
        "router": 3, "experts.gate_up": 3 * 8 * 2, "experts.down": 3 * 8,
        "shared_experts.gate_up": 3 * 2, "shared_experts.down": 3,
        "norm": 4 * 2 + 4 * 2 + 1, "lm_head": 1, "kv_cache": 4}


def test_tiny_moe_128_widths_take_128_groups():
    for op in load_catalog("tiny_moe_128").operators:
        if op.family.startswith("experts.") or op.family.startswith("attn."):
            assert op.shape[1] % 128 == 0, op


def test_config_dtype_absent_is_bf16_and_transformers5_dtype_is_read():
    from pcc.models.base import config_dtype

    assert config_dtype({"model_type": "gpt_oss"}) == "bf16"  # gpt-oss publishes no torch_dtype
    assert config_dtype({"dtype": "float16"}) == "fp16"  # transformers 5 writes `dtype`
    assert config_dtype({"torch_dtype": "float32"}) == "fp32"
    assert config_dtype({"text_config": {"torch_dtype": "bfloat16"}, "torch_dtype": "float32"}) == "bf16"


# Parameter counts the model cards state (Qwen/Qwen2.5-*/README.md "Number of Parameters", Qwen/Qwen3-*
# README.md): the catalogs built from Miles' architecture flags must carry the published model.
# Qwen/Qwen3.5-35B-A3B README.md: 35B in total (the catalog is the language model, 34.66B: no vision tower, no
# MTP layer). MiniMaxAI's MiniMax-M2 model card: 230B total, 10B active (M2.5 keeps the architecture; the
# catalog, without the MTP modules, is 228.69B).
# Issue 30's catalogs, the catalog's count against the card's: meta-llama/Llama-3.2-1B README.md "1B (1.23B)"
# (1,235,814,400, embeddings tied); Qwen/Qwen2.5-1.5B README.md 1.54B (1,543,656,960, tied); Qwen/Qwen2.5-32B
# README.md 32.5B (32,763,417,600: the card's non-embedding 31.0B plus two 152064 x 5120 embeddings, 1.56B, is
# 32.56B; the card rounds down); Qwen/Qwen3-0.6B README.md 0.6B (596,049,920, tied); Qwen/Qwen3-1.7B README.md 1.7B
# (1,720,574,976, tied); Qwen/Qwen3-235B-A22B README.md 235B total (235,093,634,560); moonshotai/Moonlight-16B-A3B
# README.md 16B total, 3B activated (15,960,108,544); Qwen/Qwen2.5-14B README.md 14.7B (14,769,689,600);
# Qwen/Qwen2.5-72B README.md 72.7B (72,705,384,448). Qwen3.5-27B: 27B as the Qwen3.6-27B card (same sizes) states
# it (quoted by 67ailab.com's Qwen3.6-27B deep dive; the catalog, the language model without vision tower and MTP
# layer, is 26.9B). Qwen/Qwen3.5-397B-A17B and Qwen3.5-122B-A10B README.md: 397B and 122B in total (the language
# models: 396.3B and 122.1B). openai/gpt-oss-20b model card: 21B parameters (20.9B).
PUBLISHED_PARAMS = {"qwen2_5_0_5b": 0.49e9, "qwen2_5_3b": 3.09e9, "qwen2_5_7b": 7.61e9, "qwen3_4b": 4.0e9,
                    "qwen3_32b": 32.8e9, "qwen3_5_35b_a3b": 35e9, "minimax_m2": 230e9, "llama3_2_1b": 1.23e9,
                    "qwen2_5_1_5b": 1.54e9, "qwen2_5_32b": 32.5e9, "qwen3_0_6b": 0.6e9, "qwen3_1_7b": 1.7e9,
                    "qwen3_235b_a22b": 235e9, "moonlight_16b_a3b": 16e9,
                    "qwen2_5_14b": 14.7e9, "qwen2_5_72b": 72.7e9, "qwen3_5_27b": 27e9,
                    "qwen3_5_397b_a17b": 397e9, "qwen3_5_122b_a10b": 122e9, "gpt_oss_20b": 21e9}


@pytest.mark.parametrize("name", sorted(PUBLISHED_PARAMS))
def test_catalog_parameter_count_matches_the_model_card(name):
    import math

    from pcc.diff.load import model_catalog

    cat = model_catalog(name)
    total = sum(math.prod(op.shape) for op in cat.operators if op.family != "kv_cache")
    assert abs(total - PUBLISHED_PARAMS[name]) / PUBLISHED_PARAMS[name] < 0.02, (name, total)
