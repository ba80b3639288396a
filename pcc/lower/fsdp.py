"""Plan -> an FSDP2 trainer's precision config (trainer/fsdp.json): torch's MixedPrecisionPolicy,
torchao's low-precision training per module, torchao INT4 QAT, PEFT LoRA, and the modules kept wide.

There is no one FSDP trainer program to pass flags to (Miles' FSDP backend runs BF16 only:
targets/fsdp.yaml), so the artifact is a config a trainer applies with the libraries' own calls:
`convert_to_float8_training(model, module_filter_fn=..., config=Float8LinearConfig(...))`,
`quantize_(model, MXFP8TrainingOpConfig(...) | Float8BlockwiseLinearConfig() | QATConfig(...), filter_fn)`,
`get_peft_model(model, LoraConfig(...))`, then `fully_shard(..., mp_policy=MixedPrecisionPolicy(...))`.
Every module is named explicitly (the checkpoint's tensor name less `.weight`), never by a pattern.
pcc.lower.verify_fsdp builds each config with torchao, torch and PEFT and applies them to a
meta-device model of those modules. The trainer loads its BF16 weights from PCC_REF_LOAD, never
from the rollout checkpoint, which may be quantized. What FSDP cannot express is PCC640-PCC642.
"""

from __future__ import annotations

import functools
import json

from pcc.lower import PATH_VARIABLES, Lowered, Unsupported, refuse, target, unsupported
from pcc.plan import Plan
from pcc.plan.patterns import NON_GEMM
from pcc.resources import target_table

FILE = "trainer/fsdp.json"
GEMMS = ("fprop", "dgrad", "wgrad")


@functools.cache
def tables() -> dict:
    return target_table("fsdp")


def module_name(tensor: str) -> str:
    """The torch module that holds a checkpoint tensor ("model.layers.0.mlp.gate.weight" -> "...mlp.gate")."""
    return tensor.removesuffix(".weight")


def gemm_modules(plan: Plan) -> list[int]:
    """Operators that are one torch module's GEMM (linear layers, router, LM head), in catalog order."""
    return [i for i, op in enumerate(plan.catalog.operators)
            if op.family not in NON_GEMM and op.tensor.endswith(".weight") and len(op.shape) == 2]


def _refuse(plan: Plan, comp: str, i: int, why: str, hint: str | None = None):
    unsupported("PCC640", f"{plan.catalog.operators[i].tensor}: {why}", plan.decision(comp, i).path, hint=hint)


def _accumulate_output(plan: Plan) -> None:
    """torchao's scaled GEMMs accumulate in FP32 and write the parameter dtype (PCC601/PCC602, as for Megatron)."""
    act = plan.contract.trainer.params
    for comp in GEMMS:
        for d, _ in plan.used(comp):
            if d.accumulate not in (None, "fp32"):
                refuse("PCC601", f"torch and torchao accumulate {comp} GEMMs in FP32, not {d.accumulate}",
                       d.path, hint="drop 'accumulate', or write 'accumulate fp32'")
            allowed = {act, plan.contract.trainer.grads} if comp == "wgrad" else {act}
            if d.output not in (None, *allowed):
                refuse("PCC602", f"the FSDP trainer's {comp} GEMMs write {' or '.join(sorted(allowed))}, not "
                       f"{d.output}", d.path, hint=f"drop 'output', or write 'output {act}'")


