"""The checkpoint layout registry (pcc.plan.layouts): one class per layout, found by name, and at
most one layout per scheme, so `layout_of` does not depend on which module registered first."""

from pcc.contract.scheme import PRESETS, preset
from pcc.plan.layouts import LAYOUTS, layout_of, named


def test_every_layout_is_registered_by_its_name():
    assert set(LAYOUTS) == {"wide", "fp8_block", "fp8_tensor", "mxfp8", "mxfp4", "nvfp4", "int4"}
    assert all(named(name).name == name for name in LAYOUTS)
    assert len({type(x) for x in LAYOUTS.values()}) == len(LAYOUTS)


def test_each_scheme_has_at_most_one_layout():
    expect = {"fp8_tensor": "fp8_tensor", "fp8_row": None, "fp8_block": "fp8_block", "int4_g128": "int4",
              "bf16": "wide", "mxfp8": "mxfp8", "mxfp4": "mxfp4", "nvfp4": "nvfp4", "fp8_e5m2": None}
    for name in PRESETS:
        spec = preset(name)
        accepting = [x.name for x in LAYOUTS.values() if x.accepts(spec)]
        assert len(accepting) <= 1, (name, accepting)
        if name in expect:
            assert (layout_of(spec).name if layout_of(spec) else None) == expect[name], name
