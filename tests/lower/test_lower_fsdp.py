"""The fsdp target: trainer/fsdp.json for every contracts/fsdp/ variant, what it refuses (PCC640-PCC642),
and the file built and applied with torchao's, torch's and PEFT's own classes (requirements/fsdp.txt,
a side folder). With CI=true a missing torchao fails the engine tests; elsewhere they skip. Expected
values are written out by hand from the contracts, the model shapes and torchao's sources.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from pcc.lower import Unsupported, compile_file as check_file, lower, lower_all, targets_for
from pcc.lower.fsdp import FILE, gemm_modules, module_name
from pcc.lang.diagnostics import Reporter
from pcc.plan import compile_file

ROOT = Path(__file__).resolve().parents[2]
VARIANTS = sorted((ROOT / "contracts" / "fsdp").glob("*.prec"))
# qwen3_30b_a3b: 48 layers of q, k, v, o and 128 experts x (gate, up, down) = 18624 linear modules;
# kept wide: the 48 routers (mlp.gate) and lm_head
QWEN_MOE_LINEAR, QWEN_MOE_WIDE = 48 * (4 + 128 * 3), 49


def _plan(path: Path):
    c = compile_file(str(path))
    assert c.ok, [d.render() for d in c.diagnostics if d.is_error]
    return c.plan


def _text(tmp_path: Path, body: str, extra: str = "", model: str = "qwen3_8b", hw: str = "H100"):
    p = tmp_path / "c.prec"
    p.write_text(f"contract c {{\n  model {model}\n  hardware {hw}\n  rollout sglang {{\n  }}\n"
                 f"  trainer fsdp {{\n{body}\n  }}\n{extra}}}\n", encoding="utf-8")
    c = compile_file(str(p))
    assert c.plan is not None, [d.render() for d in c.diagnostics]
    return c.plan


def _doc(plan) -> dict:
    return json.loads(lower(plan, "fsdp").files[FILE])


def _refused(plan) -> Unsupported:
    with pytest.raises(Unsupported) as exc:
        lower(plan, "fsdp")
    return exc.value


@pytest.mark.parametrize("path", VARIANTS, ids=lambda p: p.stem)
def test_every_variant_names_each_module_once_and_loads_bf16_weights(path):
    plan = _plan(path)
    assert "fsdp" in targets_for(plan) and "megatron" not in targets_for(plan) and "miles" not in targets_for(plan)
    doc = _doc(plan)
    assert doc["weights"]["load_from_env"] == "PCC_REF_LOAD"
    named = doc["keep_wide"] + [m for g in doc["low_precision"] for m in g["modules"]]
    ops = plan.catalog.operators
    assert sorted(named) == sorted(module_name(ops[i].tensor) for i in gemm_modules(plan))
    assert len(named) == len(set(named))
    assert not any(ch in m for m in named for ch in "*?[]^$"), "module names, never patterns"


def test_shipped_variants_by_hand():
    d = {p.stem: _doc(_plan(p)) for p in VARIANTS}
    bf16 = d["bf16_baseline"]
    assert bf16["low_precision"] == [] and bf16["mp_policy"] == {"param_dtype": "bfloat16", "reduce_dtype": "float32"}
    assert bf16["sharded_param_dtype"] == "float32" and bf16["data_parallel_size"] == 32
    assert bf16["optimizer"] == "torch.optim.AdamW" and bf16["cpu_offload"] is False

    (row,) = d["fp8_rowwise"]["low_precision"]
    assert row["kind"] == "float8" and row["config"]["recipe"] == "rowwise" and len(row["modules"]) == QWEN_MOE_LINEAR
    assert row["config"]["round_scales_to_power_of_2"] is True and row["config"]["emulate"] is False
    assert row["gemms"]["dgrad"] == "grad_output axiswise float8_e4m3fn, weight_for_grad_input axiswise float8_e4m3fn"
    assert len(d["fp8_rowwise"]["keep_wide"]) == QWEN_MOE_WIDE
    assert "model.layers.47.mlp.gate" in d["fp8_rowwise"]["keep_wide"] and "lm_head" in d["fp8_rowwise"]["keep_wide"]

    (tw,) = d["fp8_tensor"]["low_precision"]
    assert tw["config"]["enable_fsdp_float8_all_gather"] is True and tw["config"]["recipe"] is None
    assert tw["config"]["casts"]["cast_config_grad_output"] == {
        "scaling_type": "dynamic", "scaling_granularity": "tensorwise", "target_dtype": "float8_e4m3fn"}

    (blk,) = d["unified_fp8"]["low_precision"]
    assert blk["kind"] == "blockwise" and len(blk["modules"]) == QWEN_MOE_LINEAR

    (mx,) = d["mxfp8_blackwell"]["low_precision"]
    assert mx["kind"] == "mxfp8" and mx["config"] == {"kernel_preference": "auto", "out_dtype": "bfloat16",
                                                       "wgrad_with_hp": False, "scale_calculation_mode": "floor",
                                                       "pad_token_groups_for_grouped_mm": False}

    (qat,) = d["int4_qat_w4a16"]["low_precision"]
    assert qat["config"] == {"dtype": "int4", "group_size": 128, "is_symmetric": True}

    lora = d["qwen38_nvfp4_lora"]["lora"]
    assert (lora["r"], lora["lora_alpha"], lora["lora_dropout"]) == (16, 32, 0.0)
    assert len(lora["target_modules"]) == 48 * 4 and "model.layers.0.self_attn.v_proj" in lora["target_modules"]
    assert d["qwen38_nvfp4_lora"]["low_precision"] == []

    (tiny,) = d["tiny_cpu"]["low_precision"]  # FProp per-row E4M3 QDQ, DGrad and WGrad BF16
    assert tiny["config"]["emulate"] is True and tiny["gemms"]["dgrad"] == tiny["gemms"]["wgrad"] == "high precision"
    assert tiny["config"]["casts"]["cast_config_weight_for_grad_input"]["scaling_type"] == "disabled"
    assert len(tiny["modules"]) == 4 * (4 + 8 * 3) and d["tiny_cpu"]["keep_wide"][-1] == "lm_head"


def test_int4_qat_warns_that_torchaos_grid_differs():
    c = check_file(str(ROOT / "contracts" / "fsdp" / "int4_qat_w4a16.prec"))  # what `pcc check` runs
    assert c.ok
    (w,) = [d for d in c.diagnostics if d.code == "PCC612"]
    assert "[-8, 7]" in w.message and "amax/7.5" in w.message and "DGrad" in w.message


def test_a_quantized_rollout_with_an_fsdp_trainer_checks():
    """PCC408 is retired: the trainer loads BF16 weights from PCC_REF_LOAD, rollout its own checkpoint."""
    c = check_file(str(ROOT / "contracts" / "fsdp" / "unified_fp8.prec"))
    assert c.ok and not [d for d in c.diagnostics if d.code in ("PCC408", "PCC303", "PCC611")]


REFUSED = {
    "nvfp4": ("    fprop mlp : nvfp4 real", "PCC640", "training path for nvfp4"),
    "block_qdq": ("    fprop linear : fp8_block qdq", "PCC640", "no emulated"),
    "block_fprop_only": ("    fprop linear : fp8_block real", "PCC640", "quantizes FProp, DGrad and WGrad"),
    "e5m2_dgrad": ("    fprop linear : fp8_tensor real\n    dgrad linear : fp8_e5m2 real", "PCC640",
                   "one dtype in both GEMMs"),
    "delayed": ("    gemm linear : fp8_delayed real", "PCC640", "dynamically"),
    "tp": ("    parallel tp 4", "PCC641", "data-parallel only"),
    "fp16_master": ("    master fp16 moments fp16\n    optimizer adam distributed precision_aware", "PCC641",
                    "master copy"),
    "rowwise_gather": ("    gemm linear : fp8_row real\n    param_gather fp8\n    optimizer adam distributed",
                       "PCC641", "per-tensor weight scales"),
}


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_what_fsdp_cannot_run_is_refused_on_the_rule(tmp_path, name):
    body, code, words = REFUSED[name]
    exc = _refused(_text(tmp_path, body))
    assert exc.code == code and words in exc.message, exc.message
    assert exc.path is not None


def test_one_operand_quantized_is_refused(tmp_path):
    p = tmp_path / "c.prec"
    p.write_text("contract c {\n  model qwen3_8b\n  hardware H100\n  scheme w8 = fp8_e4m3 weights tensor\n"
                 "  rollout sglang {\n  }\n  trainer fsdp {\n    fprop linear : w8 qdq\n  }\n}\n", encoding="utf-8")
    exc = _refused(compile_file(str(p)).plan)
    assert exc.code == "PCC640" and "one operand only" in exc.message


def test_two_scale_dtypes_in_one_module_are_refused(tmp_path):
    p = tmp_path / "c.prec"
    p.write_text("contract c {\n  model qwen3_8b\n  hardware H100\n"
                 "  scheme rp = fp8_e4m3 weights row activations token scale pow2\n"
                 "  rollout sglang {\n  }\n  trainer fsdp {\n    fprop linear : fp8_row real\n"
                 "    dgrad linear : rp real\n  }\n}\n", encoding="utf-8")
    exc = _refused(compile_file(str(p)).plan)
    assert exc.code == "PCC640" and "FP32 and power-of-two scales" in exc.message


def test_lora_on_a_converted_module_is_refused(tmp_path):
    plan = _text(tmp_path, "    gemm attn : fp8_tensor real",
                 "  sync adapter { }\n  trainable lora rank 8 alpha 16 targets attn.q\n")
    exc = _refused(plan)
    assert exc.code == "PCC642" and exc.path == "trainable.targets"


def test_a_megatron_contract_lowered_for_fsdp_is_pcc611():
    plan = _plan(ROOT / "contracts" / "unified_fp8.prec")
    assert "fsdp" not in targets_for(plan)
    rep = Reporter()
    lower_all(plan, rep, ("fsdp",))
    assert [d.code for d in rep.diagnostics] == ["PCC611"]


# ---- with torchao, torch and PEFT ---------------------------------------------------------------

def _torchao_dir() -> Path:
    """The side folder holding torchao; skips without it (CI=true: fails)."""
    from pcc.lower import verify_fsdp

    where = verify_fsdp.engine_dir()
    if not (where / "torchao" / "__init__.py").is_file():
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI must run the FSDP checks: no torchao in {where}")
        pytest.skip(f"torchao is not installed in {where}")
    return where


def _verify(plan):
    from pcc.lower import verify_fsdp

    try:
        return verify_fsdp.verify_plan(plan)
    except verify_fsdp.EngineMissing as exc:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI must run the FSDP checks: {exc}")
        pytest.skip(f"torchao/PEFT are not installed ({exc}); see requirements/fsdp.txt")


KINDS = {  # a qwen3_8b trainer per torchao path: 36 layers x 7 linear modules = 252, lm_head kept wide
    "rowwise": ("    gemm linear : fp8_row real", "", {"float8": {"Float8Linear": 252}}),
    "tensor_gather": ("    gemm linear : fp8_tensor real\n    param_gather fp8\n    optimizer adam distributed", "",
                      {"float8": {"Float8Linear[WeightWithDynamicFloat8CastTensor]": 252}}),
    "mxfp8": ("    gemm linear : mxfp8 real\n    wgrad : bf16", "",
              {"mxfp8": {"Linear[MXFP8TrainingWeightWrapperTensor]": 252}}),
    "int4_qat": ("    fprop linear : int4_g32 qdq", "", {"int4_qat": {"FakeQuantizedLinear": 252}}),
    "lora": ("    gemm : bf16", "  sync adapter { }\n  trainable lora rank 8 alpha 16 targets attn, mlp\n", {}),
}


@pytest.mark.engines
@pytest.mark.parametrize("name", sorted(KINDS))
def test_torchao_and_peft_build_and_apply_each_path(tmp_path, name):
    body, extra, converted = KINDS[name]
    plan = _text(tmp_path, body, extra, hw="B200" if name == "mxfp8" else "H100")
    out = _verify(plan)
    assert out["versions"] == {"torch": "2.13.0", "torchao": "0.18.0", "peft": "0.21.2"}
    wide = 253 if name == "lora" else 1
    assert out["classes"] == {"wide": {"Linear": wide}, **converted}
    assert out["lora"] == ({"peft.tuners.lora.layer.Linear": 252} if name == "lora" else {})
    if name == "mxfp8":
        assert "wgrad_with_hp=True" in out["configs"][1]


@pytest.mark.engines
def test_blockwise_config_builds_and_its_module_needs_sm90(tmp_path):
    out = _verify(_text(tmp_path, "    gemm linear : fp8_block real"))
    assert out["configs"][1].startswith("<torchao.prototype.blockwise_fp8_training.linear.Float8BlockwiseLinearConfig")
    assert "SM90" in out["unchecked"]["blockwise"]


@pytest.mark.engines
@pytest.mark.parametrize("name", ["tiny_cpu", "fp8_rowwise", "qwen38_nvfp4_lora"])
def test_shipped_variants_apply(name):
    out = _verify(_plan(ROOT / "contracts" / "fsdp" / f"{name}.prec"))
    assert sum(n for kinds in out["classes"].values() for n in kinds.values()) == \
        {"tiny_cpu": 117, "fp8_rowwise": QWEN_MOE_LINEAR + QWEN_MOE_WIDE,
         "qwen38_nvfp4_lora": QWEN_MOE_LINEAR + QWEN_MOE_WIDE}[name]


@pytest.mark.engines
def test_torchao_rejects_what_pcc_refuses(tmp_path):
    """PCC640's 'one dtype in both GEMMs': the same casts, written by hand, fail Float8LinearConfig."""
    from pcc.lower import verify_fsdp

    plan = _text(tmp_path, "    gemm linear : fp8_tensor real")
    doc, ops = _doc(plan), plan.catalog.operators
    casts = doc["low_precision"][0]["config"]["casts"]
    casts["cast_config_weight_for_grad_input"]["target_dtype"] = "float8_e5m2"
    casts["cast_config_grad_output"]["target_dtype"] = "float8_e5m2"
    try:
        with pytest.raises(verify_fsdp.VerifyError, match="weight must be cast to the same dtype"):
            verify_fsdp.verify_fsdp_config(doc, {module_name(ops[i].tensor): ops[i].shape for i in gemm_modules(plan)})
    except verify_fsdp.EngineMissing as exc:
        if os.environ.get("CI") == "true":
            pytest.fail(str(exc))
        pytest.skip(str(exc))


