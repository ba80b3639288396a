"""One small edit of tiny_a.prec per kind of change, and a model with more layers and experts."""

from __future__ import annotations

import json
from pathlib import Path

from pcc.diff import diff, diff_plans
from pcc.models import load_catalog
from pcc.models.builtin import catalog_from_config
from pcc.plan import compile_file

BASE = Path(__file__).resolve().parent / "pairs" / "tiny_a.prec"


def variant(tmp_path: Path, *edits: tuple[str, str]) -> dict:
    text = BASE.read_text()
    for old, new in edits:
        assert old in text, old
        text = text.replace(old, new)
    path = tmp_path / "b.prec"
    path.write_text(text)
    return diff(str(BASE), str(path), targets=())


def levels(r: dict) -> set[int]:
    return {v["level"] for v in r["consequences"]["validation_levels"]}


def test_exception_added_on_one_layer(tmp_path):
    r = variant(tmp_path, ("keep bf16 : embed", "keep bf16 : experts.*[0]\n    keep bf16 : embed"))
    rows = r["components"]["rollout"]
    assert {(x["family"], x["kind"], x["layers"], x["tensors"]) for x in rows} == {
        ("experts.gate_up", "exception added", "0", 16), ("experts.down", "exception added", "0", 8)}


def test_trainer_fprop_qdq_changes_the_trainer_file(tmp_path):
    # All of attention: q, k and v share Megatron's linear_qkv, so q alone is PCC605.
    r = variant(tmp_path, ("gemm : bf16", "gemm : bf16\n    fprop attn : fp8_block qdq"))
    rows = r["components"]["fprop"]
    assert sorted((x["family"], x["from"], x["to"], x["kind"]) for x in rows) == [
        (f, "bf16", "fp8_block qdq", "newly quantized") for f in ("attn.kv", "attn.o", "attn.q")]
    c = r["consequences"]
    assert c["trainer_precision_file"]["changes"] and c["baseline"]["invalidated"]
    assert not c["rollout_artifact"]["rebuild"]
    assert {2, 3, 4, 7} <= levels(r) and 6 not in levels(r)


def test_optimizer_state(tmp_path):
    r = variant(tmp_path, ("optimizer adam distributed",
                           "moments bf16\n    optimizer adam distributed precision_aware"))
    assert {c["field"]: (c["from"], c["to"]) for c in r["optimizer"]} == {
        "trainer.moments": ("fp32", "bf16"), "trainer.optimizer.precision_aware": (False, True)}
    assert {x["name"] for x in r["consequences"]["bytes"]} == {"optimizer moments (2)"}
    assert r["consequences"]["trainer_precision_file"]["changes"] and 7 in levels(r)


def test_corrections_routing_and_placement(tmp_path):
    r = variant(tmp_path, ("routing replay rollout", "correction tis clip 2.0\n  routing replay trainer"),
                ("keep bf16 : embed, lm_head, router, norm\n  }",
                 "keep bf16 : embed, lm_head, router, norm\n    parallel tp 2\n  }"))
    assert {c["field"]: (c["from"], c["to"]) for c in r["correction"]} == {
        "correction.kind": ("none", "tis"), "correction.clip": (None, 2.0), "routing_replay": ("r3", "r2")}
    assert [(c["field"], c["from"], c["to"]) for c in r["placement"]] == [("rollout.parallel.tp", 1, 2)]
    assert {5, 6, 7, 8} <= levels(r) and r["consequences"]["baseline"]["invalidated"]


def test_expectations_tightened_and_added(tmp_path):
    r = variant(tmp_path, ("p99 <= 0.15", "p99 <= 0.1\n    version_age <= 0"))
    assert {(e["expectation"], e["change"]) for e in r["expect"]} == {
        ("same_version abs_dlogp p99 <=", "tightened"), ("version_age <=", "added")}
    assert levels(r) == {1, 4, 8} and not r["consequences"]["baseline"]["invalidated"]


