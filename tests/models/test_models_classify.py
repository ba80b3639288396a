"""The single name -> (family, layer, expert) rule, on real HF tensor names."""

import pytest

from pcc.models.classify import classify

DEEPSEEK = {"model_type": "deepseek_v3", "num_hidden_layers": 61}


@pytest.mark.parametrize("tensor, family, layer, expert", [
    ("model.embed_tokens.weight", "embed", None, None),
    ("model.norm.weight", "norm", None, None),
    ("lm_head.weight", "lm_head", None, None),
    ("model.layers.0.input_layernorm.weight", "norm", 0, None),
    ("model.layers.7.self_attn.q_a_proj.weight", "attn.q", 7, None),
    ("model.layers.7.self_attn.q_b_proj.weight", "attn.q", 7, None),
    ("model.layers.7.self_attn.q_proj.weight", "attn.q", 7, None),
    ("model.layers.7.self_attn.q_a_layernorm.weight", "norm", 7, None),
    ("model.layers.7.self_attn.kv_a_proj_with_mqa.weight", "attn.kv", 7, None),
    ("model.layers.7.self_attn.kv_b_proj.weight", "attn.kv", 7, None),
    ("model.layers.7.self_attn.kv_a_layernorm.weight", "norm", 7, None),
    ("model.layers.7.self_attn.o_proj.weight", "attn.o", 7, None),
    ("model.layers.7.mlp.gate.weight", "router", 7, None),
    ("model.layers.7.mlp.experts.255.gate_proj.weight", "experts.gate_up", 7, 255),
    ("model.layers.7.mlp.experts.3.up_proj.weight", "experts.gate_up", 7, 3),
    ("model.layers.7.mlp.experts.3.down_proj.weight", "experts.down", 7, 3),
    ("model.layers.7.mlp.shared_experts.gate_proj.weight", "shared_experts.gate_up", 7, None),
    ("model.layers.7.mlp.shared_experts.down_proj.weight", "shared_experts.down", 7, None),
    ("model.layers.1.mlp.gate_proj.weight", "mlp.gate_up", 1, None),
    ("model.layers.1.mlp.down_proj.weight", "mlp.down", 1, None),
    # DSA indexer: its norm is a norm; wq_b and wk are attn.indexer (SGLang quantizes them),
    # weights_proj (a BF16 layer in SGLang) other.
    ("model.layers.7.self_attn.indexer.k_norm.weight", "norm", 7, None),
    ("model.layers.7.self_attn.indexer.wq_b.weight", "attn.indexer", 7, None),
    ("model.layers.7.self_attn.indexer.wk.weight", "attn.indexer", 7, None),
    ("model.layers.7.self_attn.indexer.weights_proj.weight", "other", 7, None),
    # MTP layer 61 sits past the 61 decoder layers: its decoder modules keep their families (a `linear`
    # rule quantizes them, as DeepSeek's FP8 checkpoint does), its own modules get theirs.
    ("model.layers.61.eh_proj.weight", "mtp", 61, None),
    ("model.layers.61.enorm.weight", "norm", 61, None),
    ("model.layers.61.hnorm.weight", "norm", 61, None),
    ("model.layers.61.embed_tokens.weight", "embed", 61, None),
    ("model.layers.61.shared_head.norm.weight", "norm", 61, None),
    ("model.layers.61.shared_head.head.weight", "lm_head", 61, None),
    ("model.layers.61.self_attn.q_a_proj.weight", "attn.q", 61, None),
    ("model.layers.61.mlp.gate.weight", "router", 61, None),
    ("model.layers.61.mlp.experts.9.down_proj.weight", "experts.down", 61, 9),
    ("model.layers.61.mlp.shared_experts.up_proj.weight", "shared_experts.gate_up", 61, None),
    # In a decoder layer an MTP module name means nothing: eh_proj at layer 3 is "other".
    ("model.layers.3.eh_proj.weight", "other", 3, None),
    # Vision towers (Qwen-VL `visual`, Kimi-K2.5 MoonViT `vision_tower` + `mm_projector`) and
    # multimodal wrappers (`language_model.model.`, ModelOpt's `language_model.`).
    ("visual.blocks.0.attn.qkv.weight", "vision", None, None),
    ("vision_tower.encoder.blocks.3.wqkv.weight", "vision", None, None),
    ("vision_tower.encoder.blocks.3.norm0.weight", "norm", None, None),
    ("mm_projector.proj.0.weight", "vision", None, None),
    ("mm_projector.pre_norm.weight", "norm", None, None),
    ("language_model.model.layers.2.self_attn.q_b_proj.weight", "attn.q", 2, None),
    ("language_model.layers.2.mlp.experts.7.gate_proj.weight", "experts.gate_up", 2, 7),
    ("language_model.model.embed_tokens.weight", "embed", None, None),
    ("language_model.lm_head.weight", "lm_head", None, None),
    # gpt-oss: the router is `mlp.router` (with a bias, an extra).
    ("model.layers.5.mlp.router.weight", "router", 5, None),
    # Mixtral and Qwen2-MoE spellings.
    ("model.layers.2.block_sparse_moe.gate.weight", "router", 2, None),
    ("model.layers.2.block_sparse_moe.experts.5.w2.weight", "experts.down", 2, 5),
    ("model.layers.2.mlp.shared_expert.up_proj.weight", "shared_experts.gate_up", 2, None),
    ("model.layers.2.mlp.shared_expert_gate.weight", "router", 2, None),
])
def test_classify(tensor, family, layer, expert):
    assert classify(tensor, DEEPSEEK)[:3] == (family, layer, expert)


def test_without_layer_count_every_layer_is_a_decoder_layer():
    assert classify("model.layers.61.self_attn.q_a_proj.weight", {})[:3] == ("attn.q", 61, None)


def test_dsa_indexer_families_are_what_sglang_quantizes():
    """targets/sglang.yaml `dsa_indexer` against SGLang's own `Indexer.__init__` (read from the
    installed source: its package imports GPU kernels): the ReplicatedLinear layers given the quant
    config are family attn.indexer, the others (but the fused BF16 wk_weights_proj) other."""
    import ast
    import importlib.util
    from pathlib import Path

    from pcc.resources import target_table

    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("sglang is not installed")
    source = Path(spec.submodule_search_locations[0]) / "srt/layers/attention/dsa/dsa_indexer.py"
    init = next(n for n in ast.walk(ast.parse(source.read_text()))
                if isinstance(n, ast.ClassDef) and n.name == "Indexer").body
    init = next(n for n in init if isinstance(n, ast.FunctionDef) and n.name == "__init__")
    built = {}
    for node in ast.walk(init):
        if (isinstance(node, ast.Assign) and isinstance(node.value, ast.Call)
                and getattr(node.value.func, "id", None) == "ReplicatedLinear"):
            built[node.targets[0].attr] = any(k.arg == "quant_config" for k in node.value.keywords)
    built.pop("wk_weights_proj")  # the CUDA fusion of wk and weights_proj, BF16 (the table's comment)
    table = target_table("sglang")["dsa_indexer"]
    assert built == dict.fromkeys(table["quantized"], True) | dict.fromkeys(table["wide"], False)
    config = {"num_hidden_layers": 4}
    for name, quantized in built.items():
        family = classify(f"model.layers.1.self_attn.indexer.{name}.weight", config).family
        assert family == ("attn.indexer" if quantized else "other"), name
