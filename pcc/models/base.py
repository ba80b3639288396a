"""The vocabulary shared by every catalog path: families, operators, errors.

Kept free of torch and numpy so that the contract checker starts fast.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pcc.lang.diagnostics import PccError

# "mtp": the MTP (NextN) module's own projection, eh_proj (the rest of an MTP layer keeps its decoder
# families); "vision": a multimodal model's vision tower and projector; "attn.linear": the projections of a
# linear-attention (Gated DeltaNet) layer that the engines quantize (Qwen3.5's in_proj_qkv, in_proj_z,
# out_proj; targets/sglang.yaml `gated_deltanet`). docs/models.md.
FAMILIES = (
    "embed", "attn.q", "attn.kv", "attn.o", "attn.indexer", "attn.linear", "mlp.gate_up", "mlp.down", "router",
    "experts.gate_up", "experts.down", "shared_experts.gate_up", "shared_experts.down",
    "norm", "lm_head", "kv_cache", "mtp", "vision", "other",
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

# What a weight may be stored as (pcc dtype names): wide, or quantized in an encoding pcc.models.quantized reads
# (its logical dtype). Other tensors are copied as stored, in any of SAFETENSORS_DTYPES.
WEIGHT_DTYPES = ("bf16", "fp16", "fp32", "fp8_e4m3", "nvfp4", "mxfp4", "int4")
READS = ("pcc reads a weight in BF16, F16 or F32, or quantized (FP8 E4M3, NVFP4, MXFP4 or INT4 codes with their "
         f"scales), and other tensors in {', '.join(SAFETENSORS_DTYPES)}")

# config.json torch_dtype -> pcc dtype name.
_TORCH_DTYPES = {
    "bfloat16": "bf16", "float16": "fp16", "float32": "fp32",
    "float8_e4m3fn": "fp8_e4m3", "float8_e5m2": "fp8_e5m2",
}


def lm_config(config: dict) -> dict:
    """The language-model part of a config: multimodal wrappers nest it under text_config."""
    text = config.get("text_config")
    return text if isinstance(text, dict) else config


# Config fields pcc reads as sizes: an int where present (null allowed: "not used").
_SIZES = (
    "num_hidden_layers", "hidden_size", "intermediate_size", "moe_intermediate_size", "num_attention_heads",
    "num_key_value_heads", "head_dim", "vocab_size", "q_lora_rank", "kv_lora_rank", "qk_nope_head_dim",
    "qk_rope_head_dim", "v_head_dim", "n_routed_experts", "num_experts", "num_local_experts", "n_shared_experts",
    "num_experts_per_tok", "first_k_dense_replace", "moe_layer_freq", "decoder_sparse_step",
    "shared_expert_intermediate_size", "index_n_heads", "index_head_dim", "num_nextn_predict_layers",
    "linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim", "linear_value_head_dim",
    "linear_conv_kernel_dim", "full_attention_interval",
)


def check_config(config: dict, where: str) -> None:
    """Refuse a config.json pcc would misread: no layer count, a size that is not an integer (a string,
    a bool, a float), a dtype that is not one name pcc knows. PCC209, naming the file and field."""
    if not isinstance(config, dict):
        raise CatalogError(f"{where}: not a JSON object", code="PCC209")
    text = config.get("text_config")
    if text is not None and not isinstance(text, dict):
        raise CatalogError(f"{where}: text_config is {type(text).__name__}, not an object", code="PCC209")
    c = lm_config(config)
    field = "text_config.num_hidden_layers" if c is not config else "num_hidden_layers"
    if "num_hidden_layers" not in c:
        raise CatalogError(f"{where}: no {field}; pcc needs the decoder layer count to name the layers",
                           code="PCC209")
    for key in _SIZES:
        value = c.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise CatalogError(f"{where}: {key} is {value!r} ({type(value).__name__}); a size is a "
                               f"non-negative JSON integer", code="PCC209")
    if c["num_hidden_layers"] == 0:
        raise CatalogError(f"{where}: {field} is 0", code="PCC209")
    types = c.get("layer_types")  # hybrid models (Qwen3.5: linear_attention / full_attention per layer)
    if types is not None and not (isinstance(types, list) and all(isinstance(t, str) for t in types)
                                  and len(types) == c["num_hidden_layers"]):
        raise CatalogError(f"{where}: layer_types is {types!r}; it is a list of one layer type name per decoder "
                           f"layer ({c['num_hidden_layers']})", code="PCC209")
    for owner in (c, config):
        for key in ("torch_dtype", "dtype"):
            value = owner.get(key)
            if value is not None and (not isinstance(value, str) or value not in _TORCH_DTYPES):
                raise CatalogError(f"{where}: {key} is {value!r}; pcc reads one of "
                                   f"{', '.join(sorted(_TORCH_DTYPES))}", code="PCC209")


def config_dtype(config: dict) -> str:
    """The dtype a config declares (`torch_dtype`, or transformers 5's `dtype`). When it declares
    none (gpt-oss), bfloat16: the dtype every published LLM checkpoint pcc reads stores its wide
    tensors in; shard headers, when present, override it tensor by tensor."""
    lm = lm_config(config)
    name = (lm.get("torch_dtype") or lm.get("dtype") or config.get("torch_dtype") or config.get("dtype")
            or "bfloat16")
    return _TORCH_DTYPES.get(name, name)


def may_lead_to(root: Path) -> list[Path]:
    """Where the files of checkpoint directory `root` may lead: the directory itself, and for a Hugging Face hub
    cache snapshot (`models--ORG--NAME/snapshots/REV/`), which links its files into that model's own `blobs/`,
    that folder too."""
    base = root.resolve()
    if base.parent.name == "snapshots" and base.parent.parent.name.startswith("models--"):
        return [base, base.parent.parent / "blobs"]
    return [base]


def inside(root: Path, name: str) -> Path:
    """root / name, refused (PCC211) when it resolves outside the checkpoint directory (a symbolic link
    out of it) and a hub cache snapshot's `blobs/` (`may_lead_to`)."""
    path = root / name
    real = path.resolve()
    if not any(real.is_relative_to(a) for a in may_lead_to(root)):
        link = f"a symbolic link to {real}" if path.is_symlink() else f"resolves to {real}"
        raise CatalogError(f"{path}: {link}, outside the checkpoint directory {root}; pcc reads nothing "
                           f"outside it (copy the file in)", code="PCC211")
    return path
