import pytest

from pcc.numerics import PRESETS, Grouping, Scheme

CANONICAL = {"format": "fp8_e4m3",
             "weights": {"kind": "block", "rows": 128, "cols": 128},
             "activations": {"kind": "tile", "rows": 1, "cols": 128},
             "gradients": None, "scale": "fp32", "rounding": "nearest_even", "packing": None, "symmetric": True}


def test_canonical_dict_round_trip_and_defaults():
    s = Scheme.from_dict(CANONICAL)
    assert s == Scheme.preset("fp8_block")
    d = s.to_dict()
    assert d["gradients"] == {"kind": "tile", "rows": 1, "cols": 128}  # null -> same as activations
    assert Scheme.from_dict(d) == s
    for name, preset in PRESETS.items():
        assert Scheme.from_dict(preset.to_dict()) == preset, name


@pytest.mark.parametrize("fmt,group,scale", [("mxfp8", 32, "e8m0"), ("mxfp4", 32, "e8m0"),
                                             ("nvfp4", 16, "e4m3_fp32"), ("int4", 128, "fp32")])
def test_format_defaults(fmt, group, scale):
    s = Scheme.from_dict({"format": fmt})
    assert s.weights == s.activations == s.gradients == Grouping("group", size=group)
    assert s.scale == scale and s.symmetric


def test_fp8_defaults_are_per_tensor():
    s = Scheme.from_dict({"format": "fp8_e5m2", "weights": None})
    assert s.weights == Grouping("tensor") and s.scale == "fp32"


@pytest.mark.parametrize("d,msg", [
    ({"format": "mxfp8", "weights": {"kind": "group", "size": 16}}, "group 32"),
    ({"format": "mxfp4", "scale": "fp32"}, "e8m0"),
    ({"format": "nvfp4", "weights": {"kind": "group", "size": 32}}, "group 16"),
    ({"format": "nvfp4", "scale": "e8m0"}, "e4m3_fp32"),
    ({"format": "fp8_e4m3", "packing": "e2m1x2"}, "e2m1x2"),
    ({"format": "mxfp4", "packing": "int32x8"}, "int32x8"),
    ({"format": "fp8_e4m3", "scale": "e8m0"}, "mxfp"),
    ({"format": "fp8_e4m3", "symmetric": False}, "asymmetric"),
    ({"format": "bf16", "weights": {"kind": "tensor"}}, "pass-through"),
    ({"format": "fp6"}, "format"),
    ({"format": "int4", "weights": {"kind": "tile", "rows": 2, "cols": 128}}, "one row"),
    ({"format": "int4", "weights": {"kind": "block", "rows": 128}}, "cols"),
    ({"format": "int4", "weights": {"kind": "group", "size": 0}}, "size"),
    ({"format": "int4", "rounding": "down"}, "rounding"),
    ({"format": "int4", "colour": 1}, "unknown"),
])
def test_inconsistent_schemes_raise(d, msg):
    with pytest.raises(ValueError, match=msg):
        Scheme.from_dict(d)


def test_presets():
    assert Scheme.preset("fp8_block").weights == Grouping("block", 128, 128)
    assert Scheme.preset("fp8_row").activations == Grouping("token")
    assert Scheme.preset("nvfp4").packing == "e2m1x2"
    assert Scheme.preset("int4_g32").weights == Grouping("group", size=32)
    assert Scheme.preset("int4_g128").packing == "int32x8"
    assert Scheme.preset("bf16").passthrough
    with pytest.raises(ValueError, match="unknown scheme preset"):
        Scheme.preset("fp7")


def test_parse_preset_name():
    assert Scheme.parse(" mxfp4 ") == Scheme.preset("mxfp4")


def test_parse_language_text():
    s = Scheme.parse("fp8_e4m3 weights block 128x128 activations tile 1x128 scale fp32")
    assert s == Scheme.preset("fp8_block")
