"""Element casts against ml_dtypes (an independent reference), over every BF16 bit pattern.

Allowed differences, all documented in docs/numerics.md:
- E4M3: ml_dtypes turns a finite value that rounds past 448 (|x| >= 464) and +-inf into NaN;
  pcc saturates both to +-448, as the engines do by clamping before the cast.
- E5M2: ml_dtypes rounds |x| >= 61440 and +-inf to +-inf; pcc saturates to +-57344.
- NaN stays NaN in both FP8 formats; E2M1 has no NaN and NaN inputs are not compared
  (the quantizer rejects NaN before any cast).
"""

import ml_dtypes
import numpy as np
import pytest
import torch

from pcc.numerics import formats as fm

pytestmark = pytest.mark.filterwarnings("ignore:invalid value encountered in cast")

ALL_BF16 = np.arange(65536, dtype=np.uint16).view(ml_dtypes.bfloat16).astype(np.float32)
X = torch.from_numpy(ALL_BF16.copy())


def _ours_fp8(fmt):
    return fm.encode_fp8(X, fmt).view(torch.uint8).numpy()


@pytest.mark.parametrize("fmt,ml,maxcode", [(fm.E4M3, ml_dtypes.float8_e4m3fn, 0x7E),
                                            (fm.E5M2, ml_dtypes.float8_e5m2, 0x7B)])
def test_fp8_all_bf16_patterns(fmt, ml, maxcode):
    ours = _ours_fp8(fmt)
    ref_vals = ALL_BF16.astype(ml)
    ref = ref_vals.view(np.uint8)
    nan_in = np.isnan(ALL_BF16)
    ref_f = ref_vals.astype(np.float32)
    overflow = ~nan_in & ~np.isfinite(ref_f)  # ml_dtypes: NaN (E4M3) or inf (E5M2) for out-of-range
    same = ~nan_in & ~overflow
    np.testing.assert_array_equal(ours[same], ref[same])
    # saturation instead of NaN/inf, sign kept
    sign = np.signbit(ALL_BF16[overflow]).astype(np.uint8) << 7
    np.testing.assert_array_equal(ours[overflow], sign | maxcode)
    assert overflow.sum() > 0 and same.sum() > 20000
    # NaN in, NaN out
    assert np.isnan(fm.encode_fp8(X[torch.from_numpy(nan_in)], fmt).float().numpy()).all()


def test_fp8_overflow_boundary_matches_torch_saturation():
    # torch's own float->e4m3fn cast saturates finite values and inf to +-448 (NaN stays NaN);
    # pcc clamps first anyway, so its bytes do not depend on that choice.
    x = torch.tensor([447.0, 449.0, 464.0, 1e6, float("inf"), -float("inf")])
    assert fm.encode_fp8(x, fm.E4M3).float().tolist() == [448.0, 448.0, 448.0, 448.0, 448.0, -448.0]
    assert torch.isnan(fm.encode_fp8(torch.tensor([float("nan")]), fm.E4M3).float()).all()


def test_e2m1_all_bf16_patterns():
    keep = ~np.isnan(ALL_BF16)
    ours = fm.encode_e2m1(X).numpy()
    ref = ALL_BF16.astype(ml_dtypes.float4_e2m1fn).view(np.uint8) & 0xF
    np.testing.assert_array_equal(ours[keep], ref[keep])


def test_e2m1_ties_round_to_even_and_saturate():
    x = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 7.0, -0.1, 1e30])
    vals = fm.decode_e2m1(fm.encode_e2m1(x))
    assert vals.tolist() == [0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0, 6.0, -0.0, 6.0]
    assert torch.signbit(vals[8])


def test_e2m1_decode_table_matches_ml_dtypes():
    ref = np.arange(16, dtype=np.uint8).view(ml_dtypes.float4_e2m1fn).astype(np.float32)
    np.testing.assert_array_equal(fm.decode_e2m1(torch.arange(16)).numpy(), ref)


def test_fp8_decode_table_matches_cast():
    codes = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn)
    ours, ref = fm.decode_fp8(codes), codes.float()
    assert torch.equal(ours.isnan(), ref.isnan())
    assert torch.equal(ours[~ref.isnan()], ref[~ref.isnan()])


def test_e8m0_decode():
    bytes_ = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    vals = fm.decode_e8m0(bytes_)
    ref = np.arange(256, dtype=np.uint8).view(ml_dtypes.float8_e8m0fnu).astype(np.float32)
    assert np.array_equal(vals.numpy(), ref, equal_nan=True)


def test_pow2_and_floor_log2_exact():
    e = torch.arange(-149, 128)
    assert torch.equal(fm.pow2(e).double(), torch.pow(2.0, e.double()))
    a = torch.tensor([1.0, 1.5, 2.0, 3.9, 2.0**-130, 1000.0])
    assert fm.floor_log2(a).tolist() == [0, 0, 1, 1, -130, 9]


def test_stochastic_round_is_on_grid_and_unbiased():
    g = torch.Generator().manual_seed(0)
    y = torch.full((20000,), 1.3)
    r = fm.stochastic_round(y, fm.E2M1, g)
    assert set(r.unique().tolist()) == {1.0, 1.5}
    assert abs(r.mean().item() - 1.3) < 0.01
    r8 = fm.stochastic_round(torch.full((20000,), 1.01), fm.E4M3, g)
    assert set(r8.unique().tolist()) == {1.0, 1.125}
