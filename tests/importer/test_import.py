"""pcc import: checkpoint quantization configs and Miles launches as contracts.

References are the tools themselves: compressed-tensors' own `apply_quantization_config` on a
meta-device model with the catalog's module names, SGLang's own `is_layer_skipped` and
`ModelOptFp4Config.is_layer_excluded`, published checkpoint configs (tests/importer/data, sources
in docs/import.md), and pcc's shipped contracts compiled to bundles.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pcc.bundle.write import write_bundle
from pcc.importer import ImportFailed, import_source
from pcc.importer.matching import module_name, sglang_module
from pcc.lower import compile_file
from pcc.lower.checkpoint_config import quantization_config, skip_list
from pcc.models import load_catalog

DATA = Path(__file__).parent / "data"
ROOT = Path(__file__).resolve().parents[2]


def _compile(imp, tmp_path, name="imported.prec"):
    path = tmp_path / name
    path.write_text(imp.text())
    c = compile_file(str(path))
    assert c.ok, [d.render() for d in c.diagnostics if d.is_error]
    return c


def _resolved(imp, catalog):
    """The imported contract resolved by pcc's own resolver (no checks: a mixed-format import
    resolves, although pcc check then refuses one checkpoint of two formats, PCC312)."""
    from pcc.contract.model import Contract
    from pcc.lang.build import SourceMap
    from pcc.lang.diagnostics import Reporter
    from pcc.plan.resolve import resolve

    return resolve(Contract.model_validate(imp.contract), catalog, SourceMap(), Reporter())


# -- compressed-tensors: the library's own matcher is the reference -----------------------------

def _meta_model(catalog):
    """A meta-device torch model with the catalog's module names: nn.Linear where the HF model has
    one, nn.Embedding for the embedding, a plain module for norms and custom gates."""
    import torch

    from pcc.importer.matching import ct_classes

    root = torch.nn.Module()
    for op in catalog.operators:
        if op.family == "kv_cache":
            continue
        classes = ct_classes(op, catalog)
        with torch.device("meta"):
            mod = (torch.nn.Linear(256, 256, bias=False) if "Linear" in classes else
                   torch.nn.Embedding(256, 256) if "Embedding" in classes else torch.nn.LayerNorm(8))
        parent = root
        *path, leaf = module_name(op).split(".")
        for part in path:
            if not hasattr(parent, part):
                parent.add_module(part, torch.nn.Module())
            parent = getattr(parent, part)
        parent.add_module(leaf, mod)
    return root


def _ct_reference(catalog, qc: dict) -> dict[str, str]:
    """module name -> config group name, as compressed-tensors itself applies the config."""
    from compressed_tensors.quantization import QuantizationConfig, apply_quantization_config

    model = _meta_model(catalog)
    cfg = QuantizationConfig.model_validate(qc)
    apply_quantization_config(model, cfg, show_progress=False)
    groups = {json.dumps(g.model_dump(), sort_keys=True, default=str): k for k, g in cfg.config_groups.items()}
    out = {}
    for name, mod in model.named_modules():
        scheme = getattr(mod, "quantization_scheme", None)
        if scheme is not None:
            out[name] = groups[json.dumps(scheme.model_dump(), sort_keys=True, default=str)]
    return out


def _ct_config(groups: dict, ignore: list[str]) -> dict:
    from compressed_tensors.quantization import QuantizationConfig, preset_name_to_scheme

    cg = {name: preset_name_to_scheme(preset, targets) for name, (preset, targets) in groups.items()}
    return QuantizationConfig(config_groups=cg, ignore=ignore, format="pack-quantized").model_dump(mode="json")


@pytest.mark.parametrize("groups,ignore", [
    ({"group_0": ("W4A16", ["Linear"])}, ["lm_head", "re:.*mlp.gate$", "re:.*mlp.shared_expert_gate$"]),
    # overlapping regexes in two groups: compressed-tensors picks alphabetically, not by group order
    ({"group_0": ("W4A16", ["re:.*experts.*", "Linear"]), "group_1": ("W8A16", ["re:.*down_proj"])},
     ["lm_head", "model.layers.0.self_attn", "re:.*mlp.gate$"]),
    ({"g": ("FP8_BLOCK", ["re:.*self_attn.*"]), "h": ("W4A16", ["model.layers.1.mlp.experts.0.up_proj"])}, []),
])
def test_compressed_tensors_matching_equals_the_library(groups, ignore, tmp_path):
    catalog = load_catalog("tiny_moe_128")
    qc = _ct_config(groups, ignore)
    reference = _ct_reference(catalog, qc)
    imp = import_source("checkpoint", _write(tmp_path, {"quantization_config": qc}), "tiny_moe_128")
    plan = _resolved(imp, catalog)
    ours = {}
    for i, op in enumerate(catalog.operators):
        spec = plan.scheme("rollout", i)
        if op.family != "kv_cache" and not spec.wide:
            ours[module_name(op)] = spec
    assert set(ours) == set(reference)
    # each module's pcc scheme is the scheme of the group compressed-tensors chose for it
    by_group: dict[str, set] = {}
    for name, g in reference.items():
        by_group.setdefault(g, set()).add(ours[name])
    assert all(len(s) == 1 for s in by_group.values()) and len({next(iter(s)) for s in by_group.values()}) == len(by_group)


def test_compressed_tensors_warnings(tmp_path):
    qc = _ct_config({"group_0": ("W8A16", ["re:.*down_proj"]), "group_1": ("W4A16", ["re:.*experts.*", "Linear"])},
                    ["lm_head", "model.layers.0.self_attn", "re:.*mlp.gate$"])
    assert _ct_reference(load_catalog("tiny_moe_128"), qc)["model.layers.1.mlp.experts.0.down_proj"] == "group_0"
    imp = import_source("checkpoint", _write(tmp_path, {"quantization_config": qc}), "tiny_moe_128")
    paths = {(d.code, d.path) for d in imp.diagnostics}
    # ct#866: an ignore entry naming a parent module excludes nothing (exact names only)
    assert ("PCC802", "ignore[1]") in paths
    # an expert down_proj matched by both groups: "re:.*down_proj" < "re:.*experts.*" alphabetically,
    # so compressed-tensors applies group_0, where pcc's "the later wins" would read group_1
    assert any(d.code == "PCC803" and "experts" in d.message and "group_0" in d.message for d in imp.diagnostics)


# -- SGLang: its own loader functions are the reference ----------------------------------------

def _sglang_functions():
    """SGLang's own `is_layer_skipped` (quantization/utils.py) and `is_layer_excluded`
    (modelopt_quant.py), taken from the installed sources: the quantization package itself
    imports GPU kernels (tvm_ffi) at import time, these functions need only `re`."""
    import ast
    import importlib.util
    import re
    import typing
    from types import MappingProxyType

    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("sglang is not installed")
    base = Path(spec.submodule_search_locations[0]) / "srt" / "layers" / "quantization"
    ns = {"re": re, "Mapping": typing.Mapping, "List": typing.List, "MappingProxyType": MappingProxyType}
    wanted = {"_module_path_match", "_FALLBACK_FUSED_SHARDS", "is_layer_skipped", "_compile_exclusion_pattern",
              "is_layer_excluded"}
    for file in ("utils.py", "modelopt_quant.py"):
        tree = ast.parse((base / file).read_text())
        nodes = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AnnAssign, ast.Assign))
                 and (getattr(n, "name", None) in wanted or any(getattr(t, "id", None) in wanted for t in
                                                                  getattr(n, "targets", [getattr(n, "target", None)])))]
        for n in nodes:
            n.decorator_list = [] if isinstance(n, ast.FunctionDef) else None
            exec(compile(ast.Module([n], []), file, "exec"), ns)
    excluded = ns["is_layer_excluded"]

    class _Cfg:
        def __init__(self, entries):
            self.exclude_modules = entries

    return ns["is_layer_skipped"], lambda prefix, entries: excluded(_Cfg(entries), prefix)

def test_sglang_fp8_and_modelopt_rules_equal_sglang():
    is_layer_skipped, is_layer_excluded = _sglang_functions()
    from pcc.importer.matching import FusedDisagreement, modelopt_excluded, sglang_skipped

    catalog = load_catalog("deepseek_v3")
    entries = ["lm_head", "model.layers.3.mlp.experts.7.down_proj", "layers.5.self_attn", "mlp.shared_experts",
               "model.layers.*.self_attn", "model.layers.2*", "kv_b_proj", "model.layers.9.self_attn.q_a_proj"]
    for op in catalog.operators[:3000]:
        if op.family == "kv_cache":
            continue
        m = sglang_module(op)
        mapping = {"fused_qkv_a_proj_with_mqa": ["q_a_proj", "kv_a_proj_with_mqa"]}
        try:
            expected = is_layer_skipped(m.prefix, entries, mapping)
        except ValueError:
            with pytest.raises(FusedDisagreement):
                sglang_skipped(m, entries)
            continue
        assert sglang_skipped(m, entries) == expected, m.prefix
        assert modelopt_excluded(m.prefix, entries) == is_layer_excluded(m.prefix, entries), m.prefix


# -- published checkpoint configs: import, compile back, compare field by field -----------------

def _write(tmp_path, doc, name="config.json"):
    path = tmp_path / name
    path.write_text(json.dumps(doc))
    return str(path)


def _sglang_wide(catalog, entries):
    """Checkpoint module names SGLang's fp8 loader leaves unquantized (its own is_layer_skipped)."""
    is_layer_skipped, _ = _sglang_functions()
    from pcc.importer.matching import normalized_fp8_ignores

    ignored = normalized_fp8_ignores(entries)
    wide = set()
    for op in catalog.operators:
        if op.family.startswith(("attn.", "mlp.", "experts.", "shared_experts.")):
            m = sglang_module(op)
            if is_layer_skipped(m.prefix, ignored):
                wide.add(module_name(op))
    return wide


