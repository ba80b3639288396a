"""Named built-in catalogs: HF-style configs in ``configs/``, expanded to the
tensor names a Hugging Face checkpoint of that config would hold."""

from __future__ import annotations

import difflib
import json
from functools import lru_cache
from pathlib import Path

from pcc.models.base import CatalogError, config_dtype, lm_config
from pcc.models.catalog import Catalog, assemble

_CONFIGS = Path(__file__).resolve().parent / "configs"

# Model types whose attention normalizes q and k (per head: Qwen3 family; over all heads: MiniMax-M2).
_QK_NORM_TYPES = frozenset({"qwen3", "qwen3_moe", "qwen3_5_moe", "qwen3_5_moe_text", "qwen3_5", "qwen3_5_text",
                            "minimax_m2"})
# Multimodal wrappers whose checkpoint holds the language model under another prefix than `model.` (the
# wrapper's model_type, with the config's `text_config`): Qwen3.5/3.6 MoE (Qwen3_5MoeForConditionalGeneration)
# and dense (Qwen3_5ForConditionalGeneration) write `model.language_model.layers.N...`, `model.language_model.embed_tokens`, `model.language_model.norm`
# and `lm_head` at the top. Its vision tower (`model.visual.*`) and MTP layer (`mtp.*`) are not derived.
_LM_PREFIXES = {"qwen3_5_moe": "model.language_model.", "qwen3_5": "model.language_model."}
# Hybrid models whose `layer_types` (or, without it, every `full_attention_interval`-th layer full attention)
# says which layers are Gated DeltaNet linear attention (transformers' Qwen3_5MoeTextConfig and
# Qwen3_5TextConfig __post_init__).
_HYBRID_TYPES = frozenset({"qwen3_5_moe", "qwen3_5_moe_text", "qwen3_5", "qwen3_5_text"})
_LINEAR_ATTENTION = ("linear_attn.in_proj_qkv", "linear_attn.in_proj_z", "linear_attn.in_proj_b",
                     "linear_attn.in_proj_a", "linear_attn.conv1d", "linear_attn.norm", "linear_attn.out_proj")
_LINEAR_EXTRAS = ("linear_attn.A_log", "linear_attn.dt_bias")
# Non-weight tensors transformers' models of these types save (their modeling_*.py): q/k/v biases (Qwen2 always;
# others with attention_bias, o_proj's too for Llama/Mistral), the router's correction bias (GLM-4 MoE always).
_QKV_BIAS_TYPES = frozenset({"qwen2", "qwen2_moe"})
_O_BIAS_TYPES = frozenset({"llama", "mistral"})
_CORRECTION_BIAS_TYPES = frozenset({"glm4_moe"})
# The router correction bias's name where it is not the router's own (`mlp.gate.e_score_correction_bias`):
# MiniMax-M2 keeps it on the MoE block, always (transformers' MiniMaxM2SparseMoeBlock buffer).
_BLOCK_CORRECTION_BIAS = {"minimax_m2": "block_sparse_moe.e_score_correction_bias"}
_EXPERT_PROJECTIONS = ("gate_proj", "up_proj", "down_proj")


@lru_cache(maxsize=None)
def catalog_names() -> tuple[str, ...]:
    """The built-in catalog names, sorted."""
    return tuple(sorted(path.stem for path in _CONFIGS.glob("*.json")))


def close_names(name: str) -> str:
    """"; did you mean 'x'?" for the catalogs close to `name`, else "": every refusal of a catalog name
    offers one."""
    close = difflib.get_close_matches(name, catalog_names(), n=3)
    return f"; did you mean {' or '.join(map(repr, close))}?" if close else ""


@lru_cache(maxsize=None)
def load_catalog(name: str) -> Catalog:
    """The built-in catalog ``name`` (cached: build once per process)."""
    if name not in catalog_names():
        raise CatalogError(
            f"unknown model catalog {name!r}{close_names(name)} (known: {', '.join(catalog_names())})")
    config = json.loads((_CONFIGS / f"{name}.json").read_text(encoding="utf-8"))
    return catalog_from_config(name, config)


def catalog_from_config(name: str, config: dict) -> Catalog:
    """The catalog of a model with this config, without any checkpoint."""
    weights, extras = tensor_names(config)
    dtype = config_dtype(config)
    records = ((tensor, None, dtype, None) for tensor in weights)
    return assemble(name, config, records, extras)


# Per model type: (router module, expert module prefix, the expert projections gate, up, down) of a MoE
# layer, and per-layer non-weight tensors; every other type is the DeepSeek/Qwen spelling.
_MOE_NAMES = {
    "mixtral": ("block_sparse_moe.gate", "block_sparse_moe.experts", ("w1", "w3", "w2")),
    "minimax_m2": ("block_sparse_moe.gate", "block_sparse_moe.experts", ("w1", "w3", "w2")),
    # gpt-oss stores its experts fused (`mlp.experts.gate_up_proj_blocks`...); a catalog lists the logical
    # per-expert weights pcc.models.quantized reads them as.
    "gpt_oss": ("mlp.router", "mlp.experts", _EXPERT_PROJECTIONS),
}
_DEFAULT_MOE = ("mlp.gate", "mlp.experts", _EXPERT_PROJECTIONS)
_LAYER_EXTRAS = {
    "gpt_oss": ("self_attn.q_proj.bias", "self_attn.k_proj.bias", "self_attn.v_proj.bias", "self_attn.o_proj.bias",
                "self_attn.sinks", "mlp.router.bias", "mlp.experts.gate_up_proj_bias", "mlp.experts.down_proj_bias"),
}


