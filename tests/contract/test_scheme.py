"""One scheme model: the .prec text, a YAML/JSON dict and a preset name give the same object;
defaults live in one table; validity is one function (problems) that numerics enforces."""

import pytest
from pydantic import ValidationError

from pcc.contract.scheme import FORMATS, PRESETS, Grouping, Scheme, preset
from pcc.lang.build import parse_scheme
from pcc.numerics import quantize

import torch


def g(kind, **kw):
    return Grouping(kind=kind, **kw)


def test_text_dict_and_preset_are_one_object():
    text = Scheme.model_validate(parse_scheme("fp8_e4m3 weights block 128x128 activations tile 1x128 scale fp32"))
    written = Scheme.model_validate({"format": "fp8_e4m3", "weights": {"kind": "block", "rows": 128, "cols": 128},
                                     "activations": {"kind": "tile", "rows": 1, "cols": 128}})
    assert text == written == preset("fp8_block")
    assert written.gradients == g("tile", rows=1, cols=128)  # gradients follow activations


@pytest.mark.parametrize("fmt,roles,group,scale", [
    ("mxfp8", ("weights", "activations", "gradients"), g("group", size=32), "e8m0"),
    ("mxfp4", ("weights",), g("group", size=32), "e8m0"),
    ("nvfp4", ("weights", "activations", "gradients"), g("group", size=16), "e4m3_fp32"),
    ("int4", ("weights",), g("group", size=128), "fp32"),
    ("int8", ("weights", "activations"), g("row"), "fp32"),
    ("fp8_e5m2", ("weights", "activations", "gradients"), g("tensor"), "fp32"),
])
def test_format_defaults_from_yaml_dict(fmt, roles, group, scale):
    s = Scheme.model_validate({"format": fmt})  # what a YAML `{format: int4}` gives
    for r in ("weights", "activations", "gradients"):
        assert s.grouping_of(r) == (group if r in roles else None), r
    assert s.scale == scale and s.symmetric and s.packing == FORMATS[fmt].packing


def test_weight_only_presets_stay_weight_only():
    # The issue: numerics used to quantize activations for these (int4_g32 became activations group 128).
    for name in ("mxfp4", "int4_g32", "int4_g128"):
        s = preset(name)
        assert s.activations is None and s.gradients is None, name
    assert preset("int4_g32").weights == g("group", size=32)


def test_bare_grouping_shorthand_same_in_every_syntax():
    a = Scheme.model_validate(parse_scheme("int4 group 32"))
    b = Scheme.model_validate({"format": "int4", "grouping": {"kind": "group", "size": 32}})
    assert a == b == preset("int4_g32")
    assert "grouping" not in a.model_dump()


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_minimal_round_trips_through_text(name):
    s = preset(name)
    assert Scheme.model_validate(s.minimal()) == s
    assert Scheme.model_validate(parse_scheme(s.text())) == s


@pytest.mark.parametrize("d,msg", [
    ({"format": "bf16", "weights": {"kind": "tensor"}}, "wide format"),
    ({"format": "int4", "grouping": {"kind": "row"}, "weights": {"kind": "row"}}, "bare grouping"),
    ({"format": "fp6"}, "format"),
    ({"format": "int4", "weights": {"kind": "tile", "rows": 2, "cols": 128}}, "1xK"),
    ({"format": "int4", "weights": {"kind": "block", "rows": 128}}, "cols"),
    ({"format": "int4", "weights": {"kind": "group", "size": 0}}, "size"),
    ({"format": "int4", "rounding": "down"}, "rounding"),
    ({"format": "int4", "colour": 1}, "colour"),
])
def test_structural_errors_are_validation_errors(d, msg):
    with pytest.raises(ValidationError, match=msg):
        Scheme.model_validate(d)


@pytest.mark.parametrize("d,msg", [
    ({"format": "mxfp8", "weights": {"kind": "group", "size": 16}}, "groups of 32"),
    ({"format": "mxfp4", "scale": "fp32"}, "e8m0"),
    ({"format": "nvfp4", "weights": {"kind": "group", "size": 32}}, "groups of 16"),
    ({"format": "fp8_e4m3", "packing": "e2m1x2"}, "e2m1x2"),
    ({"format": "mxfp4", "packing": "int32x8"}, "int32x8"),
    ({"format": "fp8_e4m3", "scale": "e4m3_fp32"}, "NVFP4"),
    ({"format": "fp8_e4m3", "symmetric": False}, "asymmetric"),
    ({"format": "int4", "weights": {"kind": "token"}}, "per group or per row"),
    ({"format": "fp8_e4m3", "scale_rule": "ceil"}, "scale_rule"),
])
def test_problems_are_what_numerics_refuses(d, msg):
    s = Scheme.model_validate(d)
    assert any(msg in m for m, _ in s.problems())
    with pytest.raises(ValueError, match=msg):
        quantize(torch.ones(4, 64), s)


def test_fp8_with_ue8m0_scales_is_valid_and_quantizes():
    # Block FP8 with power-of-two UE8M0 scales (SGLang's scale_fmt ue8m0) is a real layout.
    s = Scheme.model_validate({"format": "fp8_e4m3", "weights": {"kind": "block", "rows": 128, "cols": 128},
                               "scale": "e8m0", "scale_rule": "ceil"})
    assert s.problems() == []
    q = quantize(torch.full((128, 128), 3.0), s)
    assert torch.equal(q.dequantize(), torch.full((128, 128), 3.0))


def test_weight_bytes():
    # 4096x4096 block FP8: 16 Mi codes + 32x32 fp32 scales.
    assert preset("fp8_block").weight_bytes((4096, 4096)) == 4096 * 4096 + 32 * 32 * 4
    # NVFP4: half a byte per value, one e4m3 per 16, one fp32 outer scale.
    assert preset("nvfp4").weight_bytes((256, 512)) == 256 * 512 // 2 + 256 * 32 + 4
    assert preset("bf16").weight_bytes((10, 10)) == 200
