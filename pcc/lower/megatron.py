"""Plan -> Megatron + Transformer Engine trainer arguments, environment and precision file.

Pure function of the Plan. Tables live in targets/megatron.yaml; the engine's own
parser checks the result in pcc/lower/verify_megatron.py. Contradictions the
checker reports (PCC303-PCC309) never reach here; what Megatron cannot express at
all is `unsupported(code, ...)` on the rule that asked for it (PCC6xx).
"""

from __future__ import annotations

import functools
import shlex
from collections import defaultdict

import yaml

from pcc.lower import Lowered, Unsupported, refuse, target, unsupported
from pcc.lower import lower as lower_target
from pcc.lower.engine_support import check
from pcc.lower.settings import env, flag
from pcc.plan import Plan
from pcc.plan.capabilities import hardware_table
from pcc.resources import target_table

TE_FORMATS = ("fp8_e4m3", "fp8_e5m2", "mxfp8", "nvfp4")
PRECISION_FILE = "trainer/te_precision.yaml"


def lora_modules(plan: Plan, modules: dict, fused: dict, code: str, engine: str) -> list[str]:
    """Megatron's LoRA target names for the contract's trainable families (`modules`: family -> name, a
    framework's table), refused with `code` where a family has none or where Megatron fuses a trained
    family with one the contract leaves frozen (`fused`: name -> the families in it)."""
    ops, targets = plan.catalog.operators, plan.contract.trainable.targets
    families = {ops[i].family for i in plan.trainable}
    names = set()
    for fam in sorted(families):
        if fam not in modules:
            unsupported(code, f"{engine} has no target for {fam}", "trainable.targets")
        names.add(modules[fam])
    for name in sorted(names):
        partners = [f for f in fused.get(name, ()) if any(op.family == f for op in ops)]
        missing = sorted(set(partners) - families)
        if missing:
            at = next((f"trainable.targets[{i}]" for i, p in enumerate(targets) if p in partners), "trainable")
            unsupported(code, f"Megatron fuses {', '.join(partners)} into {name}: LoRA on it also adapts "
                        f"{', '.join(missing)}, which the contract leaves frozen", at,
                        hint=f"add {', '.join(missing)} to the targets")
    return sorted(names)


def framework_args(plan: Plan, table: dict, code: str, engine: str, runs: str, source: str,
                   hint: str) -> list[tuple[dict, object, str | None]]:
    """The megatron target's arguments moved through a framework's table (`table`: flag -> where the
    framework takes it, or `fixed`: the value it always runs): (where, value, the rule's path) for each
    flag it takes, in order. A flag the table has no entry for, or a fixed one the contract sets
    otherwise, is refused with `code` (`engine`: who takes them; `runs`: who runs the fixed value;
    `source`: the table's file)."""
    out = []
    for s in lower_target(plan, "megatron").of("flag"):
        flag, values = s.key, s.words()
        where = table.get(flag)
        if where is None:
            unsupported(code, f"{engine} has no setting pcc maps the contract's Megatron argument {flag} to "
                        f"({source} megatron_args)", s.path, hint=hint)
        value = values[0] if values else True
        if "fixed" in where:
            if value != where["fixed"]:
                unsupported(code, f"{runs} runs {flag} {where['fixed']}; the contract asks for "
                            f"{flag} {' '.join(values)}", s.path)
            continue
        out.append((where, int(value) if isinstance(value, str) and value.isdigit() else value, s.path))
    return out


@functools.cache
def tables() -> dict:
    return target_table("megatron")


def _spec(plan: Plan, comp: str, i: int):
    """(scheme, gemm kind) of operator i in component comp."""
    d = plan.decision(comp, i)
    return d.scheme, d.gemm


