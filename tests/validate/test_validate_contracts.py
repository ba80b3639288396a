"""Shipped contracts on their CPU-size stand-ins (`--model auto`): each compiles on the catalog
docs/runtime.md names, and a representative set (static NVFP4 activations + LoRA, MLA with an FP8
KV cache, shared experts with MXFP4 experts + LoRA, 128-wide INT4) passes the ladder with the
contract's own expectations. bench/runtime.py --validate runs every contract and prints the table."""

from __future__ import annotations

from pathlib import Path

import pytest

from pcc.runtime.contract import compile_for_runtime
from pcc.validate.context import ValidateConfig
from pcc.validate.ladder import parse_levels, validate

ROOT = Path(__file__).resolve().parents[2]
STAND_IN = {"bf16_baseline": "tiny_moe", "unified_fp8": "tiny_moe", "unified_fp8_fake_fwd": "tiny_moe",
            "unified_fp8_fake_fwd_bwd": "tiny_moe", "mxfp8_blackwell": "tiny_moe", "miles_mode1": "tiny_moe",
            "qwen38_nvfp4_lora": "tiny_moe", "selective_nvfp4": "tiny_moe", "int4_qat_w4a16": "tiny_moe_128",
            "glm52_fp8_rollout": "tiny_shared_moe", "k3_mxfp4_lora": "tiny_shared_moe", "tiny_cpu": "tiny_moe"}
SHORT = {"steps": 20, "batch": 32, "lr": 2e-3, "revision": 1}  # a policy, not a good one (cached)
CFG = dict(steps=2, prompts=16)


def test_every_shipped_contract_has_its_stand_in():
    shipped = sorted(p.stem for p in (ROOT / "contracts").glob("*.prec"))
    assert shipped == sorted(STAND_IN)
    for name in shipped:
        assert compile_for_runtime(str(ROOT / "contracts" / f"{name}.prec"), "auto").plan.catalog.name == STAND_IN[name]


# k3's level 6 compares an adapter change seen through an MXFP4 base with the trainer's BF16 base: on a
# barely trained policy the two respond differently (change cosine 0.45), so it runs the full warm start.
@pytest.mark.parametrize("name, levels, short", [("qwen38_nvfp4_lora", "1-8", True), ("glm52_fp8_rollout", "1-8", True),
                                                 ("k3_mxfp4_lora", "1-8", False), ("int4_qat_w4a16", "1-6", True)])
def test_contract_passes_the_ladder_on_its_stand_in(tmp_path, name, levels, short):
    cfg = ValidateConfig(**CFG, **({"warm": SHORT} if short else {}))
    r = validate(str(ROOT / "contracts" / f"{name}.prec"), parse_levels(levels), tmp_path, model="auto",
                 cfg=cfg, plots=False)
    assert r["ok"], [(lv["level"], [c for c in lv["checks"] if c["ok"] is not True]) for lv in r["levels"]
                     if lv["status"] != "pass"]
    by = {lv["level"]: lv for lv in r["levels"]}
    assert r["model"] == STAND_IN[name]
    if name == "qwen38_nvfp4_lora":  # static input scales: decoding through the cache is one prefill
        assert by[5]["figures"]["decode vs prefill abs_dlogp p99"] < 0.01  # 0.45 with per-call scales
        assert by[2]["figures"]["static input_scale operators"] == 96
