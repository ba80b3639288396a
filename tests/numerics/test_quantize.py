import importlib
import threading

import ml_dtypes
import numpy as np
import pytest
import torch

from pcc.contract.scheme import preset
from pcc.numerics import Grouping, Scheme, dequantize, qdq, quantize


def S(fmt, weights=None, activations=None, **kw):
    """A scheme from positional groupings (weights, activations), as these tests write them."""
    return Scheme(format=fmt, weights=weights, activations=activations, **kw)


def _scheme(fmt, w=None, **kw):
    return S(fmt, w, w, **kw)


# ---------------------------------------------------------------- worked examples

def test_int4_toy_example():
    # INT4 codes -7..7, scale = amax/7.  One group {1, 3, 100}: scale 100/7, so 1 -> 0.07 -> 0 and
    # 3 -> 0.21 -> 0; 100 -> 7 -> 100.  With {1, 3} alone: scale 3/7, 3 -> 7 (exact),
    # 1 -> 2.33 -> 2 -> 6/7 = 0.857.
    s = _scheme("int4", Grouping(kind="group", size=4))
    out = qdq(torch.tensor([[1.0, 3.0, 100.0, 0.0]]), s)
    assert out[0, :2].tolist() == [0.0, 0.0] and out[0, 2].item() == pytest.approx(100.0, rel=1e-6)
    out = qdq(torch.tensor([[1.0, 3.0, 0.0, 0.0, 100.0, 0.0, 0.0, 0.0]]), S("int4", Grouping(kind="group", size=4)))
    assert out[0, 1].item() == pytest.approx(3.0, rel=1e-6)
    assert out[0, 0].item() == pytest.approx(6 / 7, rel=1e-6)
    assert out[0, 4].item() == pytest.approx(100.0, rel=1e-6)


def test_mxfp8_worked_example():
    # OCP MX v1.0, section 6.3: shared_exp = floor(log2(amax)) - emax_elem, emax_elem = 8 for E4M3.
    # Block amax 1000: floor(log2 1000) = 9, shared_exp = 1, X = 2, E8M0 byte 127 + 1 = 128.
    # 1000/2 = 500 > 448 saturates to 448 (-> 896); 3/2 = 1.5 is exact; 0.01/2 = 0.005 rounds to the
    # E4M3 subnormal 3 * 2**-9 (0.005859), since 0.005 / 2**-9 = 2.56 -> 3.
    x = torch.zeros(1, 32)
    x[0, :4] = torch.tensor([1000.0, 3.0, 0.01, -7.0])
    q = quantize(x, "mxfp8")
    assert q.scales.tolist() == [[128]]
    assert q.dequantize()[0, :4].tolist() == [896.0, 3.0, 2 * 3 * 2.0**-9, -7.0]


def test_mxfp4_worked_example():
    # emax_elem = 2 for E2M1.  Block 1: amax 5 -> floor(log2 5) = 2 -> shared_exp 0 -> X = 1 (byte 127);
    # 5 is a tie between 4 and 6 -> 4 (even mantissa); 0.75 -> 1 (tie, even); 0.25 -> 0 (tie, even).
    # Block 2: amax 0.1 -> floor(log2 0.1) = -4 -> shared_exp -6 -> X = 2**-6 (byte 121);
    # 0.1 * 64 = 6.4 saturates to 6 -> 6/64 = 0.09375; 0.02 * 64 = 1.28 -> 1.5 (nearer than 1) -> 0.0234375.
    x = torch.zeros(1, 64)
    x[0, :3] = torch.tensor([5.0, 0.75, 0.25])
    x[0, 32:34] = torch.tensor([0.1, -0.02])
    q = quantize(x, "mxfp4")
    assert q.scales.tolist() == [[127, 121]]
    d = q.dequantize()
    assert d[0, :3].tolist() == [4.0, 1.0, 0.0]
    assert d[0, 32:34].tolist() == [0.09375, -0.0234375]
    # packed: codes 4.0 -> 0b0110, 1.0 -> 0b0010: byte 0 = (2 << 4) | 6 = 0x26
    assert q.codes[0, 0].item() == 0x26