@pytest.mark.parametrize("data,model", [("qwen3_30b_a3b_fp8.json", "qwen3_30b_a3b"),
                                        ("deepseek_v3_fp8.json", "deepseek_v3")])
def test_published_block_fp8_configs_compile_back(data, model, tmp_path):
    original = json.loads((DATA / data).read_text())["quantization_config"]
    imp = import_source("checkpoint", str(DATA / data), model, "H100")
    assert not [d for d in imp.diagnostics if d.code in ("PCC802", "PCC803")], [d.message for d in imp.diagnostics]
    plan = _compile(imp, tmp_path).plan
    back = quantization_config(plan)
    for key in ("quant_method", "activation_scheme", "weight_block_size", "fmt"):
        assert back[key] == original[key], key
    catalog = load_catalog(model)
    assert _sglang_wide(catalog, back["modules_to_not_convert"]) == _sglang_wide(catalog, original.get(
        "modules_to_not_convert", []))


def test_gpt_oss_mxfp4_config(tmp_path):
    """gpt-oss's list is ignored by SGLang's mxfp4 method (warned); its router entry names no module
    of a Qwen-style MoE (warned); every routed expert is MXFP4 and nothing else, as SGLang runs it."""
    imp = import_source("checkpoint", str(DATA / "gpt_oss_mxfp4.json"), "qwen3_30b_a3b", "B200")
    assert ("PCC806", "modules_to_not_convert") in {(d.code, d.path) for d in imp.diagnostics}
    assert ("PCC802", "modules_to_not_convert[1]") in {(d.code, d.path) for d in imp.diagnostics}
    plan = _compile(imp, tmp_path).plan
    back = quantization_config(plan)
    assert back["quant_method"] == "mxfp4"
    ops = plan.catalog.operators
    quantized = {i for i in range(len(ops)) if not plan.scheme("rollout", i).wide}
    assert quantized == {i for i, op in enumerate(ops) if op.family.startswith("experts.")}


