"""The rollout checkpoint config a one-line contract produces, field by field against the model's published
one, and read by the loaders' own code: transformers' quantization config classes and its module-exclusion
rule `should_convert_module` (its FP8 and MXFP4 loaders apply it), and vLLM's (`get_quantization_config(method)
.from_config`, the fields the parsed object holds, and its exclusion rule `is_layer_skipped`), run in a child
process over vLLM's side folder as pcc.lower.verify_vllm does, and SGLang's `Fp8Config.from_config` and
`is_layer_skipped`, compiled from the installed source (its modules import GPU libraries a CPU lacks).

Published (tests/models/published/SOURCES.md): Qwen/Qwen3-30B-A3B-FP8 and Qwen/Qwen3-235B-A22B-FP8 {activation_scheme
dynamic, fmt e4m3, quant_method fp8, weight_block_size [128, 128], modules_to_not_convert: lm_head and each layer's
input_layernorm, mlp.gate, post_attention_layernorm}; NVIDIA's ModelOpt NVFP4 Qwen3-235B-A22B hf_quant_config.json
{quant_algo NVFP4, kv_cache_quant_algo FP8, group_size 16, exclude_modules: lm_head and each mlp.gate};
deepseek-ai/DeepSeek-V3 `quantization_config` {activation_scheme dynamic, fmt e4m3, quant_method
fp8, weight_block_size [128, 128]}; openai/gpt-oss-20b {modules_to_not_convert [model.layers.*.self_attn,
model.layers.*.mlp.router, model.embed_tokens, lm_head], quant_method mxfp4}. Deliberate differences
(docs/models.md): pcc lists the modules it keeps wide by name (`modules_to_not_convert`) where the published
config omits the list (DeepSeek-V3) or writes globs (gpt-oss); the loaders decide the same for every module.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import pytest
from transformers.quantizers.quantizers_utils import should_convert_module
from transformers.utils.quantization_config import FineGrainedFP8Config, Mxfp4Config

from pcc.lower import compile_file
from pcc.lower.checkpoint_config import hf_quant_config, quantization_config

PUBLISHED = Path(__file__).resolve().parent.parent / "models" / "published"
DEEPSEEK_V3 = {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8", "weight_block_size": [128, 128]}
GPT_OSS = json.loads((PUBLISHED / "openai--gpt-oss-20b.config.json").read_text())["quantization_config"]


def _plan(tmp_path, model: str, rule: str, hw: str):
    path = tmp_path / "c.prec"
    path.write_text(f"contract one-line {{\n  model {model}\n  hardware {hw}\n  rollout sglang {{\n    {rule}\n  }}\n"
                    "  routing replay rollout\n}\n", encoding="utf-8")
    compiled = compile_file(str(path))
    assert compiled.ok, [d.render(compiled.sources) for d in compiled.diagnostics if d.is_error]
    return compiled.plan


def _modules(plan) -> list[str]:
    """The module names a loader asks about: every weight operator's module, and the fused experts module."""
    names = {op.tensor[: -len(".weight")] for op in plan.catalog.operators if op.tensor.endswith(".weight")}
    names |= {op.tensor.split(".experts.")[0] + ".experts" for op in plan.catalog.operators
              if op.family.startswith("experts.")}
    return sorted(names)


def test_deepseek_v3_block_fp8(tmp_path):
    plan = _plan(tmp_path, "deepseek_v3", "linear : fp8_block", "H100")
    ours = quantization_config(plan)
    assert {k: ours[k] for k in DEEPSEEK_V3} == DEEPSEEK_V3
    assert set(ours) - set(DEEPSEEK_V3) == {"modules_to_not_convert"}
    a, b = FineGrainedFP8Config.from_dict(dict(DEEPSEEK_V3)), FineGrainedFP8Config.from_dict(dict(ours))
    assert (a.quant_method, a.activation_scheme, tuple(a.weight_block_size)) == (
        b.quant_method, b.activation_scheme, tuple(b.weight_block_size))
    # Every linear the published checkpoint quantizes (the ones with weight_scale_inv) is converted under pcc's
    # list; what pcc keeps wide is what DeepSeek stores BF16: the router, embeddings, lm_head.
    kept = [m for m in _modules(plan) if not should_convert_module(m, ours["modules_to_not_convert"])]
    assert {m.rsplit(".", 1)[-1] if m.startswith("model.layers.") else m for m in kept} == {
        "gate", "model.embed_tokens", "lm_head"}
    for op in plan.catalog.operators:
        if op.family in ("attn.q", "attn.kv", "attn.o", "mlp.gate_up", "mlp.down", "experts.gate_up",
                         "experts.down", "shared_experts.gate_up", "shared_experts.down"):
            assert should_convert_module(op.tensor[: -len(".weight")], ours["modules_to_not_convert"]), op.tensor