def _float8(plan: Plan, i: int) -> dict:
    """One module's Float8LinearConfig fields (per-tensor or per-row FP8 in any of the three GEMMs)."""
    tab = tables()
    raw: dict[str, list[str] | None] = {}  # cast -> [granularity, dtype], None: disabled
    kinds, pow2 = set(), set()
    for comp, fields in tab["float8_casts"].items():
        d = plan.decision(comp, i)
        s = d.scheme
        if s.wide:
            raw.update(dict.fromkeys(fields))
            continue
        if s.format not in tab["fp8_dtypes"]:
            _refuse(plan, comp, i, f"{comp} {s.format} next to FP8 GEMMs: a torchao Float8Linear runs FP8 or "
                    "high precision in each GEMM", "give the module's quantized GEMMs one FP8 format family")
        if s.amax == "delayed":
            _refuse(plan, comp, i, "torchao's Float8 training scales dynamically (delayed scaling was removed)",
                    "drop 'amax delayed'")
        for cast, role in fields.items():
            g = s.grouping_of(role)
            if g is None:
                _refuse(plan, comp, i, f"{comp} quantizes one operand only ({role} stays wide): torchao casts both "
                        "operands of a GEMM to FP8 or neither", f"quantize {role} too, or keep {comp} bf16")
            if g.kind not in tab["granularity"]:
                _refuse(plan, comp, i, f"torchao's Float8Linear scales per tensor or per row, not {g.text()} "
                        f"({comp} {role})", "use tensor or row/token groupings (or fp8_block in all three GEMMs)")
            raw[cast] = [tab["granularity"][g.kind], tab["fp8_dtypes"][s.format]]
        kinds.add(d.gemm)
        if s.scale not in tab["pow2_scales"]:
            _refuse(plan, comp, i, f"torchao's FP8 scales are FP32 or powers of two, not {s.scale}")
        pow2.add(tab["pow2_scales"][s.scale])
    casts = {}
    for a, b, default in tab["float8_same_dtype"]:
        if raw[a] and raw[b] and raw[a][1] != raw[b][1]:
            comp = next(c for c, f in tab["float8_casts"].items() if b in f)
            _refuse(plan, comp, i, f"torchao casts one operand to one dtype in both GEMMs it enters ({a} "
                    f"{raw[a][1]}, {b} {raw[b][1]})", "use one FP8 format for the operand in both GEMMs")
        for x, y in ((a, b), (b, a)):  # CastConfig's fields; a disabled cast keeps its operand's dtype
            v = raw[x]
            casts[x] = ({"scaling_type": "dynamic", "scaling_granularity": v[0], "target_dtype": v[1]} if v else
                        {"scaling_type": "disabled", "scaling_granularity": "tensorwise",
                         "target_dtype": (raw[y] or [None, default])[1]})
    if len(kinds) > 1 or len(pow2) > 1:
        comp = next(c for c in GEMMS if not plan.scheme(c, i).wide)
        what = "real and QDQ GEMMs (torchao's emulate)" if len(kinds) > 1 else "FP32 and power-of-two scales"
        _refuse(plan, comp, i, f"one Float8LinearConfig holds one setting per module, but its GEMMs mix {what}",
                "give the module's quantized GEMMs one scale dtype and one GEMM kind")
    fast = {tab["float8_gemm_configs"][c]: {"use_fast_accum": tab["float8_fast_accum_default"][c]
                                            and plan.decision(c, i).accumulate is None} for c in GEMMS}
    out = {"casts": casts, "round_scales_to_power_of_2": pow2.pop(), "emulate": kinds.pop() == "qdq", **fast}
    out["recipe"] = next((name for name, r in tab["float8_recipes"].items()
                          if r["casts"] == raw and r["pow2"] == out["round_scales_to_power_of_2"]), None)
    return out


def _mxfp8(plan: Plan, i: int) -> dict:
    """MXFP8TrainingOpConfig fields: MXFP8 FProp and DGrad, WGrad MXFP8 or high precision."""
    tab = tables()
    specs = {c: plan.decision(c, i) for c in GEMMS}
    for c in ("fprop", "dgrad"):
        if specs[c].scheme.format != "mxfp8":
            _refuse(plan, c if not specs[c].scheme.wide else "fprop", i,
                    f"torchao's MXFP8 training quantizes FProp and DGrad together; {c} is {specs[c].scheme.format}",
                    "give FProp and DGrad the mxfp8 scheme (WGrad may stay bf16)")
    quantized = [d for d in specs.values() if not d.scheme.wide]
    if any(d.scheme.format != "mxfp8" for d in quantized):
        _refuse(plan, "wgrad", i, f"WGrad {specs['wgrad'].scheme.format} next to MXFP8 FProp/DGrad: torchao runs it "
                "in MXFP8 or high precision", "give WGrad mxfp8 or bf16")
    if len({d.gemm for d in quantized}) > 1 or len({d.scheme.scale_rule for d in quantized}) > 1:
        _refuse(plan, "fprop", i, "one MXFP8TrainingOpConfig has one kernel choice and one scale rule; the "
                "module's GEMMs mix real and QDQ, or two E8M0 rules")
    d = specs["fprop"]
    return {"kernel_preference": "emulated" if d.gemm == "qdq" else "auto", "out_dtype": "bfloat16",
            "wgrad_with_hp": specs["wgrad"].scheme.wide,
            "scale_calculation_mode": tab["mx_scale_mode"][d.scheme.scale_rule],
            "pad_token_groups_for_grouped_mm": False}


