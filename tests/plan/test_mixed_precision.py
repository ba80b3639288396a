"""ModelOpt MIXED_PRECISION rollout checkpoints (pcc.plan.mixed): what compiles, what is refused, and what
vLLM's own `ModelOptMixedPrecisionConfig` decides for every module of pcc's config.

The reference is vLLM 0.32's modelopt.py in its side folder: `from_config` on pcc's config.json form and on
pcc's hf_quant_config.json form, `packed_modules_mapping` read from the model's own vLLM source (the class
attribute literal: importing qwen3_5.py needs torchvision), then `is_layer_excluded` and `_resolve_quant_algo`
per vLLM module prefix, as `get_quant_method` asks them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pcc.lower import compile_file
from pcc.lower.checkpoint_config import hf_quant_config, quantization_config

ROOT = Path(__file__).resolve().parents[2]
PUBLISHED = ROOT / "tests" / "models" / "published"

MIXED = """
  rollout {engine} {{
    attn : fp8_tensor
    experts : nvfp4_w4a16
    lm_head : nvfp4
    kv_cache : fp8_e4m3{extra}
  }}"""


def _contract(tmp_path, engine="vllm", model="qwen3_30b_a3b", extra="", schemes=""):
    text = (f"contract mixed {{\n  model {model}\n  hardware B200\n"
            "  scheme nvfp4_w4a16 = nvfp4 weights group 16\n" + schemes
            + MIXED.format(engine=engine, extra=extra) + "\n  trainer megatron {\n    gemm : bf16\n  }\n"
            "  trainable all\n  sync full_weights { schedule colocated bridge bf16 activation atomic }\n"
            "  routing replay rollout\n}\n")
    path = tmp_path / "mixed.prec"
    path.write_text(text, encoding="utf-8")
    return compile_file(str(path))


def _errors(c):
    return {d.code: d for d in c.diagnostics if d.is_error}


def test_sglang_keeps_one_scheme_and_names_the_engine_that_serves_mixed(tmp_path):
    err = _errors(_contract(tmp_path, engine="sglang"))["PCC312"]
    assert "vllm" in err.hint and "MIXED_PRECISION" in err.hint


def test_a_mix_of_no_modelopt_member_stays_pcc312_on_vllm(tmp_path):
    """Compressed-tensors INT4 beside block FP8: vLLM's mixed config holds neither, so one checkpoint, one scheme."""
    path = tmp_path / "c.prec"
    path.write_text("contract c {\n  model qwen3_30b_a3b\n  hardware H100\n  rollout vllm {\n    experts : int4_g128\n"
                    "    attn : fp8_block\n  }\n  routing replay rollout\n}\n", encoding="utf-8")
    errors = _errors(compile_file(str(path)))
    assert set(errors) == {"PCC312"} and "with these schemes" in errors["PCC312"].hint


def test_block_fp8_member_is_refused_with_vllms_reason(tmp_path):
    c = _contract(tmp_path, extra="\n    lm_head : fp8_block")
    err = _errors(c)["PCC650"]
    assert "FP8_PB_WO" in err.message and "128x128" in err.message and err.path.startswith("rollout.rules")


def test_weight_only_fp8_member_is_refused(tmp_path):
    c = _contract(tmp_path, schemes="  scheme fp8_wo = fp8_e4m3 weights tensor\n", extra="\n    attn.o : fp8_wo")
    assert "static per-tensor activation scale" in _errors(c)["PCC650"].message


def test_fused_projection_in_two_formats_is_refused(tmp_path):
    err = _errors(_contract(tmp_path, extra="\n    keep bf16 : attn.kv"))["PCC651"]
    assert "q_proj" in err.message and "Mixed quant_algo within fused layer" in err.message


