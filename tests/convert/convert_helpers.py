"""Small real-named Hugging Face checkpoints and one contract per rollout format, made by the tests."""

from __future__ import annotations

import json
from pathlib import Path

import torch
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