def _blockwise(plan: Plan, i: int) -> dict:
    """Float8BlockwiseLinearConfig: 128x128 weight blocks, 1x128 activation/gradient tiles, all three GEMMs."""
    b, op = tables()["blockwise"], plan.catalog.operators[i]
    for c in GEMMS:
        d = plan.decision(c, i)
        s = d.scheme
        if s.wide:
            _refuse(plan, "fprop", i, f"torchao's blockwise FP8 training quantizes FProp, DGrad "
                    f"and WGrad; {c} is {s.format} here", "give all three GEMMs fp8_block, or use per-tensor/row FP8")
        w, a, g = s.weights, s.activations, s.gradients
        if s.format != b["format"] or not (w and w.kind == "block" and [w.rows, w.cols] == b["weights"]) or \
                any(not (x and x.kind == "tile" and [x.rows, x.cols] == b["activations"]) for x in (a, g)) or \
                s.scale != b["scale"]:
            _refuse(plan, c, i, f"torchao's blockwise FP8 runs E4M3 with 128x128 weight blocks, 1x128 tiles and "
                    f"FP32 scales; {c} asks for {s.format} weights {w}, activations {a}, gradients {g}, "
                    f"scale {s.scale}", "use fp8_block (with FP32 scales) in all three GEMMs")
        if d.gemm != "real":
            _refuse(plan, c, i, "torchao's blockwise FP8 training has no emulated (QDQ) mode",
                    "write 'real', or use per-tensor/row FP8 (emulate)")
    n, k = op.shape
    if n % b["multiple"] or k % b["multiple"]:
        _refuse(plan, "fprop", i, f"shape [{n}, {k}]: torchao's blockwise FP8 linear needs both dimensions to be "
                f"multiples of {b['multiple']}", "keep this module bf16")
    return {}


def _int4_qat(plan: Plan, i: int, caveats: list[Unsupported]) -> dict:
    """torchao QAT: IntxFakeQuantizeConfig(int4, group_size, is_symmetric) on the weight, in FProp only."""
    f = plan.decision("fprop", i)
    s = f.scheme
    for c in ("dgrad", "wgrad"):
        if not plan.scheme(c, i).wide:
            _refuse(plan, c, i, f"INT4 fake quantization (torchao QAT) quantizes the weight before FProp; {c} "
                    f"{plan.scheme(c, i).format} has no torchao setting", f"keep {c} bf16")
    if f.gemm != "qdq" or s.activations is not None or s.weights is None or s.weights.kind != "group":
        _refuse(plan, "fprop", i, "torchao trains INT4 as weight-only group-wise fake quantization (QDQ into a "
                "BF16 GEMM)", "use an INT4 group scheme with 'qdq' (e.g. 'fprop : int4_g128 qdq')")
    if s.scale != "fp32":
        _refuse(plan, "fprop", i, f"torchao's INT4 fake quantization keeps FP32 scales, not {s.scale}")
    if not caveats:
        q = tables()["int4_qat"]
        caveats.append(Unsupported(
            f"torchao's INT4 fake quantization rounds to codes [{q['codes'][0]}, {q['codes'][1]}] with scale "
            f"amax/{q['divisor']:g}, where the contract's INT4 (and its rollout checkpoint) uses [-7, 7] with "
            "amax/7; and its fake-quantized weight also enters DGrad, where the contract keeps DGrad bf16",
            "PCC612", f.path, "measure the trainer-rollout mismatch (pcc validate), or train INT4 QAT on Megatron"))
    return {"dtype": "int4", "group_size": s.weights.size, "is_symmetric": s.symmetric}


def _mode(plan: Plan, i: int) -> str:
    """Which torchao path a module takes: wide, float8, blockwise, mxfp8 or int4_qat."""
    fmts = {c: plan.scheme(c, i) for c in GEMMS}
    quantized = {c: s for c, s in fmts.items() if not s.wide}
    if not quantized:
        return "wide"
    formats = {s.format for s in quantized.values()}
    if formats & {"nvfp4", "mxfp4", "int8"}:
        bad = next(c for c, s in quantized.items() if s.format in ("nvfp4", "mxfp4", "int8"))
        _refuse(plan, bad, i, f"no torchao {tables()['versions']['torchao']} training path for {quantized[bad].format} "
                f"in {bad}: its NVFP4 and MXFP4 configs are inference and fake-quantization ones, its INT8 "
                "training a prototype pcc does not lower",
                "train this module in bf16, FP8 or MXFP8, or use 'trainer megatron' (TE's NVFP4 recipe)")
    if "int4" in formats:
        return "int4_qat"
    if "mxfp8" in formats:
        return "mxfp8"
    if any(g is not None and g.kind in ("block", "tile", "group") for s in quantized.values()
           for g in (s.weights, s.activations, s.gradients)):
        return "blockwise"
    return "float8"


