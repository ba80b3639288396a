"""`pcc convert` of a ModelOpt MIXED_PRECISION rollout (pcc.plan.mixed): each tensor in its own module's format.

Source: a random-weight Qwen3-MoE written by transformers' own `save_pretrained`. References are independent of
pcc: FP8 E4M3 and E2M1 by ml_dtypes, NVFP4 by its definition (TransformerEngine's two-level scaling, as in
test_convert_nvfp4_fused.py), BF16 by the source bytes. The config each module is described by is the one pcc
writes beside it: every `quantized_layers` entry's tensors are the ones its `quant_algo` needs in vLLM
(KFp8StaticTensor: weight, weight_scale, input_scale; KNvfp4Static: weight, weight_scale, weight_scale_2, and
for W4A4 NVFP4 an input_scale), and nothing it does not list is quantized."""

from __future__ import annotations

import json

import ml_dtypes
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
from convert_helpers import e2m1, load_tensors, nvfp4_reference, qwen3_5_moe_checkpoint, unpack_fp4  # noqa: E402

from pcc.cli import main  # noqa: E402

CONTRACT = """contract mixed-tiny {{
  model from "{src}"
  hardware B200
  scheme nvfp4_w4a16 = nvfp4 weights group 16
  rollout vllm {{
    attn : fp8_tensor
    experts : nvfp4_w4a16
    lm_head : nvfp4
    keep bf16 : experts[0]
  }}
  routing replay rollout
}}
"""
NEEDS = {"FP8": {"weight", "weight_scale", "input_scale"},
         "W4A16_NVFP4": {"weight", "weight_scale", "weight_scale_2"},
         "NVFP4": {"weight", "weight_scale", "weight_scale_2", "input_scale"}}


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("mixed")
    torch.manual_seed(0)
    cfg = transformers.Qwen3MoeConfig(hidden_size=128, intermediate_size=256, moe_intermediate_size=64,
                                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                                      vocab_size=256, num_experts=4, num_experts_per_tok=2, decoder_sparse_step=1,
                                      mlp_only_layers=[], tie_word_embeddings=False)
    transformers.Qwen3MoeForCausalLM(cfg).to(torch.bfloat16).save_pretrained(str(tmp / "src"))
    contract = tmp / "c.prec"
    contract.write_text(CONTRACT.format(src=tmp / "src"), encoding="utf-8")
    assert main(["convert", str(contract), "--from", str(tmp / "src"), "--to", str(tmp / "out")]) == 0
    return tmp, load_tensors(tmp / "src"), load_tensors(tmp / "out")


def _np(t) -> np.ndarray:
    return t.float().numpy()


def test_every_module_has_the_tensors_its_quant_algo_needs(converted):
    tmp, src, out = converted
    qc = json.loads((tmp / "out" / "config.json").read_text())["quantization_config"]
    nested = json.loads((tmp / "out" / "hf_quant_config.json").read_text())["quantization"]
    assert qc["quant_algo"] == nested["quant_algo"] == "MIXED_PRECISION"
    assert qc["quantized_layers"] == nested["quantized_layers"] and qc["ignore"] == ["model.layers.0.mlp.experts"]
    covered = set()
    for module, entry in qc["quantized_layers"].items():
        if module.endswith(".experts"):
            depth = module.count(".") + 3  # module.J.proj
            members = sorted({".".join(n.split(".")[:depth]) for n in out if n.startswith(module + ".")})
            assert len(members) == 4 * 3, module
        else:
            members = [module]
        for m in members:
            suffixes = {n[len(m) + 1:] for n in out if n.startswith(m + ".") and "." not in n[len(m) + 1:]}
            assert suffixes == NEEDS[entry["quant_algo"]], (m, suffixes)
            covered.add(m + ".weight")
    # everything else is the source's own BF16 bytes, layer 0's routed experts included
    for name, x in src.items():
        if name not in covered:
            assert out[name].dtype == torch.bfloat16 and torch.equal(out[name], x), name
    assert "model.layers.0.mlp.experts.0.gate_proj.weight" not in covered
    assert main(["verify-checkpoint", str(tmp / "c.prec"), str(tmp / "out"), "--source", str(tmp / "src"),
                 "--full"]) == 0


def test_fp8_members_are_per_tensor_e4m3_with_a_static_input_scale(converted):
    _, src, out = converted
    for layer in (0, 1):
        for proj in ("q_proj", "k_proj", "v_proj", "o_proj"):
            p = f"model.layers.{layer}.self_attn.{proj}"
            x = _np(src[p + ".weight"])
            scale = out[p + ".weight_scale"]
            assert scale.dtype == torch.float32 and scale.shape == ()
            s = np.float32(scale)
            assert abs(s - np.abs(x).max() / np.float32(448)) <= s * 2**-22  # amax / 448, E4M3's top
            codes = out[p + ".weight"].view(torch.uint8).numpy().view(ml_dtypes.float8_e4m3fn)
            value = codes.astype(np.float32) * s
            # within E4M3's rounding of the source: half a step (2^-4 relative), or 2^-10 scale units below 2^-6
            bound = np.maximum(np.abs(x) * 2**-4, s * 2**-10) * (1 + 2**-20)
            assert (np.abs(value - x) <= bound).all(), p
            ref = (x / s).astype(ml_dtypes.float8_e4m3fn).astype(np.float32)
            assert np.mean(ref == codes.astype(np.float32)) > 0.999, p  # ml_dtypes' rounding, ties aside
            inp = out[p + ".input_scale"]
            assert inp.dtype == torch.float32 and inp.shape == () and 0 < float(inp) != 1.0  # calibrated


