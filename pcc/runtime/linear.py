"""One linear operator executed as the plan says: each GEMM wide, QDQ, or an emulated real low-precision GEMM.

`Gemm` is what one component (rollout, fprop, dgrad, wgrad) does to one operator:
its scheme (None = wide BF16), whether the GEMM is real (codes and scales into
`scaled_gemm`, promoted per K-chunk like block-scaled kernels) or QDQ (reconstructed
values into a BF16 GEMM), and the output dtype. A role the scheme leaves unquantized
(W4A16's activations) stays BF16. The weight gradient is G_Y^T X, never taken through
the weight quantizer: that is the straight-through estimator QAT trains with.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from pcc.numerics import Scheme, qdq, quantize, scaled_gemm

from .model import bf16


@dataclass(frozen=True)
class Gemm:
    scheme: Scheme | None = None
    mode: str = "wide"  # "wide" | "qdq" | "real"
    roles: frozenset = frozenset()  # roles the plan quantizes: weight, activation, gradient
    output: str = "bf16"

    def operand(self, t: torch.Tensor, role: str, name: str) -> torch.Tensor:
        """The values this GEMM sees for one operand (QDQ, or BF16 when the role stays wide)."""
        if self.scheme is None or role not in self.roles:
            return bf16(t)
        return qdq(t.float(), self.scheme, role, name)

    def __call__(self, a: torch.Tensor, a_role: str, b: torch.Tensor, b_role: str, name: str) -> torch.Tensor:
        """a [M, K] times b [N, K]^T, operands quantized along K."""
        if self.mode == "real" and {a_role, b_role} <= self.roles:
            qa = quantize(a.float().contiguous(), self.scheme, a_role, name=f"{name} {a_role}")
            qb = quantize(b.float().contiguous(), self.scheme, b_role, name=f"{name} {b_role}")
            y = scaled_gemm(qa, qb)
        else:
            y = self.operand(a, a_role, f"{name} {a_role}") @ self.operand(b, b_role, f"{name} {b_role}").t()
        return bf16(y) if self.output == "bf16" else y


WIDE = Gemm()


def gemm_for(spec, mode: str, output: str | None = None) -> Gemm:
    """A Gemm from a plan Decision's scheme and GEMM kind."""
    if spec.wide or mode == "wide":
        return Gemm(output=output or "bf16")
    roles = frozenset(r for r, g in (("weight", spec.weights), ("activation", spec.activations),
                                     ("gradient", spec.gradients)) if g is not None)
    return Gemm(spec, mode, roles, output or "bf16")


class _PlanLinear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w, fprop: Gemm, dgrad: Gemm, wgrad: Gemm, name: str):
        x2 = x.reshape(-1, x.shape[-1])
        ctx.save_for_backward(x2, w)
        ctx.gemms, ctx.x_shape, ctx.name = (dgrad, wgrad), x.shape, name
        return fprop(x2, "activation", w, "weight", f"{name} fprop").reshape(*x.shape[:-1], w.shape[0])

    @staticmethod
    def backward(ctx, gy):
        x2, w = ctx.saved_tensors
        dgrad, wgrad = ctx.gemms
        g2 = gy.reshape(-1, gy.shape[-1]).float()
        gx = gw = None
        if ctx.needs_input_grad[0]:  # DGrad: G_X = G_Y W, reduced over N
            gx = dgrad(g2, "gradient", w.t(), "weight", f"{ctx.name} dgrad").reshape(ctx.x_shape)
        if ctx.needs_input_grad[1]:  # WGrad: G_W = G_Y^T X, reduced over tokens
            gw = wgrad(g2.t(), "gradient", x2.t(), "activation", f"{ctx.name} wgrad").float()
        return gx, gw, None, None, None, None


def plan_linear(x: torch.Tensor, w: torch.Tensor, fprop: Gemm, dgrad: Gemm, wgrad: Gemm, name: str) -> torch.Tensor:
    """y = x w^T with FProp, DGrad and WGrad each at its own Gemm."""
    return _PlanLinear.apply(x, w, fprop, dgrad, wgrad, name)