def test_nvfp4_worked_example():
    # Two-level NVFP4 (TransformerEngine): S_enc = 448*6/amax(tensor) = 2688/10 = 268.8.
    # Block 0 (amax 10): s_b = e4m3(10 * 268.8/6 = 448) = 448; element 10 -> 10*268.8/448 = 6 -> code 6.
    # Block 1 (amax 1): 1 * 44.8 -> e4m3 44 (E4M3 spacing is 4 in [32, 64)); encode factor 268.8/44 = 6.109,
    # so 1.0 -> 6.109 saturates to 6 -> 6*44/268.8 = 0.98214; 0.5 -> 3.05 -> 3 -> 0.49107.
    x = torch.zeros(1, 32)
    x[0, 0] = 10.0
    x[0, 16:18] = torch.tensor([1.0, 0.5])
    q = quantize(x, "nvfp4")
    assert q.outer_scale.item() == pytest.approx(268.8, rel=1e-7)
    assert q.scales.float().tolist() == [[448.0, 44.0]]
    d = q.dequantize()
    assert d[0, 0].item() == pytest.approx(10.0, rel=1e-6)
    assert d[0, 16].item() == pytest.approx(6 * 44 / 268.8, rel=1e-6)
    assert d[0, 17].item() == pytest.approx(3 * 44 / 268.8, rel=1e-6)


def test_nvfp4_outer_scale_is_the_float32_quotient_and_a_given_amax_is_used():
    # S_enc = 2688 / amax divided in float32 (TransformerEngine), for many amaxes: not 2688 * (1 / amax),
    # which is an ulp off for about a quarter of them
    amaxes = np.random.default_rng(7).uniform(1e-3, 50, 400).astype(np.float32)
    for a in amaxes:
        x = torch.zeros(1, 16)
        x[0, 3] = float(a)
        assert quantize(x, "nvfp4").outer_scale.item() == np.float32(2688) / a, a
    # `amax=`: the scale of a fused group (or of the whole weight, for a piece of it) instead of x's own
    x = torch.tensor([[1.0, -0.5] + [0.0] * 14])
    q = quantize(x, "nvfp4", amax=torch.tensor(4.0))
    assert q.outer_scale.item() == np.float32(2688) / np.float32(4)
    assert q.scales.float().item() == 112.0  # e4m3(1 * 672 / 6)
    assert q.dequantize()[0, :2].tolist() == pytest.approx([1.0, -0.5], rel=1e-6)
    with pytest.raises(ValueError, match="a given amax"):
        quantize(x, "fp8_block", amax=torch.tensor(4.0))


def test_fp8_block_scale_shapes_and_partial_edges():
    # scales are [ceil(N/128), ceil(K/128)]; an edge block's scale is the amax of its real elements / 448
    w = torch.randn(300, 200)
    w[299, 199] = 50.0
    q = quantize(w, "fp8_block")
    assert q.codes.shape == w.shape and q.codes.dtype == torch.float8_e4m3fn
    assert q.scales.shape == (3, 2)
    assert q.scales[2, 1].item() == pytest.approx(w[256:, 128:].abs().max().item() / 448, rel=1e-7)
    assert q.scales[0, 0] == w[:128, :128].abs().max() / 448
    # the block-FP8 checkpoint multiplier: w ~ code * weight_scale_inv
    approx = q.codes.float() * q.scales.repeat_interleave(128, 0)[:300].repeat_interleave(128, 1)[:, :200]
    assert torch.equal(approx, q.dequantize())


def test_activation_tile_and_token_scales():
    a = torch.randn(5, 3, 256)
    q = quantize(a, "fp8_block", role="activation")
    assert q.scales.shape == (5, 3, 2)
    assert quantize(a, "fp8_row", role="activation").scales.shape == (5, 3, 1)
    assert quantize(a, "fp8_tensor").scales.shape == ()


