"""Tensor name -> (family, layer, expert): the one rule both catalog paths use.

Built-in catalogs generate Hugging Face names from a config and checkpoints
list real ones; both go through ``classify`` so they agree by construction.
The rule reads names only (plus the layer count, to tell MTP/nextn layers
from decoder layers), which is why it also serves unknown model types.
"""

from __future__ import annotations

import re
from typing import NamedTuple

from pcc.models.base import lm_config

# Language-model prefixes: plain causal LMs, and multimodal wrappers around one (Kimi-K2.5 writes
# `language_model.model.`, its ModelOpt NVFP4 export `language_model.`).
_PREFIX = r"(?:model\.|model\.language_model\.|language_model\.model\.|language_model\.)"
_LAYER = re.compile(
    rf"{_PREFIX}layers\.(\d+)\.(?:(?:mlp|block_sparse_moe)\.experts\.(\d+)\.)?(.+)\.weight"
)
_TOP = re.compile(rf"{_PREFIX}(embed_tokens|norm)\.weight|(?:language_model\.)?(lm_head)\.weight")
_TOP_FAMILIES = {"embed_tokens": "embed", "norm": "norm", "lm_head": "lm_head"}
# A multimodal model's vision tower and its projector into the language model (Kimi-K2.5's MoonViT
# `vision_tower` + `mm_projector`, Qwen-VL's `visual`, LLaVA's `vision_tower` + `multi_modal_projector`).
_VISION = re.compile(r"(?:model\.)?(?:vision_tower|visual|vision_model|mm_projector|multi_modal_projector)\."
                     r"(?:.+\.)?([^.]+)\.weight")
# Modules only an MTP (NextN) layer has (DeepSeek-V3 layer 61, GLM-5 layer 78), and their families;
# the rest of such a layer is a decoder layer and keeps its families.
_MTP_MODULES = {"embed_tokens": "embed", "enorm": "norm", "hnorm": "norm", "shared_head.norm": "norm",
                "eh_proj": "mtp", "shared_head.head": "lm_head"}

# Module path inside a decoder layer -> family, in canonical within-layer order.
_LAYER_MODULES = {
    "input_layernorm": "norm",
    "post_attention_layernorm": "norm",
    "self_attn.q_a_layernorm": "norm",
    "self_attn.kv_a_layernorm": "norm",
    "self_attn.q_norm": "norm",
    "self_attn.k_norm": "norm",
    "self_attn.q_proj": "attn.q",
    "self_attn.q_a_proj": "attn.q",
    "self_attn.q_b_proj": "attn.q",
    "self_attn.k_proj": "attn.kv",
    "self_attn.v_proj": "attn.kv",
    "self_attn.kv_a_proj_with_mqa": "attn.kv",
    "self_attn.kv_b_proj": "attn.kv",
    "self_attn.o_proj": "attn.o",
    # DeepSeek sparse attention's indexer (DeepSeek-V3.2, GLM-5): its query and key projections
    # are Linear layers SGLang quantizes with the checkpoint's method; weights_proj is not (other).
    "self_attn.indexer.wq_b": "attn.indexer",
    "self_attn.indexer.wk": "attn.indexer",
    # A linear-attention (Gated DeltaNet) layer (Qwen3.5/3.6 `qwen3_5_moe`): the projections SGLang and vLLM
    # build with the checkpoint's quant config and load quantized (targets/sglang.yaml, vllm.yaml
    # `gated_deltanet`). Its in_proj_b, in_proj_a (one merged [num_v_heads] x 2 layer, which block FP8
    # refuses) and conv1d (no quant config) stay wide: other. Qwen3-Next stores qkv and z fused as in_proj_qkvz.
    "linear_attn.in_proj_qkv": "attn.linear",
    "linear_attn.in_proj_z": "attn.linear",
    "linear_attn.in_proj_qkvz": "attn.linear",
    "linear_attn.out_proj": "attn.linear",
    "mlp.gate": "router",
    "mlp.router": "router",  # gpt-oss
    "block_sparse_moe.gate": "router",
    "mlp.shared_expert_gate": "router",
    "mlp.shared_experts.gate_proj": "shared_experts.gate_up",
    "mlp.shared_experts.up_proj": "shared_experts.gate_up",
    "mlp.shared_experts.down_proj": "shared_experts.down",
    "mlp.shared_expert.gate_proj": "shared_experts.gate_up",
    "mlp.shared_expert.up_proj": "shared_experts.gate_up",
    "mlp.shared_expert.down_proj": "shared_experts.down",
    "mlp.gate_proj": "mlp.gate_up",
    "mlp.up_proj": "mlp.gate_up",
    "mlp.down_proj": "mlp.down",
}
# Routed expert projections (HF names and Mixtral's w1/w3/w2), gate before up before down.
_EXPERT_MODULES = {
    "gate_proj": "experts.gate_up", "w1": "experts.gate_up",
    "up_proj": "experts.gate_up", "w3": "experts.gate_up",
    "down_proj": "experts.down", "w2": "experts.down",
}