@pytest.fixture
def gpt_oss_dir(tmp_path):
    d = tmp_path / "gpt-oss-20b"
    d.mkdir()
    (d / "config.json").write_text((PUBLISHED / "openai--gpt-oss-20b.config.json").read_text())
    return d


def test_gpt_oss_mxfp4(tmp_path, gpt_oss_dir):
    path = tmp_path / "g.prec"
    path.write_text(f'contract one-line {{\n  model from "{gpt_oss_dir}"\n  hardware B200\n  rollout sglang {{\n'
                    "    experts : mxfp4\n  }\n  routing replay rollout\n}\n", encoding="utf-8")
    compiled = compile_file(str(path))
    assert compiled.ok, [d.render(compiled.sources) for d in compiled.diagnostics if d.is_error]
    ours = quantization_config(compiled.plan)
    assert set(ours) == set(GPT_OSS) and ours["quant_method"] == GPT_OSS["quant_method"]
    a, b = Mxfp4Config.from_dict(dict(GPT_OSS)), Mxfp4Config.from_dict(dict(ours))
    assert a.quant_method == b.quant_method
    modules = _modules(compiled.plan)
    assert "model.layers.23.mlp.experts" in modules and "model.layers.23.mlp.router" in modules
    for m in modules:  # transformers' own exclusion rule decides the same with either list
        assert should_convert_module(m, ours["modules_to_not_convert"]) == should_convert_module(
            m, GPT_OSS["modules_to_not_convert"]), m
    converted = [m for m in modules if should_convert_module(m, ours["modules_to_not_convert"])
                 and m.startswith("model.layers.") and "norm" not in m]
    assert converted and all(".mlp.experts" in m for m in converted)  # the experts only, as published


_VLLM_CHILD = textwrap.dedent("""
    import json, sys
    sys.path.append(sys.argv[1])
    from vllm.model_executor.layers.quantization import get_quantization_config
    from vllm.model_executor.layers.quantization.utils.quant_utils import is_layer_skipped
    out = []
    for case in json.loads(sys.stdin.read()):
        obj = get_quantization_config(case["method"]).from_config(dict(case["config"]))
        fields = {k: v for k, v in vars(obj).items() if isinstance(v, (str, int, float, bool, list, type(None)))}
        mode = getattr(obj, "ignored_layers_match_mode", "exact")
        if hasattr(obj, "is_layer_excluded"):  # ModelOpt's configs
            skipped = [obj.is_layer_excluded(m) for m in case["modules"]]
        elif getattr(obj, "ignored_layers", None) is not None:
            skipped = [is_layer_skipped(m, obj.ignored_layers, match_mode=mode) for m in case["modules"]]
        else:
            skipped = None
        out.append({"class": type(obj).__name__, "fields": fields, "skipped": skipped})
    print(json.dumps(out))
""")


