"""The rollout checkpoint config a one-line contract produces, field by field against the model's published
one, and read by a loader's own code (transformers' quantization config classes and its module-exclusion
rule `should_convert_module`, which its FP8 and MXFP4 loaders apply).

Published: deepseek-ai/DeepSeek-V3 `quantization_config` {activation_scheme dynamic, fmt e4m3, quant_method
fp8, weight_block_size [128, 128]}; openai/gpt-oss-20b {modules_to_not_convert [model.layers.*.self_attn,
model.layers.*.mlp.router, model.embed_tokens, lm_head], quant_method mxfp4}. Deliberate differences
(docs/models.md): pcc lists the modules it keeps wide by name (`modules_to_not_convert`) where the published
config omits the list (DeepSeek-V3) or writes globs (gpt-oss); the loaders decide the same for every module.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from transformers.quantizers.quantizers_utils import should_convert_module
from transformers.utils.quantization_config import FineGrainedFP8Config, Mxfp4Config

from pcc.lower import compile_file
from pcc.lower.checkpoint_config import quantization_config

PUBLISHED = Path(__file__).resolve().parent.parent / "models" / "published"
DEEPSEEK_V3 = {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8", "weight_block_size": [128, 128]}
GPT_OSS = json.loads((PUBLISHED / "openai--gpt-oss-20b.config.json").read_text())["quantization_config"]


def _plan(tmp_path, model: str, rule: str, hw: str):
    path = tmp_path / "c.prec"
    path.write_text(f"contract one-line {{\n  model {model}\n  hardware {hw}\n  rollout sglang {{\n    {rule}\n  }}\n"
                    "  routing replay rollout\n}\n", encoding="utf-8")
    compiled = compile_file(str(path))
    assert compiled.ok, [d.render(compiled.sources) for d in compiled.diagnostics if d.is_error]
    return compiled.plan


def _modules(plan) -> list[str]:
    """The module names a loader asks about: every weight operator's module, and the fused experts module."""
    names = {op.tensor[: -len(".weight")] for op in plan.catalog.operators if op.tensor.endswith(".weight")}
    names |= {op.tensor.split(".experts.")[0] + ".experts" for op in plan.catalog.operators
              if op.family.startswith("experts.")}
    return sorted(names)


def test_deepseek_v3_block_fp8(tmp_path):
    plan = _plan(tmp_path, "deepseek_v3", "linear : fp8_block", "H100")
    ours = quantization_config(plan)
    assert {k: ours[k] for k in DEEPSEEK_V3} == DEEPSEEK_V3
    assert set(ours) - set(DEEPSEEK_V3) == {"modules_to_not_convert"}
    a, b = FineGrainedFP8Config.from_dict(dict(DEEPSEEK_V3)), FineGrainedFP8Config.from_dict(dict(ours))
    assert (a.quant_method, a.activation_scheme, tuple(a.weight_block_size)) == (
        b.quant_method, b.activation_scheme, tuple(b.weight_block_size))
    # Every linear the published checkpoint quantizes (the ones with weight_scale_inv) is converted under pcc's
    # list; what pcc keeps wide is what DeepSeek stores BF16: the router, embeddings, lm_head.
    kept = [m for m in _modules(plan) if not should_convert_module(m, ours["modules_to_not_convert"])]
    assert {m.rsplit(".", 1)[-1] if m.startswith("model.layers.") else m for m in kept} == {
        "gate", "model.embed_tokens", "lm_head"}
    for op in plan.catalog.operators:
        if op.family in ("attn.q", "attn.kv", "attn.o", "mlp.gate_up", "mlp.down", "experts.gate_up",
                         "experts.down", "shared_experts.gate_up", "shared_experts.down"):
            assert should_convert_module(op.tensor[: -len(".weight")], ours["modules_to_not_convert"]), op.tensor


@pytest.fixture
def gpt_oss_dir(tmp_path):
    d = tmp_path / "gpt-oss-20b"
    d.mkdir()
    (d / "config.json").write_text((PUBLISHED / "openai--gpt-oss-20b.config.json").read_text())
    return d


def test_gpt_oss_mxfp4(tmp_path, gpt_oss_dir):
    path = tmp_path / "g.prec"
    path.write_text(f'contract one-line {{\n  model from "{gpt_oss_dir}"\n  hardware B200\n  rollout sglang {{\n'
                    "    experts : mxfp4\n  }\n  routing replay rollout\n}\n", encoding="utf-8")
    compiled = compile_file(str(path))
    assert compiled.ok, [d.render(compiled.sources) for d in compiled.diagnostics if d.is_error]
    ours = quantization_config(compiled.plan)
    assert set(ours) == set(GPT_OSS) and ours["quant_method"] == GPT_OSS["quant_method"]
    a, b = Mxfp4Config.from_dict(dict(GPT_OSS)), Mxfp4Config.from_dict(dict(ours))
    assert a.quant_method == b.quant_method
    modules = _modules(compiled.plan)
    assert "model.layers.23.mlp.experts" in modules and "model.layers.23.mlp.router" in modules
    for m in modules:  # transformers' own exclusion rule decides the same with either list
        assert should_convert_module(m, ours["modules_to_not_convert"]) == should_convert_module(
            m, GPT_OSS["modules_to_not_convert"]), m
    converted = [m for m in modules if should_convert_module(m, ours["modules_to_not_convert"])
                 and m.startswith("model.layers.") and "norm" not in m]
    assert converted and all(".mlp.experts" in m for m in converted)  # the experts only, as published