def test_full_weights_to_lora(tmp_path):
    r = variant(tmp_path, ("trainable all", "trainable lora rank 8 alpha 16 targets attn.q, attn.o"),
                ("sync full_weights { schedule colocated bridge bf16 activation atomic }",
                 "sync adapter { schedule colocated activation atomic }"))
    fields = {c["field"]: (c["from"], c["to"]) for c in r["trainable"]["fields"]}
    assert fields == {"trainable.kind": ("all", "lora"), "trainable.rank": (None, 8), "trainable.alpha": (None, 16.0)}
    ops = load_catalog("tiny_moe").operators
    assert r["trainable"]["tensors_b"] == sum(op.family in ("attn.q", "attn.o") for op in ops)
    assert {x["kind"] for x in r["components"]["wgrad"]} == {"no longer runs"}  # base WGrad stops
    assert r["components"]["dgrad"] == []  # sensitivity still flows through the frozen base
    assert r["consequences"]["adapter_mapping"]["changes"]
    assert r["sync"][0] == {"field": "sync.moves", "from": "full_weights", "to": "adapter"}


def test_new_model_version_with_more_layers_and_experts():
    config = load_catalog("tiny_moe").config
    bigger = {**config, "num_hidden_layers": config["num_hidden_layers"] + 2,
              "num_experts": config["num_experts"] * 2}
    ca = compile_file(str(BASE))
    cb = compile_file(str(BASE), catalog_from_config("tiny_moe_v2", bigger))
    assert ca.ok and cb.ok
    r = diff_plans(ca.plan, cb.plan, targets=())
    a_names = {op.tensor for op in ca.plan.catalog.operators}
    only_b = [op for op in cb.plan.catalog.operators if op.tensor not in a_names]
    assert sum(g["tensors"] for g in r["model"]["only_b"]) == len(only_b)
    assert r["model"]["only_a"] == []
    experts_b = {g["family"]: g for g in r["model"]["only_b"]}["experts.down"]
    assert experts_b["layers"] == f"0..{bigger['num_hidden_layers'] - 1}"
    assert not any(r["components"].values())  # the shared tensors resolve alike
    assert levels(r) == set(range(1, 10)) and r["consequences"]["rollout_artifact"]["tensors"] == len(
        cb.plan.catalog.operators)
    json.dumps(r)


def test_redefined_scheme_name_shows_both_definitions(tmp_path):
    path_a, path_b = tmp_path / "a.prec", tmp_path / "b.prec"
    # (a row-scaled FP8 rollout has no SGLang checkpoint layout: PCC608)
    text = BASE.read_text().replace("  rollout sglang {", "  scheme s = fp8_e4m3 weights block 64x64 activations "
                                    "tile 1x64\n\n  rollout sglang {")
    path_a.write_text(text.replace(": fp8_block", ": s"))
    path_b.write_text(text.replace(": fp8_block", ": s").replace("fp8_e4m3 weights block 64x64 activations tile 1x64",
                                                                      "fp8_e4m3 tensor"))
    r = diff(str(path_a), str(path_b), targets=())
    rows = r["components"]["rollout"]
    assert rows and all(x["from"].startswith("s (fp8_e4m3") and x["from"] != x["to"] for x in rows)
    assert r["changed"]


ROOT = Path(__file__).resolve().parents[2]


def test_a_verl_variant_differs_only_in_framework_and_engine():
    """contracts/verl/X.prec against X.prec: the same precision everywhere; what moves is the framework (and the
    rollout engine where verl needs vLLM), which re-runs the live update, the training step and the profile."""
    for path in sorted((ROOT / "contracts" / "verl").glob("*.prec")):
        r = diff(str(ROOT / "contracts" / path.name), str(path), targets=())
        assert r["changed"], path.name
        assert not any(r["components"].values()) and not r["model"], path.name
        assert not (r["optimizer"] or r["sync"] or r["correction"] or r["expect"] or r["trainable"]["fields"])
        fields = {c["field"]: (c["from"], c["to"]) for c in r["placement"]}
        assert fields.pop("framework") == ("miles", "verl"), path.name
        if path.name == "tiny_cpu.prec":  # its vLLM rollout runs on a GPU: the CPU build refuses R3 (PCC637)
            assert fields.pop("rollout.hardware") == ("cpu", "H100")
        assert fields in ({}, {"rollout.engine": ("sglang", "vllm")}), (path.name, fields)
        assert {6, 7, 9} <= levels(r)
        if not fields:  # the framework alone: same engines, same step-0 baseline and trainer file
            assert not r["consequences"]["baseline"]["invalidated"]
            assert not r["consequences"]["trainer_precision_file"]["changes"]
