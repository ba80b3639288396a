"""Plan -> SGLang server arguments, a standalone launch script and the checkpoint's quantization_config.

The flag tables live in targets/sglang.yaml; `pcc.lower.verify_sglang` runs the result
through SGLang's own ServerArgs parser. What the parser does not check and a plan can get
wrong (LoRA target scopes SGLang cannot express, MoE LoRA on an expert base SGLang's MoE
LoRA runner rejects, routed experts on a dense model) is `unsupported(code, ...)` here.
"""

from __future__ import annotations

import functools
import json

from pcc.lower import Lowered, Unsupported, module_leaf, refuse, target, unsupported
from pcc.lower.checkpoint_config import quantization_config, rollout_layout
from pcc.lower.engine_support import check, check_flags
from pcc.lower.server_script import (Server, kv_cache_rule, quantized_rule, request_caveats, routed_experts,
                                     server_script)
from pcc.lower.settings import Setting, flag
from pcc.plan import Plan
from pcc.plan.layouts import named
from pcc.resources import target_table

LAUNCH = "rollout/launch_server.sh"
ARGS_FILE = "rollout/server_args.txt"
QUANT_FILE = "rollout/quantization_config.json"


@functools.lru_cache(maxsize=1)
def tables() -> dict:
    return target_table("sglang")


def _kv_cache_dtype(plan: Plan) -> str:
    kv = plan.kv_cache_formats()
    fmts = set(kv)
    if len(fmts) > 1:
        unsupported("PCC311", f"SGLang stores the whole KV cache in one dtype; the plan asks for "
                    f"{', '.join(sorted(fmts))}", next(r.path for r in kv.values() if r is not None))
    fmt = fmts.pop() if fmts else "bf16"
    table = tables()["kv_cache_dtype"]
    if fmt not in table:
        unsupported("PCC609", f"SGLang has no {fmt} KV cache (--kv-cache-dtype: {', '.join(sorted(table))})",
                    kv[fmt].path if kv.get(fmt) else "rollout", hint="use fp8_e4m3 or fp8_e5m2 for the kv_cache")
    return table[fmt]


def _expert_layout(plan: Plan) -> str:
    """The layout SGLang's fused MoE layers hold their routed experts in."""
    ops = plan.catalog.operators
    for i, op in enumerate(ops):
        if op.family.startswith("experts."):
            spec = plan.scheme("rollout", i)
            return "wide" if spec.wide else rollout_layout(plan)
    return "wide"


def _lora(plan: Plan, notes: list[str]) -> list[Setting]:
    """LoRA target names from the adapter's operators, refused where SGLang would not apply them as stated."""
    t, tab, ops = plan.contract.trainable, tables(), plan.catalog.operators
    names, families = set(), set()
    for i in plan.trainable:
        op, leaf = ops[i], module_leaf(ops[i].tensor)
        if leaf not in tab["lora_modules"].get(op.family, ()):
            unsupported("PCC610", f"{op.tensor}: SGLang has no LoRA target for {op.family} module '{leaf}' "
                        "(targets per family: targets/sglang.yaml lora_modules)", "trainable.targets")
        names.add(leaf)
        families.add(op.family)
    fused = {tab["lora_fused"].get(n, n) for n in names}
    moe_wrapped = plan.catalog.is_moe and {"gate_up_proj", "down_proj"} <= fused
    if families & {"experts.gate_up", "experts.down"} and not moe_wrapped:
        unsupported("PCC414", "SGLang puts LoRA on routed experts only when the targets hold both gate/up and "
                    "down projections: target experts.gate_up and experts.down together", "trainable.targets")
    if moe_wrapped:
        base = _expert_layout(plan)
        if base not in tab["moe_lora_bases"]:
            unsupported("PCC414", f"the LoRA targets put LoRA on SGLang's fused MoE layers, whose routed experts "
                        f"are {base}; SGLang's MoE LoRA runs on {', '.join(tab['moe_lora_bases'])} "
                        "expert bases only (lora/moe/runner.py)", "trainable.targets")
    # SGLang selects modules by (fused) leaf name in every layer: name what it covers beyond the plan.
    trained = set(plan.trainable)
    extra = [i for i, op in enumerate(ops) if i not in trained and op.family in tab["lora_modules"]
             and tab["lora_fused"].get(module_leaf(op.tensor), module_leaf(op.tensor)) in fused
             and (moe_wrapped or not op.family.startswith("experts."))]
    if extra:
        shown = ", ".join(ops[i].tensor for i in extra[:3])
        notes.append(f"SGLang applies LoRA by module name in every layer (q/k/v and gate/up fused): it also "
                     f"wraps {len(extra)} operator(s) the adapter does not train ({shown}...); their adapter "
                     "slices are absent and stay zero")
    notes.append(f"LoRA: rank {t.rank} is the contract's; target modules {', '.join(sorted(names))} are the leaf "
                 f"names of the {len(plan.trainable)} adapter operators ({', '.join(sorted(families))})")
    if _expert_layout(plan) == "mxfp4" and not moe_wrapped:
        notes.append("LoRA with an MXFP4 base: SGLang's MXFP4 method quantizes only the fused MoE layers, so "
                     "the attention the adapter targets stays BF16 and takes LoRA as usual; LoRA on the MXFP4 "
                     "experts themselves is refused (Mxfp4MoEMethod has no MoE LoRA runner)")
    return [flag("sglang", "--enable-lora", path="trainable"),
            flag("sglang", "--max-lora-rank", str(t.rank), "trainable.rank"),
            flag("sglang", "--lora-target-modules", tuple(sorted(names)), "trainable.targets")]


