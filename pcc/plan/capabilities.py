"""The capability tables in targets/ (hardware x format), read once."""

from __future__ import annotations

from functools import lru_cache

from pcc.resources import target_table


@lru_cache(maxsize=1)
def hardware_table() -> dict[str, dict]:
    return target_table("hardware")["hardware"]


def gemm_support(hardware: str, fmt: str, weight_only: bool) -> str:
    """'native', 'weight_only', 'emulated' (cpu) or 'none' for a real GEMM in `fmt`."""
    hw = hardware_table()[hardware]
    if hw.get("emulated"):
        return "emulated"
    if fmt in hw["native"]:
        return "native"
    if weight_only and fmt in hw["weight_only"]:
        return "weight_only"
    return "none"


def supported_on(fmt: str) -> list[str]:
    return [name for name, hw in hardware_table().items() if fmt in hw["native"] + hw["weight_only"]]