def test_fuzzed_fsdp_contracts_check_and_compile_alike(tmp_path):
    """tests/test_fuzz_pipeline.py's mutations on the shipped contracts with 'trainer fsdp': no input
    escapes as an exception, the .prec and YAML twins agree, and a contract that checks writes a bundle."""
    import sys

    sys.path.insert(0, str(ROOT / "tests"))
    import test_fuzz_pipeline as fuzz

    bases = [fuzz._base(p) for p in fuzz.CONTRACTS]
    broken, compiled = [], 0
    for seed in range(200):
        base = json.loads(json.dumps(bases[seed % len(bases)]))
        base.pop("framework", None)
        base["trainer"] = {**base.get("trainer", {}), "engine": "fsdp", "parallel": {"tp": 1, "ep": 1, "pp": 1}}
        moe = base.get("routing_replay", "none") != "none" or "experts" in json.dumps(base)  # as the fuzz test picks
        if (problem := fuzz.run_case(base, seed, moe, tmp_path)) is not None:
            broken.append(problem)
        compiled += check_file(str(tmp_path / f"c{seed}.prec")).ok
    assert not broken, broken[0]
    assert compiled > 10  # the cases reach the fsdp target's lowering, not only the checker's errors


@pytest.mark.engines
def test_pcc_check_and_compile_never_import_torchao_or_peft(tmp_path):
    """With both importable, checking and writing an fsdp bundle (the LoRA one: a PEFT config) loads neither:
    only pcc.lower.fsdp_apply.apply and verify do."""
    import subprocess
    import sys

    where = _torchao_dir()
    code = ("import sys; sys.path.append(sys.argv[1])\n"
            "from pcc.lower import compile_file\nfrom pcc.bundle.write import bundle_files\nimport pcc.lower.fsdp_apply\n"
            "c = compile_file(sys.argv[2]); assert c.ok; bundle_files(c.plan)\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torchao', 'peft')))\n")
    out = subprocess.run([sys.executable, "-c", code, str(where), str(ROOT / "contracts" / "fsdp" /
                          "qwen38_nvfp4_lora.prec")], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "[]"


@pytest.mark.engines
def test_torchaos_int4_grid_is_what_pcc612_says():
    """The PCC612 caveat, measured: torchao's symmetric INT4 fake quantization of one 128-wide group
    has step amax/7.5 and clamps +amax to code 7 (its range is [-8, 7]), where pcc's INT4 steps by amax/7."""
    import subprocess
    import sys

    where = _torchao_dir()
    code = ("import sys, json, torch; sys.path.append(sys.argv[1])\n"
            "from torchao.quantization.qat import IntxFakeQuantizeConfig\n"
            "from torchao.quantization.qat.fake_quantizer import IntxFakeQuantizer\n"
            "w = torch.linspace(-0.9, 1.0, 128).reshape(1, 128)\n"
            "q = IntxFakeQuantizer(IntxFakeQuantizeConfig(torch.int4, group_size=128, is_symmetric=True))(w)\n"
            "u = torch.unique(q); step = float((u[1:] - u[:-1]).min())\n"
            "print(json.dumps({'ratio': 1.0 / step, 'highest': round(float(q.max()) / step)}))\n")
    out = subprocess.run([sys.executable, "-c", code, str(where)], capture_output=True, text=True, timeout=300)
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert abs(got["ratio"] - 7.5) < 1e-4 and got["highest"] == 7


def test_cpu_offload_on_fsdp_needs_no_precision_aware_optimizer(tmp_path):
    """PCC309 is Megatron's rule (its CPU optimizer offload runs inside the precision-aware optimizer);
    FSDP2 offloads with CPUOffloadPolicy, which the trainer file turns on."""
    plan = _text(tmp_path, "    optimizer adam distributed offload")
    c = compile_file(str(tmp_path / "c.prec"))
    assert c.ok and "PCC309" not in {d.code for d in c.diagnostics}
    assert _doc(plan)["cpu_offload"] is True