@target("sglang", honours=("rollout.rules", "rollout.parallel.tp", "rollout.parallel.ep", "rollout.parallel.pp",
                            "rollout.parallel.dp", "rollout.hardware", "rollout.deterministic", "rollout.record",
                            "trainable", "routing_replay"))
def lower_sglang(plan: Plan) -> Lowered:
    c, tab = plan.contract, tables()
    if c.rollout.engine != "sglang":
        unsupported("PCC611", f"rollout engine is '{c.rollout.engine}', not sglang", "rollout")
    for d, _ in plan.used("rollout"):
        if d.accumulate not in (None, "fp32"):
            refuse("PCC601", f"SGLang's GEMM kernels accumulate in FP32, not {d.accumulate}", d.path,
                   hint="drop 'accumulate', or write 'accumulate fp32'")
        if d.output not in (None, "bf16"):
            refuse("PCC602", f"SGLang's linear layers write the model dtype (--dtype bfloat16), not "
                   f"{d.output}", d.path, hint="drop 'output', or write 'output bf16'")
    notes: list[str] = []
    layout = rollout_layout(plan)
    out = Lowered("sglang", notes=notes)

    def put(key: str, value=True, path: str | None = "rollout") -> None:
        out.settings.append(flag("sglang", key, value, path))

    put("--dtype", "bfloat16")
    notes.append("--dtype bfloat16: the wide rollout operators are the contract's default bf16")
    if named(layout).quantized:
        put("--quantization", tab["quantization"][layout], quantized_rule(plan))
        notes.append(f"--quantization {tab['quantization'][layout]}: rollout weights are {layout}. The checkpoint's "
                     "quantization_config names it too; passing it anyway makes SGLang refuse a checkpoint whose "
                     "config names another method, and the launch script refuses one that names none (where "
                     "SGLang would quantize a BF16 checkpoint online, in a layout other than the contract's)")
    kv = _kv_cache_dtype(plan)
    put("--kv-cache-dtype", kv, kv_cache_rule(plan))
    if kv != "auto":
        notes.append(f"--kv-cache-dtype {kv}: the rollout kv_cache rule; scales come from the checkpoint when "
                     "it carries them, else SGLang uses 1.0")
    par = c.rollout.parallel
    put("--tp-size", str(par.tp), "rollout.parallel.tp")
    put("--ep-size", str(par.ep), "rollout.parallel.ep")
    put("--dp-size", str(par.dp), "rollout.parallel.dp")
    if par.pp > 1:
        put("--pp-size", str(par.pp), "rollout.parallel.pp")
    if par.cp > 1:
        refuse("PCC631", f"rollout cp {par.cp}: pcc lowers context parallelism for the Megatron trainer only "
               "(SGLang's --attn-cp-size splits prefill attention, not the sequence the contract means)",
               "rollout.parallel.cp", hint="drop cp from the rollout's parallel statement")
    if plan.hardware("rollout") == "cpu":
        put("--device", "cpu", "rollout.hardware" if c.rollout.hardware else "hardware")
        notes.append("--device cpu: the contract's rollout hardware is cpu")
    if c.rollout.deterministic:
        put("--enable-deterministic-inference", path="rollout.deterministic")
        notes.append("--enable-deterministic-inference: the contract asks for a deterministic rollout "
                     "(batch-invariant kernels; slower)")
    out.settings += routed_experts(plan, "sglang", notes)
    put("--weight-version", tab["initial_weight_version"], "sync")
    notes.append(f"--weight-version {tab['initial_weight_version']}: the checkpoint is version "
                 f"{tab['initial_weight_version']}; every sync raises it, so samples carry the version they came from")
    if c.trainable.kind == "lora":
        out.settings += _lora(plan, notes)
    check("sglang", out.settings, "SGLang")
    check_flags("sglang", out.settings, "SGLang")
    args = out.args
    files = out.files
    files.update({ARGS_FILE: "".join(a + "\n" for a in args),
                  LAUNCH: launch_script(args, tab["checkpoint_quant_method"].get(layout), c.trainable.kind == "lora")})
    qcfg = quantization_config(plan)
    if qcfg is not None:
        files[QUANT_FILE] = json.dumps(qcfg, indent=2, sort_keys=True) + "\n"
    caveats = request_caveats(SERVER, plan)
    if "versions" not in c.rollout.record:
        caveats.append(Unsupported(
            "SGLang tags every sample with the weight version that produced it (--weight-version, raised by each "
            "sync), and the launch cannot turn that off: 'record' without 'versions' still records versions",
            "PCC616", "rollout.record", "add 'versions' to 'record'"))
    out.caveats = caveats
    return out


SERVER = Server("launch_server.sh", "SGLang", 'python -m sglang.launch_server --model-path "$PCC_ROLLOUT_CHECKPOINT"',
                "--lora-paths", ("config.json", "hf_quant_config.json"), "sampling_params.max_new_tokens")


def launch_script(args: list[str], quant_method: str | None, lora: bool) -> str:
    """A standalone launcher (pcc.lower.server_script)."""
    return server_script(SERVER, args, quant_method, tables()["adapter_name"] if lora else None)
