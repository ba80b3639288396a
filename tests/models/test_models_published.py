"""Real published checkpoints as users have them: config.json as published, tensor names, dtypes and shape
relations of the published shards (shrunk where the real ones are huge). Each is read with shards, with only
the index, and checked, explained and compiled through a contract.

Sources: openai/gpt-oss-20b config.json and index (fused MXFP4 experts `mlp.experts.{gate_up,down}_proj_
{blocks,scales,bias}`, `mlp.router` with a bias, `self_attn.sinks`, attention biases; modules_to_not_convert
keeps attention, router, embeddings and lm_head BF16); deepseek-ai/DeepSeek-V3 (block FP8 `weight_scale_inv`,
MTP layer 61 with `enorm`/`hnorm`/`eh_proj`/`shared_head`, README_WEIGHTS.md; SGLang's deepseek_nextn.py builds
`eh_proj` as a plain BF16 nn.Linear and the decoder with the checkpoint's quant config); nvidia/DeepSeek-R1-FP4
(ModelOpt NVFP4: `weight` U8 [7168, 9216], `weight_scale` F8_E4M3 [7168, 1152], `weight_scale_2` and
`input_scale` F32 []); moonshotai Kimi-K2.5 (`language_model.model.` prefix, compressed-tensors INT4 group 32
`weight_packed` I32 / `weight_scale` BF16 / `weight_shape` I64, MoonViT `vision_tower` + `mm_projector`).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from pcc.lower import compile_file
from pcc.models import catalog_from_checkpoint, load_catalog

INDEX = "model.safetensors.index.json"

# openai/gpt-oss-20b config.json, as published (one copy, shared with tests/plan).
GPT_OSS_20B = json.loads((Path(__file__).parent / "published" / "openai--gpt-oss-20b.config.json").read_text())
TINY_GPT_OSS = dict(GPT_OSS_20B, hidden_size=64, intermediate_size=64, head_dim=16, num_attention_heads=4,
                    num_key_value_heads=2, num_local_experts=4, num_hidden_layers=2, vocab_size=128,
                    layer_types=["sliding_attention", "full_attention"])


def _write(root, config, tensors: dict, shards: int = 2, extra_files: dict | None = None):
    root.mkdir(parents=True, exist_ok=True)
    (root / "config.json").write_text(json.dumps(config))
    for name, doc in (extra_files or {}).items():
        (root / name).write_text(json.dumps(doc))
    names, weight_map = list(tensors), {}
    for s in range(shards):
        file = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        part = {n: tensors[n].contiguous() for n in names[s::shards]}
        save_file(part, str(root / file), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(part, file))
    (root / INDEX).write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return root


def _index_only(src, dst):
    """The same model with its config and index only: what a user has before downloading the shards."""
    dst.mkdir()
    for name in ("config.json", INDEX, "hf_quant_config.json"):
        if (src / name).exists():
            (dst / name).write_text((src / name).read_text())
    return dst


def _z(shape, dtype=torch.bfloat16):
    return torch.zeros(shape, dtype=dtype)


def gpt_oss_tensors(c: dict) -> dict:
    """The tensors of gpt-oss's published checkpoint for config `c`, with its dtypes and shape relations."""
    h, e, inter, hd = c["hidden_size"], c["num_local_experts"], c["intermediate_size"], c["head_dim"]
    q, kv = c["num_attention_heads"] * hd, c["num_key_value_heads"] * hd
    t = {"model.embed_tokens.weight": _z((c["vocab_size"], h)), "model.norm.weight": _z(h),
         "lm_head.weight": _z((c["vocab_size"], h))}
    for layer in range(c["num_hidden_layers"]):
        p = f"model.layers.{layer}."
        t.update({p + "input_layernorm.weight": _z(h), p + "post_attention_layernorm.weight": _z(h),
                  p + "self_attn.q_proj.weight": _z((q, h)), p + "self_attn.q_proj.bias": _z(q),
                  p + "self_attn.k_proj.weight": _z((kv, h)), p + "self_attn.k_proj.bias": _z(kv),
                  p + "self_attn.v_proj.weight": _z((kv, h)), p + "self_attn.v_proj.bias": _z(kv),
                  p + "self_attn.o_proj.weight": _z((h, q)), p + "self_attn.o_proj.bias": _z(h),
                  p + "self_attn.sinks": _z(c["num_attention_heads"]),
                  p + "mlp.router.weight": _z((e, h)), p + "mlp.router.bias": _z(e),
                  p + "mlp.experts.gate_up_proj_blocks": _z((e, 2 * inter, h // 32, 16), torch.uint8),
                  p + "mlp.experts.gate_up_proj_scales": _z((e, 2 * inter, h // 32), torch.uint8),
                  p + "mlp.experts.gate_up_proj_bias": _z((e, 2 * inter)),
                  p + "mlp.experts.down_proj_blocks": _z((e, h, inter // 32, 16), torch.uint8),
                  p + "mlp.experts.down_proj_scales": _z((e, h, inter // 32), torch.uint8),
                  p + "mlp.experts.down_proj_bias": _z((e, h))})
    return t


def _contract(tmp_path, model, rollout: str, hw: str = "B200", extra: str = "  routing replay rollout\n"):
    path = tmp_path / "c.prec"
    path.write_text(f'contract published {{\n  model from "{model}"\n  hardware {hw}\n'
                    f"  rollout sglang {{\n    {rollout}\n  }}\n  trainer megatron {{\n    gemm : bf16\n  }}\n"
                    f"{extra}}}\n", encoding="utf-8")
    return path


def _compiled(path):
    compiled = compile_file(str(path))
    errors = [d.render(compiled.sources) for d in compiled.diagnostics if d.is_error]
    assert compiled.ok, "\n".join(errors)
    return compiled


# ---- gpt-oss ----

def test_gpt_oss_20b_config_is_a_21b_moe(tmp_path):
    """OpenAI's model card: gpt-oss-20b has 20.91B parameters, 32 experts in each of 24 layers. The fused
    experts are expert operators (one gate, up and down per expert), the router a router."""
    (tmp_path / "config.json").write_text(json.dumps(GPT_OSS_20B))
    cat = catalog_from_checkpoint(tmp_path)
    ops = [op for op in cat.operators if op.family != "kv_cache"]
    params = sum(math.prod(op.shape) for op in ops)
    biases = 24 * (4096 + 512 + 512 + 2880 + 64 + 32 + 32 * 5760 + 32 * 2880)  # extras: biases, sinks
    assert round((params + biases) / 1e9, 2) == 20.91
    fams = {f: sum(op.family == f for op in ops) for f in ("experts.gate_up", "experts.down", "router")}
    assert fams == {"experts.gate_up": 24 * 32 * 2, "experts.down": 24 * 32, "router": 24}
    assert cat.architecture == "moe" and cat.num_experts == 32
    assert "model.layers.23.self_attn.sinks" in cat.extra_tensors
    assert "model.layers.0.mlp.experts.gate_up_proj_bias" in cat.extra_tensors


def test_gpt_oss_20b_explain_bytes_are_the_published_layout(tmp_path):
    """`experts : mxfp4` (the published scheme) keeps attention, router, embeddings, lm_head BF16: the rollout
    weights are the MXFP4 experts (17 bytes per 32 weights: 16 of codes, one E8M0 scale) plus 2 bytes per
    other weight, counted here from the config alone."""
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text(json.dumps(GPT_OSS_20B))
    plan = _compiled(_contract(tmp_path, tmp_path / "m", "experts : mxfp4\n    keep bf16 : router")).plan
    h, inter, e, layers, vocab = 2880, 2880, 32, 24, 201088
    expert = layers * e * (2 * inter * h + h * inter)
    other = 2 * vocab * h + layers * (2 * 4096 * h + 2 * 512 * h + e * h + 2 * h) + h
    assert plan.params == expert + other
    assert plan.rollout_bytes == expert // 32 * 17 + 2 * other


def test_gpt_oss_shards_and_index_only_give_the_same_operators(tmp_path):
    src = _write(tmp_path / "gpt-oss", TINY_GPT_OSS, gpt_oss_tensors(TINY_GPT_OSS))
    full = catalog_from_checkpoint(src)
    bare = catalog_from_checkpoint(_index_only(src, tmp_path / "index-only"))
    assert full.operators == bare.operators
    assert full.extra_tensors == bare.extra_tensors
    by = {op.tensor: op for op in full.operators}
    gate = by["model.layers.1.mlp.experts.3.gate_proj.weight"]
    assert (gate.family, gate.layer, gate.expert, gate.shape, gate.dtype) == ("experts.gate_up", 1, 3, (64, 64), "mxfp4")
    assert by["model.layers.1.mlp.experts.3.down_proj.weight"].shape == (64, 64)
    assert by["model.layers.0.mlp.router.weight"].family == "router"
    assert not [t for t in full.extra_tensors if t.endswith(("_blocks", "_scales"))]
    assert {t.rsplit(".", 1)[-1] for t in full.extra_tensors} == {
        "bias", "sinks", "gate_up_proj_bias", "down_proj_bias"}


def test_gpt_oss_contract_resolves_experts_and_router_and_copies_biases(tmp_path):
    src = _write(tmp_path / "gpt-oss", TINY_GPT_OSS, gpt_oss_tensors(TINY_GPT_OSS))
    plan = _compiled(_contract(tmp_path, src, "experts : mxfp4\n    keep bf16 : router")).plan
    ops = plan.catalog.operators
    for i, op in enumerate(ops):
        want = "mxfp4" if op.family.startswith("experts.") else "bf16"
        assert plan.scheme_name("rollout", i) == want, op.tensor
    fused = plan.rollout_tensors[plan.index["model.layers.0.mlp.experts.2.up_proj.weight"]]
    assert fused["targets"]["model.layers.0.mlp.experts.gate_up_proj_blocks"]["shape"] == [4, 128, 2, 16]


# ---- DeepSeek-V3 block FP8 with its MTP layer ----

DEEPSEEK_QC = {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8", "weight_block_size": [128, 128]}
TINY_DEEPSEEK = dict(hidden_size=256, intermediate_size=384, moe_intermediate_size=128, num_hidden_layers=2,
                     num_attention_heads=2, num_key_value_heads=2, q_lora_rank=128, kv_lora_rank=128,
                     qk_nope_head_dim=64, qk_rope_head_dim=64, v_head_dim=64, n_routed_experts=4,
                     num_experts_per_tok=2, first_k_dense_replace=1, n_group=2, topk_group=1, vocab_size=256,
                     num_nextn_predict_layers=1)


def deepseek_fp8_tensors(config: dict) -> dict:
    """DeepSeek-V3's published FP8 checkpoint for `config`: every decoder linear (the MTP layer's too) F8_E4M3 +
    F32 weight_scale_inv of 128x128 blocks; router, norms, embeddings, heads and the MTP's eh_proj BF16."""
    from pcc.models.builtin import catalog_from_config

    layers = config["num_hidden_layers"]
    c = dict(config, num_hidden_layers=layers + 1)  # the MTP layer is a decoder layer plus its own modules
    built = catalog_from_config("ds", c)
    t = {}
    for op in built.operators:
        if op.family == "kv_cache":
            continue
        if op.family in ("attn.q", "attn.kv", "attn.o", "mlp.gate_up", "mlp.down", "experts.gate_up",
                         "experts.down", "shared_experts.gate_up", "shared_experts.down"):
            n, k = op.shape
            t[op.tensor] = _z(op.shape, torch.float8_e4m3fn)
            t[op.tensor[: -len("weight")] + "weight_scale_inv"] = _z((-(-n // 128), -(-k // 128)), torch.float32)
        else:
            t[op.tensor] = _z(op.shape)
    for name in built.extra_tensors:
        t[name] = _z(config["n_routed_experts"], torch.float32)
    h, v, m = config["hidden_size"], config["vocab_size"], f"model.layers.{layers}."
    t.update({m + "embed_tokens.weight": _z((v, h)), m + "enorm.weight": _z(h), m + "hnorm.weight": _z(h),
              m + "eh_proj.weight": _z((h, 2 * h)), m + "shared_head.norm.weight": _z(h),
              m + "shared_head.head.weight": _z((v, h))})
    return t


@pytest.fixture(scope="module")
def deepseek(tmp_path_factory):
    config = dict(load_catalog("deepseek_v3").config, **TINY_DEEPSEEK, quantization_config=DEEPSEEK_QC)
    return _write(tmp_path_factory.mktemp("ds") / "DeepSeek-V3", config, deepseek_fp8_tensors(config))


def test_deepseek_fp8_scales_are_no_extras_and_mtp_keeps_decoder_families(deepseek, tmp_path):
    full = catalog_from_checkpoint(deepseek)
    bare = catalog_from_checkpoint(_index_only(deepseek, tmp_path / "index-only"))
    assert full.operators == bare.operators and full.extra_tensors == bare.extra_tensors
    assert not [t for t in full.extra_tensors if "scale" in t]
    assert full.extra_tensors == ("model.layers.1.mlp.gate.e_score_correction_bias",
                                  "model.layers.2.mlp.gate.e_score_correction_bias")
    mtp = {op.tensor[len("model.layers.2."):]: (op.family, op.dtype) for op in full.operators if op.layer == 2}
    assert mtp["eh_proj.weight"] == ("mtp", "bf16")
    assert mtp["enorm.weight"] == mtp["hnorm.weight"] == mtp["shared_head.norm.weight"] == ("norm", "bf16")
    assert mtp["embed_tokens.weight"] == ("embed", "bf16") and mtp["shared_head.head.weight"] == ("lm_head", "bf16")
    assert mtp["self_attn.kv_b_proj.weight"] == ("attn.kv", "fp8_e4m3")
    assert mtp["mlp.experts.3.down_proj.weight"] == ("experts.down", "fp8_e4m3")
    assert mtp["mlp.shared_experts.gate_proj.weight"] == ("shared_experts.gate_up", "fp8_e4m3")
    assert full.num_layers == 2  # layer ranges count decoder layers


def test_deepseek_linear_rule_quantizes_the_mtp_decoder_as_published(deepseek, tmp_path):
    """`linear : fp8_block` covers the MTP layer's attention and experts (FP8 in the published checkpoint) but
    not eh_proj (BF16 there, and a plain nn.Linear in SGLang's NextN model); the converter plan copies only the
    router's correction biases."""
    plan = _compiled(_contract(tmp_path, deepseek, "linear : fp8_block", hw="H100")).plan
    rollout = {op.tensor: plan.scheme_name("rollout", i) for i, op in enumerate(plan.catalog.operators)}
    assert rollout["model.layers.2.mlp.experts.0.gate_proj.weight"] == "fp8_block"
    assert rollout["model.layers.2.self_attn.q_b_proj.weight"] == "fp8_block"
    assert rollout["model.layers.2.eh_proj.weight"] == "bf16"
    from pcc.lower.converter import converter_plan

    copied = [e["source"] for e in converter_plan(plan)["copied"]]
    assert copied == ["model.layers.1.mlp.gate.e_score_correction_bias", "model.layers.2.mlp.gate.e_score_correction_bias"]


def test_mtp_pattern_selects_the_mtp_layer_only(deepseek, tmp_path):
    plan = _compiled(_contract(tmp_path, deepseek, "linear : fp8_block\n    keep bf16 : mtp", hw="H100")).plan
    for i, op in enumerate(plan.catalog.operators):
        gemm = op.family not in ("norm", "embed", "kv_cache", "lm_head", "router")
        want = "fp8_block" if gemm and op.layer in (0, 1) else "bf16"
        assert plan.scheme_name("rollout", i) == want, op.tensor
    plan = _compiled(_contract(tmp_path, deepseek, "mtp : fp8_block", hw="H100")).plan
    chosen = {op.tensor for i, op in enumerate(plan.catalog.operators) if plan.scheme_name("rollout", i) == "fp8_block"}
    assert "model.layers.2.eh_proj.weight" in chosen and "model.layers.2.mlp.experts.1.up_proj.weight" in chosen
    assert not [t for t in chosen if not t.startswith("model.layers.2.")]
    assert "model.layers.2.mlp.gate.weight" in chosen  # the MTP's router too: `mtp` is every GEMM of the layer


def test_mtp_on_a_catalog_without_mtp_layer_says_why(tmp_path):
    path = tmp_path / "c.prec"
    path.write_text("contract c {\n  model deepseek_v3\n  hardware H100\n  rollout sglang {\n    keep bf16 : mtp\n"
                    "  }\n  routing replay rollout\n}\n", encoding="utf-8")
    diags = [d for d in compile_file(str(path)).diagnostics if d.code == "PCC201"]
    assert diags and "no MTP layer" in (diags[0].hint or "")


def test_mtp_takes_no_layer_range(tmp_path, deepseek):
    diags = compile_file(str(_contract(tmp_path, deepseek, "keep bf16 : mtp[0]", hw="H100"))).diagnostics
    assert [d.code for d in diags if d.is_error] == ["PCC201"]


# ---- ModelOpt NVFP4 ----

def test_modelopt_nvfp4_dense_layer_reads_as_its_logical_shapes(tmp_path):
    """nvidia/DeepSeek-R1-FP4's dense layer: down_proj U8 [7168, 9216] is [7168, 18432] packed two per byte,
    weight_scale F8_E4M3 [7168, 1152] (groups of 16), weight_scale_2 and input_scale F32 []. Shrunk x1/56."""
    config = dict(load_catalog("deepseek_v3").config, **{
        **TINY_DEEPSEEK, "hidden_size": 128, "intermediate_size": 256, "moe_intermediate_size": 64, "q_lora_rank": 64,
        "kv_lora_rank": 64, "qk_nope_head_dim": 32, "qk_rope_head_dim": 32, "v_head_dim": 32,
        "num_nextn_predict_layers": 0})
    from pcc.models.builtin import catalog_from_config

    built = catalog_from_config("r1", config)
    tensors = {}
    for op in built.operators:
        if op.family == "kv_cache":
            continue
        if op.family in ("mlp.gate_up", "mlp.down", "experts.gate_up", "experts.down"):
            n, k = op.shape
            p = op.tensor[: -len("weight")]
            tensors.update({op.tensor: _z((n, k // 2), torch.uint8), p + "weight_scale": _z((n, k // 16), torch.float8_e4m3fn),
                            p + "weight_scale_2": _z((), torch.float32), p + "input_scale": _z((), torch.float32)})
        else:
            tensors[op.tensor] = _z(op.shape)
    tensors.update({name: _z(4, torch.float32) for name in built.extra_tensors})
    hf_quant = {"producer": {"name": "modelopt", "version": "0.23.0"},
                "quantization": {"quant_algo": "NVFP4", "kv_cache_quant_algo": None, "group_size": 16,
                                 "exclude_modules": ["lm_head"]}}
    src = _write(tmp_path / "R1-FP4", config, tensors, extra_files={"hf_quant_config.json": hf_quant})
    full = catalog_from_checkpoint(src)
    assert [op.shape for op in full.operators] == [op.shape for op in built.operators]
    down = full.operators[[op.tensor for op in full.operators].index("model.layers.0.mlp.down_proj.weight")]
    assert (down.shape, down.dtype) == ((128, 256), "nvfp4")
    assert full.extra_tensors == built.extra_tensors
    bare = catalog_from_checkpoint(_index_only(src, tmp_path / "index-only"))
    assert bare.operators == full.operators and bare.extra_tensors == full.extra_tensors


# ---- Kimi-K2.5: a VLM wrapper around a compressed-tensors INT4 DeepSeek-V3 ----

KIMI_INT4 = {"config_groups": {"group_0": {"input_activations": None, "output_activations": None,
                                           "targets": ["Linear"],
                                           "weights": {"actorder": None, "block_structure": None, "dynamic": False,
                                                       "group_size": 32, "num_bits": 4, "observer": "minmax",
                                                       "observer_kwargs": {}, "strategy": "group",
                                                       "symmetric": True, "type": "int"}}},
             "format": "pack-quantized", "ignore": ["lm_head", "re:.*self_attn.*", "re:.*shared_experts.*",
                                                    "re:.*mlp\\.(gate|up|gate_up|down)_proj.*"],
             "kv_cache_scheme": None, "quant_method": "compressed-tensors", "quantization_status": "compressed"}


def test_kimi_k25_vlm_prefix_vision_tower_and_int4_experts(tmp_path):
    text = dict(load_catalog("kimi_k2").config, **{**TINY_DEEPSEEK, "num_nextn_predict_layers": 0},
                quantization_config=KIMI_INT4)
    config = {"architectures": ["KimiK25ForConditionalGeneration"], "model_type": "kimi_k25",
              "text_config": text, "vision_config": {"hidden_size": 32}}
    from pcc.models.builtin import catalog_from_config

    built = catalog_from_config("k25", text)
    tensors = {}
    for op in built.operators:
        if op.family == "kv_cache":
            continue
        name = "language_model." + op.tensor
        if op.family.startswith("experts."):
            n, k = op.shape
            p = name[: -len("weight")]
            tensors.update({p + "weight_packed": _z((n, k // 8), torch.int32), p + "weight_scale": _z((n, k // 32)),
                            p + "weight_shape": torch.tensor([n, k], dtype=torch.int64)})
        else:
            tensors[name] = _z(op.shape)
    tensors.update({"language_model." + name: _z(4, torch.float32) for name in built.extra_tensors})
    tensors.update({"vision_tower.patch_embed.proj.weight": _z((32, 3, 14, 14)),
                    "vision_tower.encoder.blocks.0.norm0.weight": _z(32),
                    "vision_tower.encoder.blocks.0.wqkv.weight": _z((96, 32)),
                    "vision_tower.encoder.blocks.0.wqkv.bias": _z(96),
                    "mm_projector.pre_norm.weight": _z(32), "mm_projector.proj.0.weight": _z((128, 128)),
                    "mm_projector.proj.2.weight": _z((256, 128))})
    src = _write(tmp_path / "Kimi-K2.5", config, tensors)
    cat = catalog_from_checkpoint(src)
    lm = [op for op in cat.operators if op.tensor.startswith("language_model.")]
    assert [(op.tensor, op.shape, op.family) for op in lm] == [
        ("language_model." + op.tensor, op.shape, op.family) for op in built.operators]
    expert = next(op for op in lm if op.family == "experts.down")
    assert expert.dtype == "int4"
    vision = {op.tensor: op.family for op in cat.operators if not op.tensor.startswith("language_model.")}
    assert vision == {"vision_tower.patch_embed.proj.weight": "other", "vision_tower.encoder.blocks.0.norm0.weight": "norm",
                      "vision_tower.encoder.blocks.0.wqkv.weight": "vision", "mm_projector.pre_norm.weight": "norm",
                      "mm_projector.proj.0.weight": "vision", "mm_projector.proj.2.weight": "vision"}
    assert "vision_tower.encoder.blocks.0.wqkv.bias" in cat.extra_tensors
    assert not [t for t in cat.extra_tensors if "weight_" in t]
    # A glob (and `all`) leaves the tower wide; naming `vision` selects it.
    plan = _compiled(_contract(tmp_path, src, "all : fp8_block", hw="H100")).plan
    names = {op.tensor: plan.scheme_name("rollout", i) for i, op in enumerate(plan.catalog.operators)}
    assert names["mm_projector.proj.0.weight"] == "bf16"
    plan = _compiled(_contract(tmp_path, src, "experts, vision : int4_g32", hw="H100")).plan
    names = {op.tensor: plan.scheme_name("rollout", i) for i, op in enumerate(plan.catalog.operators)}
    assert names["mm_projector.proj.0.weight"] == names["vision_tower.encoder.blocks.0.wqkv.weight"] == "int4_g32"
    assert names["vision_tower.patch_embed.proj.weight"] == "bf16"