def _state(plan: Plan, notes: list[str]) -> dict:
    """FSDP2's dtypes: MixedPrecisionPolicy (compute and reduce), the sharded parameters (the master
    copy) and the optimizer state, which torch's optimizers keep in the parameter's dtype."""
    t, dt = plan.contract.trainer, tables()["dtypes"]
    if t.params not in dt:
        unsupported("PCC641", f"FSDP2 computes in bf16, fp16 or fp32, not {t.params} parameters", "trainer.params",
                    hint="write 'params bf16' (FP8 weights in the all-gather are 'param_gather fp8')")
    if t.master != "fp32":
        refuse("PCC641", f"FSDP2 shards the parameters it trains as the master copy; pcc keeps them fp32, "
               f"not {t.master}", "trainer.master", hint="write 'master fp32'")
    if t.moments != t.master:
        refuse("PCC641", f"torch's Adam keeps its moments in the parameter's dtype ({t.master}), not "
               f"{t.moments}", "trainer.moments", hint=f"write 'moments {t.master}'")
    if t.grads not in ("fp32", "bf16"):
        unsupported("PCC641", f"FSDP2 reduces gradients in fp32 or bf16, not {t.grads}", "trainer.grads")
    opt = t.optimizer
    if opt.precision_aware:
        refuse("PCC641", "the precision-aware optimizer is Megatron's; FSDP2 has none", "trainer.optimizer",
               hint="drop 'precision_aware'")
    p = t.parallel
    for axis in ("tp", "pp", "ep"):
        if getattr(p, axis) > 1:
            refuse("PCC641", f"the FSDP2 trainer pcc emits shards data-parallel only; {axis} "
                   f"{getattr(p, axis)} has no setting", f"trainer.parallel.{axis}",
                   hint=f"write 'parallel {axis} 1', or use 'trainer megatron'")
    notes.append(f"MixedPrecisionPolicy(param_dtype={dt[t.params]}, reduce_dtype={dt[t.grads]}): the contract's "
                 f"params and grads; the sharded parameters and Adam's moments stay {dt[t.master]}")
    return {"mp_policy": {"param_dtype": dt[t.params], "reduce_dtype": dt[t.grads]},
            "sharded_param_dtype": dt[t.master], "optimizer": f"torch.optim.{tables()['optimizers'][opt.kind]}",
            "cpu_offload": opt.offload,
            "data_parallel_size": p.gpus or p.dp}


def _lora(plan: Plan, converted: set[str]) -> dict | None:
    t = plan.contract.trainable
    if t.kind != "lora":
        return None
    ops = plan.catalog.operators
    linear = set(gemm_modules(plan))
    bad = [i for i in plan.trainable if i not in linear]
    if bad:
        unsupported("PCC642", f"the FSDP trainer puts LoRA (PEFT) on linear modules; {ops[bad[0]].tensor} is "
                    f"{ops[bad[0]].family}", "trainable.targets", hint="target linear projections (attn, mlp, experts)")
    names = [module_name(ops[i].tensor) for i in plan.trainable]
    over = sorted(set(names) & converted)
    if over:
        unsupported("PCC642", f"LoRA on {over[0]}, which the trainer also converts to torchao low precision: PEFT "
                    "wraps nn.Linear, not torchao's training modules", "trainable.targets",
                    hint="keep the adapted modules bf16 in the trainer")
    return {"r": t.rank, "lora_alpha": t.alpha, "lora_dropout": t.dropout, "bias": "none",
            "target_modules": sorted(names)}