def test_mixed_config_form(tmp_path):
    """The config.json form of NVIDIA's exports (tests/models/published) field for field: per-module
    `quantized_layers`, one config group per algorithm, `ignore`, MIXED_PRECISION, producer, modelopt; the
    members' layouts in the Plan; vLLM's flag and the checkpoint method the launch script requires."""
    c = _contract(tmp_path, extra="\n    keep bf16 : experts[0]")
    assert c.ok, [d.render() for d in c.diagnostics if d.is_error]
    plan = c.plan
    cfg = quantization_config(plan)
    published = json.loads((PUBLISHED / "nvidia--Qwen3.6-35B-A3B-NVFP4.config.json").read_text())["quantization_config"]
    assert set(cfg) == set(published) | {"kv_cache_scheme"}
    assert (cfg["quant_algo"], cfg["quant_method"]) == ("MIXED_PRECISION", "modelopt")
    assert cfg["quantized_layers"]["model.layers.1.self_attn.q_proj"] == {"quant_algo": "FP8"}
    assert cfg["quantized_layers"]["model.layers.1.mlp.experts"] == {"quant_algo": "W4A16_NVFP4", "group_size": 16}
    assert cfg["quantized_layers"]["lm_head"] == {"quant_algo": "NVFP4", "group_size": 16}
    assert "model.layers.0.mlp.experts" not in cfg["quantized_layers"]
    assert cfg["ignore"] == ["model.layers.0.mlp.experts"]
    groups = {g["weights"]["num_bits"] * 100 + bool(g["input_activations"]): g for g in cfg["config_groups"].values()}
    assert set(groups) == {801, 400, 401} and groups[400]["input_activations"] is None
    assert sorted(t for g in groups.values() for t in g["targets"]) == sorted(cfg["quantized_layers"])
    nested = hf_quant_config(plan)["quantization"]
    assert nested["quantized_layers"] == cfg["quantized_layers"] and nested["kv_cache_quant_algo"] == "FP8"
    names = {plan.layouts[i].name for i, op in enumerate(plan.catalog.operators) if op.family.startswith("attn.")}
    assert names == {"fp8_static"}
    targets = plan.rollout_tensors[plan.index["model.layers.1.self_attn.q_proj.weight"]]["targets"]
    assert list(targets) == [f"model.layers.1.self_attn.q_proj.{s}" for s in ("weight", "weight_scale", "input_scale")]
    expert = plan.rollout_tensors[plan.index["model.layers.1.mlp.experts.0.down_proj.weight"]]["targets"]
    assert [n.rsplit(".", 1)[-1] for n in expert] == ["weight", "weight_scale", "weight_scale_2"]
    from pcc.lower.vllm import lower_vllm

    out = lower_vllm(plan)
    assert out.args[out.args.index("--quantization") + 1] == "modelopt_mixed"
    assert 'quant_method' in out.files["rollout/launch_vllm.sh"] and "modelopt" in out.files["rollout/launch_vllm.sh"]


# -- vLLM's own reading ------------------------------------------------------------------------------------------

_CHILD = r"""
import json, sys
sys.path.append(sys.argv[1])
from vllm.model_executor.layers.quantization.modelopt import ModelOptMixedPrecisionConfig

req = json.loads(sys.stdin.read())
out = []
for cfg in req["configs"]:
    q = ModelOptMixedPrecisionConfig.from_config(cfg)
    q.packed_modules_mapping = req["packed"]
    out.append({"kv": q.kv_cache_quant_method, "algo": {
        p: (None if q.is_layer_excluded(p) else q._resolve_quant_algo(p)) for p in req["prefixes"]}})
print(json.dumps(out))
"""


def _packed(where: Path, file: str, cls: str) -> dict:
    """A vLLM model class's `packed_modules_mapping` literal, read from its source."""
    import ast

    for node in ast.walk(ast.parse((where / "vllm" / "model_executor" / "models" / file).read_text())):
        if isinstance(node, ast.ClassDef) and node.name == cls:
            for st in node.body:
                if isinstance(st, ast.Assign) and getattr(st.targets[0], "id", "") == "packed_modules_mapping":
                    return ast.literal_eval(st.value)
    raise AssertionError(f"{file}: no {cls}.packed_modules_mapping")


