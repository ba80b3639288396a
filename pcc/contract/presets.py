"""Built-in schemes, written in the language's own scheme syntax.

A rule may name a scheme the contract defines, one of these presets, or a bare
format (its defaults). The contract's own definitions win over presets.
"""

from __future__ import annotations

from functools import lru_cache

from pcc.contract.model import SchemeSpec

PRESETS: dict[str, str] = {
    "bf16": "bf16",
    "fp16": "fp16",
    "fp32": "fp32",
    "fp8_tensor": "fp8_e4m3 tensor scale fp32",
    "fp8_row": "fp8_e4m3 weights row activations token scale fp32",
    "fp8_block": "fp8_e4m3 weights block 128x128 activations tile 1x128 scale fp32",
    "fp8_delayed": "fp8_e4m3 tensor scale fp32 amax delayed",
    "mxfp8": "mxfp8",
    "mxfp4": "mxfp4",
    "nvfp4": "nvfp4",
    "int4_g32": "int4 group 32",
    "int4_g64": "int4 group 64",
    "int4_g128": "int4 group 128",
    "fp8_e4m3": "fp8_e4m3",
    "fp8_e5m2": "fp8_e5m2",
    "int8": "int8",
    "int4": "int4",
}


@lru_cache(maxsize=None)
def preset(name: str) -> SchemeSpec | None:
    text = PRESETS.get(name)
    if text is None:
        return None
    from pcc.lang.build import parse_scheme

    return SchemeSpec.model_validate(parse_scheme(text))


def lookup(schemes: dict[str, SchemeSpec], name: str) -> SchemeSpec | None:
    """A rule's scheme by name: the contract's own, else a preset."""
    return schemes.get(name) or preset(name)
