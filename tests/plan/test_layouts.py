"""The checkpoint layout registry (pcc.plan.layouts): one class per layout, found by name, and at
most one layout per scheme, so `layout_of` does not depend on which module registered first."""

from pcc.contract.scheme import PRESETS, preset
from pcc.plan.layouts import LAYOUTS, layout_of, named


def test_every_layout_is_registered_by_its_name():
    assert set(LAYOUTS) == {"wide", "fp8_block", "fp8_tensor", "mxfp8", "mxfp4", "nvfp4", "int4", "int8",
                            "fp8_static", "nvfp4_w4a16", "mixed"}  # the last three: ModelOpt MIXED_PRECISION only
    assert all(named(name).name == name for name in LAYOUTS)
    assert len({type(x) for x in LAYOUTS.values()}) == len(LAYOUTS)


def test_each_scheme_has_at_most_one_layout():
    expect = {"fp8_tensor": "fp8_tensor", "fp8_row": None, "fp8_block": "fp8_block", "int4_g128": "int4",
              "bf16": "wide", "mxfp8": "mxfp8", "mxfp4": "mxfp4", "nvfp4": "nvfp4", "fp8_e5m2": None,
              "w8a8_int8": "int8", "int8": "int8"}
    for name in PRESETS:
        spec = preset(name)
        accepting = [x.name for x in LAYOUTS.values() if x.accepts(spec)]
        assert len(accepting) <= 1, (name, accepting)
        if name in expect:
            assert (layout_of(spec).name if layout_of(spec) else None) == expect[name], name
    assert not any(named(n).accepts(preset(p)) for n in ("fp8_static", "nvfp4_w4a16", "mixed") for p in PRESETS)


def test_int8_layout_is_compressed_tensors_w8a8_only():
    """vLLM's and SGLang's CompressedTensorsW8A8Int8 load int8 weights by channel, symmetric, static, with
    activations by token, dynamic; anything else has no int8 checkpoint layout (PCC608 at check)."""
    from pcc.contract.scheme import Scheme

    int8 = named("int8")
    assert layout_of(preset("w8a8_int8")) is int8
    for other in ({"format": "int8", "weights": {"kind": "row"}},  # W8A16: their WNA16, pack-quantized
                  {"format": "int8", "grouping": {"kind": "row"}, "symmetric": False},
                  {"format": "int8", "grouping": {"kind": "tensor"}},
                  {"format": "int8", "weights": {"kind": "group", "size": 128}, "activations": {"kind": "token"}},
                  {"format": "int8", "grouping": {"kind": "row"}, "amax": "delayed"}):
        assert layout_of(Scheme.model_validate(other)) is None, other


def test_int8_quantization_config_is_compressed_tensors_w8a8_preset():
    """The config pcc writes is compressed-tensors' own model_dump of its W8A8 preset (the library pcc
    compiles without, so the layout writes it out; this compares the two)."""
    import pytest

    ct = pytest.importorskip("compressed_tensors.quantization")
    skip = ["model.embed_tokens", "lm_head"]
    ref = ct.QuantizationConfig(config_groups={"group_0": ct.preset_name_to_scheme("W8A8", ["Linear"])},
                                format="int-quantized", quantization_status="compressed", ignore=skip)
    assert named("int8").quantization_config(preset("w8a8_int8"), skip, None) == ref.model_dump()