def _vllm_parse(cases: list[dict]) -> list[dict]:
    vv = pytest.importorskip("pcc.lower.verify_vllm")
    where = vv.engine_dir()
    if not (where / "vllm" / "__init__.py").is_file():
        pytest.skip(f"vLLM is not installed in {where}")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"VLLM_TARGET_DEVICE": "cpu"}
    proc = subprocess.run([sys.executable, "-c", _VLLM_CHILD, str(where)], input=json.dumps(cases), text=True,
                          capture_output=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.engines
def test_vllm_parses_the_published_and_pcc_configs_alike(tmp_path, gpt_oss_dir):
    """vLLM's Fp8Config (DeepSeek-V3) and GptOssMxfp4Config (gpt-oss) hold the same fields for the published and
    pcc's configs but the exclusion list, and decide every module vLLM builds quantized the same way. vLLM reads
    neither `fmt` nor, for gpt-oss, `modules_to_not_convert` (GptOssMxfp4Config.from_config takes no field)."""
    ds = _plan(tmp_path, "deepseek_v3", "linear : fp8_block", "H100")
    path = tmp_path / "g.prec"
    path.write_text(f'contract one-line {{\n  model from "{gpt_oss_dir}"\n  hardware B200\n  rollout sglang {{\n'
                    "    experts : mxfp4\n  }\n  routing replay rollout\n}\n", encoding="utf-8")
    oss = compile_file(str(path)).plan
    cases = []
    for published, plan, method in ((DEEPSEEK_V3, ds, "fp8"), (GPT_OSS, oss, "gpt_oss_mxfp4")):
        modules = _modules(plan)
        cases += [{"method": method, "config": published, "modules": modules},
                  {"method": method, "config": quantization_config(plan), "modules": modules}]
    theirs_ds, ours_ds, theirs_oss, ours_oss = _vllm_parse(cases)
    assert theirs_ds["class"] == ours_ds["class"] == "Fp8Config"
    differ = {k for k in theirs_ds["fields"] if theirs_ds["fields"][k] != ours_ds["fields"][k]}
    assert differ == {"ignored_layers"} and ours_ds["fields"]["weight_block_size"] == [128, 128]
    assert ours_ds["fields"]["is_checkpoint_fp8_serialized"] and ours_ds["fields"]["activation_scheme"] == "dynamic"
    # The modules whose decision differs are the ones pcc lists and DeepSeek-V3 leaves unlisted: the router, the
    # embeddings and lm_head, which vLLM's DeepSeek model builds unquantized whatever the list says (the router is a
    # ReplicatedLinear with quant_config=None; embeddings and lm_head are no LinearBase).
    changed = {m for m, a, b in zip(cases[0]["modules"], theirs_ds["skipped"], ours_ds["skipped"]) if a != b}
    assert {m.rsplit(".", 1)[-1] if m.startswith("model.layers.") else m for m in changed} == {
        "gate", "model.embed_tokens", "lm_head"}
    assert theirs_oss == ours_oss and theirs_oss["class"] == "GptOssMxfp4Config"


def _sglang_fp8():
    """(SGLang's Fp8Config, its is_layer_skipped), compiled from the installed files: QuantizationConfig's key
    lookups (base_config.py), Fp8Config's __init__ and from_config (fp8.py), is_layer_skipped and its helpers
    (utils.py); logging and the SGLANG_FP8_IGNORED_LAYERS environment variable stubbed empty."""
    import importlib.util
    from collections.abc import Mapping
    from typing import Any, Dict, List, Optional

    spec = importlib.util.find_spec("sglang")
    if spec is None:
        pytest.skip("SGLang is not installed")
    root = Path(spec.origin).parent / "srt" / "layers" / "quantization"

    def nodes(file: str, wanted: dict[str, tuple[str, ...] | None]) -> list:
        tree = ast.parse((root / file).read_text(encoding="utf-8"))
        out = []
        for node in tree.body:
            names = [t.id for t in getattr(node, "targets", []) if isinstance(t, ast.Name)]
            if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                names = [node.target.id]
            name = getattr(node, "name", None) or (names[0] if names else None)
            if name not in wanted:
                continue
            if isinstance(node, ast.ClassDef):
                node.bases, node.keywords = [ast.Name("Base", ast.Load())] if name != "QuantizationConfig" else [], []
                node.body = [n for n in node.body if getattr(n, "name", None) in wanted[name]]
            out.append(node)
        return out

    ns = {"Any": Any, "Dict": Dict, "List": List, "Optional": Optional, "Mapping": Mapping,
          "MappingProxyType": types.MappingProxyType, "log_info_on_rank0": lambda *a: None,
          "logger": types.SimpleNamespace(warning=lambda *a: None, info=lambda *a: None),
          "envs": types.SimpleNamespace(SGLANG_FP8_IGNORED_LAYERS=types.SimpleNamespace(get=lambda: ""))}
    for file, wanted in (("base_config.py", {"QuantizationConfig": ("__init__", "get_from_keys", "get_from_keys_or")}),
                         ("utils.py", {"_module_path_match": None, "_FALLBACK_FUSED_SHARDS": None,
                                       "is_layer_skipped": None}),
                         ("fp8.py", {"ACTIVATION_SCHEMES": None, "Fp8Config": ("__init__", "from_config")})):
        if file == "fp8.py":
            ns["Base"] = ns["QuantizationConfig"]
        module = ast.fix_missing_locations(ast.Module(nodes(file, wanted), []))
        exec(compile(module, str(root / file), "exec"), ns)
    return ns["Fp8Config"], ns["is_layer_skipped"]


def test_sglang_parses_the_published_and_pcc_block_fp8_configs_alike(tmp_path):
    """SGLang's Fp8Config holds the same fields for DeepSeek-V3's published config and pcc's but the exclusion
    list (it reads no `fmt` either), and its is_layer_skipped, asked about every linear and fused-experts module,
    differs only where pcc lists what DeepSeek stores BF16 (the router, embeddings, lm_head: SGLang builds the
    router as a plain MoEGate parameter and the embeddings as no LinearBase, so the list does not change them)."""
    config_cls, skipped = _sglang_fp8()
    plan = _plan(tmp_path, "deepseek_v3", "linear : fp8_block", "H100")
    theirs, ours = config_cls.from_config(dict(DEEPSEEK_V3)), config_cls.from_config(quantization_config(plan))
    fields = set(vars(theirs)) | set(vars(ours))
    assert {f for f in fields if getattr(theirs, f, None) != getattr(ours, f, None)} == {"ignored_layers"}
    assert (ours.is_checkpoint_fp8_serialized, ours.activation_scheme, ours.weight_block_size, ours.use_mxfp8) == (
        True, "dynamic", [128, 128], False)
    modules = _modules(plan)
    changed = {m for m in modules if skipped(m, theirs.ignored_layers) != skipped(m, ours.ignored_layers)}
    assert {m.rsplit(".", 1)[-1] if m.startswith("model.layers.") else m for m in changed} == {
        "gate", "model.embed_tokens", "lm_head"}


def _published(name: str) -> dict:
    return json.loads((PUBLISHED / name).read_text())


def _model_dir(tmp_path, config: dict) -> Path:
    """The model as a config-only directory (its architecture; a one-line contract says the rollout scheme)."""
    d = tmp_path / "model"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({k: v for k, v in config.items() if k != "quantization_config"}))
    return d