def test_modelopt_nvfp4_nested_config(tmp_path):
    _, is_layer_excluded = _sglang_functions()
    src = DATA / "qwen3_30b_a3b_nvfp4_hf_quant_config.json"
    imp = import_source("checkpoint", str(src), "qwen3_30b_a3b", "B200")
    plan = _compile(imp, tmp_path).plan
    back = quantization_config(plan)
    original = json.loads(src.read_text())["quantization"]
    assert (back["quant_algo"], back["group_size"], back["kv_cache_quant_algo"]) == (
        original["quant_algo"], original["group_size"], original["kv_cache_quant_algo"])
    # the exception set, as SGLang's own is_layer_excluded decides it under each list
    prefixes = {sglang_module(op).prefix for op in plan.catalog.operators if op.family not in ("kv_cache",)}

    def excluded(entries):
        return {p for p in prefixes if is_layer_excluded(p, entries)}

    linear = {sglang_module(op).prefix for op in plan.catalog.operators
              if op.family.startswith(("attn.", "experts.", "mlp.", "shared_experts.")) or op.family == "lm_head"}
    assert excluded(back["exclude_modules"]) & linear == excluded(original["exclude_modules"]) & linear


@pytest.mark.parametrize("preset,model,ignore", [
    ("W4A16", "qwen3_30b_a3b", ["lm_head", "re:.*mlp.gate$", "re:.*mlp.shared_expert_gate$"]),
    ("FP8_BLOCK", "qwen3_8b", ["lm_head"]),
])
def test_llm_compressor_example_configs_compile_back(preset, model, ignore, tmp_path):
    """llm-compressor's examples (quantization_w4a16/qwen3_30b_moe_gptq_int4_ddp_example.py,
    quantization_w8a8_fp8/fp8_block_example.py): the config compressed-tensors writes for them."""
    qc = _ct_config({"group_0": (preset, ["Linear"])}, ignore)
    imp = import_source("checkpoint", _write(tmp_path, {"quantization_config": qc}), model, "H100")
    if preset == "W4A16":  # Qwen3-MoE has no shared expert gate: that ignore entry is dead
        assert ("PCC802", "ignore[2]") in {(d.code, d.path) for d in imp.diagnostics}
    plan = _compile(imp, tmp_path).plan
    catalog = load_catalog(model)
    reference = set(_ct_reference(catalog, qc))
    quantized = {module_name(op) for i, op in enumerate(catalog.operators)
                 if op.family != "kv_cache" and not plan.scheme("rollout", i).wide}
    assert quantized == reference
    if preset == "W4A16":
        back = quantization_config(plan)
        w = back["config_groups"]["group_0"]["weights"]
        ow = qc["config_groups"]["group_0"]["weights"]
        for key in ("num_bits", "type", "symmetric", "group_size", "strategy"):
            assert w[key] == ow[key], key
        assert set(_ct_reference(catalog, back)) == reference  # the exception set, as tensors
    else:
        assert {module_name(op) for i, op in enumerate(catalog.operators)
                if op.family != "kv_cache" and not plan.scheme("rollout", i).wide} == reference