def test_batched_block_weights_do_not_share_blocks():
    w = torch.randn(2, 130, 64)
    w[1] *= 100
    q = quantize(w, "fp8_block")
    assert q.scales.shape == (2, 2, 1)
    assert q.scales[1, 0, 0] > 10 * q.scales[0, 0, 0]


def test_fp8_codes_match_reference_division():
    # codes = e4m3(clamp(x / (amax/448))) with x / s in float32, the SGLang / converter formula
    x = torch.randn(4, 256, dtype=torch.bfloat16) * 3
    q = quantize(x, "fp8_block", role="activation")
    s = (x.float().view(4, 2, 128).abs().amax(-1, keepdim=True) / 448)
    ref = (x.float().view(4, 2, 128) / s).numpy().astype(ml_dtypes.float8_e4m3fn).view(np.uint8)
    assert np.array_equal(q.codes.view(torch.uint8).numpy(), ref.reshape(4, 256))


# ---------------------------------------------------------------- special values

@pytest.mark.parametrize("name", ["fp8_tensor", "fp8_block", "mxfp8", "mxfp4", "nvfp4", "int4_g32"])
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_nonfinite_input_names_tensor_and_block(name, bad):
    x = torch.randn(256, 256)
    x[130, 70] = bad
    with pytest.raises(ValueError, match=r"layers\.3\.w") as err:
        quantize(x, name, name="layers.3.w")
    msg = str(err.value)
    if name == "fp8_block":
        assert "(1, 0)" in msg
    elif name != "fp8_tensor":
        run = preset(name).weights.run
        assert f"(130, {70 // run})" in msg


@pytest.mark.parametrize("preset,scale", [("fp8_tensor", 1.0), ("fp8_block", 1.0), ("mxfp8", 127),
                                          ("mxfp4", 127), ("nvfp4", 0.0), ("int4_g128", 1.0)])
def test_all_zero_blocks(preset, scale):
    x = torch.zeros(128, 256)
    q = quantize(x, preset)
    assert (q.scales.float() == scale).all()
    assert (q.element_values() == 0).all()
    assert torch.equal(q.dequantize(), x)
    if preset == "nvfp4":
        assert q.outer_scale.item() == 1.0


def test_zero_block_next_to_nonzero_block():
    x = torch.zeros(2, 64)
    x[1, 40] = 3.0
    q = quantize(x, "mxfp8")
    assert q.scales.tolist() == [[127, 127], [127, 127 + 1 - 8]]
    assert q.dequantize()[1, 40].item() == 3.0


def test_subnormal_inputs_quantize_against_ml_dtypes():
    # values far below the block amax land in (or flush from) E4M3's subnormal range
    x = torch.tensor([[448.0, 2.0**-7, 2.0**-9, 2.0**-10, 3 * 2.0**-11, 1e-30, -2.0**-8]])
    q = quantize(x, S("fp8_e4m3", Grouping(kind="row"), Grouping(kind="row")))
    assert q.scales.item() == 1.0
    ref = x.numpy().astype(ml_dtypes.float8_e4m3fn).astype(np.float32)
    assert np.array_equal(q.dequantize().numpy(), ref)
    assert torch.signbit(q.dequantize()[0, 6])


def test_asymmetric_int4_zero_point():
    x = torch.tensor([[0.0, 1.0, 2.0, 15.0]])
    s = S("int4", Grouping(kind="group", size=4), Grouping(kind="group", size=4), symmetric=False)
    q = quantize(x, s)
    # range [0, 15] over 15 steps: scale 1, zero point -8 (so 0.0 is code -8)
    assert q.scales.item() == 1.0 and q.zero_point.item() == -8
    assert q.element_values().tolist() == [[-8.0, -7.0, -6.0, 7.0]]
    assert torch.equal(q.dequantize(), x)