def _plan_from(tmp_path, directory, rules: str, hw: str):
    path = tmp_path / "c.prec"
    path.write_text(f'contract one-line {{\n  model from "{directory}"\n  hardware {hw}\n  rollout sglang {{\n'
                    f"    {rules}\n  }}\n  routing replay rollout\n}}\n", encoding="utf-8")
    compiled = compile_file(str(path))
    assert compiled.ok, [d.render(compiled.sources) for d in compiled.diagnostics if d.is_error]
    return compiled.plan


NORMS = ("input_layernorm", "post_attention_layernorm")


@pytest.mark.parametrize("name", ["Qwen--Qwen3-30B-A3B-FP8.config.json", "Qwen--Qwen3-235B-A22B-FP8.config.json"])
def test_qwen3_moe_block_fp8(tmp_path, name):
    """`linear : fp8_block` writes Qwen's four fields as published; its modules_to_not_convert is Qwen's less the
    norms (never quantized, pcc lists no norm) plus model.embed_tokens (no Linear: no loader quantizes it). Every
    loader decides every Linear module the same with either list: transformers (should_convert_module), SGLang
    (is_layer_skipped), vLLM (below, test_vllm_reads_qwen3_moe_fp8_alike)."""
    published = _published(name)["quantization_config"]
    plan = _plan_from(tmp_path, _model_dir(tmp_path, _published(name)), "linear : fp8_block", "H100")
    ours = quantization_config(plan)
    assert set(ours) == set(published)
    assert {k: ours[k] for k in published if k != "modules_to_not_convert"} == {
        k: v for k, v in published.items() if k != "modules_to_not_convert"}
    theirs_list, ours_list = set(published["modules_to_not_convert"]), set(ours["modules_to_not_convert"])
    assert theirs_list - ours_list == {m for m in theirs_list if m.endswith(NORMS)}
    assert ours_list - theirs_list == {"model.embed_tokens"}
    a = FineGrainedFP8Config.from_dict(dict(published))
    b = FineGrainedFP8Config.from_dict(dict(ours))
    assert (a.quant_method, a.activation_scheme, tuple(a.weight_block_size)) == (
        b.quant_method, b.activation_scheme, tuple(b.weight_block_size))
    config_cls, skipped = _sglang_fp8()
    sa, sb = config_cls.from_config(dict(published)), config_cls.from_config(dict(ours))
    assert {f for f in set(vars(sa)) | set(vars(sb)) if getattr(sa, f, None) != getattr(sb, f, None)} == {
        "ignored_layers"}
    linears = [m for m in _modules(plan) if m != "model.embed_tokens" and not m.endswith("norm")]
    for m in linears:
        assert should_convert_module(m, published["modules_to_not_convert"]) == should_convert_module(
            m, ours["modules_to_not_convert"]), m
        assert skipped(m, sa.ignored_layers) == skipped(m, sb.ignored_layers), m
    assert {m for m in linears if not should_convert_module(m, ours["modules_to_not_convert"])} == {
        m for m in linears if m.endswith(".mlp.gate")} | {"lm_head"}


