"""Tensor shapes from config.json, in HF layout (linears are (out, in)).

Built-in catalogs take every shape from here; checkpoints are checked
against it, so a config that does not describe its weights is caught.
"""

from __future__ import annotations

from collections.abc import Callable

from pcc.models.base import lm_config

# Model types whose configs these formulas are known to describe; checkpoints
# of other types keep the shapes their safetensors headers declare. "deepseek" is DeepSeek-MoE v1
# (deepseek-ai/deepseek-moe-16b-base, DeepseekForCausalLM, trust_remote_code): q/k/v/o attention, no MLA,
# DeepSeek's MoE names and layer rule (first_k_dense_replace, moe_layer_freq), shared experts fused.
# "qwen3_5_moe_text" is Qwen3.5/3.6 MoE's language model (`text_config` of a `qwen3_5_moe` config, or a text-only
# Qwen3_5MoeForCausalLM): Gated DeltaNet linear-attention layers (`linear_attn.*`) and gated full attention
# (q_proj twice as wide: query and output gate) by `layer_types`; "qwen3_5_text" is the dense form (Qwen3.5-27B,
# transformers' modeling_qwen3_5.py: the same layers with a dense MLP). "minimax_m2": MiniMax-M2/M2.5, Mixtral's
# names, per-layer q/k norms over all heads. Formulas from transformers' modeling_qwen3_5_moe.py and
# modeling_minimax_m2.py.
KNOWN_MODEL_TYPES = frozenset({
    "llama", "mistral", "qwen2", "qwen3", "mixtral", "qwen2_moe", "qwen3_moe", "glm4_moe",
    "deepseek", "deepseek_v2", "deepseek_v3", "deepseek_v32", "kimi_k2", "glm_moe_dsa", "gpt_oss",
    "qwen3_5_moe", "qwen3_5_moe_text", "qwen3_5", "qwen3_5_text", "minimax_m2",
})
# Model types whose full-attention q_proj also produces a per-head output gate (q_proj rows 2 x heads x head_dim,
# transformers' Qwen3_5MoeAttention; SGLang and vLLM read `attn_output_gate`, default true).
GATED_Q_TYPES = frozenset({"qwen3_5_moe", "qwen3_5_moe_text", "qwen3_5", "qwen3_5_text", "qwen3_next"})
# Model types whose q_norm / k_norm normalize all heads at once (MiniMax-M2's qk_norm_type "per_layer"):
# weights [heads x head_dim] and [kv_heads x head_dim], not [head_dim].
_LAYER_QK_NORM_TYPES = frozenset({"minimax_m2"})
# Gated DeltaNet sizes a config may leave out, at transformers' defaults (Qwen3_5MoeTextConfig, Qwen3NextConfig).
LINEAR_DEFAULTS = {"linear_conv_kernel_dim": 4, "linear_key_head_dim": 128, "linear_value_head_dim": 128,
                   "linear_num_key_heads": 16, "linear_num_value_heads": 32}


def _heads(c: dict) -> int:
    return c["num_attention_heads"]


def _head_dim(c: dict) -> int:
    return c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]


def _kv_width(c: dict) -> int:
    return c.get("num_key_value_heads", c["num_attention_heads"]) * _head_dim(c)


def _mla(c: dict) -> bool:
    return c.get("kv_lora_rank") is not None


def _q_width(c: dict) -> int:
    if _mla(c):  # MLA: every head carries a no-RoPE and a RoPE part
        return _heads(c) * (c["qk_nope_head_dim"] + c["qk_rope_head_dim"])
    return _heads(c) * _head_dim(c)


def _q_proj_rows(c: dict) -> int:
    """q_proj's rows: the query, and for a gated-attention model the output gate beside it."""
    gated = c.get("attn_output_gate", c.get("model_type") in GATED_Q_TYPES)
    return _q_width(c) * (2 if gated and not _mla(c) else 1)


def _qk_norm(width: Callable[[dict], int]) -> Callable[[dict], tuple[int]]:
    """q_norm / k_norm: per head ([head_dim]), or over all heads (`width`) for MiniMax-M2's per-layer norm."""
    def shape(c: dict) -> tuple[int]:
        whole = c.get("qk_norm_type") == "per_layer" or c.get("model_type") in _LAYER_QK_NORM_TYPES
        return (width(c) if whole else _head_dim(c),)
    return shape


def _linear(c: dict, key: str) -> int:
    return c.get(key) or LINEAR_DEFAULTS[key]


def _linear_key_dim(c: dict) -> int:  # Gated DeltaNet: the keys' (and queries') width
    return _linear(c, "linear_num_key_heads") * _linear(c, "linear_key_head_dim")


def _linear_value_dim(c: dict) -> int:
    return _linear(c, "linear_num_value_heads") * _linear(c, "linear_value_head_dim")


def _linear_conv_dim(c: dict) -> int:  # q, k and v go through the causal convolution
    return 2 * _linear_key_dim(c) + _linear_value_dim(c)


def _o_width(c: dict) -> int:
    return _heads(c) * (c["v_head_dim"] if _mla(c) else _head_dim(c))


def _expert_width(c: dict) -> int:
    return c.get("moe_intermediate_size") or c["intermediate_size"]  # Mixtral has no moe_ size


def _shared_width(c: dict) -> int:
    return c["moe_intermediate_size"] * c["n_shared_experts"]  # n shared experts fused into one MLP


def _experts(c: dict) -> int:
    return c.get("n_routed_experts") or c.get("num_experts") or c["num_local_experts"]