@pytest.mark.parametrize("name", ["model.layers.1.mlp.experts.2.gate_proj", "model.layers.1.mlp.experts.2.down_proj",
                                  "lm_head"])
def test_nvfp4_members_are_nvfp4_by_definition(converted, name):
    """Routed experts W4A16 (a gate/up pair shares one global scale, as vLLM's MoE loader needs); lm_head W4A4."""
    _, src, out = converted
    x = _np(src[name + ".weight"])
    group = [name]
    if name.endswith(("gate_proj", "up_proj")):
        stem = name.rsplit(".", 1)[0]
        group = [stem + ".gate_proj", stem + ".up_proj"]
    amax = np.float32(max(np.abs(_np(src[m + ".weight"])).max() for m in group))
    codes, s_b, ws2 = nvfp4_reference(x, amax)
    assert float(out[name + ".weight_scale_2"]) == float(ws2)
    assert np.array_equal(unpack_fp4(out[name + ".weight"].numpy(), x.shape[1]), codes)
    assert np.array_equal(out[name + ".weight_scale"].view(torch.uint8).numpy(), s_b)
    d = np.repeat(s_b.view(ml_dtypes.float8_e4m3fn).astype(np.float32) * ws2, 16, axis=1)
    err = np.abs(e2m1(codes) * d - x)
    bound = (np.maximum(0.25 * d, np.abs(x) / 4) + np.maximum(np.abs(x) - 6 * d, 0)) * (1 + 2**-20)
    assert (err <= bound).all()
    assert (name + ".input_scale" in out) == (name == "lm_head")


# -- Qwen3.6's architecture as NVIDIA's MIXED_PRECISION export quantizes it -------------------------------------

QWEN3_5_CONTRACT = """contract mixed-qwen3-5 {{
  model from "{src}"
  hardware B200
  scheme nvfp4_w4a16 = nvfp4 weights group 16
  rollout vllm {{
    linear, lm_head : nvfp4_w4a16
    attn : fp8_tensor
  }}
  routing replay rollout
}}
"""


@torch.no_grad()
def test_qwen3_5_moe_converts_as_nvidias_mixed_export(tmp_path, capsys):
    """A random-weight Qwen3.5-MoE (transformers' Qwen3_5MoeForConditionalGeneration, saved by save_pretrained) under
    the rules `pcc import checkpoint` writes for NVIDIA's Qwen3.6 export: FP8 attention and gated-delta-net projections
    (in_proj_qkv, in_proj_z, out_proj), W4A16 NVFP4 routed and shared experts and lm_head; in_proj_a/b, conv1d,
    routers, norms and embeddings the source's BF16. No calibration runs for this architecture (pcc.runtime builds no
    qwen3_5_moe), so the FP8 input scales are 1.0, counted and warned."""
    qwen3_5_moe_checkpoint(tmp_path / "src")
    contract = tmp_path / "c.prec"
    contract.write_text(QWEN3_5_CONTRACT.format(src=tmp_path / "src"), encoding="utf-8")
    assert main(["convert", str(contract), "--from", str(tmp_path / "src"), "--to", str(tmp_path / "out")]) == 0
    assert "WARNING" in capsys.readouterr().err
    src, out = load_tensors(tmp_path / "src"), load_tensors(tmp_path / "out")
    qc = json.loads((tmp_path / "out" / "config.json").read_text())["quantization_config"]
    lm = "model.language_model.layers."
    assert {k.removeprefix(lm + "0."): v["quant_algo"] for k, v in qc["quantized_layers"].items()
            if k.startswith(lm + "0.")} == {
        "linear_attn.in_proj_qkv": "FP8", "linear_attn.in_proj_z": "FP8", "linear_attn.out_proj": "FP8",
        "mlp.experts": "W4A16_NVFP4", "mlp.shared_expert.gate_proj": "W4A16_NVFP4",
        "mlp.shared_expert.up_proj": "W4A16_NVFP4", "mlp.shared_expert.down_proj": "W4A16_NVFP4"}
    assert qc["quantized_layers"][lm + "1.self_attn.q_proj"] == {"quant_algo": "FP8"}
    for name in (lm + "0.linear_attn.in_proj_qkv", lm + "1.self_attn.o_proj"):
        x, s = _np(src[name + ".weight"]), np.float32(out[name + ".weight_scale"])
        value = out[name + ".weight"].view(torch.uint8).numpy().view(ml_dtypes.float8_e4m3fn).astype(np.float32) * s
        assert (np.abs(value - x) <= np.maximum(np.abs(x) * 2**-4, s * 2**-10) * (1 + 2**-20)).all(), name
        assert float(out[name + ".input_scale"]) == 1.0
    name = lm + "1.mlp.shared_expert.down_proj"
    x = _np(src[name + ".weight"])
    codes, s_b, ws2 = nvfp4_reference(x, np.float32(np.abs(x).max()))
    assert np.array_equal(unpack_fp4(out[name + ".weight"].numpy(), x.shape[1]), codes)
    assert name + ".input_scale" not in out
    for wide in (lm + "0.linear_attn.in_proj_a.weight", lm + "0.linear_attn.conv1d.weight", lm + "1.mlp.gate.weight",
                 "model.language_model.embed_tokens.weight"):
        assert torch.equal(out[wide], src[wide]), wide
    assert main(["verify-checkpoint", str(contract), str(tmp_path / "out"), "--source", str(tmp_path / "src"),
                 "--full"]) == 0
