"""Autograd: straight-through QDQ for QAT, and a linear layer whose three GEMMs each have a scheme.

Each GEMM quantizes its two operands along that GEMM's reduction axis, the way
TransformerEngine feeds tensor cores (its "columnwise" copies):
    FProp  Y   = X  W^T   reduces over K: X [M,K] (activation), W   [N,K] (weight)
    DGrad  G_X = G_Y W    reduces over N: G_Y [M,N] (gradient), W^T [K,N] (weight)
    WGrad  G_W = G_Y^T X  reduces over M: G_Y^T [N,M] (gradient), X^T [K,M] (activation)
A scheme of None leaves that GEMM in the input precision.
"""

from __future__ import annotations

import torch

from .quantize import qdq
from pcc.contract.scheme import Scheme


class _QDQSTE(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, scheme, role):
        return qdq(x, scheme, role)

    @staticmethod
    def backward(ctx, grad):
        return grad, None, None


def qdq_ste(x: torch.Tensor, scheme: Scheme | str, role: str = "weight") -> torch.Tensor:
    """Forward: qdq(x); backward: the incoming gradient unchanged (straight-through estimator)."""
    return _QDQSTE.apply(x, scheme, role)


def _q(t: torch.Tensor, scheme: Scheme | None, role: str, name: str) -> torch.Tensor:
    return t if scheme is None else qdq(t, scheme, role, name)


class _QuantizedLinear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w, bias, fprop, dgrad, wgrad):
        x2 = x.reshape(-1, x.shape[-1])
        y = _q(x2, fprop, "activation", "fprop X") @ _q(w, fprop, "weight", "fprop W").t()
        if bias is not None:
            y = y + bias
        ctx.save_for_backward(x2, w)
        ctx.schemes, ctx.x_shape, ctx.has_bias = (dgrad, wgrad), x.shape, bias is not None
        return y.reshape(*x.shape[:-1], w.shape[0])

    @staticmethod
    def backward(ctx, gy):
        x2, w = ctx.saved_tensors
        dgrad, wgrad = ctx.schemes
        g2 = gy.reshape(-1, gy.shape[-1])
        gx = gw = gb = None
        if ctx.needs_input_grad[0]:
            gx = _q(g2, dgrad, "gradient", "dgrad G_Y") @ _q(w.t(), dgrad, "weight", "dgrad W^T").t()
            gx = gx.reshape(ctx.x_shape)
        if ctx.needs_input_grad[1]:
            gw = _q(g2.t(), wgrad, "gradient", "wgrad G_Y^T") @ _q(x2.t(), wgrad, "activation", "wgrad X^T").t()
        if ctx.has_bias and ctx.needs_input_grad[2]:
            gb = g2.sum(0)
        return gx, gw, gb, None, None, None


def quantized_linear(x: torch.Tensor, w: torch.Tensor, fprop: Scheme | None = None, dgrad: Scheme | None = None,
                     wgrad: Scheme | None = None, bias: torch.Tensor | None = None) -> torch.Tensor:
    """y = x w^T + bias with FProp, DGrad and WGrad each emulated at its own scheme (QDQ)."""
    return _QuantizedLinear.apply(x, w, bias, fprop, dgrad, wgrad)
