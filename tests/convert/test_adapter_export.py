"""Trainer-side LoRA adapter -> PEFT layout with SGLang's target module names."""

from __future__ import annotations

import json

import torch
from safetensors.torch import load_file, save_file

from pcc.cli import main

CONTRACT = """contract lora-tiny {
  model tiny_dense
  hardware H100
  rollout sglang { linear : fp8_block }
  trainer megatron { gemm : bf16 optimizer adam }
  trainable lora rank 8 alpha 16 targets attn.q, attn.kv
  sync adapter { schedule colocated activation atomic }
}
"""


def _adapter(tmp_path, drop=None, rank=8):
    tensors = {}
    for layer in range(4):
        for proj, out in (("q_proj", 128), ("k_proj", 64), ("v_proj", 64)):
            m = f"model.layers.{layer}.self_attn.{proj}"
            tensors[m + ".lora_A.weight"] = torch.randn(rank, 128).to(torch.bfloat16)
            tensors[m + ".lora_B.weight"] = torch.randn(out, rank).to(torch.bfloat16)
    tensors.pop(drop, None)
    path = tmp_path / "trainer_adapter.safetensors"
    save_file(tensors, str(path))
    return path, tensors


def test_export_peft_layout(tmp_path, capsys):
    contract = tmp_path / "c.prec"
    contract.write_text(CONTRACT)
    src, tensors = _adapter(tmp_path)
    dst = tmp_path / "peft"
    assert main(["convert", str(contract), "--adapter", str(src), "--to", str(dst), "--json"]) == 0
    capsys.readouterr()
    cfg = json.loads((dst / "adapter_config.json").read_text())
    assert cfg["peft_type"] == "LORA" and cfg["r"] == 8 and cfg["lora_alpha"] == 16
    assert cfg["target_modules"] == ["k_proj", "q_proj", "v_proj"]
    out = load_file(str(dst / "adapter_model.safetensors"))
    a = "base_model.model.model.layers.2.self_attn.v_proj.lora_B.weight"
    assert torch.equal(out[a], tensors["model.layers.2.self_attn.v_proj.lora_B.weight"])
    assert len(out) == len(tensors)


def test_missing_or_misshapen_adapter_tensors(tmp_path, capsys):
    contract = tmp_path / "c.prec"
    contract.write_text(CONTRACT)
    src, _ = _adapter(tmp_path, drop="model.layers.1.self_attn.k_proj.lora_A.weight")
    assert main(["convert", str(contract), "--adapter", str(src), "--to", str(tmp_path / "a")]) == 1
    assert "lacks 1 tensors" in capsys.readouterr().err
    src, _ = _adapter(tmp_path, rank=4)
    assert main(["convert", str(contract), "--adapter", str(src), "--to", str(tmp_path / "b")]) == 1
    assert "rank 8" in capsys.readouterr().err
