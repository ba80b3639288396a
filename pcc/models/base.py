"""The vocabulary shared by every catalog path: families, operators, errors.

Kept free of torch and numpy so that the contract checker starts fast.
"""

from __future__ import annotations

from dataclasses import dataclass

from pcc.lang.diagnostics import PccError

FAMILIES = (
    "embed", "attn.q", "attn.kv", "attn.o", "mlp.gate_up", "mlp.down", "router",
    "experts.gate_up", "experts.down", "shared_experts.gate_up", "shared_experts.down",
    "norm", "lm_head", "kv_cache", "other",
)


class CatalogError(PccError):
    """A model catalog cannot be built; the message names the file or tensor at fault."""

    code = "PCC204"


@dataclass(frozen=True, slots=True)
class Operator:
    """One weight tensor (or a layer's KV cache) that a contract can assign a scheme to."""

    tensor: str
    family: str
    layer: int | None
    expert: int | None
    shape: tuple[int, ...]
    dtype: str


# safetensors header dtype -> pcc dtype name.
SAFETENSORS_DTYPES = {
    "BF16": "bf16", "F16": "fp16", "F32": "fp32", "F64": "fp64",
    "F8_E4M3": "fp8_e4m3", "F8_E5M2": "fp8_e5m2", "F8_E8M0": "fp8_e8m0",
    "I8": "int8", "U8": "uint8", "I16": "int16", "I32": "int32", "I64": "int64", "BOOL": "bool",
}

# config.json torch_dtype -> pcc dtype name.
_TORCH_DTYPES = {
    "bfloat16": "bf16", "float16": "fp16", "float32": "fp32",
    "float8_e4m3fn": "fp8_e4m3", "float8_e5m2": "fp8_e5m2",
}


def lm_config(config: dict) -> dict:
    """The language-model part of a config: multimodal wrappers nest it under text_config."""
    text = config.get("text_config")
    return text if isinstance(text, dict) else config


def config_dtype(config: dict) -> str:
    """The dtype a config declares (`torch_dtype`, or transformers 5's `dtype`). When it declares
    none (gpt-oss), bfloat16: the dtype every published LLM checkpoint pcc reads stores its wide
    tensors in; shard headers, when present, override it tensor by tensor."""
    lm = lm_config(config)
    name = (lm.get("torch_dtype") or lm.get("dtype") or config.get("torch_dtype") or config.get("dtype")
            or "bfloat16")
    return _TORCH_DTYPES.get(name, name)
