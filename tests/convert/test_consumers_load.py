"""`pcc convert` outputs read by the consumers' own loading code on a CPU, checked against the BF16 source.

Small random models from real configs (pcc/models/configs: Qwen/Qwen3-30B-A3B and meta-llama/Meta-Llama-3-8B,
shrunk), no hub access. Each rollout checkpoint is read the way a consumer reads it on a CPU:
- block FP8: transformers' finegrained-FP8 loader dequantizes on a CPU (quantizer_finegrained_fp8 sets
  `dequantize` without a GPU) with `Fp8Dequantize`, for the modules `should_convert_module` does not skip
  under the checkpoint's `modules_to_not_convert`. Its quantizer needs `accelerate`, which the test extra
  lacks, so the test applies those two functions of transformers' loader itself, then `from_pretrained`.
- INT4 pack-quantized: transformers' `from_pretrained` with `CompressedTensorsConfig(dequantize=True)`, i.e.
  compressed-tensors' own decompression.
- W8A8 INT8 int-quantized: the same, and compressed-tensors' own `quantize` at the stored scales gives the
  stored codes.
- MXFP4 (gpt-oss, openai/gpt-oss-20b config.json shrunk): transformers' gpt-oss dequantization
  `convert_moe_packed_tensors` (what its Mxfp4 quantizer runs on a CPU; that quantizer also needs
  `accelerate`), into `GptOssForCausalLM`'s fused `experts.gate_up_proj` [E, H, 2I] (gate even, up odd columns).
Each dequantized weight is within the scheme's rounding bound of the BF16 source (computed here from the
source's own block maxima), and the logits of the loaded model are close to the BF16 model's.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch
from convert_helpers import make_checkpoint
from safetensors import safe_open
from safetensors.torch import save_file

from pcc.cli import main

transformers = pytest.importorskip("transformers")
from transformers.integrations.finegrained_fp8 import Fp8Dequantize  # noqa: E402
from transformers.integrations.mxfp4 import convert_moe_packed_tensors  # noqa: E402
from transformers.quantizers.quantizers_utils import should_convert_module  # noqa: E402

QWEN3_MOE = dict(hidden_size=256, intermediate_size=512, moe_intermediate_size=128, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, head_dim=64, vocab_size=512, num_experts=4,
                 num_experts_per_tok=2, bos_token_id=1, eos_token_id=2)
LLAMA3 = dict(hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, head_dim=64, vocab_size=512, bos_token_id=1, eos_token_id=2)


def _convert(tmp_path, src, rules: str, capsys, extra: str = "", hw: str = "H100"):
    contract = tmp_path / "c.prec"
    contract.write_text(f'contract consumer {{\n  model from "{src}"\n  hardware {hw}\n  rollout sglang {{\n'
                        f"    {rules}\n  }}\n  trainer megatron {{\n    gemm : bf16\n  }}\n{extra}}}\n",
                        encoding="utf-8")
    dst = tmp_path / "rollout"
    code = main(["convert", str(contract), "--source", str(src), "-o", str(dst), "--json"])
    out = capsys.readouterr()
    assert code == 0, out.out + out.err
    return dst


def _tensors(directory) -> dict[str, torch.Tensor]:
    out = {}
    for f in sorted(directory.glob("*.safetensors")):
        with safe_open(str(f), framework="pt") as h:
            out.update({n: h.get_tensor(n) for n in h.keys()})
    return out


def _logits(directory, **kwargs) -> torch.Tensor:
    model = transformers.AutoModelForCausalLM.from_pretrained(str(directory), dtype=torch.float32, **kwargs).eval()
    ids = torch.randint(0, 512, (2, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        return model(ids).logits


def _blocks(x: torch.Tensor, r: int, c: int) -> torch.Tensor:
    """Each element's block maximum |x| over its r x c block (edge blocks partial)."""
    n, k = x.shape
    nb, kb = -(-n // r), -(-k // c)
    padded = torch.zeros(nb * r, kb * c)
    padded[:n, :k] = x.abs()
    amax = padded.reshape(nb, r, kb, c).amax(dim=(1, 3))
    return amax.repeat_interleave(r, 0).repeat_interleave(c, 1)[:n, :k]


def test_block_fp8_output_through_transformers_fp8_dequantize(tmp_path, capsys):
    """Qwen3-30B-A3B (shrunk), `linear : fp8_block`: every linear pcc quantizes is one transformers converts (the
    router, embeddings and lm_head it skips by the written list), its dequantized value is within e4m3's rounding
    of the source (half a unit in the last place: 2^-4 relative, 2^-10 of the block scale amax/448 below the
    normal range), and the model's logits stay close."""
    src = tmp_path / "Qwen3-30B-A3B"
    source = {n: t.float() for n, t in make_checkpoint(src, "qwen3_30b_a3b", shards=1, **QWEN3_MOE).items()}
    dst = _convert(tmp_path, src, "linear : fp8_block", capsys, "  routing replay rollout\n")
    config = json.loads((dst / "config.json").read_text())
    qc = config.pop("quantization_config")
    skip = qc["modules_to_not_convert"]
    stored = _tensors(dst)
    dequantized, converted = {}, 0
    for name, t in stored.items():
        if name.endswith(".weight_scale_inv"):
            continue
        module = name[: -len(".weight")]
        scale = stored.get(name + "_scale_inv")
        assert (scale is not None) == (t.ndim == 2 and should_convert_module(module, skip)), name
        if scale is None:
            dequantized[name] = t
            continue
        assert t.dtype == torch.float8_e4m3fn and scale.dtype == torch.float32
        value = Fp8Dequantize(None).convert({"weight": [t], "weight_scale_inv": [scale]}, full_layer_name=name,
                                            output_dtype=torch.float32)[name].float()
        x = source[name]
        bound = torch.maximum(x.abs() * 2.0 ** -4, _blocks(x, 128, 128) / 448 * 2.0 ** -10) * 1.001
        assert bool(((value - x).abs() <= bound).all()), name
        dequantized[name] = value.to(torch.bfloat16)
        converted += 1
    assert converted == 2 * (4 + 4 * 3)  # q, k, v, o and 4 experts x 3 per layer
    wide = tmp_path / "dequantized"
    wide.mkdir()
    save_file(dequantized, str(wide / "model.safetensors"), metadata={"format": "pt"})
    (wide / "config.json").write_text(json.dumps(config))
    ref, got = _logits(src), _logits(wide)
    # measured 0.051 of the largest logit; e4m3 alone (no scale) or a transposed scale grid fails the weights above
    assert (got - ref).abs().max() <= 0.1 * ref.abs().max()


def test_int4_output_through_compressed_tensors_decompression(tmp_path, capsys):
    """Meta-Llama-3-8B (shrunk), `linear : int4_g32`: transformers + compressed-tensors decompress the
    pack-quantized checkpoint on a CPU; each weight is within half a step (group amax / 7 / 2) of the source."""
    src = tmp_path / "Llama-3-8B"
    source = {n: t.float() for n, t in make_checkpoint(src, "llama3_8b", shards=1, **LLAMA3).items()}
    dst = _convert(tmp_path, src, "linear : int4_g32", capsys)
    model = transformers.AutoModelForCausalLM.from_pretrained(
        str(dst), dtype=torch.float32, quantization_config=transformers.CompressedTensorsConfig(dequantize=True))
    loaded = model.state_dict()
    quantized = 0
    for name, x in source.items():
        got = loaded[name].float()
        if "_proj" not in name:
            assert torch.equal(got, x), name  # embeddings, norms, lm_head: the BF16 source as it was
            continue
        bound = _blocks(x, 1, 32) / 14 * 1.01 + 1e-6
        assert bool(((got - x).abs() <= bound).all()), name
        assert not torch.equal(got, x), name  # it was quantized, not carried wide
        quantized += 1
    assert quantized == 2 * 7
    ref = _logits(src)
    got = _logits(dst, quantization_config=transformers.CompressedTensorsConfig(dequantize=True))
    # measured 0.18 of the largest logit (random weights, 4 bits)
    assert (got - ref).abs().max() <= 0.3 * ref.abs().max()


def _gpt_oss_source(root):
    """gpt-oss as OpenAI publishes it (tests/models: fused MXFP4 experts, biases, sinks), random codes and E8M0
    exponents 2^-9..2^-4."""
    path = Path(__file__).parents[1] / "models" / "test_models_published.py"
    spec = importlib.util.spec_from_file_location("published", path)
    published = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(published)
    TINY_GPT_OSS, gpt_oss_tensors = published.TINY_GPT_OSS, published.gpt_oss_tensors
    gen = torch.Generator().manual_seed(0)
    tensors = {}
    for name, t in gpt_oss_tensors(TINY_GPT_OSS).items():
        if name.endswith("_blocks"):
            tensors[name] = torch.randint(0, 256, t.shape, dtype=torch.uint8, generator=gen)
        elif name.endswith("_scales"):
            tensors[name] = torch.randint(118, 124, t.shape, dtype=torch.uint8, generator=gen)
        else:
            tensors[name] = (torch.randn(t.shape, generator=gen) * 0.05).to(t.dtype)
    return published._write(root, dict(TINY_GPT_OSS, pad_token_id=0, bos_token_id=1, eos_token_id=1), tensors,
                            shards=1)


def _experts(tensors: dict, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
    """transformers' dequantization of one layer's fused experts: (gate_up [E, H, 2I], down [E, I, H])."""
    p = f"model.layers.{layer}.mlp.experts."
    return tuple(convert_moe_packed_tensors(tensors[p + f + "_blocks"], tensors[p + f + "_scales"], dtype=torch.float32)
                 for f in ("gate_up_proj", "down_proj"))


def _gpt_oss_logits(config: dict, tensors: dict, experts: dict) -> torch.Tensor:
    config = {k: v for k, v in config.items() if k != "quantization_config"}
    model = transformers.GptOssForCausalLM(transformers.GptOssConfig(**config)).eval()
    state = {n: t for n, t in tensors.items() if not n.endswith(("_blocks", "_scales"))}
    for layer, (gate_up, down) in experts.items():
        state[f"model.layers.{layer}.mlp.experts.gate_up_proj"] = gate_up
        state[f"model.layers.{layer}.mlp.experts.down_proj"] = down
    model.load_state_dict({n: t.float() for n, t in state.items()}, strict=True)
    ids = torch.randint(0, config["vocab_size"], (2, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        return model(ids).logits


def test_mxfp4_output_through_transformers_gpt_oss_dequantization(tmp_path, capsys):
    """pcc reads OpenAI's layout as transformers does (its BF16 experts equal transformers' dequantization bit for
    bit), and the MXFP4 checkpoint pcc writes from a BF16 source dequantizes, in transformers, to within MXFP4's
    rounding of that source: each value at most half a step of the e2m1 grid x its block's E8M0 scale (or its
    overshoot past 6 x scale), with scales that use the grid (block amax >= 3 x scale)."""
    src = _gpt_oss_source(tmp_path / "gpt-oss")
    config = json.loads((src / "config.json").read_text())
    published = _tensors(src)
    (tmp_path / "w").mkdir()
    wide = _tensors(_convert(tmp_path / "w", src, "all : bf16", capsys, "  routing replay rollout\n", "B200"))
    layers = range(config["num_hidden_layers"])
    for layer in layers:
        gate_up, down = _experts(published, layer)
        p = f"model.layers.{layer}.mlp.experts."  # kept wide: transformers' fused BF16 layout
        assert not [n for n in wide if n.startswith(p) and n.endswith("_proj.weight")]
        assert torch.equal(wide[p + "gate_up_proj"].float(), gate_up) and torch.equal(wide[p + "down_proj"].float(), down)
    # A BF16 source (transformers' fused layout) that is not MXFP4-exact: pcc's wide values plus noise.
    gen = torch.Generator().manual_seed(1)
    noisy = {n: (t.float() + 0.01 * torch.randn(t.shape, generator=gen)).to(torch.bfloat16)
             if ".experts." in n and n.endswith(("gate_up_proj", "down_proj")) else t for n, t in wide.items()}
    bf16 = tmp_path / "gpt-oss-bf16"
    bf16.mkdir()
    save_file({n: t.contiguous() for n, t in noisy.items()}, str(bf16 / "model.safetensors"), metadata={"format": "pt"})
    (bf16 / "config.json").write_text(json.dumps({k: v for k, v in config.items() if k != "quantization_config"}))
    (tmp_path / "q").mkdir()
    dst = _convert(tmp_path / "q", bf16, "experts : mxfp4", capsys, "  routing replay rollout\n", "B200")
    written = _tensors(dst)
    assert json.loads((dst / "config.json").read_text())["quantization_config"]["quant_method"] == "mxfp4"
    experts = {}
    for layer in layers:
        gate_up, down = experts[layer] = _experts(written, layer)
        p = f"model.layers.{layer}.mlp.experts."
        scales = {f: torch.exp2(written[p + f + "_scales"].float() - 127)
                  for f in ("gate_up_proj", "down_proj")}
        for j in range(config["num_local_experts"]):
            q = f"{p}{j}."
            src_gate_up, src_down = noisy[p + "gate_up_proj"][j], noisy[p + "down_proj"][j]
            pairs = ((src_gate_up[:, 0::2].T, gate_up[j][:, 0::2].T, scales["gate_up_proj"][j, 0::2]),
                     (src_gate_up[:, 1::2].T, gate_up[j][:, 1::2].T, scales["gate_up_proj"][j, 1::2]),
                     (src_down.T, down[j].T, scales["down_proj"][j]))
            for x, got, scale in pairs:
                x, s = x.float(), scale.repeat_interleave(32, dim=-1)
                v = x.abs() / s
                step = torch.where(v < 2, 0.25, torch.where(v < 4, 0.5, 1.0))
                assert bool(((got - x).abs() <= torch.maximum(step, v - 6) * s).all()), q
                assert bool((_blocks(x, 1, 32) >= 3 * s).all()), q
    ref = _gpt_oss_logits(config, published, {layer: _experts(published, layer) for layer in layers})
    got = _gpt_oss_logits(config, written, experts)
    # measured 0.022 of the largest logit (the noise added to the source is about one MXFP4 step)
    assert (got - ref).abs().max() <= 0.1 * ref.abs().max()


def test_w8a8_int8_output_through_compressed_tensors(tmp_path, capsys):
    """Meta-Llama-3-8B (shrunk), `linear : w8a8_int8`: the config is compressed-tensors' own W8A8 preset, its
    `quantize` gives pcc's codes at pcc's scales (amax / 127 per output channel), and transformers +
    compressed-tensors decompress every weight to within half a step of the source."""
    from compressed_tensors.quantization import QuantizationConfig, preset_name_to_scheme
    from compressed_tensors.quantization.lifecycle.forward import quantize

    src = tmp_path / "Llama-3-8B"
    source = {n: t.float() for n, t in make_checkpoint(src, "llama3_8b", shards=1, **LLAMA3).items()}
    dst = _convert(tmp_path, src, "linear : w8a8_int8", capsys)
    qc = json.loads((dst / "config.json").read_text())["quantization_config"]
    preset = preset_name_to_scheme("W8A8", ["Linear"])
    assert qc == QuantizationConfig(config_groups={"group_0": preset}, format="int-quantized",
                                    quantization_status="compressed", ignore=qc["ignore"]).model_dump()
    stored = _tensors(dst)
    model = transformers.AutoModelForCausalLM.from_pretrained(
        str(dst), dtype=torch.float32, quantization_config=transformers.CompressedTensorsConfig(dequantize=True))
    loaded = model.state_dict()
    quantized = 0
    for name, x in source.items():
        got = loaded[name].float()
        if "_proj" not in name:
            assert torch.equal(got, x), name
            continue
        codes, scale = stored[name], stored[name + "_scale"]
        assert codes.dtype == torch.int8 and scale.shape == (x.shape[0], 1)
        assert torch.equal(scale, x.abs().amax(1, keepdim=True) / 127), name
        ref = quantize(x, scale, torch.zeros_like(scale, dtype=torch.int8), preset.weights, dtype=torch.int8)
        assert torch.equal(codes, ref), name
        assert bool(((got - x).abs() <= scale * 0.5 * (1 + 2**-20) + x.abs() * 2**-22).all()), name
        quantized += 1
    assert quantized == 2 * 7