def _hidden(c: dict) -> tuple[int]:
    return (c["hidden_size"],)


def _vocab(c: dict) -> tuple[int, int]:
    return (c["vocab_size"], c["hidden_size"])


def _col(width: Callable[[dict], int]) -> Callable[[dict], tuple[int, int]]:
    """A linear from hidden to ``width``."""
    return lambda c: (width(c), c["hidden_size"])


def _row(width: Callable[[dict], int]) -> Callable[[dict], tuple[int, int]]:
    """A linear from ``width`` back to hidden."""
    return lambda c: (c["hidden_size"], width(c))


def _index_q(c: dict) -> tuple[int, int]:
    return (c["index_n_heads"] * c["index_head_dim"], c["q_lora_rank"])


_RULES: dict[str, Callable[[dict], tuple[int, ...]]] = {
    "embed_tokens": _vocab,
    "lm_head": _vocab,
    "norm": _hidden,
    "input_layernorm": _hidden,
    "post_attention_layernorm": _hidden,
    "self_attn.q_norm": _qk_norm(_q_width),
    "self_attn.k_norm": _qk_norm(_kv_width),
    "self_attn.q_proj": _col(_q_proj_rows),
    "self_attn.k_proj": _col(_kv_width),
    "self_attn.v_proj": _col(_kv_width),
    "self_attn.o_proj": _row(_o_width),
    "self_attn.q_a_proj": _col(lambda c: c["q_lora_rank"]),
    "self_attn.q_a_layernorm": lambda c: (c["q_lora_rank"],),
    "self_attn.q_b_proj": lambda c: (_q_width(c), c["q_lora_rank"]),
    "self_attn.kv_a_proj_with_mqa": _col(lambda c: c["kv_lora_rank"] + c["qk_rope_head_dim"]),
    "self_attn.kv_a_layernorm": lambda c: (c["kv_lora_rank"],),
    "self_attn.kv_b_proj": lambda c: (
        _heads(c) * (c["qk_nope_head_dim"] + c["v_head_dim"]), c["kv_lora_rank"]),
    "self_attn.indexer.wq_b": _index_q,
    "self_attn.indexer.wk": _col(lambda c: c["index_head_dim"]),
    "self_attn.indexer.k_norm": lambda c: (c["index_head_dim"],),
    "self_attn.indexer.weights_proj": _col(lambda c: c["index_n_heads"]),
    # Gated DeltaNet (transformers' Qwen3_5MoeGatedDeltaNet): in_proj_qkv [q|k|v], in_proj_z the output gate,
    # in_proj_b and in_proj_a one row per value head, a depthwise causal conv over q|k|v, a per-head gated norm.
    "linear_attn.in_proj_qkv": _col(_linear_conv_dim),
    "linear_attn.in_proj_z": _col(_linear_value_dim),
    "linear_attn.in_proj_qkvz": _col(lambda c: _linear_conv_dim(c) + _linear_value_dim(c)),
    "linear_attn.in_proj_b": _col(lambda c: _linear(c, "linear_num_value_heads")),
    "linear_attn.in_proj_a": _col(lambda c: _linear(c, "linear_num_value_heads")),
    "linear_attn.in_proj_ba": _col(lambda c: 2 * _linear(c, "linear_num_value_heads")),
    "linear_attn.conv1d": lambda c: (_linear_conv_dim(c), 1, _linear(c, "linear_conv_kernel_dim")),
    "linear_attn.norm": lambda c: (_linear(c, "linear_value_head_dim"),),
    "linear_attn.out_proj": _row(_linear_value_dim),
    "mlp.gate_proj": _col(lambda c: c["intermediate_size"]),
    "mlp.up_proj": _col(lambda c: c["intermediate_size"]),
    "mlp.down_proj": _row(lambda c: c["intermediate_size"]),
    "mlp.gate": _col(_experts),
    "mlp.router": _col(_experts),
    "block_sparse_moe.gate": _col(_experts),
    "mlp.shared_expert_gate": lambda c: (1, c["hidden_size"]),
    "experts.gate_proj": _col(_expert_width),
    "experts.w1": _col(_expert_width),
    "experts.up_proj": _col(_expert_width),
    "experts.w3": _col(_expert_width),
    "experts.down_proj": _row(_expert_width),
    "experts.w2": _row(_expert_width),
    "mlp.shared_experts.gate_proj": _col(_shared_width),
    "mlp.shared_experts.up_proj": _col(_shared_width),
    "mlp.shared_experts.down_proj": _row(_shared_width),
    "mlp.shared_expert.gate_proj": _col(lambda c: c["shared_expert_intermediate_size"]),
    "mlp.shared_expert.up_proj": _col(lambda c: c["shared_expert_intermediate_size"]),
    "mlp.shared_expert.down_proj": _row(lambda c: c["shared_expert_intermediate_size"]),
    # DeepSeek-style MTP layer extras (family "other", but their shapes are known).
    "enorm": _hidden,
    "hnorm": _hidden,
    "shared_head.norm": _hidden,
    "eh_proj": lambda c: (c["hidden_size"], 2 * c["hidden_size"]),
    "shared_head.head": _vocab,
}


def formula_shape(kind: str, config: dict) -> tuple[int, ...] | None:
    """The shape config.json implies for a tensor kind (see ``classify.Slot``),
    or None when the kind is unknown or the config lacks a field it needs."""
    rule = _RULES.get(kind)
    if rule is None:
        return None
    try:
        shape = tuple(rule(lm_config(config)))
    except (KeyError, TypeError):
        return None
    return shape if all(isinstance(dim, int) for dim in shape) else None
