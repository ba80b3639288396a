"""Qwen3.5/3.6 MoE (Gated DeltaNet + gated full attention) and MiniMax-M2 as transformers writes them: a shrunk
random-weight model of each built-in catalog's config (pcc/models/configs/qwen3_5_35b_a3b.json, minimax_m2.json),
saved with `save_pretrained` (BF16, a few shards), is `model from DIR` of a one-line contract that checks, explains,
compiles and converts. `linear : fp8_block` quantizes Qwen3.5's attn.linear projections (in_proj_qkv, in_proj_z,
out_proj) and keeps in_proj_b, in_proj_a and conv1d wide, listed in modules_to_not_convert, so SGLang's
is_layer_skipped (compiled from the installed source) builds its merged in_proj_ba wide and in_proj_qkvz quantized,
as targets/sglang.yaml `gated_deltanet` says; the vision tower is copied as it is."""

from __future__ import annotations

import ast
import importlib.util
import json
import types
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
from safetensors import safe_open  # noqa: E402

from pcc.cli import main  # noqa: E402
from pcc.resources import target_table  # noqa: E402

CONFIGS = Path(__file__).resolve().parents[2] / "pcc" / "models" / "configs"
# Widths the 128x128 blocks divide; two layers (Qwen3.5: one Gated DeltaNet, one full attention), four experts.
SMALL = dict(hidden_size=256, num_attention_heads=2, num_key_value_heads=1, head_dim=128, vocab_size=256,
             num_hidden_layers=2, pad_token_id=0, bos_token_id=1, eos_token_id=2)
QWEN35 = dict(SMALL, moe_intermediate_size=128, shared_expert_intermediate_size=128, num_experts=4,
              num_experts_per_tok=2, linear_num_key_heads=2, linear_num_value_heads=2, linear_key_head_dim=64,
              linear_value_head_dim=64, layer_types=["linear_attention", "full_attention"])
VISION = {"depth": 1, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2, "out_hidden_size": 256,
          "patch_size": 4, "num_position_embeddings": 16}
MINIMAX = dict(SMALL, intermediate_size=128, num_local_experts=4, num_experts_per_tok=2)
LM = {"qwen3_5_35b_a3b": "model.language_model.layers.", "minimax_m2": "model.layers."}
# The modules `linear` selects in these models (Mixtral's w1/w3/w2 for MiniMax-M2's experts).
LINEAR = ("q_proj", "k_proj", "v_proj", "o_proj", "in_proj_qkv", "in_proj_z", "out_proj", "gate_proj", "up_proj",
          "down_proj", "w1", "w2", "w3")


def _save(name: str, root: Path) -> Path:
    config = json.loads((CONFIGS / f"{name}.json").read_text(encoding="utf-8"))
    config.pop("_source")
    torch.manual_seed(0)
    if name == "qwen3_5_35b_a3b":
        text = {k: v for k, v in {**config["text_config"], **QWEN35}.items() if k != "model_type"}
        vision = {**{k: v for k, v in config["vision_config"].items() if k != "model_type"}, **VISION}
        top = {k: v for k, v in config.items() if k not in ("model_type", "text_config", "vision_config")}
        hf = transformers.Qwen3_5MoeConfig(**top, text_config=text, vision_config=vision)
        model = transformers.AutoModelForImageTextToText.from_config(hf)
    else:
        hf = transformers.MiniMaxM2Config(**{k: v for k, v in {**config, **MINIMAX}.items() if k != "model_type"})
        model = transformers.AutoModelForCausalLM.from_config(hf)
    src = root / "src"
    model.to(torch.bfloat16).save_pretrained(str(src), max_shard_size="2MB")
    return src


def _tensors(directory: Path) -> dict:
    out = {}
    for f in sorted(directory.glob("*.safetensors")):
        with safe_open(str(f), framework="pt") as h:
            out.update({n: h.get_tensor(n) for n in h.keys()})
    return out


