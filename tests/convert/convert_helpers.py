"""Small real-named Hugging Face checkpoints and one contract per rollout format, made by the tests."""

from __future__ import annotations

import json
from pathlib import Path

import ml_dtypes
import numpy as np
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from pcc.models.builtin import catalog_from_config

CONFIGS = Path(__file__).resolve().parents[2] / "pcc" / "models" / "configs"

# format -> (catalog, hardware, rollout rules)
FORMATS = {
    "fp8_block": ("tiny_moe", "H100", "linear : fp8_block\n    keep bf16 : embed, lm_head, router, norm"),
    "int4": ("tiny_dense", "H100", "linear : int4_g32\n    keep bf16 : embed, lm_head, norm"),
    "mxfp8": ("tiny_moe", "B200", "linear : mxfp8\n    keep bf16 : embed, lm_head, router, norm"),
    "nvfp4": ("tiny_moe", "B200", "experts : nvfp4\n    keep bf16 : experts[0]"),
    "mxfp4": ("tiny_moe", "GB300", "experts : mxfp4\n    keep bf16 : attn, router, embed, lm_head, norm"),
}


def write_contract(directory: Path, fmt: str) -> Path:
    model, hw, rules = FORMATS[fmt]
    replay = "  routing replay rollout\n" if model == "tiny_moe" else ""
    text = (f"contract conv-{fmt.replace('_', '-')} {{\n  model {model}\n  hardware {hw}\n"
            f"  rollout sglang {{\n    {rules}\n  }}\n"
            "  trainer megatron {\n    gemm : bf16\n    optimizer adam\n  }\n  trainable all\n"
            "  sync full_weights { schedule colocated bridge bf16 activation atomic }\n"
            f"{replay}}}\n")
    path = directory / f"{fmt}.prec"
    path.write_text(text, encoding="utf-8")
    return path


def config_for(model: str, **widen) -> dict:
    config = json.loads((CONFIGS / f"{model}.json").read_text(encoding="utf-8"))
    config.pop("_source", None)
    config.update(widen)
    return config


def make_checkpoint(directory: Path, model: str = "tiny_moe", shards: int = 2, seed: int = 0,
                    dtype=torch.bfloat16, **widen) -> dict[str, torch.Tensor]:
    """Write config.json, tokenizer/generation files and `shards` safetensors files + index;
    returns the tensors written."""
    directory.mkdir(parents=True, exist_ok=True)
    config = config_for(model, **widen)
    catalog = catalog_from_config(model, config)
    gen = torch.Generator().manual_seed(seed)
    tensors = {}
    for k, op in enumerate(op for op in catalog.operators if op.family != "kv_cache"):
        scale = 0.02 * (1 + k % 7)  # blocks of different magnitudes
        tensors[op.tensor] = (torch.randn(op.shape, generator=gen) * scale).to(dtype)
    names = list(tensors)
    per = -(-len(names) // shards)
    weight_map = {}
    for s in range(shards):
        part = names[s * per:(s + 1) * per]
        file = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        save_file({n: tensors[n] for n in part}, str(directory / file), metadata={"format": "pt"})
        weight_map.update({n: file for n in part})
    (directory / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    (directory / "config.json").write_text(json.dumps(config, indent=2))
    (directory / "tokenizer.json").write_text('{"version": "1.0", "model": {"type": "BPE"}}')
    (directory / "generation_config.json").write_text('{"do_sample": true, "temperature": 0.6}')
    return tensors


def load_tensors(directory: Path) -> dict[str, torch.Tensor]:
    """Every tensor of a checkpoint directory's shards, read with safetensors' own loader."""
    out = {}
    for f in sorted(directory.glob("*.safetensors")):
        with safe_open(str(f), framework="pt") as h:
            out.update({n: h.get_tensor(n) for n in h.keys()})
    return out


def e2m1(codes: np.ndarray) -> np.ndarray:
    """E2M1 codes as their float32 values (ml_dtypes' float4_e2m1fn)."""
    return codes.astype(np.uint8).view(ml_dtypes.float4_e2m1fn).astype(np.float32)


def unpack_fp4(packed: np.ndarray, k: int) -> np.ndarray:
    """uint8 [N, K/2] -> E2M1 codes [N, K]: element 2i in the low nibble, 2i+1 in the high one."""
    out = np.empty((packed.shape[0], packed.shape[1] * 2), np.uint8)
    out[:, 0::2], out[:, 1::2] = packed & 0xF, packed >> 4
    return out[:, :k]


def nvfp4_reference(x: np.ndarray, amax: np.float32):
    """NVFP4 by its definition (TransformerEngine's two-level scaling, docs/numerics.md), in float32:
    S_enc = 2688 / amax; s_b = e4m3(amax_b * (S_enc * (1/6))); codes = e2m1(x * (1 / (s_b * (1/S_enc)))).
    (codes [N, K], block scales as their E4M3 bytes, the global scale 1 / S_enc)."""
    n, k = x.shape
    s_enc = np.float32(448.0 * 6.0) / amax
    blocks = x.reshape(n, k // 16, 16)
    s_b = (np.abs(blocks).max(-1) * (s_enc * np.float32(1.0 / 6.0))).astype(ml_dtypes.float8_e4m3fn)
    factor = np.float32(1.0) / (s_b.astype(np.float32) * (np.float32(1.0) / s_enc))
    codes = (blocks * factor[..., None]).astype(ml_dtypes.float4_e2m1fn).view(np.uint8).reshape(n, k)
    return codes, s_b.view(np.uint8), np.float32(1.0) / s_enc


# A small Qwen3.5-MoE text model: a Gated DeltaNet layer, then a full-attention layer.
QWEN3_5_MOE = dict(hidden_size=256, num_attention_heads=2, num_key_value_heads=1, head_dim=128, vocab_size=256,
                   num_hidden_layers=2, pad_token_id=0, bos_token_id=1, eos_token_id=2, moe_intermediate_size=128,
                   shared_expert_intermediate_size=128, num_experts=4, num_experts_per_tok=2, linear_num_key_heads=2,
                   linear_num_value_heads=2, linear_key_head_dim=64, linear_value_head_dim=64,
                   layer_types=["linear_attention", "full_attention"])


def qwen3_5_moe_checkpoint(directory: Path) -> None:
    """A random-weight (seed 0) Qwen3.5-MoE as transformers builds and saves it (Qwen3_5MoeForConditionalGeneration
    with a one-block vision tower, BF16, save_pretrained) in `directory`. Needs transformers."""
    import transformers

    torch.manual_seed(0)
    text = transformers.Qwen3_5MoeTextConfig(**QWEN3_5_MOE)
    vision = transformers.Qwen3_5MoeVisionConfig(depth=1, hidden_size=32, intermediate_size=64, num_heads=2,
                                                 out_hidden_size=256, patch_size=4, num_position_embeddings=16)
    cfg = transformers.Qwen3_5MoeConfig(text_config=text.to_dict(), vision_config=vision.to_dict(),
                                        tie_word_embeddings=False)
    model = transformers.AutoModelForImageTextToText.from_config(cfg).to(torch.bfloat16).eval()
    model.save_pretrained(str(directory))