# -- the round trip over every shipped contract --------------------------------------------------

# What a bundle's artifacts cannot carry, per contract: (diff section, field) or (component, family).
# Everything else must come back identical (pcc diff finds nothing else). rollout.max_tokens is carried
# (--rollout-max-response-len is read back).
NOT_CARRIED = {
    "bf16_baseline": set(),
    "glm52_fp8_rollout": {("placement", "rollout.hardware"), ("placement", "trainer.hardware")},
    # Miles' INT4 QAT fake-quantizes routed experts only; the sync bridge is not a flag
    "int4_qat_w4a16": {("sync", "sync.bridge"), ("fprop", "attn.q"), ("fprop", "attn.kv"), ("fprop", "attn.o")},
    # the baseline regime's expectations replace the same-version bound with a recorded baseline
    "k3_mxfp4_lora": {("placement", "rollout.hardware"), ("placement", "trainer.hardware"),
                      ("expect", "same_version")},
    "miles_mode1": set(),
    "mxfp8_blackwell": {
        (c, f) for c in ("fprop", "dgrad", "wgrad") for f in ("attn.q", "attn.kv", "attn.o", "experts.gate_up",
                                                                "experts.down")},
    "qwen38_nvfp4_lora": {("expect", "same_version")},
    "selective_nvfp4": set(),
    "tiny_cpu": {("placement", "trainer.fp8_recipe")} | {
        ("fprop", f) for f in ("attn.q", "attn.kv", "attn.o", "experts.gate_up", "experts.down")},
    "unified_fp8": {
        (c, f) for c in ("fprop", "dgrad", "wgrad") for f in ("attn.q", "attn.kv", "attn.o", "experts.gate_up",
                                                                "experts.down")},
    "unified_fp8_fake_fwd": {("placement", "trainer.fp8_recipe")} | {
        ("fprop", f) for f in ("attn.q", "attn.kv", "attn.o", "experts.gate_up", "experts.down")},
    "unified_fp8_fake_fwd_bwd": {("placement", "trainer.fp8_recipe")} | {
        (c, f) for c in ("fprop", "dgrad", "wgrad") for f in ("attn.q", "attn.kv", "attn.o", "experts.gate_up",
                                                                "experts.down")},
}
_BIG = {"glm52_fp8_rollout", "k3_mxfp4_lora"}


def _differences(report) -> set[tuple[str, str]]:
    out = set()
    for section in ("optimizer", "sync", "correction", "placement"):
        out |= {(section, c["field"]) for c in report[section]}
    out |= {("expect", e["metric"]) for e in report["expect"]}
    for comp, rows in report["components"].items():
        out |= {(comp, r["family"]) for r in rows}
    t = report["trainable"]
    out |= {("trainable", f["field"]) for f in t["fields"]}
    if t["gained"] or t["lost"]:
        out.add(("trainable", "tensors"))
    return out


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n in _BIG else n
                                  for n in sorted(NOT_CARRIED)])
def test_bundle_round_trip(name, tmp_path):
    from pcc.diff import diff

    assert sorted(NOT_CARRIED) == sorted(p.stem for p in (ROOT / "contracts").glob("*.prec"))
    src = str(ROOT / "contracts" / f"{name}.prec")
    c = compile_file(src)
    write_bundle(c.plan, tmp_path / "bundle")
    imp = import_source("miles", str(tmp_path / "bundle"), c.plan.contract.model.catalog)
    out = tmp_path / "imported.prec"
    out.write_text(imp.text())
    assert compile_file(str(out)).ok
    report = diff(src, str(out))
    assert _differences(report) == NOT_CARRIED[name]
    # the imported contract regenerates the same engine arguments and environment, engine by engine
    assert {e: (r["args"], r["env"]) for e, r in report["engines"].items() if r["args"] or r["env"]} == {}
    # every field the launch cannot state is announced
    assert {d.path for d in imp.diagnostics if d.code == "PCC808"} >= {"sync.bridge"}


# -- a Miles launch script, as Miles' own example scripts write them ------------------------------

SCRIPT = r"""#!/bin/bash
set -ex
export PYTHONBUFFERED=16
source "${SCRIPT_DIR}/models/qwen3-30B-A3B.sh"
CKPT_ARGS=(
   --hf-checkpoint {ckpt}
   --ref-load /root/Qwen3-30B-A3B_torch_dist
)
PERF_ARGS=(
   --tensor-model-parallel-size 4
   --expert-model-parallel-size 8
   --use-distributed-optimizer
)
GRPO_ARGS=(
   --use-tis
   --tis-clip 1.5
   --use-rollout-routing-replay
)
SGLANG_ARGS=(
   --rollout-num-gpus-per-engine 4
   --sglang-ep-size 4
   --sglang-kv-cache-dtype fp8_e4m3
)
ray start --head --node-ip-address ${MASTER_ADDR} --num-gpus 8 --disable-usage-stats
RUNTIME_ENV_JSON="{
  \"env_vars\": {
    \"OPEN_TRAINING_INT4_FAKE_QAT_FLAG\": \"1\",
    \"OPEN_TRAINING_INT4_GROUP_SIZE\": \"128\"
  }
}"
ray job submit --address="http://127.0.0.1:8265" \
   --runtime-env-json="${RUNTIME_ENV_JSON}" \
   -- python3 train_async.py \
   --bf16 \
   ${MODEL_ARGS[@]} ${CKPT_ARGS[@]} ${PERF_ARGS[@]} ${GRPO_ARGS[@]} ${SGLANG_ARGS[@]} \
   --fully-async --max-weight-staleness 3
"""


