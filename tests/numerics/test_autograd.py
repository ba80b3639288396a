import pytest
import torch
import torch.nn.functional as F

from pcc.contract.scheme import preset
from pcc.numerics import Grouping, Scheme, qdq, qdq_ste, quantize, quantized_linear, scaled_gemm


def S(fmt, weights=None, activations=None, **kw):
    """A scheme from positional groupings (weights, activations), as these tests write them."""
    return Scheme(format=fmt, weights=weights, activations=activations, **kw)

FP8 = preset("fp8_block")
MX = preset("mxfp8")


def _inputs(m=8, k=256, n=130, bias=True):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, m // 2, k, generator=g, requires_grad=True)
    w = torch.randn(n, k, generator=g, requires_grad=True)
    b = torch.randn(n, generator=g, requires_grad=True) if bias else None
    gy = torch.randn(2, m // 2, n, generator=g)
    return x, w, b, gy


def test_all_none_equals_f_linear():
    x, w, b, gy = _inputs()
    y = quantized_linear(x, w, bias=b)
    y.backward(gy)
    grads = [t.grad.clone() for t in (x, w, b)]
    for t in (x, w, b):
        t.grad = None
    y_ref = F.linear(x, w, b)
    y_ref.backward(gy)
    assert torch.allclose(y, y_ref, atol=1e-5)
    for got, t in zip(grads, (x, w, b)):
        assert torch.allclose(got, t.grad, atol=1e-5)


def test_three_paths_follow_their_schemes():
    x, w, b, gy = _inputs()
    y = quantized_linear(x, w, fprop=FP8, dgrad=MX, wgrad=None, bias=b)
    y.backward(gy)
    x2, g2 = x.detach().reshape(-1, 256), gy.reshape(-1, 130)
    # FProp: Y = Xq Wq^T, X as activation (1x128 tiles), W as weight (128x128 blocks)
    y_ref = qdq(x2, FP8, "activation") @ qdq(w.detach(), FP8, "weight").t() + b.detach()
    assert torch.equal(y.detach().reshape(-1, 130), y_ref)
    # DGrad: G_X = G_Yq Wq, both quantized along N (the reduction axis): W^T is the weight operand
    gx_ref = qdq(g2, MX, "gradient") @ qdq(w.detach().t(), MX, "weight").t()
    assert torch.equal(x.grad.reshape(-1, 256), gx_ref)
    # WGrad left wide: G_W = G_Y^T X
    assert torch.allclose(w.grad, g2.t() @ x2, atol=1e-5)
    assert torch.allclose(b.grad, g2.sum(0))


def test_wgrad_quantizes_along_tokens():
    x, w, _, gy = _inputs(bias=False)
    quantized_linear(x, w, wgrad=FP8).backward(gy)
    x2, g2 = x.detach().reshape(-1, 256), gy.reshape(-1, 130)
    gw_ref = qdq(g2.t(), FP8, "gradient") @ qdq(x2.t(), FP8, "activation").t()
    assert torch.equal(w.grad, gw_ref)
    assert not torch.allclose(w.grad, g2.t() @ x2, atol=1e-4)


def test_ste_passes_gradient_unchanged():
    w = torch.randn(64, 64, requires_grad=True)
    g = torch.randn(64, 64)
    out = qdq_ste(w, "mxfp4")
    assert torch.equal(out.detach(), qdq(w.detach(), "mxfp4"))
    out.backward(g)
    assert torch.equal(w.grad, g)


def test_scaled_gemm_promotes_per_k_block():
    g = torch.Generator().manual_seed(0)
    a = torch.randn(16, 384, generator=g)
    b = torch.randn(40, 384, generator=g) * 0.01
    qa, qb = quantize(a, FP8, "activation"), quantize(b, FP8, "weight")
    out = scaled_gemm(qa, qb)
    # explicit formula in float64: sum over K-blocks of (codes_a . codes_b) * s_a[m, kb] * s_b[n // 128, kb]
    va, vb = qa.element_values().double(), qb.element_values().double()
    ref = torch.zeros(16, 40, dtype=torch.float64)
    for kb in range(3):
        sl = slice(128 * kb, 128 * (kb + 1))
        sa = qa.scales[:, kb].double()[:, None]
        sb = qb.scales[0, kb].double()
        ref += (va[:, sl] @ vb[:, sl].t()) * sa * sb
    assert torch.allclose(out.double(), ref, rtol=1e-5, atol=1e-6)
    # and it is not the same computation as QDQ followed by a BF16 GEMM
    bf16 = (qa.dequantize(torch.bfloat16) @ qb.dequantize(torch.bfloat16).t()).float()
    assert not torch.equal(out, bf16)
    assert torch.allclose(out, bf16, rtol=0.05, atol=0.05)


def test_scaled_gemm_mixed_groupings_and_formats():
    a, b = torch.randn(5, 96), torch.randn(7, 96)
    for sa, sb in ((MX, MX), (preset("nvfp4"), preset("nvfp4")), (preset("fp8_row"), FP8)):
        qa, qb = quantize(a, sa, "activation"), quantize(b, sb, "weight")
        ref = qa.dequantize().double() @ qb.dequantize().double().t()
        assert torch.allclose(scaled_gemm(qa, qb).double(), ref, rtol=1e-5, atol=1e-5)


def test_scaled_gemm_rejects_mismatched_operands():
    qa = quantize(torch.randn(4, 64), MX, "activation")
    with pytest.raises(ValueError, match="K"):
        scaled_gemm(qa, quantize(torch.randn(4, 32), MX))
    asym = S("int4", Grouping(kind="group", size=32), Grouping(kind="group", size=32), symmetric=False)
    with pytest.raises(ValueError, match="symmetric"):
        scaled_gemm(qa, quantize(torch.randn(4, 64), asym))
