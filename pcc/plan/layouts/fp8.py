"""FP8 E4M3 layouts: block-scaled, tensor-scaled and MXFP8 (SGLang's fp8.py `Fp8Config`)."""

from __future__ import annotations

from pcc.plan.layouts import Layout, register


class _Fp8(Layout):
    """FP8 E4M3 codes under the weight's own name and one scale tensor (SGLang's fp8.py `Fp8Config`)."""

    quant_method = "fp8"
    element = (2**-4, 2**-9, 448.0)

    def encode(self, q, targets, shape, rows):
        scale = list(targets.values())[1]["shape"]
        return [q.codes, q.scales.reshape(scale if rows is None or not scale else (-1, *scale[1:]))]

    def decode(self, t, shape, scheme):
        import torch

        from pcc.numerics import Quantized

        return Quantized(t[0], t[1], torch.Size(shape), scheme, "weight")

    def stored(self, enc, parts):
        return [parts.get("weight"), parts["scale"]]

    def quantization_config(self, spec, skip, kv):
        cfg = {"quant_method": self.quant_method, "activation_scheme": "dynamic", "modules_to_not_convert": skip,
               **self._fields(spec)}
        if kv:
            cfg["kv_cache_quant_algo"] = kv
        return cfg

    def _fields(self, spec) -> dict:
        return {"fmt": "e4m3"}  # the published FP8 configs (Qwen3-*-FP8, DeepSeek-V3) carry it; loaders read e4m3


@register("fp8_block")
class Fp8Block(_Fp8):
    piece_kinds = ("block", "group", "row")

    def accepts(self, spec):
        return spec.format == "fp8_e4m3" and spec.weights is not None and spec.weights.kind == "block"

    def tensors(self, w, symmetric, shape, dtype):
        n, k = shape
        return ((None, "float8_e4m3fn", shape), (".weight_scale_inv", "float32", (-(-n // w.rows), -(-k // w.cols))))

    def _copies(self, enc, spec):
        w = spec.weights
        return (w.rows, w.cols) == enc.block and (spec.scale == "fp32" or spec.scale == "pow2" and enc.pow2)

    def _fields(self, spec):
        out = {**super()._fields(spec), "weight_block_size": [spec.weights.rows, spec.weights.cols]}
        if spec.scale == "pow2":
            out["scale_fmt"] = "ue8m0"
        return out


@register("fp8_tensor")
class Fp8Tensor(_Fp8):
    global_scale = True

    def accepts(self, spec):
        return spec.format == "fp8_e4m3" and spec.weights is not None and spec.weights.kind == "tensor"

    def tensors(self, w, symmetric, shape, dtype):
        return ((None, "float8_e4m3fn", shape), (".weight_scale", "float32", ()))

    def piece_rows(self, w):
        return 1  # one scale: any rows, given the whole weight's amax

    def _copies(self, enc, spec):
        return spec.scale == "fp32"

    def mixed_member(self, spec):
        a = spec.activations
        return "fp8_static" if a is not None and a.kind == "tensor" else None


@register("fp8_static")
class Fp8Static(Fp8Tensor):
    """ModelOpt `FP8` as a MIXED_PRECISION member: per-tensor FP8 weight and a static per-tensor
    `input_scale` (vLLM's KFp8StaticTensor registers both, modelopt.py, and reads the activation scale from
    the checkpoint). The `input_scale` is written as the NVFP4 one is: carried, calibrated (amax / 448) or
    1.0 counted uncalibrated (pcc.convert.calibration). Chosen by the Plan only inside a mixed checkpoint."""

    input_range = 448.0
    modelopt_algo = "FP8"

    def accepts(self, spec):
        return False

    def mixed_member(self, spec):
        return None

    def copies(self, enc, spec):
        return enc.kind == "fp8_tensor" and spec.weights is not None and self._copies(enc, spec)

    def tensors(self, w, symmetric, shape, dtype):
        return (*super().tensors(w, symmetric, shape, dtype), (".input_scale", "float32", ()))

    def encode(self, q, targets, shape, rows):
        import torch

        from pcc.plan.layouts.fp4 import NVFP4_INPUT_SCALE

        return [*super().encode(q, targets, shape, rows), torch.full((), NVFP4_INPUT_SCALE, dtype=torch.float32)]

    def stored(self, enc, parts):
        import torch

        return [*super().stored(enc, parts), parts.get("input_scale", torch.ones((), dtype=torch.float32))]


@register("mxfp8")
class Mxfp8(_Fp8):
    quant_method = "mxfp8"
    e8m0_scales = True
    piece_kinds = ("block", "group", "row")

    def accepts(self, spec):
        return spec.format == "mxfp8"

    def tensors(self, w, symmetric, shape, dtype):
        n, k = shape
        return ((None, "float8_e4m3fn", shape), (".weight_scale_inv", "uint8", (n, -(-k // 32))))

    def _fields(self, spec):
        return {"weight_block_size": [1, 32]}