@pytest.mark.engines
def test_vllm_reads_qwen3_moe_fp8_and_nvfp4_alike(tmp_path):
    """vLLM's Fp8Config (Qwen3-30B-A3B-FP8) and ModelOptNvFp4Config (NVIDIA's NVFP4 Qwen3-235B-A22B: its nested
    hf_quant_config.json against pcc's flat config.json form, which vLLM reads first) hold the same fields but the
    exclusion list, and is_layer_skipped decides every Linear module alike."""
    fp8 = _published("Qwen--Qwen3-30B-A3B-FP8.config.json")
    (tmp_path / "a").mkdir()
    plan = _plan_from(tmp_path / "a", _model_dir(tmp_path / "a", fp8), "linear : fp8_block", "H100")
    nv = _published("nvidia--Qwen3-235B-A22B-NVFP4.hf_quant_config.json")
    (tmp_path / "b").mkdir()
    nv_plan = _plan_from(tmp_path / "b", _model_dir(tmp_path / "b", _published(
        "nvidia--Qwen3-235B-A22B-NVFP4.config.json")), "linear : nvfp4\n    kv_cache : fp8_e4m3", "B200")
    linears = [m for m in _modules(plan) if m != "model.embed_tokens" and not m.endswith("norm")]
    nv_linears = [m for m in _modules(nv_plan) if m != "model.embed_tokens" and not m.endswith("norm")]
    cases = [{"method": "fp8", "config": fp8["quantization_config"], "modules": linears},
             {"method": "fp8", "config": quantization_config(plan), "modules": linears},
             {"method": "modelopt_fp4", "config": nv, "modules": nv_linears},
             {"method": "modelopt_fp4", "config": quantization_config(nv_plan), "modules": nv_linears}]
    theirs, ours, nv_theirs, nv_ours = _vllm_parse(cases)
    assert theirs["skipped"] == ours["skipped"] and nv_theirs["skipped"] == nv_ours["skipped"]
    assert {k for k in theirs["fields"] if theirs["fields"][k] != ours["fields"][k]} == {"ignored_layers"}
    assert nv_theirs["class"] == nv_ours["class"]
    differ = {k for k in nv_theirs["fields"] if nv_theirs["fields"][k] != nv_ours["fields"][k]}
    assert differ <= {"exclude_modules", "ignored_layers"}, differ  # kv_cache_quant_algo FP8 on both sides
    assert any(nv_theirs["skipped"]) and not all(nv_theirs["skipped"])  # the routers are skipped, the rest is not


def test_qwen3_235b_nvfp4_hf_quant_config(tmp_path):
    """`linear : nvfp4` + `kv_cache : fp8_e4m3` writes NVIDIA's quantization fields (quant_algo, group_size,
    kv_cache_quant_algo) and excludes what it excludes (lm_head, every router) plus model.embed_tokens. The producer
    is pcc, not modelopt: vLLM refuses a non-ModelOpt producer only when it has to read hf_quant_config.json, and it
    reads config.json's quantization_config first, which pcc writes too."""
    published = _published("nvidia--Qwen3-235B-A22B-NVFP4.hf_quant_config.json")
    plan = _plan_from(tmp_path, _model_dir(tmp_path, _published("nvidia--Qwen3-235B-A22B-NVFP4.config.json")),
                      "linear : nvfp4\n    kv_cache : fp8_e4m3", "B200")
    ours = hf_quant_config(plan)["quantization"]
    theirs = published["quantization"]
    assert set(ours) == set(theirs)
    assert {k: ours[k] for k in theirs if k != "exclude_modules"} == {k: v for k, v in theirs.items()
                                                                      if k != "exclude_modules"}
    assert set(ours["exclude_modules"]) - set(theirs["exclude_modules"]) == {"model.embed_tokens"}
    assert set(theirs["exclude_modules"]) <= set(ours["exclude_modules"])
    flat = quantization_config(plan)
    assert (flat["quant_algo"], flat["group_size"], flat["kv_cache_quant_algo"]) == ("NVFP4", 16, "FP8")