def _gemm_text(kind: str, cfg: dict) -> dict[str, str]:
    """What each GEMM of a group runs (for the reader; the config is what torchao reads)."""
    if kind != "float8":
        return tables()["gemms"][kind] if kind != "mxfp8" else {
            **tables()["gemms"]["mxfp8"], **({"wgrad": "high precision"} if cfg["wgrad_with_hp"] else {})}
    out = {}
    for comp, fields in tables()["float8_casts"].items():
        parts = [f"{c.removeprefix('cast_config_')} {v['scaling_granularity']} {v['target_dtype']}"
                 for c in fields if (v := cfg["casts"][c])["scaling_type"] == "dynamic"]
        out[comp] = ", ".join(parts) if parts else "high precision"
    return out


@target("fsdp", honours=("trainer.rules", "trainer.params", "trainer.master", "trainer.moments", "trainer.grads",
                         "trainer.param_gather", "trainer.optimizer", "trainer.parallel", "trainer.hardware",
                         "trainable"))
def lower_fsdp(plan: Plan) -> Lowered:
    c, tab = plan.contract, tables()
    if c.trainer.engine != "fsdp":
        unsupported("PCC611", f"trainer engine is '{c.trainer.engine}', not fsdp", "trainer")
    if c.trainer.parallel.cp > 1:
        refuse("PCC631", f"trainer cp {c.trainer.parallel.cp}: pcc's FSDP2 trainer shards over data-parallel ranks "
               "only (no context parallelism)", "trainer.parallel.cp", hint="use 'trainer megatron' for cp")
    _accumulate_output(plan)
    out = Lowered("fsdp")
    doc = {"_about": "Generated by pcc from the resolved plan (docs/lower-fsdp.md); apply with torchao, PEFT and "
                     "torch.distributed.fsdp as pcc.lower.fsdp says. Module names are explicit.",
           "versions": tab["versions"], "module_layout": tab["module_layout"],
           "weights": {"load_from_env": tab["weights_variable"], "dtype": tab["dtypes"]["bf16"],
                       "why": PATH_VARIABLES[tab["weights_variable"]]}}
    doc.update(_state(plan, out.notes))
    ops = plan.catalog.operators
    groups: dict[str, dict] = {}
    wide: list[str] = []
    for i in gemm_modules(plan):
        mode = _mode(plan, i)
        name = module_name(ops[i].tensor)
        if mode == "wide":
            wide.append(name)
            continue
        cfg = {"float8": _float8, "mxfp8": _mxfp8, "blockwise": _blockwise}[mode](plan, i) \
            if mode != "int4_qat" else _int4_qat(plan, i, out.caveats)
        key = mode + json.dumps(cfg, sort_keys=True)
        groups.setdefault(key, {"kind": mode, "config": cfg, "modules": []})["modules"].append(name)
    if c.trainer.param_gather == "fp8":
        f8 = [g for g in groups.values() if g["kind"] == "float8"]
        per_tensor = all(g["config"]["casts"]["cast_config_weight"]["scaling_granularity"] == "tensorwise" for g in f8)
        if not f8 or not per_tensor or len(f8) != len(groups):
            unsupported("PCC641", "FP8 parameter all-gather in FSDP2 is torchao's enable_fsdp_float8_all_gather, "
                        "which needs every quantized module on a Float8Linear with per-tensor weight scales",
                        "trainer.param_gather", hint="use per-tensor FP8 weights, or 'param_gather bf16'")
        for g in f8:
            g["config"]["enable_fsdp_float8_all_gather"] = True
    elif c.trainer.param_gather != "bf16":
        unsupported("PCC641", f"FSDP2 all-gathers parameters in their param_dtype (or FP8 with torchao), not "
                    f"{c.trainer.param_gather}", "trainer.param_gather")
    for g in groups.values():
        if g["kind"] == "float8":
            g["config"].setdefault("enable_fsdp_float8_all_gather", False)
        g["gemms"] = _gemm_text(g["kind"], g["config"])
        out.notes.append(f"{g['kind']}: {len(g['modules'])} module(s)"
                         + (f", recipe {g['config']['recipe']}" if g["config"].get("recipe") else ""))
    doc["low_precision"] = list(groups.values())
    doc["keep_wide"] = wide
    converted = {n for g in groups.values() for n in g["modules"]}
    doc["trainable"] = c.trainable.kind
    doc["lora"] = _lora(plan, converted)
    out.notes.append(f"the trainer loads its BF16 weights from ${tab['weights_variable']}, not from the rollout "
                     "checkpoint (which the converter may have quantized)")
    out.files[FILE] = json.dumps(doc, indent=1) + "\n"
    return out
