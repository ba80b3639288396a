"""Derived facts are computed once on the Plan and every report reads them: explain, the converter
plan and diff give the same byte counts (the issue: 21,126,153,216 vs 21,126,223,872 B)."""

import dataclasses
import json
from pathlib import Path

import pytest

from pcc.diff import diff
from pcc.lower import compile_file, lower
from pcc.plan.dump import plan_json
from pcc.plan.explain import explain
from pcc.plan.tensors import nbytes

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("name", ["selective_nvfp4", "int4_qat_w4a16", "qwen38_nvfp4_lora", "tiny_cpu",
                                  "mxfp8_blackwell"])
def test_explain_converter_and_diff_agree_on_bytes(name, tmp_path):
    path = ROOT / "contracts" / f"{name}.prec"
    plan = compile_file(str(path)).plan
    conv = json.loads(lower(plan, "converter").files["convert/plan.json"])
    reps = {r["name"]: r["bytes"] for r in explain(plan)["representations"]}
    # every distinct checkpoint tensor the converter writes, counted once
    written = {n: nbytes(t) for e in conv["tensors"] for n, t in e["targets"].items()}
    assert plan.rollout_bytes == sum(written.values())
    adapter = 2 * plan.adapter_params
    assert reps["rollout weights (packed)"] == plan.rollout_bytes + adapter
    assert reps["sync payload per version"] == conv["sync"]["bytes_per_version"] == plan.sync_bytes
    # diff reads the same accounting (against the BF16 baseline, every representation moves)
    rows = diff(str(path), str(ROOT / "contracts" / "bf16_baseline.prec"), targets=())["consequences"]["bytes"]
    assert rows and all(reps[r["name"]] == r["a"] for r in rows if r["name"] in reps and r["a"] is not None)


def test_selective_nvfp4_rollout_bytes_count_every_checkpoint_tensor():
    # NVFP4 carries weight_scale_2 and input_scale per tensor: the number the converter writes.
    plan = compile_file(str(ROOT / "contracts" / "selective_nvfp4.prec")).plan
    assert plan.rollout_bytes == 21_126_223_872


def test_decisions_are_shared_per_rule_and_carry_the_rule():
    plan = compile_file(str(ROOT / "contracts" / "unified_fp8.prec")).plan
    ops = plan.catalog.operators
    q = [i for i, op in enumerate(ops) if op.family == "attn.q"]
    d = plan.decision("fprop", q[0])
    assert d is plan.decision("fprop", q[-1])
    assert (d.scheme_name, d.gemm, d.recipe) == ("fp8_block", "real", "blockwise")
    assert d.rule is not None and plan.smap.find(d.path).line > 0
    router = next(i for i, op in enumerate(ops) if op.family == "router")
    assert plan.decision("fprop", router).gemm == "wide"


def test_the_plan_cannot_be_changed_by_a_consumer():
    """Every consumer reads the same Plan: its fields and shared facts refuse mutation, and the caller's
    own lists and dicts passed at construction are copied, so changing them later changes nothing."""
    plan = compile_file(str(ROOT / "contracts" / "qwen38_nvfp4_lora.prec")).plan
    before = plan_json(plan)
    attempts = [
        lambda: plan.rules.append(plan.rules[0]),
        lambda: plan.trainable.append(0),
        lambda: plan.schemes.__setitem__("bf16", None),
        lambda: plan.owner.__setitem__("rollout", []),
        lambda: plan.owner["rollout"].__setitem__(0, 0),
        lambda: plan.decisions["rollout"].pop(-1),
        lambda: plan.index.__setitem__("x", 0),
        lambda: plan.groups["rollout"].append((0, ())),
        lambda: plan.groups["rollout"][0][1].append(0),
        lambda: plan.rollout_tensors.__setitem__(0, None),
        lambda: plan.layouts.__setitem__(0, None),
        lambda: setattr(plan, "trainable", []),
    ]
    for attempt in attempts:
        with pytest.raises((TypeError, AttributeError)):
            attempt()
    owner = {c: list(a) for c, a in plan.owner.items()}
    copy = dataclasses.replace(plan, owner=owner)
    owner["rollout"][0] = 12345
    assert copy.owner["rollout"][0] == plan.owner["rollout"][0] != 12345
    assert plan_json(copy) == plan_json(plan) == before
