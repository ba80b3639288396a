"""Hypothesis properties of quantize/qdq on float32 inputs.

Idempotence, exactly: with power-of-two scales (pow2, e8m0) qdq(qdq(x)) == qdq(x) bit for bit.
Dequantized values are code * 2**k, so re-quantizing finds the same scale, or, when the block
amax rounded down to exactly qmax/2 * 2**k, half of it; either way every value is again on the
grid and comes back unchanged.  With fp32 scales s = amax/qmax the amax element dequantizes to
fl(qmax * s), and fl(fl(qmax * s) / qmax) need not equal s, so the codes are idempotent but the
values only agree to a couple of float32 ulps.  NVFP4 re-derives its per-tensor scale from the
dequantized amax and is not idempotent in general.
"""

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from pcc.contract.scheme import preset
from pcc.numerics import Grouping, Scheme, qdq, quantize
from pcc.numerics import formats as fm


def S(fmt, weights=None, activations=None, **kw):
    """A scheme from positional groupings (weights, activations), as these tests write them."""
    return Scheme(format=fmt, weights=weights, activations=activations, **kw)

FINITE = st.floats(-1e4, 1e4, allow_nan=False, allow_infinity=False, width=32)
SMALL = st.floats(-2.0**-100, 2.0**-100, allow_nan=False, width=32)
ELEMS = st.one_of(FINITE, SMALL, st.just(0.0), st.just(-0.0))


def tensors(rows=st.integers(1, 5), cols=st.integers(1, 70)):
    return st.tuples(rows, cols).flatmap(
        lambda rc: arrays(np.float32, rc, elements=ELEMS)).map(torch.from_numpy)


POW2_SCHEMES = [
    S("fp8_e4m3", Grouping(kind="block", rows=2, cols=16), Grouping(kind="tile", rows=1, cols=16), scale="pow2"),
    S("fp8_e5m2", Grouping(kind="row"), Grouping(kind="row"), scale="pow2"),
    preset("mxfp8"),
    preset("mxfp4"),
    S("int4", Grouping(kind="group", size=32), Grouping(kind="group", size=32), scale="pow2"),
]
FP32_SCHEMES = [preset("fp8_tensor"), preset("fp8_block"), preset("int4_g32"),
                S("int8", Grouping(kind="row"), Grouping(kind="token"))]
GRID = {"fp8_e4m3": fm.E4M3, "fp8_e5m2": fm.E5M2, "mxfp8": fm.E4M3, "mxfp4": fm.E2M1}

FAST = settings(max_examples=40, deadline=None)


def _per_element_scale(q):
    geo = q.geometry
    out = torch.empty(geo.rows, geo.cols)
    geo.map_rows(torch.zeros(geo.rows, geo.cols), out, lambda z, s: z + s, geo.per_row(q.block_scales()))
    return out.reshape(q.shape)


@pytest.mark.parametrize("scheme", POW2_SCHEMES, ids=lambda s: s.format)
@FAST
@given(x=tensors())
def test_qdq_idempotent_with_pow2_scales(scheme, x):
    once = qdq(x, scheme)
    assert torch.equal(qdq(once, scheme), once)


@pytest.mark.parametrize("scheme", FP32_SCHEMES, ids=lambda s: s.format)
@FAST
@given(x=tensors())
def test_qdq_codes_idempotent_with_fp32_scales(scheme, x):
    once = qdq(x, scheme)
    q1, q2 = quantize(x, scheme), quantize(once, scheme)
    assert torch.equal(q1.element_values(), q2.element_values())
    assert torch.allclose(qdq(once, scheme), once, rtol=2**-21, atol=0)


@pytest.mark.parametrize("scheme", POW2_SCHEMES, ids=lambda s: s.format)
@FAST
@given(x=tensors())
def test_dequantized_values_lie_on_the_grid_times_scale(scheme, x):
    q = quantize(x, scheme)
    ratio = q.dequantize() / _per_element_scale(q)  # exact: scales are powers of two
    if scheme.format in GRID:
        fmt = GRID[scheme.format]
        onto = fm.decode_e2m1(fm.encode_e2m1(ratio)) if fmt is fm.E2M1 else fm.encode_fp8(ratio, fmt).float()
        assert torch.equal(onto, ratio)
    else:
        assert torch.equal(ratio, ratio.round()) and ratio.abs().max() <= 7


@pytest.mark.parametrize("scheme", FP32_SCHEMES + POW2_SCHEMES[:2], ids=lambda s: s.format)
@FAST
@given(x=tensors())
def test_block_amax_element_reconstructs_within_half_ulp(scheme, x):
    # true for fp32 and pow2 scales (amax/s <= qmax, never saturated).  E8M0 (OCP) scales can
    # put amax/X in (max, 2**(emax+1)) where it saturates; see test_mxfp8_worked_example.
    q = quantize(x, scheme)
    s, d = _per_element_scale(q), q.dequantize()
    geo = q.geometry
    a = x.abs().reshape(-1, geo.cols)
    for r in range(geo.rows):
        for c0 in range(0, geo.cols, geo.block_cols):
            # the row-wise max of a run is a block max whenever blocks are one row high
            if geo.block_rows != 1:
                continue
            j = c0 + int(a[r, c0:c0 + geo.block_cols].argmax())
            xv, dv, sv = x.reshape(-1, geo.cols)[r, j], d.reshape(-1, geo.cols)[r, j], s.reshape(-1, geo.cols)[r, j]
            if scheme.format.startswith("int"):
                half_ulp = 0.5 * sv
            else:
                fmt = GRID[scheme.format]
                e = max(math.floor(math.log2(max(abs(xv.item()) / sv.item(), 2.0**-150))), fmt.emin)
                half_ulp = 0.5 * 2.0 ** (e - fmt.mbits) * sv
            assert abs(dv - xv) <= half_ulp * (1 + 2**-20) + 1e-45


@FAST
@given(x=tensors(), bad=st.sampled_from([float("nan"), float("inf"), -float("inf")]))
def test_nonfinite_always_raises(x, bad):
    x = x.clone()
    x.view(-1)[x.numel() // 2] = bad
    with pytest.raises(ValueError, match="NaN or inf"):
        quantize(x, "mxfp8", name="t")


@FAST
@given(x=tensors())
def test_signed_zero_and_zero_blocks(x):
    q = quantize(torch.zeros_like(x) * -1.0, "fp8_row")
    assert (q.dequantize() == 0).all()
    assert (quantize(x, "fp8_row").dequantize()[x == 0] == 0).all()
