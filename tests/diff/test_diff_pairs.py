"""The seed-shaped pairs: each asserts what changed against counts taken straight from
the model catalog (not from pcc's plan), and what the change implies."""

from __future__ import annotations

from pathlib import Path

import pytest

from pcc.diff import diff
from pcc.models import load_catalog

ROOT = Path(__file__).resolve().parents[2]
PAIRS = Path(__file__).resolve().parent / "pairs"


def run(a: Path, b: Path) -> dict:
    return diff(str(a), str(b), targets=())


def levels(report: dict) -> list[int]:
    return [v["level"] for v in report["consequences"]["validation_levels"]]


@pytest.fixture(scope="module")
def k3() -> dict:
    return run(ROOT / "contracts/k3_mxfp4_lora.prec", PAIRS / "k3_nvfp4_lora.prec")


def test_k3_mxfp4_base_moves_to_nvfp4(k3):
    ops = load_catalog("kimi_k2").operators
    experts = {f: [op for op in ops if op.family == f] for f in ("experts.gate_up", "experts.down")}
    rows = k3["components"]["rollout"]
    assert {(r["family"], r["from"], r["to"], r["kind"], r["tensors"]) for r in rows} == {
        (f, "mxfp4", "nvfp4", "scheme", len(v)) for f, v in experts.items()}
    assert k3["components"]["fprop"] == k3["components"]["dgrad"] == k3["components"]["wgrad"] == []
    assert {c["field"]: (c["from"], c["to"]) for c in k3["placement"]} == {
        "rollout.hardware": ("GB300", "B200"), "trainer.hardware": ("GB300", "B200")}
    t = k3["trainable"]
    assert not (t["fields"] or t["gained"] or t["lost"])
    c = k3["consequences"]
    assert c["rollout_artifact"]["rebuild"] and c["rollout_artifact"]["tensors"] == 60 * 384 * 3
    assert c["baseline"]["invalidated"]
    assert not c["adapter_mapping"]["changes"] and not c["trainer_precision_file"]["changes"]
    assert levels(k3) == [1, 2, 3, 4, 5, 6, 8, 9]  # no trainer change: no deterministic training step


def test_k3_rollout_bytes_by_hand(k3):
    """MXFP4: 4-bit codes + one E8M0 byte per 32; NVFP4 (ModelOpt's checkpoint): 4-bit codes + one E4M3
    byte per 16 + two FP32 scalars per tensor (weight_scale_2, input_scale). The packed rollout base
    grows by numel/16 - numel/32 bytes + 8 per tensor."""
    ops = [op for op in load_catalog("kimi_k2").operators if op.family.startswith("experts.")]
    want = sum(op.shape[0] * op.shape[1] // 16 - op.shape[0] * op.shape[1] // 32 + 8 for op in ops)
    rows = {r["name"]: r for r in k3["consequences"]["bytes"]}
    assert rows["rollout weights (packed)"]["delta"] == want
    assert "sync payload per version" not in rows  # the adapter is all that moves, on both sides


def test_glm_staleness_widened():
    r = run(ROOT / "contracts/glm52_fp8_rollout.prec", PAIRS / "glm52_staleness4.prec")
    assert r["changed"] and not any(r["components"].values())
    assert r["sync"] == [{"field": "sync.max_staleness", "from": 2, "to": 4}]
    assert [(e["expectation"], e["change"]) for e in r["expect"]] == [("version_age <=", "loosened")]
    c = r["consequences"]
    assert not c["rollout_artifact"]["rebuild"]
    assert not c["baseline"]["invalidated"]  # staleness is not same-version mismatch
    assert levels(r) == [1, 8, 9]
    assert c["bytes"] == []


def test_qwen_child_only_adds_lora_targets():
    r = run(ROOT / "contracts/qwen38_nvfp4_lora.prec", PAIRS / "qwen38_expert_lora.prec")
    ops = load_catalog("qwen3_30b_a3b").operators
    down = [op for op in ops if op.family == "experts.down"]
    gate_up = [op for op in ops if op.family == "experts.gate_up"]
    t = r["trainable"]
    assert t["fields"] == [] and t["lost"] == []
    assert sorted((g["family"], g["tensors"]) for g in t["gained"]) == [("experts.down", len(down)),
                                                                        ("experts.gate_up", len(gate_up))]
    assert not any(r["components"].values()) and not r["sync"] and not r["placement"]
    c = r["consequences"]
    assert c["adapter_mapping"]["changes"] and not c["rollout_artifact"]["rebuild"]
    assert not c["baseline"]["invalidated"]  # a new LoRA adapter starts at zero
    assert 6 in levels(r) and 7 in levels(r) and 2 not in levels(r)
    # BF16 adapter A (rank x in) and B (out x rank) per new target: 2 bytes each
    payload = {x["name"]: x for x in c["bytes"]}["sync payload per version"]
    assert payload["delta"] == sum(16 * (op.shape[0] + op.shape[1]) * 2 for op in down + gate_up)


def test_rule_reordering_is_no_change():
    r = run(PAIRS / "tiny_a.prec", PAIRS / "tiny_reordered.yaml")
    assert not r["changed"]
    assert not any(r["components"].values()) and r["expect"] == []
    assert r["consequences"]["validation_levels"] == [] and r["engines"] == {}


def test_pattern_edit_changes_one_family_only():
    r = run(PAIRS / "tiny_a.prec", PAIRS / "tiny_attn_kv.prec")
    kv = [op for op in load_catalog("tiny_moe").operators if op.family == "attn.kv"]
    rows = [row for comp in r["components"].values() for row in comp]
    assert len(rows) == 1
    row = rows[0]
    assert (row["family"], row["from"], row["to"], row["kind"]) == ("attn.kv", "bf16", "fp8_block",
                                                                     "exception removed")
    assert row["tensors"] == len(kv) and row["examples"] == [op.tensor for op in kv[:3]]
    assert row["rules_b"] == ["rollout.rules[0]: attn.q, attn.kv, attn.o : fp8_block"]
    assert r["consequences"]["rollout_artifact"]["tensors"] == len(kv)
