"""`pcc convert` outputs read by the consumers' own loading code on a CPU, checked against the BF16 source.

Small random models from real configs (pcc/models/configs: Qwen/Qwen3-30B-A3B and meta-llama/Meta-Llama-3-8B,
shrunk), no hub access. Each rollout checkpoint is read the way a consumer reads it on a CPU:
- block FP8: transformers' finegrained-FP8 loader dequantizes on a CPU (quantizer_finegrained_fp8 sets
  `dequantize` without a GPU) with `Fp8Dequantize`, for the modules `should_convert_module` does not skip
  under the checkpoint's `modules_to_not_convert`. Its quantizer needs `accelerate`, which the test extra
  lacks, so the test applies those two functions of transformers' loader itself, then `from_pretrained`.
- INT4 pack-quantized: transformers' `from_pretrained` with `CompressedTensorsConfig(dequantize=True)`, i.e.
  compressed-tensors' own decompression.
Each dequantized weight is within the scheme's rounding bound of the BF16 source (computed here from the
source's own block maxima), and the logits of the loaded model are close to the BF16 model's.
"""

from __future__ import annotations

import json

import pytest
import torch
from convert_helpers import make_checkpoint
from safetensors import safe_open
from safetensors.torch import save_file

from pcc.cli import main

transformers = pytest.importorskip("transformers")
from transformers.integrations.finegrained_fp8 import Fp8Dequantize  # noqa: E402
from transformers.quantizers.quantizers_utils import should_convert_module  # noqa: E402

QWEN3_MOE = dict(hidden_size=256, intermediate_size=512, moe_intermediate_size=128, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, head_dim=64, vocab_size=512, num_experts=4,
                 num_experts_per_tok=2, bos_token_id=1, eos_token_id=2)
LLAMA3 = dict(hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, head_dim=64, vocab_size=512, bos_token_id=1, eos_token_id=2)


def _convert(tmp_path, src, rules: str, capsys, extra: str = ""):
    contract = tmp_path / "c.prec"
    contract.write_text(f'contract consumer {{\n  model from "{src}"\n  hardware H100\n  rollout sglang {{\n'
                        f"    {rules}\n  }}\n  trainer megatron {{\n    gemm : bf16\n  }}\n{extra}}}\n", encoding="utf-8")
    dst = tmp_path / "rollout"
    code = main(["convert", str(contract), "--source", str(src), "-o", str(dst), "--json"])
    assert code == 0, capsys.readouterr().err
    capsys.readouterr()
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
