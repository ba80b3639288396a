"""The objective and the per-GEMM linear, against hand-worked numbers and pcc.numerics' own linear."""

from __future__ import annotations

import math

import pytest
import torch

from pcc.contract.model import Correction
from pcc.contract.scheme import Scheme
from pcc.numerics import qdq, quantized_linear
from pcc.runtime.linear import Gemm, gemm_for, plan_linear
from pcc.runtime.model import bf16
from pcc.runtime.objective import advantages, objective

FP8 = Scheme.model_validate({"format": "fp8_e4m3", "weights": {"kind": "block", "rows": 128, "cols": 128},
                                 "activations": {"kind": "tile", "rows": 1, "cols": 128},
                                 "gradients": {"kind": "tile", "rows": 1, "cols": 128}, "scale": "fp32"})


def test_group_normalized_advantages_by_hand():
    a = advantages(torch.tensor([1.0, 0.0, 0.5, 0.5, 0.0, 1.0]), 2)
    # groups (1, 0), (0.5, 0.5), (0, 1): mean 0.5 / std 0.7071 (unbiased), then zero, then mirrored
    s = 0.5 / math.sqrt(0.5)
    assert torch.allclose(a, torch.tensor([s, -s, 0.0, 0.0, -s, s]), atol=1e-5)


def test_tis_truncates_the_behaviour_ratio():
    logp = torch.log(torch.tensor([[0.5, 0.5, 0.5]]))
    mu = torch.log(torch.tensor([[0.5, 0.1, 0.9]]))  # pi/mu = 1, 5, 0.556
    mask = torch.ones(1, 3)
    out = objective(logp.clone().requires_grad_(), mu, torch.tensor([1.0]), mask, Correction(kind="tis", clip=2.0))
    # ratio vs the trainer's own (detached) score is 1: loss = -mean(min(w, 2)) * A
    assert float(out.loss.detach()) == pytest.approx(-(1 + 2 + 0.5 / 0.9) / 3, rel=1e-5)
    assert out.is_clip_frac == pytest.approx(1 / 3)
    masked = objective(logp.clone().requires_grad_(), mu, torch.tensor([1.0]), mask,
                       Correction(kind="mis", clip=2.0, low=0.6))
    assert float(masked.loss.detach()) == pytest.approx(-1 / 3, rel=1e-5)  # 5 and 0.556 are masked out
    assert masked.is_clip_frac == pytest.approx(2 / 3)


def test_without_correction_the_ratio_is_against_behaviour_and_clipped():
    logp = torch.log(torch.tensor([[0.6, 0.3]])).requires_grad_()
    mu = torch.log(torch.tensor([[0.4, 0.3]]))  # ratios 1.5 (clipped to 1.2 for A > 0) and 1
    out = objective(logp, mu, torch.tensor([2.0]), torch.ones(1, 2), Correction())
    assert float(out.loss.detach()) == pytest.approx(-(1.2 * 2 + 1.0 * 2) / 2, rel=1e-5)
    assert out.clip_frac == 0.5
    out.loss.backward()
    assert float(logp.grad[0, 0]) == 0.0  # the clipped token passes no gradient


def test_qdq_linear_equals_pcc_numerics_linear():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(7, 256, generator=g)
    w = torch.randn(192, 256, generator=g) * 0.05
    gy = torch.randn(7, 192, generator=g)
    q = gemm_for(FP8, "qdq", "fp32")
    s = FP8

    def run(fn):
        xi, wi = x.clone().requires_grad_(), w.clone().requires_grad_()
        y = fn(xi, wi)
        y.backward(gy)
        return y.detach(), xi.grad, wi.grad

    mine = run(lambda a, b: plan_linear(a, b, q, q, q, "t"))
    ref = run(lambda a, b: quantized_linear(a, b, fprop=s, dgrad=s, wgrad=s))
    for a, b in zip(mine, ref):
        assert torch.allclose(a, b, rtol=1e-5, atol=1e-6)


def test_real_gemm_is_close_to_qdq_and_weight_gradient_is_straight_through():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(5, 128, generator=g)
    w = (torch.randn(64, 128, generator=g) * 0.05).requires_grad_()
    real, fake = gemm_for(FP8, "real", "fp32"), gemm_for(FP8, "qdq", "fp32")
    y_real = plan_linear(x, w, real, Gemm(), Gemm(output="fp32"), "t")
    y_fake = plan_linear(x, w.detach(), fake, Gemm(), Gemm(output="fp32"), "t")
    assert torch.allclose(y_real, y_fake, rtol=1e-4, atol=1e-5)
    gy = torch.randn(5, 64, generator=g)
    y_real.backward(gy)
    # STE: G_W = G_Y^T X over BF16 operands, never through the weight quantizer
    assert torch.allclose(w.grad, bf16(gy).t() @ bf16(x), rtol=1e-6)
    assert not torch.equal(qdq(w.detach(), FP8, "weight"), w.detach())