def _operator_modes(plan: Plan, notes: list[str]) -> dict[int, tuple[str, str | None]]:
    """op index -> (TE recipe, backward_override) for trainer operators a TE recipe covers."""
    ops, modes, qdq_seen = plan.catalog.operators, {}, False
    for i, op in enumerate(ops):
        if op.family == "kv_cache":
            continue
        f, fk = _spec(plan, "fprop", i)
        (d, dk), (w, wk) = _spec(plan, "dgrad", i), _spec(plan, "wgrad", i)
        if fk == "wide" or f.format not in TE_FORMATS:
            if dk != "wide" or wk != "wide":
                if d.format in TE_FORMATS or w.format in TE_FORMATS:
                    comp = "dgrad" if dk != "wide" else "wgrad"
                    unsupported("PCC603", f"{op.tensor}: quantized {comp} with a wide FProp has no Transformer "
                                "Engine recipe (TE quantizes a module's backward only with its forward)",
                                plan.decision(comp, i).path,
                                hint="quantize FProp with the same scheme, or keep DGrad and WGrad bf16")
            continue
        if op.family in tables()["always_wide"]:
            unsupported("PCC310", f"{op.tensor}: Megatron keeps {op.family} wide; a {f.format} trainer GEMM "
                        "there cannot be honoured", plan.decision("fprop", i).path)
        qdq_seen |= "qdq" in (fk, dk, wk)
        recipe = plan.decision("fprop", i).recipe
        if dk == wk == "wide":
            modes[i] = (recipe, tables()["wide_backward_override"])
        elif dk != "wide" and wk != "wide" and {plan.decision("dgrad", i).recipe,
                                                   plan.decision("wgrad", i).recipe} == {recipe}:
            modes[i] = (recipe, None)
        else:
            unsupported("PCC604", f"{op.tensor}: FProp {f.format}, DGrad {d.format}, WGrad {w.format} mix "
                        "recipes; Transformer Engine runs one recipe per module (or a wide backward)",
                        plan.decision("dgrad" if dk != "wide" else "wgrad", i).path,
                        hint="give FProp, DGrad and WGrad one scheme ('gemm linear : S'), or a bf16 backward")
    if qdq_seen:
        notes.append("Megatron has no FP8/FP4 fake-quantization path: 'qdq' trainer GEMMs run as TE's real "
                     "GEMMs of the same recipe, which see the same quantized operand values (only the "
                     "accumulation inside the tensor-core GEMM differs from QDQ into a BF16 GEMM).")
    return modes


def _module_paths(plan: Plan, i: int) -> list[str]:
    op = plan.catalog.operators[i]
    return [f"decoder.layers.{op.layer}.{m}" for m in tables()["modules"].get(op.family, [])]


def _module_modes(plan: Plan, modes: dict) -> dict[str, tuple[str, str | None] | None]:
    """Megatron module path -> mode (None = BF16); every operator sharing a module must agree."""
    out: dict[str, tuple] = {}
    owner: dict[str, str] = {}
    for i, op in enumerate(plan.catalog.operators):
        for path in _module_paths(plan, i):
            mode = modes.get(i)
            if path in out and out[path] != mode:
                unsupported("PCC605", f"{op.tensor} and {owner[path]} share Megatron module {path} but differ in "
                            "trainer precision (fused or grouped GEMMs run one recipe)",
                            plan.decision("fprop", i).path or plan.decision("fprop", plan.index[owner[path]]).path,
                            hint="give the operators of one module (q/k/v, gate/up, a layer's experts) one scheme")
            out[path], owner[path] = mode, op.tensor
    return out


def _first_last(plan: Plan, by_module: dict, mode) -> tuple[int, int] | None:
    """(start, end) when the wide modules are exactly whole first/last layers."""
    n = plan.catalog.num_layers
    layers = defaultdict(set)
    for path, m in by_module.items():
        layers[int(path.split(".")[2])].add(m)
    wide = [layer for layer in range(n) if layers.get(layer) == {None}]
    if any(layers.get(layer) not in ({None}, {mode}) for layer in range(n)):
        return None
    start = next((k for k in range(n) if k not in wide), n)
    end = next((k for k in range(n) if n - 1 - k not in wide), n)
    if start + end == len(wide) and 0 < len(wide) < n:
        return start, end
    return None