def _sglang_is_layer_skipped():
    """SGLang's `is_layer_skipped` and `_module_path_match` (layers/quantization/utils.py), compiled from the
    installed source: the package imports GPU kernels."""
    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(spec.submodule_search_locations[0]) / "srt/layers/quantization/utils.py"
    wanted = {"_module_path_match", "_FALLBACK_FUSED_SHARDS", "is_layer_skipped"}
    nodes = [n for n in ast.parse(path.read_text()).body
             if getattr(n, "name", None) in wanted
             or any(getattr(t, "id", None) in wanted for t in [*getattr(n, "targets", []), getattr(n, "target", None)])]
    ns = {"Mapping": dict, "List": list, "MappingProxyType": types.MappingProxyType}
    exec(compile(ast.fix_missing_locations(ast.Module(nodes, [])), str(path), "exec"), ns)
    return ns["is_layer_skipped"]


def _dequantized(w: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    n, k = w.shape
    return w.float() * s.repeat_interleave(128, 0)[:n].repeat_interleave(128, 1)[:, :k]


@pytest.mark.parametrize("name", ["qwen3_5_35b_a3b", "minimax_m2"])
def test_check_explain_compile_convert(name, tmp_path, capsys):
    src = _save(name, tmp_path)
    contract = tmp_path / "c.prec"
    contract.write_text(f'contract c {{\n  model from "{src}"\n  hardware H100\n  rollout sglang {{\n'
                        "    linear : fp8_block\n  }\n  routing replay rollout\n}\n", encoding="utf-8")
    for command in (["check"], ["explain"], ["compile", "-o", str(tmp_path / "bundle")]):
        assert main([command[0], str(contract), *command[1:]]) == 0, capsys.readouterr()
    dst = tmp_path / "rollout"
    assert main(["convert", str(contract), "--source", str(src), "-o", str(dst), "--json"]) == 0, capsys.readouterr()
    capsys.readouterr()

    source, written = _tensors(src), _tensors(dst)
    skip = json.loads((dst / "config.json").read_text())["quantization_config"]["modules_to_not_convert"]
    layer = LM[name]
    quantized = [n for n in source if n.startswith(layer) and n.endswith(tuple(f".{m}.weight" for m in LINEAR))]
    assert quantized
    for n in quantized:  # every linear projection FP8, within its rounding of the source
        w, s = written[n], written[n.removesuffix("weight") + "weight_scale_inv"]
        assert w.dtype == torch.float8_e4m3fn and w.shape == source[n].shape, n
        ref = source[n].float()
        assert (_dequantized(w, s) - ref).abs().max() <= 0.07 * ref.abs().max(), n
    wide = [n for n in source if n not in quantized]
    for n in wide:  # everything else as the source stores it: norms, routers, embeddings, the vision tower...
        assert written[n].dtype == source[n].dtype and torch.equal(written[n], source[n]), n
        assert n.removesuffix("weight") + "weight_scale_inv" not in written
    assert sorted(written) == sorted([*source, *(n.removesuffix("weight") + "weight_scale_inv" for n in quantized)])

    if name == "qwen3_5_35b_a3b":
        gdn = f"{layer}0.linear_attn."
        assert {gdn + p for p in ("in_proj_qkv.weight", "in_proj_z.weight", "out_proj.weight")} <= set(quantized)
        assert {gdn + "in_proj_b", gdn + "in_proj_a", gdn + "conv1d"} <= set(skip)
        assert not [m for m in skip if m.endswith(("in_proj_qkv", "in_proj_z", "out_proj"))]
        assert any(n.startswith("model.visual.") for n in wide)
        assert written[gdn + "A_log"].dtype == source[gdn + "A_log"].dtype
        skipped = _sglang_is_layer_skipped()
        if skipped is not None:  # SGLang builds the merged layers as the table says, from this list
            merged = target_table("sglang")["gated_deltanet"]["merged"]
            assert skipped(gdn + "in_proj_ba", skip, merged) is True
            assert skipped(gdn + "in_proj_qkvz", skip, merged) is False
            assert skipped(gdn + "out_proj", skip, merged) is False
            assert skipped(f"{layer}0.mlp.experts", skip, merged) is False
    else:
        assert f"{layer}0.block_sparse_moe.gate" in skip
        bias = f"{layer}0.block_sparse_moe.e_score_correction_bias"
        assert torch.equal(written[bias], source[bias])