_GROUP = {  # sort position of a family inside a layer
    "embed": 0, "mtp": 0, "lm_head": 0, "norm": 0, "attn.q": 1, "attn.kv": 1, "attn.o": 1, "attn.indexer": 1,
    "attn.linear": 1,
    "kv_cache": 2,
    "router": 3, "experts.gate_up": 4, "experts.down": 4, "shared_experts.gate_up": 5,
    "shared_experts.down": 5, "mlp.gate_up": 6, "mlp.down": 6, "other": 7,
}
_RANK = {module: i for i, module in enumerate(_LAYER_MODULES)} | {
    "experts.gate_proj": 0, "experts.w1": 0, "experts.up_proj": 1, "experts.w3": 1,
    "experts.down_proj": 2, "experts.w2": 2,
}


class Slot(NamedTuple):
    """Where a tensor sits. ``kind`` is its module path with layer and expert
    indices removed (e.g. "self_attn.q_b_proj", "experts.down_proj"); shape
    formulas and the canonical order key on it."""

    family: str
    layer: int | None
    expert: int | None
    kind: str


def classify(tensor: str, config: dict) -> Slot:
    """Classify a ``*.weight`` tensor name. Unknown weights are "other"
    (layer kept when the name has one). A layer at or past ``num_hidden_layers``
    is an MTP (NextN) layer: its decoder modules keep their families, its own
    modules (eh_proj, enorm, hnorm, shared_head, embed_tokens) get theirs."""
    match = _LAYER.fullmatch(tensor)
    if match:
        layer, expert, module = int(match[1]), match[2], match[3]
        num_layers = lm_config(config).get("num_hidden_layers")
        mtp = isinstance(num_layers, int) and layer >= num_layers
        if expert is not None:
            family, kind = _EXPERT_MODULES.get(module, "other"), "experts." + module
            expert = int(expert)
        else:
            family, kind = (_MTP_MODULES.get(module) if mtp else None) or _LAYER_MODULES.get(module), module
            if family is None:
                family = "norm" if module.endswith("norm") else "other"
        return Slot(family, layer, expert, kind)
    match = _VISION.fullmatch(tensor)
    if match:
        norm = "norm" in match[1] or match[1].startswith("ln")
        return Slot("norm" if norm else "vision", None, None, tensor)
    match = _TOP.fullmatch(tensor)
    if match:
        kind = match[1] or match[2]
        return Slot(_TOP_FAMILIES[kind], None, None, kind)
    return Slot("other", None, None, tensor)


def order_key(slot: Slot, tensor: str) -> tuple:
    """Canonical catalog order: embed; each layer (norms, attention, kv_cache,
    router, experts by expert, shared experts, mlp, other); final norm,
    lm_head; then unplaced tensors (vision towers...) by name."""
    if slot.layer is None:
        section = {"embed_tokens": 0, "norm": 2, "lm_head": 2}.get(slot.kind, 3)
        return (section, 0, int(slot.family == "lm_head"), -1, 0, tensor)
    expert = -1 if slot.expert is None else slot.expert
    return (1, slot.layer, _GROUP[slot.family], expert, _RANK.get(slot.kind, len(_RANK)), tensor)
