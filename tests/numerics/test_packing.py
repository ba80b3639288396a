import pytest
import torch

from pcc.numerics import Grouping, Scheme, quantize
from pcc.numerics.packing import pack_e2m1x2, pack_int32x8, unpack_e2m1x2, unpack_int32x8


def S(fmt, weights=None, activations=None, **kw):
    """A scheme from positional groupings (weights, activations), as these tests write them."""
    return Scheme(format=fmt, weights=weights, activations=activations, **kw)


def test_e2m1x2_low_nibble_is_the_even_element():
    # gpt-oss / SGLang *_blocks: element 2i in bits 0..3, element 2i+1 in bits 4..7
    assert pack_e2m1x2(torch.tensor([1, 2], dtype=torch.uint8)).tolist() == [0x21]
    assert pack_e2m1x2(torch.tensor([[0xF, 0x0, 0x7, 0x8]], dtype=torch.uint8)).tolist() == [[0x0F, 0x87]]
    assert pack_e2m1x2(torch.tensor([5, 6, 7], dtype=torch.uint8)).tolist() == [0x65, 0x07]  # odd tail padded


def test_e2m1x2_round_trip():
    codes = torch.randint(0, 16, (3, 5, 33), dtype=torch.uint8)
    assert torch.equal(unpack_e2m1x2(pack_e2m1x2(codes), 33), codes)


def test_int32x8_bit_order_matches_compressed_tensors():
    # compressed-tensors pack_to_int32: value + 8 as an unsigned nibble, element j of a word in bits 4j..4j+3
    codes = torch.tensor([[-8, -7, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 7]], dtype=torch.int8)
    words = pack_int32x8(codes)
    assert words.dtype == torch.int32 and words.shape == (1, 2)
    assert words[0, 0].item() == 0x76543210
    assert words[0, 1].item() == 0xFEDCBA98 - 2**32  # the same 32 bits read as signed int32
    one = pack_int32x8(torch.tensor([[1, 0, 0]], dtype=torch.int8))  # tail padded with nibble 0 (= -8)
    assert one.tolist() == [[0x889]]  # nibbles 9, 8, 8, then five padding zeros


def test_int32x8_round_trip_and_packed_dim0():
    codes = torch.randint(-8, 8, (9, 21), dtype=torch.int8)
    assert torch.equal(unpack_int32x8(pack_int32x8(codes), 21), codes)
    packed0 = pack_int32x8(codes, dim=0)  # how compressed-tensors packs zero points
    assert packed0.shape == (2, 21)
    assert torch.equal(unpack_int32x8(packed0, 9, dim=0), codes)


def test_quantized_int4_packs_codes_per_row():
    x = torch.tensor([[7.0, -7.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0]])
    q = quantize(x, S("int4", Grouping(kind="group", size=8), Grouping(kind="group", size=8), packing="int32x8"))
    # codes 7, -7, 1, 0... -> nibbles 15, 1, 9, 8, 8, 8, 8, 8
    assert q.codes.tolist() == [[0x8888891F - 2**32]]


@pytest.mark.parametrize("k", [1, 2, 31, 32, 33])
def test_quantized_fp4_packing_any_width(k):
    x = torch.randn(4, k)
    q = quantize(x, "mxfp4")
    assert q.codes.shape == (4, (k + 1) // 2)
    assert q.dequantize().shape == x.shape