def test_miles_script_int4_qat_drift(tmp_path):
    """The public drift: an INT4 rollout checkpoint in groups of 32, trainer QAT in groups of 128."""
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    qc = _ct_config({"group_0": ("W4A16", ["re:.*experts.*"])}, [])
    qc["config_groups"]["group_0"]["weights"]["group_size"] = 32
    (ckpt / "config.json").write_text(json.dumps({"quantization_config": qc}))
    script = tmp_path / "run-qwen3-30B-A3B-int4.sh"
    script.write_text(SCRIPT.replace("{ckpt}", str(ckpt)))
    imp = import_source("miles", str(script), "qwen3_30b_a3b", "H100")
    assert ("PCC809", "OPEN_TRAINING_INT4_GROUP_SIZE") in {(d.code, d.path) for d in imp.diagnostics}
    d = imp.contract
    assert {"components": ["fprop"], "patterns": ["experts"], "scheme": "int4_g128", "gemm": "qdq"} in d["trainer"]["rules"]
    assert d["trainer"]["params"] == "bf16"  # Miles: bf16 unless --fp16
    assert d["sync"] == {"moves": "full_weights", "schedule": "async", "max_staleness": 3}
    assert d["correction"] == {"kind": "tis", "clip": 1.5} and d["routing_replay"] == "r3"
    assert d["rollout"]["parallel"] == {"tp": 4, "ep": 4}
    assert d["trainer"]["parallel"] == {"tp": 4, "ep": 8} and d["trainer"]["optimizer"]["distributed"]
    assert {"components": ["rollout"], "patterns": ["kv_cache"], "scheme": "fp8_e4m3"} in d["rollout"]["rules"]
    c = compile_file(str(_save(imp, tmp_path)))
    assert "PCC403" in {x.code for x in c.diagnostics}  # pcc check names the same drift


EXPANDED = r"""#!/bin/bash
BASE_DIR=/root/shared
TP=2
FP8=(--fp8-format e4m3 --fp8-recipe blockwise)
perf() {
  echo --tensor-model-parallel-size $((TP * 2)) --expert-model-parallel-size $((TP + 2))
}
ROLLOUT_ARGS=(
   --rollout-num-gpus-per-engine $((TP * 4))
   --hf-checkpoint "${BASE_DIR}/Qwen3-30B-A3B-FP8"
   --sglang-ep-size ${EP:-4}
)
python3 train.py "${FP8[@]}" "${ROLLOUT_ARGS[@]}" $(perf) --colocate --num-rollout $(nproc) \
   --rollout-max-response-len $((1024 * 8)) --context-parallel-size 2 --custom-config-path "${BASE_DIR}/extra.yaml"
"""


def test_miles_script_expanded_as_bash(tmp_path):
    """Arrays in quotes, a variable inside a word, arithmetic over what the script assigned and a
    function that echoes flags: read where bash passes them; a command substitution stays, warned."""
    script = tmp_path / "run-qwen3-30B-A3B-fp8.sh"
    script.write_text(EXPANDED)
    imp = import_source("miles", str(script), "qwen3_30b_a3b", "H100")
    d = imp.contract
    assert d["rollout"]["parallel"] == {"tp": 8, "ep": 4}
    assert d["trainer"]["parallel"] == {"tp": 4, "ep": 4, "cp": 2}  # --context-parallel-size: the contract's cp
    assert {r["scheme"] for r in d["trainer"]["rules"]} == {"fp8_block"}
    assert d["rollout"]["max_tokens"] == 8192
    assert "rollout.max_tokens" not in {x.path for x in imp.diagnostics}
    extra = next(x for x in imp.diagnostics if x.path == "--custom-config-path")
    assert extra.code == "PCC808" and "/root/shared/extra.yaml" in extra.message
    hf = next(x for x in imp.diagnostics if x.path == "--hf-checkpoint")
    assert "/root/shared/Qwen3-30B-A3B-FP8 is not a readable directory" in hf.message
    left = next(x for x in imp.diagnostics if x.path == "$(nproc)")
    assert left.code == "PCC808" and left.span.line == EXPANDED.splitlines().index(
        next(x for x in EXPANDED.splitlines() if "$(nproc)" in x)) + 1


def _save(imp, tmp_path):
    path = tmp_path / "imported.prec"
    path.write_text(imp.text())
    return path


# -- errors and the command ----------------------------------------------------------------------

