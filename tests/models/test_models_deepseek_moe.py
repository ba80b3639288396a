"""DeepSeek-MoE v1 (deepseek-ai/deepseek-moe-16b-base, model_type "deepseek", DeepseekForCausalLM): standard
q/k/v/o attention (no MLA), 64 routed experts of width 1408, 2 shared experts fused into one MLP of 2 x 1408,
the first layer dense (first_k_dense_replace 1, moe_layer_freq 1), top-6 softmax routing.

Its config.json as published (the values below): found through the code search, not verbatim: the fields
are the ones a pinned DeepSeekMoE source audit checks against the hub's config.json (hidden 2048,
moe_intermediate_size 1408, 64 routed, 6 per token, 2 shared, first_k_dense_replace 1, softmax routing,
norm_topk_prob false), and the rest as DeepseekConfig's defaults for name "deepseek-moe-16b-base" in
vendorings of its configuration_deepseek.py (vocab 102400, intermediate 10944, 28 layers, 16 heads, 16 KV
heads, moe_layer_freq 1); zhongyi-zhou/DeepSeek-MoE playground.py loads deepseek-ai/deepseek-moe-16b-base
with trust_remote_code. Tensor names as its modeling_deepseek.py builds them: `mlp.experts.E.{gate,up,down}_proj`,
`mlp.shared_experts.{gate,up,down}_proj`, `mlp.gate.weight` (MoEGate, a bare [E, hidden] parameter).

The checkpoint is written here (transformers has no DeepseekForCausalLM of its own: it is remote code), small
widths, three layers, four experts; pcc reads it config-only, index-only and with shards.
"""

from __future__ import annotations

import json
import math
import shutil

import pytest

torch = pytest.importorskip("torch")
from safetensors.torch import save_file  # noqa: E402

from pcc.lower import compile_file  # noqa: E402
from pcc.models import catalog_from_checkpoint  # noqa: E402
from pcc.models.base import CatalogError  # noqa: E402
from model_helpers import partial_copies  # noqa: E402

DEEPSEEK_MOE_16B = {
    "architectures": ["DeepseekForCausalLM"], "model_type": "deepseek", "vocab_size": 102400, "hidden_size": 2048,
    "intermediate_size": 10944, "moe_intermediate_size": 1408, "num_hidden_layers": 28, "num_attention_heads": 16,
    "num_key_value_heads": 16, "n_shared_experts": 2, "n_routed_experts": 64, "num_experts_per_tok": 6,
    "moe_layer_freq": 1, "first_k_dense_replace": 1, "norm_topk_prob": False, "scoring_func": "softmax",
    "aux_loss_alpha": 0.001, "seq_aux": True, "hidden_act": "silu", "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-06, "rope_theta": 10000, "attention_bias": False, "tie_word_embeddings": False,
    "bos_token_id": 100000, "eos_token_id": 100001, "torch_dtype": "bfloat16",
}
SMALL = {"vocab_size": 256, "hidden_size": 128, "intermediate_size": 320, "moe_intermediate_size": 48,
         "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 4, "n_routed_experts": 4,
         "num_experts_per_tok": 2}
INDEX = "model.safetensors.index.json"