def test_pow2_scale_is_ceil_rule():
    x = torch.tensor([[500.0, 1.0]])
    q = quantize(x, S("fp8_e4m3", Grouping(kind="row"), Grouping(kind="row"), scale="pow2"))
    assert q.scales.item() == 2.0  # 2**ceil(log2(500/448)); no saturation
    assert q.dequantize()[0, 0].item() == 512.0  # 250 -> E4M3 256 (spacing 16 in [128, 256))


def test_passthrough_and_dequantize_alias():
    x = torch.randn(3, 5)
    q = quantize(x, "bf16")
    assert q.codes.dtype == torch.bfloat16 and q.scales is None
    assert torch.equal(dequantize(q), x.bfloat16().float())
    assert torch.equal(qdq(x, "fp32"), x)


def test_stochastic_rounding_is_unbiased():
    g = torch.Generator().manual_seed(1)
    s = S("int8", Grouping(kind="row"), Grouping(kind="row"), rounding="stochastic")
    x = torch.full((1, 4096), 0.3)
    x[0, 0] = 127.0
    d = qdq(x, s, generator=g)
    assert abs(d[0, 1:].mean().item() - 0.3) < 0.02
    assert set(d[0, 1:].unique().tolist()) == {0.0, 1.0}


def test_packed_codes_round_trip_shapes():
    x = torch.randn(7, 45)
    for name, cols in (("mxfp4", 23), ("nvfp4", 23), ("int4_g32", 6)):
        q = quantize(x, name)
        assert q.codes.shape == (7, cols)
        unpacked = Scheme.model_validate({**q.scheme.model_dump(), "packing": None})
        assert torch.equal(q.dequantize(), quantize(x, unpacked).dequantize())


def test_mx_scale_rules_hand_worked():
    """One MXFP8 (E4M3, max 448) block whose amax is 960.
    OCP v1.0: X = floor(log2 960) - emax(E4M3) = 9 - 8 = 1, scale 2: 960/2 = 480 clips to 448 -> 896.
    ceil (TransformerEngine): X = ceil(log2(960/448)) = ceil(1.0995) = 2, scale 4: 960/4 = 240, an
    E4M3 value (1.875 * 2**7) -> 960 exactly.
    A block whose amax/448 is exactly a power of two (amax 896) gets X = 1 under both rules."""
    import torch

    from pcc.numerics import Scheme, quantize

    x = torch.zeros(1, 32)
    x[0, 0] = 960.0
    ocp = quantize(x, Scheme.model_validate({"format": "mxfp8"}), role="weight")
    ceil = quantize(x, Scheme.model_validate({"format": "mxfp8", "scale_rule": "ceil"}), role="weight")
    assert int(ocp.scales.flatten()[0]) == 127 + 1 and int(ceil.scales.flatten()[0]) == 127 + 2
    assert ocp.dequantize()[0, 0].item() == 896.0 and ceil.dequantize()[0, 0].item() == 960.0
    x[0, 0] = 896.0
    for rule in ("ocp", "ceil"):
        q = quantize(x, Scheme.model_validate({"format": "mxfp8", "scale_rule": rule}), role="weight")
        assert int(q.scales.flatten()[0]) == 127 + 1 and q.dequantize()[0, 0].item() == 896.0


# ---------------------------------------------------------------- chunked, on the chunk workers

def _e4m3(a: np.ndarray) -> np.ndarray:
    return np.clip(a, -448, 448).astype(ml_dtypes.float8_e4m3fn).view(np.uint8)


