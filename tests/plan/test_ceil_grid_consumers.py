"""PCC205's consumer warning for rollout block FP8, checked against the consumers' own code on a CPU.

For every rollout weight of a contract, whether pcc says a consumer refuses it is compared with what that
consumer's code does with the weight's shape:
- transformers: `Fp8Dequantize._dequantize_one` (its CPU load path) on a weight with pcc's ceil-sized scale grid;
- vLLM: `validate_fp8_block_shape` / `validate_fp8_block_shape_moe` (quantization/utils/fp8_utils.py), run in a
  child process over vLLM's side folder as pcc.lower.verify_vllm does;
- SGLang: `Fp8LinearMethod.validate_block_quant_shapes` (srt/layers/quantization/fp8.py), compiled from the
  installed source on its own, since the module imports GPU libraries (tvm_ffi) a CPU lacks.
How each module is built (fused QKV, merged gate/up, replicated MLA down-projections, fused MoE) is the engines'
model code (sglang/srt/models/qwen3_moe.py, deepseek_v2.py; vllm/model_executor/models/ the same).
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
import torch

from pcc.lower import compile_file
from pcc.plan.checks import _engine_refusal, _grid_fit, rank_rows

Fp8Dequantize = pytest.importorskip("transformers.integrations.finegrained_fp8").Fp8Dequantize

QKV = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj")
MERGED = ("gate_proj", "up_proj")
COLUMN = ("self_attn.q_b_proj", "self_attn.kv_b_proj")
ROW = ("self_attn.o_proj", "down_proj")
CONFIGS = Path(__file__).resolve().parents[2] / "pcc" / "models" / "configs"
# Real configs (pcc/models/configs: Qwen/Qwen3-30B-A3B, deepseek-ai/DeepSeek-V3) with their real widths and fewer
# layers and experts, which no check here depends on.
FEWER = {"tiny_moe": {}, "qwen3_30b_a3b": {"num_hidden_layers": 2, "num_experts": 8},
         "deepseek_v3": {"num_hidden_layers": 2, "first_k_dense_replace": 1, "n_routed_experts": 8, "n_group": 1,
                         "topk_group": 1}}
CASES = [("tiny_moe", 1, 1), ("qwen3_30b_a3b", 4, 1), ("qwen3_30b_a3b", 4, 4), ("qwen3_30b_a3b", 8, 8),
         ("deepseek_v3", 8, 1), ("deepseek_v3", 32, 1)]


def _plan(tmp_path, model: str, tp: int, ep: int):
    tmp_path.mkdir()
    config = json.loads((CONFIGS / f"{model}.json").read_text(encoding="utf-8")) | FEWER[model]
    (tmp_path / model).mkdir()
    (tmp_path / model / "config.json").write_text(json.dumps(config))
    path = tmp_path / f"{model}-{tp}-{ep}.prec"
    path.write_text(f'contract grid {{\n  model from "{tmp_path / model}"\n  hardware H100\n  rollout sglang {{\n'
                    f"    parallel tp {tp} ep {ep}\n    linear : fp8_block\n  }}\n  routing replay rollout\n}}\n",
                    encoding="utf-8")
    compiled = compile_file(str(path))
    assert compiled.ok
    warned = [d.message for d in compiled.diagnostics if d.code == "PCC205" and "not every consumer" in d.message]
    return compiled.plan, warned


def _weights(plan):
    ops = plan.catalog.operators
    return [ops[i] for d, idx in plan.used("rollout") if d.scheme.format == "fp8_e4m3" for i in idx
            if len(ops[i].shape) == 2 and ops[i].family not in ("kv_cache", "embed", "norm")]


def _layer_sizes(op, rows: dict[str, int], tp: int, ep: int, kv_heads: int) -> dict:
    """The engine layer a weight loads into, as its FP8 block validator sees it."""
    n, k = op.shape
    module = op.tensor[: -len(".weight")]
    if op.family.startswith("experts."):
        moe_tp = max(1, tp // ep)
        return {"kind": "moe", "tp": moe_tp, "inter": (n if op.family == "experts.gate_up" else k) // moe_tp}
    base = dict(kind="linear", tp=tp, input_size=k, input_size_per_partition=k, output_size=n, parts=[n // tp])
    if module.endswith(QKV):  # QKVParallelLinear: one whole KV head per rank where tp exceeds the KV heads
        prefix = module.rsplit(".", 1)[0]
        q, k, v = (rows[f"{prefix}.{p}.weight"] for p in ("q_proj", "k_proj", "v_proj"))
        kv_tp = tp if tp < kv_heads else kv_heads
        return dict(base, output_size=q + k + v, parts=[q // tp, k // kv_tp, v // kv_tp])
    if module.endswith(MERGED):
        return dict(base, output_size=2 * n, parts=[n // tp, n // tp])
    if module.endswith(COLUMN):
        return base
    if module.endswith(ROW):
        return dict(base, input_size_per_partition=k // tp, parts=[n])
    return dict(base, tp=1, parts=[n])  # replicated (MLA q_a_proj, kv_a_proj_with_mqa fused into one)


_VLLM_CHILD = textwrap.dedent("""
    import json, sys, types
    sys.path.append(sys.argv[1])
    import vllm.distributed as dist
    from vllm.model_executor.layers.quantization.utils import fp8_utils
    out = []
    for case in json.loads(sys.stdin.read()):
        dist.get_tensor_model_parallel_world_size = lambda: case["tp"]
        try:
            if case["kind"] == "moe":
                fp8_utils.validate_fp8_block_shape_moe(case["inter"], [128, 128])
            else:
                fp8_utils.validate_fp8_block_shape(types.SimpleNamespace(tp_size=case["tp"], prefix="w"),
                    case["input_size"], case["output_size"], case["input_size_per_partition"], case["parts"],
                    [128, 128])
            out.append(False)
        except ValueError:
            out.append(True)
    print(json.dumps(out))
