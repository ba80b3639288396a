"""Megatron lowering: seed rows, and every shipped contract accepted by megatron-core's own parser.

The engine checks need requirements/megatron.txt; with CI=true a missing engine fails.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from pcc.lower import lower
from pcc.plan import compile_file

ROOT = Path(__file__).resolve().parents[2]
CONTRACTS = sorted((ROOT / "contracts").glob("*.prec"))


@pytest.fixture(scope="module")
def engine():
    from pcc.lower import verify_megatron as vm

    try:
        vm._arguments()
        vm.recipe_module()
    except vm.EngineMissing as exc:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI must run the Megatron checks: {exc}")
        pytest.skip(str(exc))
    return vm


def _lowered(path, text=None, tmp_path=None):
    if text is not None:
        path = tmp_path / Path(path).name
        path.write_text(text)
    compiled = compile_file(str(path))
    assert compiled.ok, [d.message for d in compiled.diagnostics if d.is_error]
    return compiled.plan, lower(compiled.plan, "megatron")


def _verify(vm, plan, lo, tmp_path, monkeypatch, args=None):
    for rel, text in lo.files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    monkeypatch.chdir(tmp_path)  # the precision file path is bundle-relative
    return vm.verify_megatron_args(lo.args if args is None else args, vm.model_args(plan), vm.device_arch(plan),
                                   lo.env)


def _pairs(args):
    return {(a, b) for a, b in zip(args, args[1:])}


@pytest.mark.parametrize("path", CONTRACTS, ids=lambda p: p.stem)
def test_every_contract_parses_and_builds_its_recipe(engine, path, tmp_path, monkeypatch):
    plan, lo = _lowered(path)
    ns = _verify(engine, plan, lo, tmp_path, monkeypatch)
    recipe = engine.te_recipe(ns, lo.env)
    want = {None: None, "blockwise": "Float8BlockScaling", "mxfp8": "MXFP8BlockScaling",
            "tensorwise": "Float8CurrentScaling", "delayed": "DelayedScaling"}[ns.fp8_recipe if ns.fp8 else None]
    assert (type(recipe).__name__ if recipe else None) == ("NVFP4BlockScaling" if ns.fp4 else want)
    assert lo.files["trainer/args.txt"].split("\n")[:-1] == lo.args


def test_unified_fp8_is_blockwise_e4m3_with_fp32_scales(engine, tmp_path, monkeypatch):
    plan, lo = _lowered(ROOT / "contracts/unified_fp8.prec")
    assert {("--fp8-format", "e4m3"), ("--fp8-recipe", "blockwise")} <= _pairs(lo.args)
    ns = _verify(engine, plan, lo, tmp_path, monkeypatch)
    recipe = engine.te_recipe(ns, lo.env)
    # TE reads NVTE_FP8_BLOCK_SCALING_FP32_SCALES at import: with it, scales are not forced to powers of 2.
    assert recipe.fp8_quant_fwd_weight.power_2_scale is False and recipe.w_block_scaling_dim == 2
    assert engine.te_recipe(ns, {}).fp8_quant_fwd_weight.power_2_scale is True


def test_mxfp8_recipe(engine, tmp_path, monkeypatch):
    plan, lo = _lowered(ROOT / "contracts/mxfp8_blackwell.prec")
    assert ("--fp8-recipe", "mxfp8") in _pairs(lo.args)
    ns = _verify(engine, plan, lo, tmp_path, monkeypatch)
    assert type(engine.te_recipe(ns, lo.env)).__name__ == "MXFP8BlockScaling"


def test_selective_nvfp4_precision_file_covers_routed_experts_only(engine, tmp_path, monkeypatch):
    plan, lo = _lowered(ROOT / "contracts/selective_nvfp4.prec")
    assert {("--fp4-format", "e2m1"), ("--fp4-recipe", "nvfp4")} <= _pairs(lo.args)
    ns = _verify(engine, plan, lo, tmp_path, monkeypatch)
    assert engine.te_recipe(ns, lo.env).backward_override == "high_precision"  # BF16 DGrad/WGrad
    n = plan.catalog.num_layers
    for layer in range(n):
        for module in ("mlp.experts.linear_fc1", "mlp.experts.linear_fc2", "mlp.experts.local_experts.3.linear_fc2",
                       "self_attention.linear_qkv", "self_attention.linear_proj"):
            qp = engine.precision_config_params(lo.args[lo.args.index("--te-precision-config-file") + 1],
                                                f"decoder.layers.{layer}.{module}")
            routed = ".experts." in module and 0 < layer < n - 1
            assert qp.training_recipe.fp4_quantization_recipe == ("nvfp4" if routed else None), (layer, module)
            assert qp.training_recipe.fp8_quantization_recipe is None


def test_int4_qat_group_follows_the_rollout_scheme(tmp_path):
    src = (ROOT / "contracts/int4_qat_w4a16.prec").read_text()
    _, lo = _lowered(ROOT / "contracts/int4_qat_w4a16.prec")
    assert lo.env["OPEN_TRAINING_INT4_FAKE_QAT_FLAG"] == "1" and lo.env["OPEN_TRAINING_INT4_GROUP_SIZE"] == "128"
    changed = src.replace("scheme w4a16 = int4", "scheme w4a16 = int4 weights group 32")
    plan, lo32 = _lowered("int4_qat_w4a16.prec", changed, tmp_path)
    assert lo32.env["OPEN_TRAINING_INT4_GROUP_SIZE"] == "32"
    assert {plan.scheme("rollout", i).weights.size for i in range(len(plan.catalog.operators))
            if plan.scheme("rollout", i).format == "int4"} == {32}
    assert "export OPEN_TRAINING_INT4_GROUP_SIZE=32\n" in lo32.files["trainer/env.sh"]


def test_contradiction_rejected_by_pcc_and_by_megatron(engine, tmp_path, monkeypatch):
    src = (ROOT / "contracts/unified_fp8.prec").read_text()
    bad = tmp_path / "bad.prec"
    bad.write_text(src.replace("optimizer adam distributed", "optimizer adam\n    param_gather fp8"))
    compiled = compile_file(str(bad))
    assert "PCC304" in {d.code for d in compiled.diagnostics if d.is_error}
    good = src.replace("optimizer adam distributed", "optimizer adam distributed\n    param_gather fp8")
    plan, lo = _lowered("ok.prec", good, tmp_path)
    assert "--fp8-param-gather" in lo.args
    _verify(engine, plan, lo, tmp_path, monkeypatch)  # accepted with the distributed optimizer
    forced = [a for a in lo.args if a != "--use-distributed-optimizer"]
    with pytest.raises(engine.VerifyError, match="fp8-param-gather"):
        _verify(engine, plan, lo, tmp_path, monkeypatch, forced)


def test_parser_rejects_unknown_choice(engine, tmp_path, monkeypatch):
    plan, lo = _lowered(ROOT / "contracts/unified_fp8.prec")
    args = [("e5m2" if a == "e4m3" else a) for a in lo.args]
    with pytest.raises(engine.VerifyError, match="argument parser"):
        _verify(engine, plan, lo, tmp_path, monkeypatch, args)


def test_verify_checks_the_generated_architecture_with_the_precision_flags(engine, tmp_path, monkeypatch):
    """`pcc compile --verify` parses the architecture pcc generates (miles/model_args.txt), not stand-ins:
    a model with 3 KV heads under trainer tp 2 is one Megatron refuses (query groups must be a multiple
    or a divisor of tp), which catalog stand-ins without --num-query-groups let through."""
    import json

    from pcc.models.builtin import _CONFIGS

    config = json.loads((_CONFIGS / "tiny_dense.json").read_text())
    config |= {"num_attention_heads": 6, "num_key_value_heads": 3, "hidden_size": 192}
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text(json.dumps(config))
    text = ('contract gqa-tp {\n  model from "m"\n  hardware H100\n  rollout sglang { }\n'
            "  trainer megatron {\n    gemm linear : fp8_block\n    parallel tp 2\n  }\n}\n")
    plan, lo = _lowered("gqa_tp.prec", text, tmp_path)
    assert ("--num-query-groups", "3") in _pairs(engine.model_args(plan))
    with pytest.raises(engine.VerifyError, match="num_query_groups"):
        _verify(engine, plan, lo, tmp_path, monkeypatch)
    stand_in = ["--num-layers", "4", "--hidden-size", "192", "--num-attention-heads", "6", *engine.JOB_STAND_INS]
    engine.verify_megatron_args(lo.args, stand_in, engine.device_arch(plan), lo.env)  # what the old check saw


def test_verify_without_a_generated_architecture_falls_back_to_stand_ins(engine):
    """A model whose architecture pcc cannot generate (PCC613 on the Miles target) still gets its
    precision flags checked, with dimensions from the catalog."""
    plan = compile_file(str(ROOT / "tests/check_fixtures/PCC613_unmapped_architecture.prec")).plan
    args = engine.model_args(plan)
    assert ("--hidden-size", "128") in _pairs(args) and "--swiglu" not in args
    engine.verify_megatron_args(lower(plan, "megatron").args, args, engine.device_arch(plan))


def test_checkable_drops_only_what_tests_a_gpu_library(engine):
    args = ["--multi-latent-attention", "--beta-fast", "1", "--moe-permute-fusion", "--rotary-base", "50000"]
    assert engine.checkable(args, ["--beta-fast"]) == ["--multi-latent-attention", "--rotary-base", "50000"]
    assert engine.checkable(["--swiglu"], [])[-1] == "--no-rope-fusion"


def test_context_parallelism_reaches_megatron_verl_and_the_miles_world_size(tmp_path):
    """`parallel cp N` is Megatron's --context-parallel-size (checked by its own parser), verl's
    actor.megatron.context_parallel_size, and one model replica of tp x pp x cp GPUs in Miles' count."""
    from pcc.lower import compile_file, lower

    src = tmp_path / "cp.prec"
    src.write_text("contract cp {\n  model qwen3_8b\n  hardware H100\n  trainer megatron {\n"
                   "    parallel tp 2 cp 2 dp 2 gpus 12\n  }\n}\n")
    plan = compile_file(str(src)).plan
    assert lower(plan, "megatron").value("--context-parallel-size") == "2"
    caveat = next(c for c in lower(plan, "miles").caveats if c.path == "trainer.parallel.dp")
    assert "tp 2 x pp 1 x cp 2" in caveat.message and "gpus 8" in caveat.hint
    verl = tmp_path / "cpv.prec"
    verl.write_text(src.read_text().replace("hardware H100\n", "hardware H100\n  framework verl\n")
                    .replace(" dp 2 gpus 12", ""))
    keys = {s.key: s.value for s in lower(compile_file(str(verl)).plan, "verl").settings}
    assert keys["actor_rollout_ref.actor.megatron.context_parallel_size"] == 2