def _vllm_dir() -> Path:
    vv = pytest.importorskip("pcc.lower.verify_vllm")
    where = vv.engine_dir()
    if not (where / "vllm" / "__init__.py").is_file():
        pytest.skip(f"vLLM is not installed in {where}")
    return where


def _vllm_decisions(req: dict) -> list[dict]:
    where = _vllm_dir()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"VLLM_TARGET_DEVICE": "cpu"}
    proc = subprocess.run([sys.executable, "-c", _CHILD, str(where)], input=json.dumps(req), text=True,
                          capture_output=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def vllm_modules(plan, packed: dict) -> dict[str, set]:
    """vLLM module prefix -> the ModelOpt algos pcc wrote for its members (None: wide), from the catalog and
    vLLM's packed_modules_mapping (a shard's module is its packed name; a layer's routed experts one module)."""
    shard_of = {s: fused for fused, shards in packed.items() for s in shards}
    out: dict[str, set] = {}
    for i, op in enumerate(plan.catalog.operators):
        if op.family in ("kv_cache", "norm") or not op.tensor.endswith(".weight"):
            continue
        name = op.tensor.removesuffix(".weight")
        if op.family.startswith("experts."):
            prefix = name.split(".experts.")[0] + ".experts"
        else:
            head, _, leaf = name.rpartition(".")
            prefix = f"{head}.{shard_of[leaf]}" if leaf in shard_of else name
        x = plan.layouts[i]
        out.setdefault(prefix, set()).add(x.modelopt_algo if x is not None and x.quantized else None)
    return out


def _check_with_vllm(plan, file: str, cls: str, twin: bool = False):
    cfgs = [quantization_config(plan), hf_quant_config(plan)]
    packed = _packed(_vllm_dir(), file, cls)
    want = vllm_modules(plan, packed)
    assert all(len(v) == 1 for v in want.values()), {k: v for k, v in want.items() if len(v) > 1}
    prefixes = list(want)
    if twin:  # vLLM's Qwen3.5 modules may be named language_model.model.*: the same decision either way
        prefixes += ["language_model.model." + p.removeprefix("model.language_model.")
                     for p in want if p.startswith("model.language_model.")]
    got = _vllm_decisions({"packed": packed, "configs": cfgs, "prefixes": prefixes})
    for g in got:
        for p in prefixes:
            key = p if p in want else "model.language_model." + p.removeprefix("language_model.model.")
            assert g["algo"][p] == next(iter(want[key])), p
    return want, got


@pytest.mark.engines
def test_vllm_decides_every_module_as_the_plan(tmp_path):
    """Qwen3-30B-A3B: FP8 attention (q/k/v fused), W4A16 NVFP4 experts but layer 0's (wide, excluded), NVFP4
    lm_head; routers and embeddings unquantized; KV cache FP8 from either file form."""
    plan = _contract(tmp_path, extra="\n    keep bf16 : experts[0]").plan
    want, got = _check_with_vllm(plan, "qwen3_moe.py", "Qwen3MoeForCausalLM")
    assert want["model.layers.0.self_attn.qkv_proj"] == {"FP8"} and want["model.layers.0.mlp.experts"] == {None}
    assert want["model.layers.5.mlp.gate"] == {None} and want["lm_head"] == {"NVFP4"}
    assert [g["kv"] for g in got] == ["FP8", "FP8"]


@pytest.mark.engines
def test_vllm_decides_every_qwen3_6_module_as_the_plan(tmp_path):
    """Qwen3.6-35B-A3B (the published config's architecture): FP8 attention and gated-delta-net projections
    (in_proj_qkvz fused from in_proj_qkv + in_proj_z, in_proj_ba wide), routed experts W4A16 NVFP4 but layer 2's,
    which stay wide although its shared expert is quantized: vLLM's RoutedExperts fallback would give them the
    shared expert's algo, so pcc's `ignore` names them."""
    d = tmp_path / "q36"
    d.mkdir()
    cfg = json.loads((PUBLISHED / "nvidia--Qwen3.6-35B-A3B-NVFP4.config.json").read_text())
    cfg.pop("quantization_config")
    (d / "config.json").write_text(json.dumps(cfg))
    c = _contract(tmp_path, model=f'from "{d}"', extra="\n    shared_experts : nvfp4_w4a16\n    keep bf16 : experts[2]")
    assert c.ok, [x.render() for x in c.diagnostics if x.is_error]
    want, _ = _check_with_vllm(c.plan, "qwen3_5.py", "Qwen3_5ForCausalLMBase", twin=True)
    assert want["model.language_model.layers.0.linear_attn.in_proj_qkvz"] == {"FP8"}
    assert want["model.language_model.layers.0.linear_attn.in_proj_ba"] == {None}
    assert want["model.language_model.layers.2.mlp.experts"] == {None}
    assert want["model.language_model.layers.2.mlp.shared_expert.gate_up_proj"] == {"W4A16_NVFP4"}


@pytest.mark.engines
def test_vllm_reads_the_published_qwen3_6_export_and_pcc_regenerated_config_alike(tmp_path):
    """NVIDIA's NVFP4 Qwen3.6-35B-A3B, imported (`pcc import checkpoint`) and compiled back: vLLM's own config class
    resolves every module the same quant_algo (or none) under the published config.json and hf_quant_config.json as
    under pcc's two files. The KV cache: the published config.json sets none (vLLM reads it first), its
    hf_quant_config.json FP8 (PCC806 at import)."""
    from pcc.importer import import_source

    d = tmp_path / "q36"
    d.mkdir()
    for suffix in ("config.json", "hf_quant_config.json"):
        (d / suffix).write_bytes((PUBLISHED / f"nvidia--Qwen3.6-35B-A3B-NVFP4.{suffix}").read_bytes())
    imp = import_source("checkpoint", str(d))
    path = tmp_path / "imported.prec"
    path.write_text(imp.text(), encoding="utf-8")
    c = compile_file(str(path))
    assert c.ok, [x.render() for x in c.diagnostics if x.is_error]
    plan = c.plan
    packed = _packed(_vllm_dir(), "qwen3_5.py", "Qwen3_5ForCausalLMBase")
    want = vllm_modules(plan, packed)
    prefixes = list(want) + ["language_model.model." + p.removeprefix("model.language_model.") for p in want
                             if p.startswith("model.language_model.")]
    published = [json.loads((d / "config.json").read_text())["quantization_config"],
                 json.loads((d / "hf_quant_config.json").read_text())]
    ours = [quantization_config(plan), hf_quant_config(plan)]
    got = _vllm_decisions({"packed": packed, "configs": published + ours, "prefixes": prefixes})
    assert got[0]["algo"] == got[1]["algo"] == got[2]["algo"] == got[3]["algo"]
    assert [g["kv"] for g in got] == [None, "FP8", None, None]
    for p, algos in want.items():  # and they are the Plan's
        assert got[2]["algo"][p] == next(iter(algos)), p
    seen = {a for a in got[0]["algo"].values()}
    assert seen == {"FP8", "W4A16_NVFP4", None}


def test_the_shipped_contract_regenerates_nvidias_quantized_layers():
    """contracts/vllm/qwen36_mixed_nvfp4.prec on the built-in qwen3_5_35b_a3b: the published export's
    `quantized_layers` and FP8 config group, entry for entry."""
    c = compile_file(str(ROOT / "contracts" / "vllm" / "qwen36_mixed_nvfp4.prec"))
    assert c.ok, [x.render() for x in c.diagnostics if x.is_error]
    ours = quantization_config(c.plan)
    published = json.loads((PUBLISHED / "nvidia--Qwen3.6-35B-A3B-NVFP4.config.json").read_text())["quantization_config"]
    assert ours["quantized_layers"] == published["quantized_layers"]
    assert ours["config_groups"]["group_0"] == published["config_groups"]["group_0"]
