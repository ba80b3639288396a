"""DeepSeek sparse attention (GLM-5, DeepSeek-V3.2): a block-FP8 checkpoint config imports into a
contract whose rollout quantizes the indexer's wq_b and wk, as SGLang builds them (targets/sglang.yaml
`dsa_indexer`), and `pcc convert` writes them FP8 with weight_scale_inv; weights_proj stays BF16."""

from __future__ import annotations

import json

import pytest
import torch
from convert_helpers import make_checkpoint
from safetensors.torch import load_file

from pcc.cli import main
from pcc.importer import import_source
from pcc.lower import compile_file

SMALL = dict(hidden_size=256, intermediate_size=256, moe_intermediate_size=128, num_hidden_layers=2,
             num_attention_heads=2, num_key_value_heads=2, vocab_size=256, q_lora_rank=128, kv_lora_rank=128,
             qk_nope_head_dim=64, qk_rope_head_dim=64, v_head_dim=64, n_routed_experts=4, num_experts_per_tok=2,
             first_k_dense_replace=1, index_n_heads=2, index_head_dim=128, num_nextn_predict_layers=0)
# DeepSeek-V3.2's published quantization_config (GLM-5-FP8 writes the same block FP8 method).
FP8 = {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8", "scale_fmt": "ue8m0",
       "weight_block_size": [128, 128]}
MODELS = {"glm_moe_dsa": {}, "deepseek_v32": {"model_type": "deepseek_v32",
                                              "architectures": ["DeepseekV32ForCausalLM"]}}


@pytest.mark.parametrize("model_type", sorted(MODELS))
def test_fp8_checkpoint_quantizes_the_indexer_as_sglang(model_type, tmp_path):
    src = tmp_path / "src"
    tensors = make_checkpoint(src, "glm5", shards=1, **SMALL, **MODELS[model_type])
    published = tmp_path / "published"
    published.mkdir()
    config = json.loads((src / "config.json").read_text())
    (published / "config.json").write_text(json.dumps({**config, "quantization_config": FP8}))

    imp = import_source("checkpoint", str(published / "config.json"), str(src), "H100")
    contract = tmp_path / "imported.prec"
    contract.write_text(imp.text())
    compiled = compile_file(str(contract))
    assert compiled.ok, [d.render() for d in compiled.diagnostics if d.is_error]
    plan = compiled.plan
    scheme = {op.tensor: plan.scheme("rollout", i) for i, op in enumerate(plan.catalog.operators)}
    for layer in range(2):
        base = f"model.layers.{layer}.self_attn.indexer"
        assert not scheme[f"{base}.wq_b.weight"].wide and not scheme[f"{base}.wk.weight"].wide
        assert scheme[f"{base}.weights_proj.weight"].wide

    dst = tmp_path / "dst"
    assert main(["convert", str(contract), "--source", str(src), "-o", str(dst)]) == 0
    out = {}
    for f in dst.glob("*.safetensors"):
        out.update(load_file(str(f)))
    for layer in range(2):
        base = f"model.layers.{layer}.self_attn.indexer"
        for proj in ("wq_b", "wk"):
            w, s = out[f"{base}.{proj}.weight"], out[f"{base}.{proj}.weight_scale_inv"]
            assert w.dtype == torch.float8_e4m3fn and w.shape == tensors[f"{base}.{proj}.weight"].shape
            assert s.shape == (-(-w.shape[0] // 128), -(-w.shape[1] // 128))
        assert out[f"{base}.weights_proj.weight"].dtype == torch.bfloat16
        assert f"{base}.weights_proj.weight_scale_inv" not in out
    written = json.loads((dst / "config.json").read_text())["quantization_config"]
    assert not [m for m in written.get("modules_to_not_convert", []) if m.endswith((".wq_b", ".wk"))]