def tensor_names(config: dict) -> tuple[list[str], list[str]]:
    """(``*.weight`` names, other tensor names) of a HF checkpoint of ``config``,
    without MTP/nextn layers."""
    c = lm_config(config)
    model_type = c.get("model_type")
    lm = _LM_PREFIXES.get(config.get("model_type"), "model.") if c is not config else "model."
    attention, attention_extras = _attention_modules(c)
    router, experts, projections = _MOE_NAMES.get(model_type, _DEFAULT_MOE)
    weights = [f"{lm}embed_tokens.weight"]
    extras: list[str] = []
    for layer in range(c["num_hidden_layers"]):
        prefix = f"{lm}layers.{layer}."
        if _linear_attention(c, layer):
            modules, layer_extras = ["input_layernorm", "post_attention_layernorm", *_LINEAR_ATTENTION], [*_LINEAR_EXTRAS]
        else:
            modules = ["input_layernorm", "post_attention_layernorm", *attention]
            # (gpt-oss: attention_bias and its own list both name the q/k/v biases; each is listed once)
            layer_extras = list(dict.fromkeys([*attention_extras, *_LAYER_EXTRAS.get(model_type, ())]))
        if _is_moe_layer(c, layer):
            modules.append(router)
            if model_type in _BLOCK_CORRECTION_BIAS:
                layer_extras.append(_BLOCK_CORRECTION_BIAS[model_type])
            elif c.get("topk_method") == "noaux_tc" or model_type in _CORRECTION_BIAS_TYPES:
                layer_extras.append("mlp.gate.e_score_correction_bias")
            for expert in range(_num_experts(c)):
                modules += [f"{experts}.{expert}.{proj}" for proj in projections]
            if c.get("n_shared_experts"):
                modules += ["mlp.shared_experts.gate_proj", "mlp.shared_experts.up_proj",
                            "mlp.shared_experts.down_proj"]
            elif c.get("shared_expert_intermediate_size"):  # Qwen2-MoE / Qwen3.5: one gated shared expert
                modules += ["mlp.shared_expert.gate_proj", "mlp.shared_expert.up_proj",
                            "mlp.shared_expert.down_proj", "mlp.shared_expert_gate"]
        else:
            modules += ["mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"]
        weights += [f"{prefix}{module}.weight" for module in modules]
        extras += [prefix + extra for extra in layer_extras]
    weights.append(f"{lm}norm.weight")
    if not c.get("tie_word_embeddings", False):
        weights.append("lm_head.weight")
    return weights, extras


def _linear_attention(c: dict, layer: int) -> bool:
    """Is this decoder layer a Gated DeltaNet (linear-attention) layer? `layer_types` where the config has it,
    else, for the hybrid model types, every layer but each `full_attention_interval`-th (default 4)."""
    types = c.get("layer_types")
    if isinstance(types, list) and layer < len(types):
        return types[layer] == "linear_attention"
    if c.get("model_type") in _HYBRID_TYPES:
        return bool((layer + 1) % (c.get("full_attention_interval") or 4))
    return False


def _attention_modules(c: dict) -> tuple[list[str], list[str]]:
    if c.get("kv_lora_rank") is None:
        modules = ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj"]
        if c.get("model_type") in _QK_NORM_TYPES or c.get("use_qk_norm"):
            modules += ["self_attn.q_norm", "self_attn.k_norm"]
        biases = []
        if c.get("attention_bias") or c.get("model_type") in _QKV_BIAS_TYPES:
            biases = [f"self_attn.{p}_proj.bias" for p in ("q", "k", "v")]
            if c.get("attention_bias") and c.get("model_type") in _O_BIAS_TYPES:
                biases.append("self_attn.o_proj.bias")
        return modules, biases
    if c.get("q_lora_rank") is None:
        modules = ["self_attn.q_proj"]
    else:
        modules = ["self_attn.q_a_proj", "self_attn.q_a_layernorm", "self_attn.q_b_proj"]
    modules += ["self_attn.kv_a_proj_with_mqa", "self_attn.kv_a_layernorm", "self_attn.kv_b_proj",
                "self_attn.o_proj"]
    if "index_n_heads" not in c:
        return modules, []
    # DeepSeek sparse attention (GLM-5, DeepSeek-V3.2): the indexer's own projections.
    modules += ["self_attn.indexer.wq_b", "self_attn.indexer.wk", "self_attn.indexer.k_norm",
                "self_attn.indexer.weights_proj"]
    return modules, ["self_attn.indexer.k_norm.bias"]


def _num_experts(c: dict) -> int:
    return c.get("n_routed_experts") or c.get("num_experts") or c.get("num_local_experts") or 0


def _is_moe_layer(c: dict, layer: int) -> bool:
    """DeepSeek rule (first_k_dense_replace, moe_layer_freq) and Qwen rule
    (decoder_sparse_step, mlp_only_layers) at once: each family's config lacks
    the other's fields, whose defaults then change nothing."""
    return (
        _num_experts(c) > 0
        and layer >= c.get("first_k_dense_replace", 0)
        and layer % c.get("moe_layer_freq", 1) == 0
        and (layer + 1) % c.get("decoder_sparse_step", 1) == 0
        and layer not in c.get("mlp_only_layers", ())
    )
