"""Exact low-precision numerics (FP8, MX, NVFP4, INT4) in pure PyTorch, matching the engines' bytes."""

from .autograd import qdq_ste, quantized_linear
from .gemm import ScaledMMUnsupported, scaled_gemm
from .quantize import Geometry, Quantized, all_finite, codes_nbytes, dequantize, geometry, qdq, quantize, tensor_amax
from pcc.contract.scheme import PRESETS, Grouping, Scheme

__all__ = ["Scheme", "Grouping", "PRESETS", "Quantized", "Geometry", "geometry", "quantize", "tensor_amax",
           "codes_nbytes", "all_finite", "dequantize", "qdq", "qdq_ste", "quantized_linear", "scaled_gemm", "ScaledMMUnsupported"]