""")


def _vllm_refuses(cases: list[dict]) -> list[bool]:
    vv = pytest.importorskip("pcc.lower.verify_vllm")
    where = vv.engine_dir()
    if not (where / "vllm" / "__init__.py").is_file():
        pytest.skip(f"vLLM is not installed in {where}")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"VLLM_TARGET_DEVICE": "cpu"}
    proc = subprocess.run([sys.executable, "-c", _VLLM_CHILD, str(where)], input=json.dumps(cases), text=True,
                          capture_output=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _sglang_validator():
    """SGLang's Fp8LinearMethod.validate_block_quant_shapes, compiled from the installed file on its own."""
    import importlib.util

    spec = importlib.util.find_spec("sglang")
    if spec is None:
        pytest.skip("SGLang is not installed")
    path = os.path.join(os.path.dirname(spec.origin), "srt", "layers", "quantization", "fp8.py")
    tree = ast.parse(open(path, encoding="utf-8").read())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Fp8LinearMethod")
    fn = next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "validate_block_quant_shapes")
    fn.decorator_list = []
    namespace = {"List": list, "print_warning_once": print}
    exec(compile(ast.Module([fn], []), path, "exec"), namespace)
    return namespace["validate_block_quant_shapes"]


def _sglang_refuses(validate, case: dict) -> bool:
    layer = types.SimpleNamespace(tp_group=types.SimpleNamespace(world_size=case["tp"]))
    try:
        validate(layer, types.SimpleNamespace(weight_block_size=[128, 128]), case["input_size"],
                 case["input_size_per_partition"], case["output_size"], sum(case["parts"]), case["parts"])
    except ValueError:
        return True
    return False


def test_engines_refuse_exactly_what_pcc_says(tmp_path):
    """Every block-FP8 rollout weight of each (model, tp, ep): SGLang's and vLLM's validators refuse its layer
    exactly when pcc names it, and the warning is there exactly when some consumer refuses something."""
    runs = []
    for model, tp, ep in CASES:
        plan, warned = _plan(tmp_path / f"{model}-{tp}-{ep}", model, tp, ep)
        weights = _weights(plan)
        rows = {op.tensor: op.shape[0] for op in plan.catalog.operators if len(op.shape) == 2}
        kv = plan.catalog.num_key_value_heads
        runs.append((tp, ep, warned, weights, rank_rows(plan.catalog, tp),
                     [_layer_sizes(op, rows, tp, ep, kv) for op in weights]))
    unique = {json.dumps(c, sort_keys=True): c for run in runs for c in run[-1]}
    vllm = dict(zip(unique, _vllm_refuses(list(unique.values()))))
    validate = _sglang_validator()
    totals = []
    for tp, ep, warned, weights, rows, cases in runs:
        refused = 0
        for op, case in zip(weights, cases):
            ours = _engine_refusal(op, tp, ep, 128, 128, rows) is not None
            assert vllm[json.dumps(case, sort_keys=True)] == ours, (op.tensor, case)
            if case["kind"] == "linear":
                assert _sglang_refuses(validate, case) == ours, (op.tensor, case)
            refused += ours
        padded = any(_grid_fit(d, 128) != "ok" for op in weights for d in op.shape)
        assert bool(warned) == bool(refused or padded)
        assert not refused or f"SGLang and vLLM refuse {refused}:" in warned[0]
        totals.append(refused)
    # tiny_moe: k/v and experts 64 wide; Qwen3 experts at tp 4 (192), not at tp 4 ep 4, nor at tp 8 (its 4 KV heads
    # replicated: one whole head per rank); DeepSeek fine at tp 8, not at 32
    assert [bool(t) for t in totals] == [True, True, False, False, False, True]


@pytest.mark.parametrize("shape", [(576, 7168), (200, 256), (64, 128), (256, 320), (128, 7168)])
def test_transformers_fp8_dequantize_on_a_ceil_grid(shape):
    """transformers reads a scale grid's block as dimension / grid: it refuses a grid that does not divide the
    dimension, and applies the wrong scales where it divides but the block is not 128; pcc's `_grid_fit` says which."""
    n, k = shape
    grid = (-(-n // 128), -(-k // 128))
    scales = torch.arange(1, grid[0] * grid[1] + 1, dtype=torch.float32).reshape(grid)
    weight = torch.ones(shape).to(torch.float8_e4m3fn)
    right = scales.repeat_interleave(128, 0).repeat_interleave(128, 1)[:n, :k]
    fits = [_grid_fit(d, 128) for d in shape]
    try:
        got = Fp8Dequantize(None)._dequantize_one(weight, scales, output_dtype=torch.float32)
    except ValueError as err:
        assert "not divisible by scale grid" in str(err)
        assert "refused" in fits
        return
    assert "refused" not in fits
    assert torch.equal(got, right) == (fits == ["ok", "ok"])
