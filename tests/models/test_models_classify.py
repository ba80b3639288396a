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


def _init_layers(source, cls: str) -> dict[str, bool]:
    """`self.X = Layer(...)` in `cls.__init__` of this source file: {X: built with the model's quant config}
    (a `quant_config=` keyword that is not None)."""
    import ast

    body = next(n for n in ast.walk(ast.parse(source.read_text())) if isinstance(n, ast.ClassDef) and n.name == cls).body
    init = next(n for n in body if isinstance(n, ast.FunctionDef) and n.name == "__init__")
    built = {}
    for node in ast.walk(init):
        if (isinstance(node, ast.Assign) and isinstance(node.value, ast.Call) and len(node.targets) == 1
                and isinstance(node.targets[0], ast.Attribute)):
            kwargs = {k.arg: k.value for k in node.value.keywords}
            if any(k in kwargs for k in ("quant_config", "bias", "prefix")):  # a layer, not a plain attribute
                q = kwargs.get("quant_config")
                built[node.targets[0].attr] = q is not None and not (isinstance(q, ast.Constant) and q.value is None)
    return built


def _merged_shards(source, cls: str) -> dict[str, list[str]]:
    """`cls.packed_modules_mapping` (what the engine's quant config decides a merged layer by, and its loader
    loads into it): engine layer -> its checkpoint modules, for the Gated DeltaNet projections (`in_proj_*`)."""
    import ast

    body = next(n for n in ast.walk(ast.parse(source.read_text())) if isinstance(n, ast.ClassDef) and n.name == cls).body
    value = next(n.value for n in body if isinstance(n, ast.Assign) and len(n.targets) == 1
                 and getattr(n.targets[0], "id", None) == "packed_modules_mapping")
    merged: dict[str, list[str]] = {}
    for node in ast.walk(value):
        if isinstance(node, ast.Dict):
            for k, v in zip(node.keys, node.values):
                if isinstance(k, ast.Constant) and str(k.value).startswith("in_proj_"):
                    merged[k.value] = [e.value for e in v.elts]
    return merged


def _check_gated_deltanet(table: dict, built: dict[str, bool], merged: dict[str, list[str]], refusal: str) -> None:
    """The engine's facts (`built`: its layers and their quant config; `merged`: checkpoint shards per layer;
    `refusal`: its block-FP8 check of merged parts) against the table, and pcc's families against the table."""
    assert merged == table["merged"]
    shards = {s: module for module, members in merged.items() for s in members}
    assert {"in_proj_qkvz", "in_proj_ba", "out_proj", "conv1d"} <= set(built), built
    assert not {k for k in built if k.startswith(("in_proj", "out_proj", "conv"))} - {
        "in_proj_qkvz", "in_proj_ba", "out_proj", "conv1d"}, built  # no projection the table does not know
    by_checkpoint = {s: built[shards.get(s, s)] for s in [*shards, "out_proj", "conv1d"]}
    # Every layer in `quantized` is built with the quant config; what is not is wide.
    assert all(by_checkpoint[s] for s in table["quantized"])
    assert {s for s, q in by_checkpoint.items() if not q} == {"conv1d"} <= set(table["wide"])
    # in_proj_b and in_proj_a are built with it but merged into one layer of num_v_heads-row parts, which the
    # engine's block-FP8 check refuses (Qwen3.5-35B-A3B: 32 rows, 128-row blocks): pcc keeps them wide.
    assert "% block_n" in refusal
    assert set(table["wide"]) - {"conv1d"} == set(merged["in_proj_ba"])
    assert sorted(table["quantized"] + table["wide"]) == sorted(by_checkpoint)
    config = {"num_hidden_layers": 4}
    for name in table["quantized"]:
        assert classify(f"model.language_model.layers.0.linear_attn.{name}.weight", config).family == "attn.linear"
    for name in table["wide"]:
        assert classify(f"model.language_model.layers.0.linear_attn.{name}.weight", config).family == "other"


def test_gated_deltanet_families_are_what_sglang_quantizes():
    """targets/sglang.yaml `gated_deltanet` against SGLang's `Qwen3_5GatedDeltaNet.__init__` and
    `Qwen3_5ForCausalLM.packed_modules_mapping` (every Qwen3.5 class's, the MoE and multimodal ones included), read
    from the installed source: the package imports GPU kernels."""
    import importlib.util
    from pathlib import Path

    from pcc.resources import target_table

    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("sglang is not installed")
    srt = Path(spec.submodule_search_locations[0]) / "srt"
    model = srt / "models/qwen3_5.py"
    refusal = (srt / "layers/quantization/fp8.py").read_text()
    refusal = refusal[refusal.index("def validate_block_quant_shapes"):][:3000]
    _check_gated_deltanet(target_table("sglang")["gated_deltanet"], _init_layers(model, "Qwen3_5GatedDeltaNet"),
                          _merged_shards(model, "Qwen3_5ForCausalLM"), refusal)


def test_gated_deltanet_families_are_what_vllm_quantizes():
    """targets/vllm.yaml `gated_deltanet` against vLLM's `QwenGatedDeltaNetAttention.__init__` (layers/mamba/gdn/
    qwen_gdn_linear_attn.py) and the Qwen3.5 models' `packed_modules_mapping`, read from the source where vLLM is
    installed."""
    import importlib.util
    from pathlib import Path

    from pcc.resources import target_table

    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("vllm is not installed")
    root = Path(spec.submodule_search_locations[0]) / "model_executor"
    refusal = (root / "layers/quantization/utils/fp8_utils.py").read_text()
    refusal = refusal[refusal.index("def validate_fp8_block_shape"):][:3000]
    table = target_table("vllm")
    assert table["gated_deltanet"] == target_table("sglang")["gated_deltanet"]
    built = _init_layers(root / "layers/mamba/gdn/qwen_gdn_linear_attn.py", "QwenGatedDeltaNetAttention")
    _check_gated_deltanet(table["gated_deltanet"], built,
                          _merged_shards(root / "models/qwen3_5.py", "Qwen3_5ForConditionalGeneration"), refusal)
    assert _merged_shards(root / "models/qwen3_5.py", "Qwen3_5ForCausalLMBase") == table["gated_deltanet"]["merged"]


def test_importer_fuses_the_gated_deltanet_layers_as_sglang():
    """pcc.importer.matching (and the converter's NVFP4 scale groups) decide SGLang's merged Gated DeltaNet layers by
    their checkpoint shards, as SGLang's packed_modules_mapping (targets/sglang.yaml `gated_deltanet` `merged`)."""
    from pcc.plan.tensors import FUSED_LINEARS as FUSED
    from pcc.resources import target_table

    for module, shards in target_table("sglang")["gated_deltanet"]["merged"].items():
        assert FUSED[module] == tuple(shards)


def test_attn_linear_is_a_family_of_the_pattern_language():
    """`attn.linear` names the family; `linear`, `attn`, `attn.*` and `all` select it; `other` (the Gated DeltaNet
    tensors kept wide) only by name."""
    from pcc.plan.patterns import parse_pattern

    assert parse_pattern("attn.linear").families == ("attn.linear",)
    assert parse_pattern("attn.linear[0..2]").layers == ((0, 2),)
    for alias in ("linear", "attn", "attn.*", "all", "*"):
        assert "attn.linear" in parse_pattern(alias).families, alias
        assert "other" not in parse_pattern(alias).families, alias
