"""pcc import nemo_rl: a NeMo RL GRPO recipe back into a contract.

References: pcc's own NeMo RL lowering (every contract in contracts/nemo_rl/ goes out as the bundle's
nemo_rl/config.yaml and comes back with no engine argument difference, less what a recipe cannot
carry), and NeMo RL's own published recipes (tests/importer/nemo_rl_recipes/, verbatim copies at v0.7.0;
every one is imported by test_nemo_rl_recipes.py). Nothing here needs the NeMo RL checkout: the pinned
base recipes' values are targets/nemo_rl_keys.json.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from test_import import _differences

from pcc.importer import ImportFailed, import_source
from pcc.lower import compile_file, lower

ROOT = Path(__file__).resolve().parents[2]
RECIPES = Path(__file__).parent / "nemo_rl_recipes" / "examples" / "configs" / "recipes" / "llm"
_GEMMS = ("attn.q", "attn.kv", "attn.o", "experts.gate_up", "experts.down")
_EXPECT = {("expect", "route_agreement"), ("expect", "same_version")}
_ALL = {(c, f) for c in ("fprop", "dgrad", "wgrad") for f in _GEMMS}  # TE's real GEMMs: no qdq/accumulate back
NOT_CARRIED = {
    "nemo_rl/bf16_baseline": _EXPECT,
    "nemo_rl/fp8_block": _EXPECT | _ALL,
}


def test_the_round_trip_covers_every_nemo_rl_contract():
    assert sorted(NOT_CARRIED) == sorted(f"nemo_rl/{p.stem}" for p in (ROOT / "contracts" / "nemo_rl").glob("*.prec"))


@pytest.mark.parametrize("name", sorted(NOT_CARRIED))
def test_nemo_rl_round_trip(name, tmp_path):
    """Lower to NeMo RL, import the bundle's nemo_rl/config.yaml (over the base recipe launch.sh names),
    same Plan and the same engine arguments."""
    from pcc.diff import diff

    src = str(ROOT / "contracts" / f"{name}.prec")
    c = compile_file(src)
    config = tmp_path / "nemo_rl" / "config.yaml"
    config.parent.mkdir()
    config.write_text(lower(c.plan, "nemo_rl").files["nemo_rl/config.yaml"])
    for source in (config, tmp_path):  # the file, or the folder pcc writes
        imp = import_source("nemo_rl", str(source), c.plan.contract.model.catalog)
        assert imp.contract["framework"] == "nemo_rl"
        assert not [d for d in imp.diagnostics if d.code != "PCC808"], [d.render() for d in imp.diagnostics]
        out = tmp_path / "imported.prec"
        out.write_text(imp.text())
        assert compile_file(str(out)).ok
        report = diff(src, str(out))
        assert _differences(report) == NOT_CARRIED[name]
        assert {e: (r["args"], r["env"]) for e, r in report["engines"].items() if r["args"] or r["env"]} == {}
        assert {d.path for d in imp.diagnostics if d.code == "PCC808"} >= {"expect", "trainer.rules gemm", "defaults"}


def test_fp8_recipe_reads_the_base_and_its_own_keys():
    imp = import_source("nemo_rl", str(RECIPES / "grpo-llama3.1-8b-instruct-2n8g-megatron-fp8-e2e.yaml"), "llama3_8b")
    t, r = imp.contract["trainer"], imp.contract["rollout"]
    assert t["engine"] == "megatron" and t["parallel"] == {"pp": 2}
    assert t["optimizer"] == {"kind": "adam", "distributed": True, "precision_aware": False}  # base on, recipe off
    assert r["max_tokens"] == 4096 and r["engine"] == "vllm"
    assert t["rules"] and t["rules"][0]["scheme"] == "fp8_block"  # fp8_cfg: enabled, e4m3 blockwise from the base
    untruncated = [d for d in imp.diagnostics if d.code == "PCC804"]
    assert untruncated and untruncated[0].path == "loss_fn.use_importance_sampling_correction"
    assert untruncated[0].span is not None and untruncated[0].span.line == 7


def test_unresolved_defaults_read_the_recipe_alone(tmp_path):
    src = tmp_path / "r.yaml"
    src.write_text("defaults: some_base_nowhere.yaml\npolicy:\n  megatron_cfg:\n    enabled: true\n"
                   "    tensor_model_parallel_size: 2\n  generation:\n    vllm_cfg:\n      precision: fp8\n"
                   "      kv_cache_dtype: fp8\n      tensor_parallel_size: 2\n    max_new_tokens: 512\n"
                   "loss_fn:\n  use_importance_sampling_correction: true\n  truncated_importance_sampling_type: icepop\n"
                   "  truncated_importance_sampling_ratio: 5\n  truncated_importance_sampling_ratio_min: 0.5\n")
    imp = import_source("nemo_rl", str(src), "qwen3_8b", "H100")
    unresolved = [d for d in imp.diagnostics if d.code == "PCC808" and d.path == "defaults"]
    assert unresolved and "some_base_nowhere.yaml" in unresolved[0].message and unresolved[0].span.line == 1
    c = imp.contract
    assert c["trainer"]["parallel"] == {"tp": 2} and c["rollout"]["parallel"] == {"tp": 2}
    assert c["correction"] == {"kind": "mis", "clip": 5.0, "low": 0.5}
    assert any(r["patterns"] == ["kv_cache"] for r in c["rollout"]["rules"])


def test_unknown_and_unmapped_keys_are_positioned(tmp_path):
    src = tmp_path / "r.yaml"
    src.write_text("defaults: ../../grpo_math_1B.yaml\npolicy:\n  megatron_cfg:\n    enabled: true\n"
                   "    fp8_cfg:\n      enabled: true\n      fp8_recipe: tensorwise\n    moe_router_dtpe: fp32\n"
                   "  dtensor_cfg:\n    enabled: false\n  generation:\n    vllm_cfg:\n      precision: fp8\n"
                   "      quantization_ignored_layer_kws: [nothing_matches]\n")
    imp = import_source("nemo_rl", str(src), "qwen3_8b", "H100")
    codes = {(d.code, d.path): d for d in imp.diagnostics}
    assert codes[("PCC810", "policy.megatron_cfg.moe_router_dtpe")].span.line == 8
    assert ("PCC802", "policy.generation.vllm_cfg.quantization_ignored_layer_kws") in codes
    assert imp.contract["trainer"]["rules"]  # fp8_cfg.fp8 e4m3 from the base, tensorwise from the recipe


def test_cli_registers_the_kind():
    from pcc.importer import KINDS

    assert "nemo_rl" in KINDS


def test_yaml_merge_keys_are_overridden_not_duplicates(tmp_path):
    """NeMo RL's distillation_math.yaml: `teacher: {<<: *POLICY_BASE, model_name: ...}`; the written key
    replaces the merged one (YAML's merge), and a key written twice beside a merge is still refused."""
    from pcc.importer.yamlsource import load

    text = ("policy: &P\n  model_name: a\n  dtensor_cfg: &D\n    enabled: true\n    tp: 1\n"
            "teacher:\n  <<: *P\n  model_name: b\n  dtensor_cfg:\n    <<: *D\n    tp: 4\n")
    doc, spans = load(text, "r.yaml", "NeMo RL recipe")
    assert doc["teacher"] == {"model_name": "b", "dtensor_cfg": {"enabled": True, "tp": 4}}
    assert spans["teacher.model_name"].line == 8 and spans["teacher.dtensor_cfg.tp"].line == 11
    with pytest.raises(ImportFailed) as exc:
        load(text + "  model_name: c\n", "r.yaml", "NeMo RL recipe")
    assert "written twice" in exc.value.message and exc.value.span.line == 12


@pytest.mark.parametrize("section,code", [("sft", "PCC805"), ("dpo", "PCC805"), ("rm", "PCC805"),
                                          ("distillation", "PCC805")])
def test_a_job_that_is_no_rl_is_refused(section, code, tmp_path):
    src = tmp_path / "r.yaml"
    src.write_text(f"{section}:\n  max_num_steps: 10\npolicy:\n  model_name: Qwen/Qwen3-8B\n  precision: bfloat16\n")
    with pytest.raises(ImportFailed) as exc:
        import_source("nemo_rl", str(src), "qwen3_8b")
    d = exc.value.to_diagnostic()
    assert d.code == code and d.path == section and d.span.line == 2, d.render()


def test_a_ppo_recipe_names_its_value_model(tmp_path):
    src = tmp_path / "r.yaml"
    base = RECIPES.parents[1] / "ppo_math_1B.yaml"  # NeMo RL's PPO base: ppo, value, no grpo section
    src.write_text(f"defaults: {base}\nppo:\n  max_num_steps: 10\nvalue:\n  precision: float32\n")
    imp = import_source("nemo_rl", str(src), "qwen3_8b")
    named = [d for d in imp.diagnostics if d.code == "PCC807" and d.path == "value"]
    assert named and "run_ppo.py" in named[0].message and named[0].span.line == 5


def test_keys_nemo_rl_reads_are_not_unknown(tmp_path):
    """Keys the published recipes set and NeMo RL reads (a free-form HF config override, keys read with
    .get, the logger's TypedDicts) are no PCC810; a key NeMo RL reads nowhere still is."""
    src = tmp_path / "r.yaml"
    src.write_text("policy:\n  hf_config_overrides:\n    text_config:\n      router_aux_loss_coef: 0.0\n"
                   "  sequence_packing:\n    fuse_loss: true\n  generation:\n    vllm_cfg:\n"
                   "      enable_prefix_caching: false\n  megatron_cfg:\n    converter_type: Qwen3ForCausalLM\n"
                   "logger:\n  tensorboard:\n    log_dir: tb\n")
    imp = import_source("nemo_rl", str(src), "qwen3_8b", "H100")
    assert {d.path for d in imp.diagnostics if d.code == "PCC810"} == {"policy.megatron_cfg.converter_type"}


def test_precision_a_base_recipe_sets_is_named_where_it_is_written(tmp_path):
    """A precision key the recipe inherits from a base (not pcc's launch base) is PCC807 at the base's line,
    as NeMo RL's *-tq_simple recipes inherit defer_fp32_logits; a disabled section (peft) is not read."""
    base = tmp_path / "parent.yaml"
    base.write_text("defaults: ../../grpo_math_1B.yaml\npolicy:\n  megatron_cfg:\n    enabled: true\n"
                    "    defer_fp32_logits: true\n    peft:\n      lora_dtype: fp32\n  dtensor_cfg:\n    enabled: false\n")
    src = tmp_path / "child.yaml"
    src.write_text("defaults: parent.yaml\npolicy:\n  generation:\n    max_new_tokens: 64\n")
    imp = import_source("nemo_rl", str(src), "qwen3_8b", "H100")
    named = {d.path: d for d in imp.diagnostics if d.code == "PCC807"}
    d = named["policy.megatron_cfg.defer_fp32_logits"]
    assert d.span.file == str(base) and d.span.line == 5 and "parent.yaml" in d.message, d.render()
    assert "policy.megatron_cfg.peft.lora_dtype" not in named


def test_async_grpo_is_named():
    """NeMo RL's async GRPO (grpo.async_grpo) is staleness the NeMo RL target cannot lower: PCC804 at the key."""
    src = RECIPES / "performance" / "grpo-llama3.1-8b-instruct-2n8g-async-1off.yaml"
    imp = import_source("nemo_rl", str(src), "llama3_8b")
    named = [d for d in imp.diagnostics if d.code == "PCC804" and d.path == "grpo.async_grpo.enabled"]
    assert named and "up to 1 step(s) old" in named[0].message and named[0].span is not None, imp.diagnostics
    assert imp.contract["sync"] == {"schedule": "colocated"}


def test_megatron_lora_is_imported():
    """megatron_cfg.peft: rank, alpha and the families of its Megatron modules (none: every linear layer);
    the merged refit is named (PCC804 on sync), and the contract checks."""
    imp = import_source("nemo_rl", str(RECIPES / "grpo-qwen3-8b-base-1n8g-megatron-lora.yaml"), "qwen3_8b")
    assert imp.contract["trainable"] == {"kind": "lora", "rank": 128, "alpha": 128.0,
                                         "targets": ["attn.q", "attn.kv", "attn.o", "mlp.gate_up", "mlp.down"]}
    assert imp.contract["sync"]["moves"] == "adapter"
    assert [d.span.line for d in imp.diagnostics if d.code == "PCC804" and d.path == "sync"] == [16]


def test_megatron_lora_target_modules_read_backwards(tmp_path):
    src = tmp_path / "r.yaml"
    src.write_text("defaults: ../../grpo_math_1B_megatron.yaml\npolicy:\n  megatron_cfg:\n    peft:\n      enabled: true\n"
                   "      dim: 16\n      alpha: 32\n      target_modules: [linear_qkv, '*.layers.0.*.linear_fc1']\n")
    imp = import_source("nemo_rl", str(src), "qwen3_8b", "H100")
    assert imp.contract["trainable"]["targets"] == ["attn.q", "attn.kv"]
    named = [d for d in imp.diagnostics if d.code == "PCC807" and d.path == "policy.megatron_cfg.peft.target_modules"]
    assert named and "*.layers.0.*.linear_fc1" in named[0].message and named[0].span.line == 8


def test_precision_key_the_launch_base_adds_is_named():
    """A recipe whose chain does not set a precision key that the base recipe pcc's launch.sh puts under the
    contract does set (NeMo RL's PPO recipes over ppo_math_1B.yaml have no mcore_generation_config; the launch
    base writes kv_cache_management_mode persist) runs with the base's value after the round trip: PCC807 names it."""
    src = RECIPES / "ppo-qwen2.5-1.5b-gsm8k-1n8g-automodel-valuetp2sp.yaml"
    imp = import_source("nemo_rl", str(src), "qwen2_5_1_5b")
    key = "policy.generation.mcore_generation_config.kv_cache_management_mode"
    named = [d for d in imp.diagnostics if d.code == "PCC807" and d.path == key]
    assert named and "persist" in named[0].message and "does not set" in named[0].message, imp.diagnostics


def test_router_dtype_of_a_dense_model_is_named(tmp_path):
    """megatron_cfg.moe_router_dtype of a model with no router is nothing the contract states: where it differs
    from the launch base's (fp64), PCC807 names it (NeMo RL's Nemotron-3-Super pipeline checks on Qwen3-1.7B
    with fp32); a MoE model's is read (PCC804 for anything but fp32)."""
    src = tmp_path / "r.yaml"
    src.write_text("defaults: ../../grpo_math_1B_megatron.yaml\npolicy:\n  megatron_cfg:\n    moe_router_dtype: fp32\n")
    imp = import_source("nemo_rl", str(src), "qwen3_8b", "H100")
    named = [d for d in imp.diagnostics if d.code == "PCC807" and d.path == "policy.megatron_cfg.moe_router_dtype"]
    assert named and named[0].span.line == 4, imp.diagnostics
    imp = import_source("nemo_rl", str(src), "qwen3_30b_a3b", "H100")
    assert not [d for d in imp.diagnostics if d.path == "policy.megatron_cfg.moe_router_dtype"], imp.diagnostics