@pytest.mark.parametrize("qc,words", [
    ({"quant_method": "awq", "bits": 4}, "awq"),
    ({"quant_method": "fp8", "weight_block_size": [128, 128]}, "activation_scheme"),
    ({"quant_method": "fp8", "activation_scheme": "static", "weight_block_size": [128, 128]}, "dynamic"),
    ({"quant_method": "fp8", "activation_scheme": "dynamic",
      "modules_to_not_convert": ["model.layers.0.self_attn.q_proj"]}, "some but not all"),
    ({"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 32}, "group_size"),
])
def test_errors_are_coded(qc, words, tmp_path):
    with pytest.raises(ImportFailed) as exc:
        import_source("checkpoint", _write(tmp_path, {"quantization_config": qc}), "qwen3_8b")
    assert exc.value.code == "PCC801" and words in exc.value.message


def test_cli(tmp_path, capsys):
    from pcc.cli import main

    out = tmp_path / "c.prec"
    assert main(["import", "checkpoint", str(DATA / "deepseek_v3_fp8.json"), "--model", "tiny_moe", "-o", str(out)]) == 0
    assert out.read_text().startswith("contract deepseek_v3_fp8 {")
    capsys.readouterr()
    assert main(["fmt", "--check", str(out)]) == 0
    capsys.readouterr()
    assert main(["import", "checkpoint", str(tmp_path / "missing.json"), "--json"]) == 2
    env = json.loads(capsys.readouterr().out)
    assert env["command"] == "import" and env["exit_code"] == 2
    bad = _write(tmp_path, {"quant_method": "gguf"})
    assert main(["import", "checkpoint", bad, "--model", "tiny_moe", "--json"]) == 1
    env = json.loads(capsys.readouterr().out)
    assert env["diagnostics"][0]["code"] == "PCC801"


def test_skip_list_of_a_compiled_import_is_what_sglang_skips(tmp_path):
    """The converter's skip list (what pcc writes back) names every module the source kept wide."""
    imp = import_source("checkpoint", str(DATA / "qwen3_30b_a3b_fp8.json"), "qwen3_30b_a3b", "H100")
    plan = _compile(imp, tmp_path).plan
    assert "lm_head" in skip_list(plan)


def test_modelopt_language_model_prefixed_exclusions(tmp_path):
    """A multimodal wrapper's ModelOpt export names its exclusions under `language_model.`; SGLang's
    `ModelOptQuantConfig.apply_weight_name_mapper` (modelopt_quant.py) keeps each also without the
    prefix, so attention, shared experts and lm_head of the text model stay BF16, no PCC802."""
    entries = ["language_model.lm_head", "language_model.model.layers.*.self_attn*",
               "language_model.model.layers.*.mlp.shared_experts*", "language_model.model.layers.*.mlp.gate"]
    doc = {"producer": {"name": "modelopt", "version": "0.33.0"},
           "quantization": {"quant_algo": "NVFP4", "group_size": 16, "exclude_modules": entries}}
    imp = import_source("checkpoint", _write(tmp_path, doc, "hf_quant_config.json"), "deepseek_v3", "B200")
    assert not [d for d in imp.diagnostics if d.code == "PCC802"], [d.message for d in imp.diagnostics]
    plan = _resolved(imp, load_catalog("deepseek_v3"))
    ops = plan.catalog.operators
    wide = {op.family for i, op in enumerate(ops) if plan.scheme("rollout", i).wide}
    narrow = {op.family for i, op in enumerate(ops) if not plan.scheme("rollout", i).wide}
    assert {"attn.q", "attn.kv", "attn.o", "shared_experts.gate_up", "shared_experts.down", "lm_head"} <= wide
    assert narrow == {"experts.gate_up", "experts.down", "mlp.gate_up", "mlp.down"}


# -- published checkpoint directories of the hybrid families (tests/models/published, SOURCES.md) ---------------

PUBLISHED = ROOT / "tests" / "models" / "published"


def _published_dir(tmp_path, stem: str) -> Path:
    """A checkpoint directory holding the published config.json (+ hf_quant_config.json) as the model has them."""
    d = tmp_path / stem
    d.mkdir()
    (d / "config.json").write_bytes((PUBLISHED / f"{stem}.config.json").read_bytes())
    if (PUBLISHED / f"{stem}.hf_quant_config.json").exists():
        (d / "hf_quant_config.json").write_bytes((PUBLISHED / f"{stem}.hf_quant_config.json").read_bytes())
    return d


def test_minimax_m2_5_fp8_imports_and_compiles_back(tmp_path):
    """MiniMax-M2.5 (FP8 native): the contract is `linear : fp8_block` and its compiled rollout config has the
    published quant_method, activation_scheme and block; `modules_to_not_convert` differs in its entries, not in
    what it decides: SGLang's own is_layer_skipped keeps the same modules wide under either list (every router,
    via the published `gate` and pcc's per-layer names). What pcc writes differently is warned: `fmt` (PCC804:
    pcc writes e4m3, SGLang reads neither) and `e_score_correction_bias` (PCC802: a parameter, no module)."""
    is_layer_skipped, _ = _sglang_functions()
    d = _published_dir(tmp_path, "MiniMaxAI--MiniMax-M2.5")
    original = json.loads((d / "config.json").read_text())["quantization_config"]
    imp = import_source("checkpoint", str(d))
    codes = {(x.code, x.path) for x in imp.diagnostics}
    assert ("PCC804", "fmt") in codes and ("PCC802", "modules_to_not_convert[1]") in codes, codes
    assert "linear : fp8_block" in imp.text()
    plan = _compile(imp, tmp_path).plan
    back = quantization_config(plan)
    for key in ("quant_method", "activation_scheme", "weight_block_size"):
        assert back[key] == original[key], key
    assert (back["fmt"], original["fmt"]) == ("e4m3", "float8_e4m3fn")
    from pcc.importer.matching import normalized_fp8_ignores

    prefixes = {sglang_module(op).prefix for op in plan.catalog.operators
                if op.family.startswith(("attn.", "experts.", "router")) or op.family == "lm_head"}

    def wide(entries):
        return {p for p in prefixes if is_layer_skipped(p, normalized_fp8_ignores(entries))}

    assert wide(back["modules_to_not_convert"]) == wide(original["modules_to_not_convert"])
    assert {p for p in wide(original["modules_to_not_convert"]) if p != "lm_head"} == {
        sglang_module(op).prefix for op in plan.catalog.operators if op.family == "router"}
    ops = plan.catalog.operators
    assert {op.family for i, op in enumerate(ops) if not plan.scheme("rollout", i).wide} == {
        "attn.q", "attn.kv", "attn.o", "experts.gate_up", "experts.down"}


def _sglang_packed(model_file: str, cls: str) -> dict:
    """`packed_modules_mapping` of an SGLang model class, read from its installed source (the models import GPU
    kernels at import time)."""
    import ast
    import importlib.util

    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("sglang is not installed")
    tree = ast.parse((Path(spec.submodule_search_locations[0]) / "srt" / "models" / model_file).read_text())
    body = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls).body
    return ast.literal_eval(next(n.value for n in body if isinstance(n, ast.Assign)
                                 and any(getattr(t, "id", None) == "packed_modules_mapping" for t in n.targets)))


@pytest.mark.parametrize("stem", ["nvidia--MiniMax-M2.5-NVFP4", "nvidia--Qwen3.5-122B-A10B-NVFP4",
                                  "nvidia--Qwen3.5-397B-A17B-NVFP4"])
def test_nvidia_nvfp4_exports_import_and_compile_back(tmp_path, stem):
    """NVIDIA's NVFP4 MiniMax-M2.5 and Qwen3.5-122B-A10B / 397B-A17B: routed experts NVFP4; attention (and Qwen3.5's
    linear attention and shared experts), routers and lm_head excluded; FP8 KV cache. The import warns of nothing
    but the hardware (Qwen3.5's `model.visual*` and `mtp*` entries name the vision tower and MTP layer the catalog
    leaves out, kept as stored); the compiled config has the published quant_algo, group size and KV algorithm, and
    SGLang's own is_layer_excluded excludes the same Linear and MoE modules under pcc's list as under the published
    one (both the flat config.json `ignore` and hf_quant_config.json's `exclude_modules`)."""
    is_layer_skipped, is_layer_excluded = _sglang_functions()
    d = _published_dir(tmp_path, stem)
    nested = json.loads((d / "hf_quant_config.json").read_text())["quantization"]
    flat = json.loads((d / "config.json").read_text())["quantization_config"]
    imp = import_source("checkpoint", str(d))
    assert "experts : nvfp4" in imp.text() and "kv_cache : fp8_e4m3" in imp.text()
    assert {x.code for x in imp.diagnostics} == {"PCC808"}, [(x.code, x.path) for x in imp.diagnostics]
    plan = _compile(imp, tmp_path).plan
    back = quantization_config(plan)
    assert (back["quant_algo"], back["group_size"], back["kv_cache_quant_algo"]) == (
        nested["quant_algo"], nested["group_size"], nested["kv_cache_quant_algo"])
    # SGLang's ModelOptFp4Config.get_quant_method: a Linear (or LM head) is excluded by is_layer_skipped (fused
    # qkv_proj decided by its q/k/v shards) or is_layer_excluded; a FusedMoE by is_layer_excluded only.
    packed = _sglang_packed("qwen3_5.py", "Qwen3_5ForCausalLM")  # + Gated DeltaNet's in_proj_qkvz, in_proj_ba
    assert packed["qkv_proj"] == ["q_proj", "k_proj", "v_proj"] and packed["gate_up_proj"] == ["gate_proj", "up_proj"]
    # Routers are compared through the plan: SGLang builds them without a quant_config (MiniMax-M2.5's list names
    # them, Qwen3.5's does not; pcc's names them), so no list decides them.
    ops = plan.catalog.operators
    linear = {sglang_module(op).prefix for op in ops
              if op.family.startswith(("attn.", "shared_experts.")) or op.family == "lm_head"
              or sglang_module(op).prefix.endswith(".in_proj_ba")}
    moe = {sglang_module(op).prefix for op in ops if op.family.startswith("experts.")}
    assert linear and moe
    assert all(plan.scheme("rollout", i).wide for i, op in enumerate(ops) if op.family == "router")

    def excluded(entries):
        return ({p for p in linear if is_layer_skipped(p, entries, packed) or is_layer_excluded(p, entries)}
                | {p for p in moe if is_layer_excluded(p, entries)})

    assert excluded(back["exclude_modules"]) == excluded(nested["exclude_modules"]) == excluded(flat["ignore"])
    assert excluded(back["exclude_modules"]) == linear  # all but the routed experts BF16; every expert NVFP4


def test_qwen3_6_nvfp4_mixed_precision_imports_and_compiles_back(tmp_path):
    """NVIDIA's NVFP4 Qwen3.6-35B-A3B is ModelOpt MIXED_PRECISION: FP8 attention and linear attention, W4A16 NVFP4
    experts, shared experts and lm_head. It imports as a vLLM rollout of those schemes, and compiles back to the
    published `quantized_layers` entry for entry (config.json and hf_quant_config.json), the same FP8 config group,
    MIXED_PRECISION and modelopt. What differs is coded at import: group_1's 4-bit input activations for W4A16 targets
    (PCC804: vLLM reads quantized_layers), the nested file's FP8 KV cache (PCC806: vLLM reads config.json's flat
    form, which sets none); the `mtp*` exclusions name the MTP layer the config has and the catalog leaves out (pcc
    carries it as stored: no warning, and pcc's list is empty); the producer is pcc, which vLLM does not read (tests/plan/test_mixed_precision.py: vLLM decides every module alike under both)."""
    d = _published_dir(tmp_path, "nvidia--Qwen3.6-35B-A3B-NVFP4")
    flat = json.loads((d / "config.json").read_text())["quantization_config"]
    nested = json.loads((d / "hf_quant_config.json").read_text())["quantization"]
    imp = import_source("checkpoint", str(d))
    codes = {(x.code, x.path) for x in imp.diagnostics}
    assert {("PCC804", "config_groups.group_1.input_activations"), ("PCC806", "kv_cache_scheme")} <= codes, codes
    assert not any(c == "PCC802" for c, _ in codes), codes
    assert "rollout vllm {" in imp.text() and "attn : fp8_tensor" in imp.text()
    plan = _compile(imp, tmp_path).plan
    back = quantization_config(plan)
    from pcc.lower.checkpoint_config import hf_quant_config

    back_nested = hf_quant_config(plan)["quantization"]
    assert back["quantized_layers"] == flat["quantized_layers"] == back_nested["quantized_layers"]
    assert nested["quantized_layers"] == flat["quantized_layers"]
    for key in ("quant_algo", "quant_method"):
        assert back[key] == flat[key], key
    assert back["config_groups"]["group_0"] == flat["config_groups"]["group_0"]
    g1, p1 = back["config_groups"]["group_1"], flat["config_groups"]["group_1"]
    assert (g1["weights"], g1["targets"]) == (p1["weights"], p1["targets"]) and g1["input_activations"] is None
    assert back["ignore"] == back_nested["exclude_modules"] == [] and "kv_cache_scheme" not in back
    assert (back_nested["quant_algo"], back_nested["kv_cache_quant_algo"]) == ("MIXED_PRECISION", None)


def test_a_mixed_export_with_a_kv_cache_scheme_pcc_cannot_carry_is_refused(tmp_path):
    """A flat MIXED_PRECISION config whose kv_cache_scheme is no FP8 float scheme is a coded refusal, not a
    contract that silently keeps the KV cache wide."""
    d = _published_dir(tmp_path, "nvidia--Qwen3.6-35B-A3B-NVFP4")
    config = json.loads((d / "config.json").read_text())
    config["quantization_config"]["kv_cache_scheme"] = {"type": "int", "num_bits": 8}
    (d / "config.json").write_text(json.dumps(config))
    with pytest.raises(ImportFailed) as exc:
        import_source("checkpoint", str(d))
    assert exc.value.code == "PCC801" and exc.value.path == "kv_cache_scheme"


def test_a_mixed_export_is_matched_within_the_import_bounds(tmp_path, monkeypatch):
    """Every quantized_layers key and exclusion of a MIXED_PRECISION export meets every module: counted before
    matching, PCC811 past the bound (as the other ModelOpt and compressed-tensors lists)."""
    from pcc.importer import bounds

    d = _published_dir(tmp_path, "nvidia--Qwen3.6-35B-A3B-NVFP4")
    monkeypatch.setattr(bounds, "MAX_MATCHES", 1000)
    with pytest.raises(ImportFailed) as exc:
        import_source("checkpoint", str(d))
    assert exc.value.code == "PCC811" and "module names" in exc.value.message