def _precision_file(by_module: dict, plan: Plan) -> str:
    """Named TE configs + ordered glob matchers (first match wins), one matcher per quantized
    module, then a catch-all BF16 entry; megatron.core.quantization.quant_config reads it."""
    if plan.contract.trainer.parallel.pp > 1:
        unsupported("PCC606", "a per-module precision file names layers by their number inside a pipeline "
                    "stage, so a layer-selective trainer precision cannot be expressed with pp > 1",
                    "trainer.parallel.pp", hint="use 'parallel pp 1', or one precision for all layers")
    configs, matchers = {}, {}
    for path, mode in sorted(by_module.items(), key=lambda kv: _layer_key(kv[0])):
        if mode is None:
            continue
        recipe, backward = mode
        name = recipe + ("_bwd_" + backward if backward else "")
        key = "fp4_quantization_recipe" if recipe == "nvfp4" else "fp8_quantization_recipe"
        configs[name] = {"transformer_engine_config_type": "TEQuantizationParams",
                         "training_recipe": {key: recipe}}
        matchers[path.replace(".", "_").replace("*", "x")] = {
            "config": name, "type": "glob", "pattern": "*" + path, "enabled": True}
    configs["bf16"] = {"transformer_engine_config_type": "TEQuantizationParams", "training_recipe": {}}
    matchers["default_bf16"] = {"config": "bf16", "type": "glob", "pattern": "*", "enabled": True}
    head = "# Generated by pcc from the resolved plan: every quantized module by name; all else BF16.\n"
    return head + yaml.safe_dump({"configs": configs, "matchers": matchers}, sort_keys=False)


def _layer_key(path: str) -> tuple[int, str]:
    return int(path.split(".")[2]), path


def _arch(plan: Plan) -> int:
    """CUDA compute-capability major of the trainer hardware (0 when not a known GPU)."""
    arch = hardware_table().get(plan.hardware("trainer") or "", {}).get("arch")
    return tables()["compute_capability"].get(arch, 0)


def _int4_group(plan: Plan, notes: list[str]) -> int | None:
    """Group size for INT4 fake QAT, from the rollout scheme of the operators the trainer fake-quantizes."""
    ops = [i for i in range(len(plan.catalog.operators))
           if _spec(plan, "fprop", i)[0].format == "int4" and _spec(plan, "fprop", i)[1] == "qdq"]
    if not ops:
        return None
    roll = {g.size for i in ops if (s := plan.scheme("rollout", i)).format == "int4" and (g := s.weights)}
    source = "the rollout checkpoint's INT4 scheme"
    if not roll:
        roll = {plan.scheme("fprop", i).weights.size for i in ops}
        source = "the trainer FProp scheme (rollout does not run INT4 here)"
    if len(roll) != 1 or None in roll:
        unsupported("PCC607", f"INT4 fake QAT (OPEN_TRAINING_INT4_GROUP_SIZE) takes one group size; the plan has "
                    f"{', '.join(sorted(map(str, roll)))}", plan.decision("fprop", ops[0]).path,
                    hint="use one INT4 group size for every fake-quantized operator")
    size = roll.pop()
    notes.append(f"OPEN_TRAINING_INT4_GROUP_SIZE={size} comes from {source}, so trainer QAT and the "
                 "rollout checkpoint cannot drift (the 32-vs-128 launcher bug).")
    return size


def _accumulate_output(plan: Plan) -> None:
    """PCC601/PCC602: Transformer Engine accumulates every GEMM in FP32 and writes the activation
    dtype (WGrad: the main-gradient dtype too); a rule asking for anything else is refused."""
    t = plan.contract.trainer
    act = "fp16" if t.params == "fp16" else "bf16"
    for comp in ("fprop", "dgrad", "wgrad"):
        for d, _ in plan.used(comp):
            if d.accumulate not in (None, "fp32"):
                refuse("PCC601", f"Transformer Engine accumulates {comp} GEMMs in FP32, not {d.accumulate}",
                       d.path, hint="drop 'accumulate', or write 'accumulate fp32'")
            allowed = {act, t.grads} if comp == "wgrad" else {act}
            if d.output not in (None, *allowed):
                refuse("PCC602", f"Megatron's {comp} GEMMs write {' or '.join(sorted(allowed))}, not "
                       f"{d.output}", d.path, hint=f"drop 'output', or write 'output {act}'")


@target("megatron", honours=("trainer.rules", "trainer.params", "trainer.master", "trainer.moments",
                             "trainer.grads", "trainer.param_gather", "trainer.impl", "trainer.optimizer",
                             "trainer.parallel.tp", "trainer.parallel.pp", "trainer.parallel.ep", "trainer.parallel.cp",
                             "trainer.hardware"))
