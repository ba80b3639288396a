"""The INT8 W8A8 layout: compressed-tensors int-quantized (its `W8A8` preset)."""

from __future__ import annotations

from pcc.plan.layouts import Layout, register


@register("int8")
class Int8(Layout):
    """compressed-tensors int-quantized W8A8: int8 codes under the weight's own name, one float32 scale per
    output channel (`weight_scale` [N, 1]), activations quantized by the engine per token at run time
    (symmetric, dynamic: no `input_scale`). What vLLM's and SGLang's `CompressedTensorsW8A8Int8` load
    (compressed_tensors.py `_is_dynamic_token_w8a8`: 8-bit weights by channel, symmetric, static; 8-bit
    inputs by token, dynamic). Weight-only INT8 (W8A16) is their `CompressedTensorsWNA16`, which reads the
    pack-quantized format, not this one: a scheme without quantized activations has no layout here."""

    piece_kinds = ("row",)

    def accepts(self, spec):
        w, a = spec.weights, spec.activations
        return (spec.format == "int8" and w is not None and w.kind == "row" and a is not None
                and a.kind in ("row", "token") and spec.symmetric and spec.scale == "fp32" and spec.amax == "current")

    def tensors(self, w, symmetric, shape, dtype):
        n, _ = shape
        return ((None, "int8", shape), (".weight_scale", "float32", (n, 1)))

    def encode(self, q, targets, shape, rows):
        return [q.codes, q.scales.float().reshape(-1, 1)]

    def decode(self, t, shape, scheme):
        import torch

        from pcc.numerics import Quantized

        return Quantized(t[0], t[1].float().reshape(-1, 1), torch.Size(shape), scheme, "weight")

    def slack(self, x, s):
        # half a step, plus float32 rounding of x/s and of q*s (as the INT4 layout)
        return s * 0.5 * (1 + 2**-20) + x.abs() * 2**-22

    def quantization_config(self, spec, skip, kv):
        """compressed-tensors' QuantizationConfig of its W8A8 preset (preset_name_to_scheme("W8A8")), as its
        own model_dump() writes it (tests/lower/test_lower_int8.py compares the two)."""
        weights = {"num_bits": 8, "type": "int", "symmetric": True, "group_size": None, "strategy": "channel",
                   "dynamic": False}
        inputs = {"num_bits": 8, "type": "int", "symmetric": True, "group_size": None, "strategy": "token",
                  "dynamic": True}
        group = {"targets": ["Linear"], "weights": weights, "input_activations": inputs, "output_activations": None,
                 "format": None}
        return {"quant_method": "compressed-tensors", "format": "int-quantized", "quantization_status": "compressed",
                "config_groups": {"group_0": group}, "kv_cache_scheme": None, "global_compression_ratio": None,
                "ignore": skip, "moe_sparsity_config": None}
