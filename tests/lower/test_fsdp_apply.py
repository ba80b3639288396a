"""pcc.lower.fsdp_apply on a real transformers model: a tiny Qwen3ForCausalLM (the module names of
the Qwen3 checkpoints) saved as a checkpoint, a contract `model from` it, the fsdp target's file
applied with torchao/PEFT, then fully_shard (a one-process gloo group on the CPU) and one forward
and backward step. The mismatch checks (PCC715) need only torch; the rest needs the side folder
(requirements/fsdp.txt) and skips without it unless CI=true. Run as a script, this file is the child
that imports torchao, so its import side effects stay out of the test process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pcc.lower import lower
from pcc.lower.fsdp import FILE

ROOT = Path(__file__).resolve().parents[2]
# Qwen3's layout at CPU size: head_dim 32, 2 KV heads (k/v_proj [64, 128]), untied lm_head as in Qwen3-8B
CONFIG = dict(vocab_size=256, hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, head_dim=32, tie_word_embeddings=False)
LINEAR = 2 * 7  # q, k, v, o, gate, up, down per layer; lm_head kept wide
KINDS = {  # name -> trainer rules, trainable, the class every named module becomes
    "fp8_rowwise": ("gemm linear : fp8_row real", "", "Float8Linear"),
    "fp8_tensor": ("gemm linear : fp8_tensor real", "", "Float8Linear"),
    "fp8_rowwise_qdq": ("fprop linear : fp8_row qdq", "", "Float8Linear"),
    "int4_qat": ("fprop linear : int4_g32 qdq", "", "FakeQuantizedLinear"),
    "mxfp8_qdq": ("gemm linear : mxfp8 qdq\n    wgrad : bf16", "", "Linear[MXFP8TrainingWeightWrapperTensor]"),
    "lora": ("gemm : bf16", "  sync adapter { }\n  trainable lora rank 8 alpha 16 targets attn, mlp\n",
             "peft.tuners.lora.layer.Linear"),
}


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("qwen3_tiny")
    Qwen3ForCausalLM(Qwen3Config(**CONFIG)).save_pretrained(path)
    return path


def _file(checkpoint: Path, tmp_path: Path, name: str) -> dict:
    from pcc.plan import compile_file

    body, extra, _ = KINDS[name]
    hw = "B200" if name.startswith("mxfp8") else "H100"
    p = tmp_path / f"{name}.prec"
    p.write_text(f'contract c {{\n  model from "{checkpoint}"\n  hardware {hw}\n  rollout sglang {{\n  }}\n'
                 f"  trainer fsdp {{\n    {body}\n  }}\n{extra}}}\n", encoding="utf-8")
    c = compile_file(str(p))
    assert c.ok, [d.render() for d in c.diagnostics if d.is_error]
    return json.loads(lower(c.plan, "fsdp").files[FILE])


def _model(checkpoint: Path, dtype: str = "float32"):
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(checkpoint, dtype=getattr(torch, dtype))


def test_a_model_with_other_modules_is_pcc715_naming_them(checkpoint, tmp_path):
    from pcc.lower.fsdp_apply import ModelMismatch, apply

    doc = _file(checkpoint, tmp_path, "fp8_rowwise")
    assert len(doc["low_precision"][0]["modules"]) == LINEAR and doc["keep_wide"] == ["lm_head"]
    doc["keep_wide"] = ["lm_head", "model.layers.2.mlp.down_proj"]  # a file for a deeper model
    doc["low_precision"][0]["modules"].remove("model.layers.1.self_attn.o_proj")  # ... or a different one
    with pytest.raises(ModelMismatch) as exc:
        apply(_model(checkpoint), doc)
    assert exc.value.code == "PCC715"
    assert "1 module(s) the file names are not nn.Linear modules of the model (model.layers.2.mlp.down_proj)" \
        in exc.value.message
    assert "1 nn.Linear module(s) of the model the file does not name (model.layers.1.self_attn.o_proj)" \
        in exc.value.message


def test_a_model_in_another_dtype_than_the_sharded_one_is_pcc715(checkpoint, tmp_path):
    from pcc.lower.fsdp_apply import ModelMismatch, apply

    doc = _file(checkpoint, tmp_path, "fp8_rowwise")
    with pytest.raises(ModelMismatch) as exc:
        apply(_model(checkpoint, "bfloat16"), doc)
    assert exc.value.code == "PCC715" and "model.embed_tokens.weight is torch.bfloat16" in exc.value.message
    assert exc.value.hint == "load the model with dtype=torch.float32"


@pytest.mark.engines
def test_each_torchao_and_peft_path_applies_and_trains_one_step_on_the_cpu(checkpoint, tmp_path):
    from pcc.lower import verify_fsdp

    where = verify_fsdp.engine_dir()
    if not (where / "torchao" / "__init__.py").is_file() or not (where / "peft" / "__init__.py").is_file():
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI must run the FSDP checks: no torchao/PEFT in {where}")
        pytest.skip(f"torchao/PEFT are not installed in {where}; see requirements/fsdp.txt")
    docs = {name: _file(checkpoint, tmp_path, name) for name in KINDS}
    request = json.dumps({"dir": str(where), "checkpoint": str(checkpoint), "docs": docs})
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run([sys.executable, __file__], input=request, capture_output=True, text=True, timeout=600,
                          env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    for name, (_, _, cls) in KINDS.items():
        got = out[name]
        assert got["converted"] == {cls: LINEAR}, name
        assert got["wide"] == {"torch.nn.modules.linear.Linear": 1}, name  # lm_head stays nn.Linear
        assert got["finite"] and got["grads"] == got["trainable"], name
        assert got["trainable"] == (LINEAR * 2 if name == "lora" else 25), name  # LoRA: only A and B train
        assert 5.0 < got["loss"] < 6.0, name  # about ln(256) = 5.55 for an untrained model
    # the CPU's torch._scaled_mm (real FP8) and torchao's emulation give one forward pass
    assert abs(out["fp8_rowwise"]["loss"] - out["fp8_rowwise_qdq"]["loss"]) < 1e-4


# ---- the child: torchao and PEFT importable ------------------------------------------------------

def _child(request: dict) -> dict:
    sys.path.append(request["dir"])
    import torch
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard

    from pcc.lower.fsdp_apply import apply

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(29500 + os.getpid() % 1000))
    dist.init_process_group("gloo", rank=0, world_size=1)
    out = {}
    for name, doc in request["docs"].items():
        torch.manual_seed(0)
        model = _model(Path(request["checkpoint"]))
        run = apply(model, doc)
        modules = dict(model.named_modules())
        names = (doc["lora"] or {}).get("target_modules") or [m for g in doc["low_precision"] for m in g["modules"]]
        converted: dict[str, int] = {}
        for n in names:
            m = modules[n]
            w = type(m.weight).__name__ if hasattr(m, "weight") else "Parameter"
            key = (f"{type(m).__module__}.{type(m).__name__}" if doc["lora"] else type(m).__name__) + \
                ("" if w == "Parameter" else f"[{w}]")
            converted[key] = converted.get(key, 0) + 1
        wide: dict[str, int] = {}
        for n in set(doc["keep_wide"]) - set(names):  # with LoRA, its targets are kept wide too
            key = f"{type(modules[n]).__module__}.{type(modules[n]).__qualname__}"
            wide[key] = wide.get(key, 0) + 1
        for layer in model.model.layers:
            fully_shard(layer, **run.shard)
        fully_shard(model, **run.shard)
        ids = torch.randint(0, CONFIG["vocab_size"], (2, 16))
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        trainable = [p for p in model.parameters() if p.requires_grad]
        grads = [p.grad for p in trainable if p.grad is not None]
        out[name] = {"converted": converted, "wide": wide, "loss": float(loss), "trainable": len(trainable),
                     "grads": len(grads), "finite": all(bool(torch.isfinite(g.full_tensor()).all()) for g in grads)}
    dist.destroy_process_group()
    return out


if __name__ == "__main__":
    sys.stdout.write("\n" + json.dumps(_child(json.loads(sys.stdin.read()))) + "\n")