def _tensors(c: dict) -> dict[str, tuple[int, ...]]:
    """Every tensor of DeepseekForCausalLM's state dict (modeling_deepseek.py) and its shape."""
    h, head = c["hidden_size"], c["hidden_size"] // c["num_attention_heads"]
    kv = c["num_key_value_heads"] * head
    out = {"model.embed_tokens.weight": (c["vocab_size"], h)}
    for n in range(c["num_hidden_layers"]):
        p = f"model.layers.{n}."
        out.update({p + "input_layernorm.weight": (h,), p + "post_attention_layernorm.weight": (h,),
                    p + "self_attn.q_proj.weight": (h, h), p + "self_attn.k_proj.weight": (kv, h),
                    p + "self_attn.v_proj.weight": (kv, h), p + "self_attn.o_proj.weight": (h, h)})
        moe = n >= c["first_k_dense_replace"] and n % c["moe_layer_freq"] == 0
        if not moe:
            i = c["intermediate_size"]
            out.update({p + "mlp.gate_proj.weight": (i, h), p + "mlp.up_proj.weight": (i, h),
                        p + "mlp.down_proj.weight": (h, i)})
            continue
        i, s = c["moe_intermediate_size"], c["moe_intermediate_size"] * c["n_shared_experts"]
        out[p + "mlp.gate.weight"] = (c["n_routed_experts"], h)
        for e in range(c["n_routed_experts"]):
            q = f"{p}mlp.experts.{e}."
            out.update({q + "gate_proj.weight": (i, h), q + "up_proj.weight": (i, h), q + "down_proj.weight": (h, i)})
        out.update({p + "mlp.shared_experts.gate_proj.weight": (s, h), p + "mlp.shared_experts.up_proj.weight": (s, h),
                    p + "mlp.shared_experts.down_proj.weight": (h, s)})
    out["model.norm.weight"] = (h,)
    out["lm_head.weight"] = (c["vocab_size"], h)
    return out


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """(shards + index, config-only copy, index-only copy, {tensor: shape})."""
    config = {**DEEPSEEK_MOE_16B, **SMALL}
    shapes = _tensors(config)
    root = tmp_path_factory.mktemp("deepseek-moe")
    shards = root / "shards"
    shards.mkdir()
    names = list(shapes)
    weight_map = {}
    for j, part in enumerate((names[: len(names) // 2], names[len(names) // 2:])):
        file = f"model-{j + 1:05d}-of-00002.safetensors"
        save_file({n: torch.zeros(shapes[n], dtype=torch.bfloat16) for n in part}, str(shards / file),
                  metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(part, file))
    (shards / "config.json").write_text(json.dumps(config))
    (shards / INDEX).write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    copies = partial_copies(shards, root)
    return shards, copies, shapes


def _view(catalog) -> tuple:
    return [(op.tensor, op.family, op.shape, op.dtype) for op in catalog.operators], catalog.extra_tensors


def test_config_only_index_only_and_shards_agree(saved):
    shards, copies, shapes = saved
    full = catalog_from_checkpoint(shards)
    assert _view(catalog_from_checkpoint(copies["index-only"])) == _view(full)
    assert _view(catalog_from_checkpoint(copies["config-only"])) == _view(full)
    assert {op.tensor: tuple(op.shape) for op in full.operators if op.family != "kv_cache"} == shapes
    assert full.extra_tensors == ()
    assert full.num_experts == 4 and full.is_moe


def test_families(saved):
    shards, _, _ = saved
    cat = catalog_from_checkpoint(shards)
    family = {op.tensor: op.family for op in cat.operators}
    assert not [t for t, f in family.items() if f == "other"]
    p = "model.layers."
    assert family[p + "0.mlp.gate_proj.weight"] == "mlp.gate_up" and family[p + "0.mlp.down_proj.weight"] == "mlp.down"
    assert family[p + "1.mlp.gate.weight"] == "router"
    assert family[p + "2.mlp.experts.3.up_proj.weight"] == "experts.gate_up"
    assert family[p + "2.mlp.experts.3.down_proj.weight"] == "experts.down"
    assert family[p + "1.mlp.shared_experts.gate_proj.weight"] == "shared_experts.gate_up"
    assert family[p + "1.mlp.shared_experts.down_proj.weight"] == "shared_experts.down"
    assert family[p + "1.self_attn.k_proj.weight"] == "attn.kv" and family[p + "1.self_attn.q_proj.weight"] == "attn.q"
    counts = {f: sum(1 for v in family.values() if v == f) for f in set(family.values())}
    assert counts["experts.gate_up"] == 2 * 4 * 2 and counts["experts.down"] == 2 * 4
    assert counts["router"] == 2 and counts["mlp.gate_up"] == 2 and counts["shared_experts.down"] == 2


def test_published_size_config_only(tmp_path):
    """The published config alone: 28 layers, 27 MoE; the parameter count is DeepSeek's 16.4B
    (the DeepSeekMoE paper's 16.4B total)."""
    (tmp_path / "config.json").write_text(json.dumps(DEEPSEEK_MOE_16B))
    cat = catalog_from_checkpoint(tmp_path)
    params = sum(math.prod(op.shape) for op in cat.operators)
    assert 16.3e9 < params < 16.5e9, params
    assert sum(1 for op in cat.operators if op.family == "router") == 27
    assert sum(1 for op in cat.operators if op.family.startswith("experts.")) == 27 * 64 * 3


def test_shard_shape_disagreeing_with_config_is_refused(saved, tmp_path):
    """model_type "deepseek" is a known type: a shard whose expert width is not the config's is PCC204-class."""
    shards, _, _ = saved
    bad = tmp_path / "bad"
    shutil.copytree(shards, bad)
    config = json.loads((bad / "config.json").read_text())
    (bad / "config.json").write_text(json.dumps(dict(config, moe_intermediate_size=64)))
    with pytest.raises(CatalogError, match="experts"):
        catalog_from_checkpoint(bad)


@pytest.mark.parametrize("rule", ["experts : fp8_block", "linear : fp8_block"])
def test_one_line_contract_checks_and_compiles(saved, tmp_path, rule):
    shards, copies, _ = saved
    for directory in (shards, copies["config-only"]):
        path = tmp_path / "c.prec"
        path.write_text(f'contract c {{\n  model from "{directory}"\n  hardware H100\n  rollout sglang {{\n    {rule}\n'
                        "  }\n  routing replay rollout\n}\n", encoding="utf-8")
        compiled = compile_file(str(path))
        assert compiled.ok, [d.render(compiled.sources) for d in compiled.diagnostics if d.is_error]