def _blocks(x: np.ndarray, r: int, c: int) -> np.ndarray:
    """[rows, cols] -> [nbr, r, nbc, c], zero-padded (amax of a partial block is its real elements')."""
    n, k = x.shape
    p = np.zeros((-(-n // r) * r, -(-k // c) * c), dtype=x.dtype)
    p[:n, :k] = x
    return p.reshape(p.shape[0] // r, r, p.shape[1] // c, c)


@pytest.fixture
def small_chunks(monkeypatch):
    """Chunks of 4096 elements: the tensors below split into several chunks on the workers."""
    qm = importlib.import_module("pcc.numerics.quantize")  # the package's `quantize` is the function
    monkeypatch.setattr(qm, "_CHUNK", 4096)
    return qm


def test_chunked_fp8_block_matches_numpy_and_ml_dtypes(small_chunks):
    # batched [E, N, K] with partial blocks on both axes: blocks never cross an expert or a chunk edge
    g = torch.Generator().manual_seed(3)
    x = (torch.randn(3, 300, 200, generator=g) * torch.rand(3, 300, 1, generator=g) * 5).to(torch.bfloat16)
    x[1, 140:260] *= 100  # one block row of expert 1 far larger
    q = quantize(x, "fp8_block")
    for e in range(3):
        xb = _blocks(x[e].float().numpy(), 128, 128)
        s = (np.abs(xb).max(axis=(1, 3)) / np.float32(448)).astype(np.float32)
        assert np.array_equal(q.scales[e].numpy(), s)
        codes = _e4m3(xb / s[:, None, :, None]).reshape(384, 256)[:300, :200]
        assert np.array_equal(q.codes[e].view(torch.uint8).numpy(), codes)


def test_chunked_mxfp8_nvfp4_int4_match_independent_references(small_chunks):
    g = torch.Generator().manual_seed(4)
    x = (torch.randn(257, 96, generator=g) * torch.logspace(-3, 2, 257).unsqueeze(1)).float()
    xn = x.numpy()
    # MXFP8, OCP MX v1.0: E8M0 exponent floor(log2(amax)) - 8, codes e4m3(x / 2**e)
    q = quantize(x, "mxfp8")
    amax = np.abs(xn.reshape(257, 3, 32)).max(-1)
    e = np.floor(np.log2(amax)).astype(np.int32) - 8
    assert np.array_equal(q.scales.numpy().astype(np.int32) - 127, e)
    ref = _e4m3(xn.reshape(257, 3, 32) / np.exp2(e)[..., None].astype(np.float32)).reshape(257, 96)
    assert np.array_equal(q.codes.view(torch.uint8).numpy(), ref)
    # NVFP4 (TransformerEngine): S_enc = 2688 / amax(x), s_b = e4m3(amax_b * S_enc / 6), codes e2m1(x * S_enc / s_b)
    q = quantize(x, "nvfp4")
    s_enc = np.float32(448 * 6) / np.abs(xn).max()
    amax = np.abs(xn.reshape(257, 6, 16)).max(-1)
    s_b = (amax * (s_enc * np.float32(1 / 6))).astype(ml_dtypes.float8_e4m3fn)
    assert np.array_equal(q.scales.view(torch.uint8).numpy(), s_b.view(np.uint8))
    assert q.outer_scale.item() == s_enc
    factor = np.float32(1) / (s_b.astype(np.float32) * (np.float32(1) / s_enc))
    fp4 = (xn.reshape(257, 6, 16) * factor[..., None]).astype(ml_dtypes.float4_e2m1fn).view(np.uint8) & 0xF
    assert np.array_equal(q.element_values().numpy(),
                          fp4.reshape(257, 96).view(ml_dtypes.float4_e2m1fn).astype(np.float32))
    # INT4 group 32, symmetric: s = amax / 7, codes round-half-even(x / s)
    q = quantize(x, "int4_g32")
    amax = np.abs(xn.reshape(257, 3, 32)).max(-1)
    s = (amax / np.float32(7)).astype(np.float32)
    assert np.array_equal(q.scales.numpy(), s)
    codes = np.clip(np.rint(xn.reshape(257, 3, 32) / s[..., None]), -7, 7).reshape(257, 96)
    assert np.array_equal(q.element_values().numpy(), codes)


def test_chunked_nonfinite_names_the_first_block(small_chunks):
    x = torch.randn(512, 256)
    x[400, 3] = float("nan")
    x[300, 200] = float("inf")  # an earlier block, in another chunk
    with pytest.raises(ValueError, match=r"w: NaN or inf in scale block \(2, 1\)"):
        quantize(x, "fp8_block", name="w")


def test_chunks_run_on_workers_with_one_intra_op_thread(small_chunks):
    qm = small_chunks
    seen, before = [], torch.get_num_threads()
    qm.run_chunks(lambda k: seen.append((threading.current_thread().name, torch.get_num_threads())), range(8))
    if qm.cores() > 1:
        assert all(name.startswith("pcc-chunks") and n == 1 for name, n in seen), seen
    assert len(seen) == 8 and torch.get_num_threads() == before
    with pytest.raises(ZeroDivisionError):  # a worker's error reaches the caller
        qm.run_chunks(lambda k: 1 / (k - 3), range(6))


def test_chunk_workers_are_kept_on_distinct_cores_and_the_caller_is_not(small_chunks):
    """Each worker is pinned to one core of the process's mask (the kernel's balancer otherwise left
    them sharing one core beside a busy neighbour), and the caller's own affinity is untouched."""
    import os

    qm = small_chunks
    if not hasattr(os, "sched_getaffinity") or qm.cores() < 2:
        pytest.skip("needs per-thread affinity (Linux) and two usable cores")
    mask = os.sched_getaffinity(0)
    qm._pool()
    seen, gate = {}, threading.Barrier(qm.cores())

    def where(k):
        gate.wait(timeout=10)  # every worker holds one item at once, so each reports
        seen[threading.current_thread().name] = os.sched_getaffinity(0)

    qm.run_chunks(where, range(qm.cores()))
    assert len(seen) == qm.cores()
    pinned = [next(iter(m)) for m in seen.values()]
    assert all(len(m) == 1 for m in seen.values()) and len(set(pinned)) == len(pinned) and set(pinned) <= mask
    assert os.sched_getaffinity(0) == mask


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_16_bit_inputs_amax_by_magnitude_bits(dtype):
    # block amax of BF16/FP16 inputs is taken on their magnitude bits: subnormals, -0.0, the largest
    # finite value and negative values must give the same scales and codes as numpy on the float32 values
    fi = torch.finfo(dtype)
    g = torch.Generator().manual_seed(5)
    x = (torch.randn(256, 384, generator=g) * 3).to(dtype)
    x[0:128, 0:128] = torch.tensor(fi.smallest_normal / 4, dtype=dtype)  # a subnormal block
    x[0:128, 128:256] = -0.0
    x[5, 130] = -fi.tiny  # the only nonzero of its block, negative
    x[200, 300] = -fi.max
    q = quantize(x, "fp8_block")
    xb = _blocks(x.float().numpy(), 128, 128)
    amax = np.abs(xb).max(axis=(1, 3))
    # docs/numerics.md: s = amax / 448, at least the smallest normal float32; an all-zero block 1.0
    s = np.maximum((amax / np.float32(448)).astype(np.float32), np.finfo(np.float32).tiny)
    s[amax == 0] = 1.0
    assert np.array_equal(q.scales.numpy(), s)
    assert np.array_equal(q.codes.view(torch.uint8).numpy(), _e4m3(xb / s[:, None, :, None]).reshape(256, 384))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("bad", [float("nan"), -float("nan"), float("inf"), -float("inf")])
def test_16_bit_nonfinite_found_by_magnitude_bits(dtype, bad):
    x = torch.randn(256, 256).to(dtype)
    x[130, 70] = bad
    with pytest.raises(ValueError, match=r"w: NaN or inf in scale block \(1, 0\)"):
        quantize(x, "fp8_block", name="w")
    with pytest.raises(ValueError, match=r"w: NaN or inf in scale block \(130, 2\)"):
        quantize(x, "mxfp8", name="w")


def test_a_forked_child_quantizes_with_its_own_workers(small_chunks):
    """The parent's chunk workers do not exist in a forked child: it must not wait on them."""
    import multiprocessing

    x = torch.randn(64, 256)
    want = quantize(x, "mxfp8").codes.view(torch.uint8)  # starts the parent's pool
    ctx = multiprocessing.get_context("fork")
    with ctx.Pool(1) as pool:
        got = pool.apply_async(_codes_in_child, (x,)).get(timeout=60)
    assert torch.equal(torch.from_numpy(got), want)


def _codes_in_child(x):
    return quantize(x, "mxfp8").codes.view(torch.uint8).numpy()


@pytest.mark.parametrize("scheme", [
    {"format": "fp8_e4m3", "weights": {"kind": "block", "rows": 1, "cols": 32}},
    {"format": "fp8_e4m3", "weights": {"kind": "block", "rows": 1, "cols": 32}, "scale": "pow2"},
    {"format": "fp8_e5m2", "weights": {"kind": "block", "rows": 1, "cols": 32}},
    {"format": "mxfp8", "scale_rule": "ceil"},
])
def test_unclamped_fp8_codes_stay_in_range_where_amax_over_its_scale_rounds_up(scheme):
    """Where the scale bounds |x/s| by the format's max (fp32 fl(amax/max), pow2, E8M0 no-clip rule) the
    quantizer does not clamp: 20 000 blocks whose amax is a random float32 over 60 binades (with fp32
    scales hundreds give x/s just above max) all give ml_dtypes' code of the clamped quotient, never NaN."""
    g = torch.Generator().manual_seed(11)
    amax = torch.exp2(torch.rand(20000, 1, generator=g) * 60 - 30) * (1 + torch.rand(20000, 1, generator=g))
    x = torch.rand(20000, 32, generator=g) * 2 - 1
    x[:, :1] = 1
    x = (x * amax).float()
    q = quantize(x, Scheme.model_validate(scheme), role="weight")
    fmt = {"fp8_e5m2": ml_dtypes.float8_e5m2}.get(scheme["format"], ml_dtypes.float8_e4m3fn)
    top = float(ml_dtypes.finfo(fmt).max)
    scale = (q.scales.float() if scheme.get("scale_rule") != "ceil"
             else torch.exp2(q.scales.to(torch.int32).float() - 127)).numpy().reshape(20000, 1)
    ref = np.clip(x.numpy() / scale, -top, top).astype(fmt).view(np.uint8)
    got = q.codes.view(torch.uint8).numpy()
    assert np.array_equal(got, ref)
    assert not np.isnan(got.view(fmt).astype(np.float32)).any()
    if scheme.get("scale", "fp32") == "fp32" and scheme["format"] != "mxfp8":  # the case the clamp caught
        assert (np.abs(x.numpy()[:, 0] / scale[:, 0]) > top).sum() > 100


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32, torch.float64,
                                   torch.float8_e4m3fn])
def test_all_finite_agrees_with_numpy_on_every_special_value(small_chunks, dtype):
    """all_finite (magnitude bits, chunks on the workers) against numpy's isfinite of the float64 values:
    the largest finite value, subnormals and -0.0 are finite; one NaN or +-inf anywhere, in any chunk, is not."""
    from pcc.numerics import all_finite

    info = torch.finfo(dtype)
    base = torch.tensor([info.max, -info.max, info.tiny / 4 if dtype != torch.float8_e4m3fn else info.tiny,
                         -0.0, 0.0, 1.0], dtype=torch.float64).to(dtype)
    x = base.repeat(5000)  # 30 000 elements: 8 chunks of 4096
    assert all_finite(x) and np.isfinite(x.double().numpy()).all()
    assert all_finite(torch.arange(10)) and all_finite(torch.empty(0, dtype=dtype))
    specials = [float("nan")] + ([] if dtype == torch.float8_e4m3fn else [float("inf"), -float("inf")])
    for bad in specials:
        for at in (0, 4095, 4096, 29_999):
            y = x.clone()
            y.view(-1)[at] = bad
            assert not all_finite(y) and not np.isfinite(y.double().numpy()).all()


def test_e8m0_exponents_and_factors_against_numpy_over_every_binade():
    """The E8M0 exponent read from amax's float32 bits (OCP) and by frexp of amax/max (ceil) against
    numpy's float64 frexp, and 2**e against np.ldexp, for amaxes in every binade (subnormals, 0, max):
    the same bytes the OCP MX v1.0 rule and TransformerEngine's give."""
    qm = importlib.import_module("pcc.numerics.quantize")
    a = torch.arange(0, 0x7F800000, 4093, dtype=torch.int64).to(torch.int32).view(torch.float32)
    a = torch.cat([a, torch.tensor([0.0, 2.0**-149, 2.0**-127, 2.0**-126, 448.0, 896.0, 960.0, 3.4028235e38])])
    an = a.numpy().astype(np.float64)
    for emax, qmax in ((8, 448.0), (2, 6.0), (15, 57344.0)):
        ocp = qm._e8m0_exponent(a, emax, "ocp", qmax).numpy()
        ref = np.where(an > 0, np.frexp(np.where(an > 0, an, 1.0))[1] - 1 - emax, 0).clip(-127, 127)
        assert np.array_equal(ocp, ref)
        ceil = qm._e8m0_exponent(a, emax, "ceil", qmax).numpy()
        r = (a.numpy() / np.float32(qmax)).astype(np.float64)  # the float32 quotient, as the rule takes it
        m, e = np.frexp(np.where(an > 0, r, 1.0))
        assert np.array_equal(ceil, np.where(an > 0, e - (m == 0.5), 0).clip(-127, 127))
        for exp in (ocp, ceil):
            got = importlib.import_module("pcc.numerics.formats").pow2(torch.from_numpy(exp)).numpy()
            assert np.array_equal(got, np.ldexp(np.float32(1), exp).astype(np.float32))


@pytest.mark.parametrize("scheme", ["fp8_block", "mxfp8", "mxfp4", "nvfp4", "int4_g32",
                                    {**preset("int4_g32").model_dump(), "packing": None, "symmetric": False}])
def test_codes_written_into_out_are_the_fresh_codes_and_fill_it_exactly(scheme):
    """quantize(out=) writes the codes into the front of the caller's bytes (the converter's recycled
    buffers): every code byte is overwritten (the buffer starts as 0xA5 garbage), the bytes after them
    are left alone, and codes_nbytes is their size."""
    from pcc.numerics import codes_nbytes

    x = torch.randn(130, 96, dtype=torch.bfloat16)
    fresh = quantize(x, scheme)
    nbytes = fresh.codes.numel() * fresh.codes.element_size()
    assert codes_nbytes(x.shape, scheme) == nbytes
    buf = torch.full((nbytes + 64,), 0xA5, dtype=torch.uint8)
    q = quantize(x, scheme, out=buf)
    assert q.codes.untyped_storage().data_ptr() == buf.untyped_storage().data_ptr()
    assert q.codes.dtype == fresh.codes.dtype and q.codes.shape == fresh.codes.shape
    assert torch.equal(q.codes.view(torch.uint8), fresh.codes.view(torch.uint8))
    assert torch.equal(q.scales.view(torch.uint8), fresh.scales.view(torch.uint8))
    assert bool((buf[nbytes:] == 0xA5).all())
    with pytest.raises(ValueError, match=f"at least {nbytes} bytes"):
        quantize(x, scheme, out=buf[: nbytes - 1])
    with pytest.raises(ValueError, match="uint8"):
        quantize(x, scheme, out=torch.empty(nbytes, dtype=torch.float32))


def test_codes_nbytes_of_pass_through_and_batched_blocks():
    from pcc.numerics import codes_nbytes

    assert codes_nbytes((64, 64), "bf16") == 0
    x = torch.randn(3, 130, 200)  # block grouping per batch slice: one code per element
    assert codes_nbytes(x.shape, "fp8_block") == quantize(x, "fp8_block").codes.numel() == 3 * 130 * 200