def lower_megatron(plan: Plan) -> Lowered:
    t, cat = plan.contract.trainer, plan.catalog
    tab = tables()
    if t.engine != "megatron":
        unsupported("PCC611", f"trainer engine is '{t.engine}', not megatron", "trainer")
    _accumulate_output(plan)
    out = Lowered("megatron")
    notes = out.notes

    def put(key: str, value=True, path: str | None = "trainer") -> None:
        out.settings.append(flag("megatron", key, value, path))

    def put_env(key: str, value: str, path: str | None) -> None:
        out.settings.append(env("megatron", key, value, path))

    if t.params in ("bf16", "fp8"):
        put("--bf16", path="trainer.params")
    elif t.params == "fp16":
        put("--fp16", path="trainer.params")
    put("--transformer-impl", t.impl, "trainer.impl")

    # the first quantized FProp rule: what asked for the recipe and its environment
    asked = next((d.path for d, _ in plan.used("fprop") if not d.scheme.wide), "trainer.rules")
    modes = _operator_modes(plan, notes)
    recipes = {m[0] for m in modes.values()}
    if len(recipes) > 1:
        i = next(i for i, m in modes.items() if m[0] != modes[min(modes)][0])
        unsupported("PCC604", f"Megatron runs one trainer recipe at a time; the plan asks for "
                    f"{', '.join(sorted(recipes))}", plan.decision("fprop", i).path,
                    hint="use one trainer scheme family (FP8 block, FP8 tensor, MXFP8 or NVFP4)")
    if recipes and t.impl != "transformer_engine":
        refuse("PCC303", "quantized trainer GEMMs need Transformer Engine ('impl transformer_engine')",
               "trainer.impl")
    by_module = _module_modes(plan, modes)
    if recipes:
        recipe = recipes.pop()
        if recipe == "nvfp4":
            put("--fp4-format", "e2m1", asked)
            put("--fp4-recipe", "nvfp4", asked)
        else:
            if plan.fp8_recipe not in (None, recipe):  # None: only QDQ GEMMs
                unsupported("PCC604", f"trainer recipes disagree: {recipe} (QDQ) vs {plan.fp8_recipe} (real)",
                            "trainer", hint="use one trainer scheme family")
            grads = {_spec(plan, c, i)[0].format for i in modes for c in ("dgrad", "wgrad")}
            hybrid = "fp8_e5m2" in grads
            put("--fp8-format", "hybrid" if hybrid else "e4m3", asked)
            put("--fp8-recipe", recipe, asked)
            if hybrid:
                notes.append("--fp8-format hybrid: gradients are E5M2, FProp operands E4M3.")
        mode_set = {m for m in by_module.values() if m is not None}
        backward = {m[1] for m in mode_set}
        uniform = set(by_module.values()) == mode_set
        if len(backward) > 1:
            unsupported("PCC604", "NVTE_BACKWARD_OVERRIDE is global: some quantized modules have a wide "
                        "backward and others a quantized one", "trainer",
                        hint="quantize DGrad/WGrad for every quantized module, or for none")
        if b := backward.pop():
            put_env("NVTE_BACKWARD_OVERRIDE", b, asked)
            notes.append(f"NVTE_BACKWARD_OVERRIDE={b}: DGrad and WGrad are wide in the plan and use the "
                         "original operands, so TE keeps them for a BF16 backward.")
        fl = None if uniform else _first_last(plan, by_module, next(iter(mode_set)))
        if fl:
            put("--first-last-layers-bf16", path=asked)
            put("--num-layers-at-start-in-bf16", str(fl[0]), asked)
            put("--num-layers-at-end-in-bf16", str(fl[1]), asked)
            notes.append(f"--first-last-layers-bf16: the plan keeps the first {fl[0]} and last {fl[1]} "
                         "layers wide and every other TE module on the recipe.")
        elif not uniform:
            out.files[PRECISION_FILE] = _precision_file(by_module, plan)
            put("--te-precision-config-file", PRECISION_FILE, asked)
            n = sum(m is not None for m in by_module.values())
            notes.append(f"--te-precision-config-file: {n} Megatron modules run {recipe}, all others BF16; "
                         "module names are explicit (one glob per module, first match wins).")
        for var, rule in tab["recipe_env"].get(recipe, {}).items():
            scales = {plan.scheme("fprop", i).scale for i in modes}
            arch = hardware_table().get(plan.hardware("trainer") or "", {}).get("arch")
            if arch in rule.get("by_arch", {}):
                put_env(var, rule["by_arch"][arch], asked)
                notes.append(f"{var}={rule['by_arch'][arch]}: Transformer Engine runs {recipe} on {arch} with "
                             "power-of-two scales (Miles' default there too)")
                if rule["when_scale"] in scales:
                    out.caveats.append(Unsupported(
                        f"Transformer Engine runs the {recipe} recipe on {plan.hardware('trainer')} ({arch}) "
                        f"with power-of-two scales, not the plan's {rule['when_scale']} trainer scales", "PCC612",
                        plan.decision("fprop", min(modes)).path, "write power-of-two scales for the trainer "
                        "(e.g. 'scale pow2'), or train on hardware where TE keeps FP32 scales"))
            elif scales == {rule["when_scale"]}:
                put_env(var, rule["value"], asked)
                notes.append(f"{var}={rule['value']}: the plan's {recipe} scales are {rule['when_scale']}, "
                             "not TE's default powers of two.")
            elif "otherwise" in rule and rule["when_scale"] not in scales:
                put_env(var, rule["otherwise"], asked)
                notes.append(f"{var}={rule['otherwise']}: the plan's {recipe} scales are powers of two; "
                             "set explicitly, since Miles would otherwise choose by GPU")

    group = _int4_group(plan, notes)
    if group:
        put_env(tab["int4_qat_env"]["flag"], "1", asked)
        put_env(tab["int4_qat_env"]["group_size"], str(group), asked)

    if t.param_gather == "fp8":
        put("--fp8-param-gather", path="trainer.param_gather")
    elif t.param_gather != "bf16":
        refuse("PCC304", f"Megatron all-gathers parameters in bf16 or fp8, not {t.param_gather}",
               "trainer.param_gather")

    opt = t.optimizer
    put("--optimizer", opt.kind, "trainer.optimizer")
    if opt.distributed:
        put("--use-distributed-optimizer", path="trainer.optimizer")
    if opt.precision_aware:
        put("--use-precision-aware-optimizer", path="trainer.optimizer")
    if opt.offload:
        put("--optimizer-cpu-offload", path="trainer.optimizer")
    for key, table, field in (("--main-params-dtype", "main_params_dtype", "master"),
                              ("--exp-avg-dtype", "moments_dtype", "moments"),
                              ("--exp-avg-sq-dtype", "moments_dtype", "moments"),
                              ("--main-grads-dtype", "main_grads_dtype", "grads")):
        value = getattr(t, field)
        if value in tab[table]:
            put(key, tab[table][value], f"trainer.{field}")
        elif key != "--exp-avg-sq-dtype":  # one refusal for both moments flags
            refuse("PCC308", f"Megatron has no {key} {value} (choices: {', '.join(tab[table])})",
                   f"trainer.{field}")

    if cat.is_moe:
        put("--moe-router-dtype", "fp32", "trainer")
        notes.append("--moe-router-dtype fp32: router logits and top-k in FP32 keep expert choices stable "
                     "across steps and close to rollout's (routing replay compares them).")
    if plan.contract.rollout.deterministic:
        notes.append("no --deterministic-mode: rollout determinism is an SGLang setting; Megatron's flag "
                     "would slow every trainer kernel without changing what rollout samples.")
    p = t.parallel
    put("--tensor-model-parallel-size", str(p.tp), "trainer.parallel.tp")
    put("--pipeline-model-parallel-size", str(p.pp), "trainer.parallel.pp")
    put("--expert-model-parallel-size", str(p.ep), "trainer.parallel.ep")
    if p.cp > 1:
        put("--context-parallel-size", str(p.cp), "trainer.parallel.cp")
    if cat.is_moe:
        put("--expert-tensor-parallel-size", "1", "trainer.parallel")
        notes.append("--expert-tensor-parallel-size 1: routed experts are split across EP ranks, not cut by TP "
                     "(Megatron's default ETP=TP would multiply the expert group to TP x EP GPUs).")
    if p.tp > 1 and _arch(plan) < 10:
        put_env("CUDA_DEVICE_MAX_CONNECTIONS", "1", "trainer.parallel.tp")
        notes.append("CUDA_DEVICE_MAX_CONNECTIONS=1: Megatron requires it for TP > 1 before Blackwell "
                     "(communication/compute overlap ordering).")

    check("megatron", out.settings, "Megatron (Miles' fork)")
    check("transformer_engine", out.settings, "Transformer Engine")
    out.files["trainer/args.txt"] = "".join(a + "\n" for a in out.args)
    out.files["trainer/env.sh"] = "".join(f"export {k}={shlex.quote(v)}\n" for k, v in sorted(out.env.items()))
    return out
