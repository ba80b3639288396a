"""The INT4 layout: compressed-tensors pack-quantized."""

from __future__ import annotations

from pcc.plan.layouts import Layout, packed_codes, register


@register("int4")
class Int4(Layout):
    """compressed-tensors pack-quantized W4A16: eight codes per int32 `weight_packed`, a float32 scale per
    group, `weight_shape`, and (asymmetric) zero points packed eight rows to a word."""

    packs = True
    piece_kinds = ("block", "group", "row")

    def accepts(self, spec):
        return spec.format == "int4" and spec.weights is not None and spec.weights.kind == "group"

    def tensors(self, w, symmetric, shape, dtype):
        n, k = shape
        g = w.size
        out = ((".weight_packed", "int32", (n, -(-k // 8))), (".weight_scale", "float32", (n, -(-k // g))),
               (".weight_shape", "int64", (2,)))
        if not symmetric:
            out += ((".weight_zero_point", "int32", (-(-n // 8), -(-k // g))),)
        return out

    def encode(self, q, targets, shape, rows):
        import torch

        from pcc.numerics.packing import pack_int32x8

        out = [packed_codes(q, pack_int32x8), q.scales.float(), torch.tensor(list(shape), dtype=torch.int64)]
        if q.zero_point is not None:
            out.append(pack_int32x8(q.zero_point, dim=0))
        return out

    def decode(self, t, shape, scheme):
        import torch

        from pcc.numerics import Quantized
        from pcc.numerics.packing import unpack_int32x8

        n, k = shape
        codes = t[0] if scheme.packing else unpack_int32x8(t[0], k)
        zp = unpack_int32x8(t[3], n, dim=0).to(torch.int8) if len(t) > 3 else None
        return Quantized(codes, t[1], torch.Size(shape), scheme, "weight", zero_point=zp)

    def _copies(self, enc, spec):
        return spec.weights.size == enc.block[1] and spec.symmetric == enc.symmetric and spec.scale == "fp32"

    def stored(self, enc, parts):
        import torch

        out = [parts.get("weight"), parts["scale"], torch.tensor(list(enc.shape), dtype=torch.int64)]
        return out + [parts["zero_point"]] if "zero_point" in parts else out

    def slack(self, x, s):
        # half a step, plus float32 rounding of x/s and of q*s: a round-half tie (common when the source is
        # itself on a coarse grid, e.g. dequantized FP8) lands exactly on half a step before rounding
        return s * 0.5 * (1 + 2**-20) + x.abs() * 2**-22

    def quantization_config(self, spec, skip, kv):
        """compressed-tensors' QuantizationConfig, as its own model_dump() writes it."""
        weights = {"num_bits": 4, "type": "int", "symmetric": spec.symmetric, "group_size": spec.weights.size,
                   "strategy": "group", "dynamic": False}
        group = {"targets": ["Linear"], "weights": weights, "input_activations": None, "output_activations": None,
                 "format": None}
        return {"quant_method": "compressed-tensors", "format": "pack-quantized", "quantization_status": "compressed",
                "config_groups": {"group_0": group}, "kv_cache_scheme": None, "global_compression_ratio": None,
                "ignore": skip, "moe_sparsity_config": None}
