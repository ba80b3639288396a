"""Checks over a resolved Plan: capability (PCC3xx), consistency (PCC4xx), expectations (PCC5xx).

Each check is one small function registered in CHECKS; docs/checks.md has a
bad example per code and tests/check_fixtures/ one failing contract per code.
"""

from __future__ import annotations

from typing import Callable

from pcc.lang.build import SourceMap
from pcc.lang.diagnostics import Reporter, did_you_mean
from pcc.plan.capabilities import gemm_support, hardware_table, supported_on
from pcc.plan.mixed import engine_mixed, module_of, quantized_keys
from pcc.plan.resolve import DEFAULT, Plan

CHECKS: list[Callable[[Plan, SourceMap, Reporter], None]] = []
LONG_ROLLOUT = 8192  # the seed: FP8 rollout + BF16 trainer drifts at 8K tokens, collapses at 16K
SMALL_MODEL_PARAMS = 8e9  # below this, requantizing all weights per update can cost more than FP8 saves
# Smallest same-version |dlogp| p99 bound that a wide trainer FProp against a quantized rollout
# can plausibly meet (a tighter bound is the matched-FProp regime of Unified FP8).
MISMATCH_FLOOR = {"fp8_e4m3": 0.05, "fp8_e5m2": 0.05, "mxfp8": 0.05, "int8": 0.05,
                  "int4": 0.1, "mxfp4": 0.1, "nvfp4": 0.1}
METRICS = {
    "same_version": ("abs_dlogp p50", "abs_dlogp p90", "abs_dlogp p99", "abs_dlogp p999", "abs_dlogp mean",
                     "abs_dlogp max", "kl"),
    "baseline_drift": ("abs_dlogp p50", "abs_dlogp p90", "abs_dlogp p99", "abs_dlogp mean", "abs_dlogp max"),
    "route_agreement": (None,),
    "version_age": (None, "max", "mean"),
    "trainer_rollout_kl": (None,),
    "reference_kl": (None,),
    "clip_fraction": (None,),
}


def check(fn):
    CHECKS.append(fn)
    return fn


def _names(plan: Plan, idx: list[int], n: int = 3) -> str:
    ops = plan.catalog.operators
    shown = ", ".join(ops[i].tensor for i in idx[:n])
    return shown + (f" (+{len(idx) - n} more)" if len(idx) > n else "")


def trainer_fp_formats(plan: Plan) -> set[str]:
    return {d.scheme.format for comp in ("fprop", "dgrad", "wgrad") for d, _ in plan.used(comp) if d.gemm == "real"}


@check
def hardware_known(plan: Plan, smap: SourceMap, rep: Reporter) -> None:
    table = hardware_table()
    for section in ("rollout", "trainer"):
        hw = plan.hardware(section)
        path = f"{section}.hardware" if getattr(plan.contract, section).hardware else "hardware"
        if hw is None:
            if section == "rollout":
                rep.error("PCC207", "no hardware declared", smap.find("name"),
                          hint="add e.g. 'hardware H100' (or 'hardware cpu' for the embedded runtime)")
            continue
        if hw not in table:
            rep.error("PCC207", f"unknown hardware '{hw}'", smap.find(path), path=path,
                      hint=did_you_mean(hw, table) or "known: " + ", ".join(table))


@check
def gemm_capability(plan: Plan, smap: SourceMap, rep: Reporter) -> None:
    """PCC301: a real low-precision GEMM the declared hardware has no path for."""
    table = hardware_table()
    for comp in ("rollout", "fprop", "dgrad", "wgrad"):
        for d, idx in plan.used(comp):
            ref, spec = d.rule, d.scheme
            hw = plan.hardware(ref.section)
            if hw not in table or d.gemm != "real":
                continue
            if spec.format in ("fp8_e4m3", "fp8_e5m2") and spec.weights and spec.weights.kind == "block" \
                    and table[hw].get("no_block_fp8"):
                rep.error("PCC301", f"block-scaled FP8 is not supported on {hw}", smap.find(ref.path), path=ref.path,
                          hint="the engines list block FP8 for Hopper, B200 and newer, MI350X and MI355X")
                continue
            if gemm_support(hw, spec.format, weight_only=spec.activations is None) == "none":
                where = ", ".join(supported_on(spec.format)) or "no listed hardware"
                rep.error("PCC301", f"{spec.format} has no real GEMM path on {hw} ({table[hw]['arch']}) "
                          f"for {comp}", smap.find(ref.path), path=ref.path,
                          hint=f"{spec.format} runs natively on {where}; or use 'qdq' to emulate it")


@check
def scheme_grouping(plan: Plan, smap: SourceMap, rep: Reporter) -> None:
    """PCC302: a scheme that is no valid encoding (Scheme.problems, which numerics enforces too)."""
    for name, spec in plan.contract.schemes.items():
        for message, hint in spec.problems():
            rep.error("PCC302", message, smap.find(f"schemes.{name}"), hint=hint, path=f"schemes.{name}")


@check
def tiling(plan: Plan, smap: SourceMap, rep: Reporter) -> None:
    """PCC205: shapes a scheme cannot tile. Groups along K must divide it (error); 2-D
    blocks and tiles are padded by the engines (warning, with the tensors)."""
    ops = plan.catalog.operators
    for comp in ("rollout", "fprop"):
        for d, idx in plan.used(comp):
            ref, spec = d.rule, d.scheme
            by_shape: dict[tuple, list[int]] = {}
            for i in idx:
                if len(ops[i].shape) == 2 and ops[i].family not in ("kv_cache", "embed", "norm"):
                    by_shape.setdefault(ops[i].shape, []).append(i)
            g = spec.weights
            if g is None:
                continue
            for (n, k), members in by_shape.items():
                if g.kind == "group" and k % g.size:
                    rep.error("PCC205", f"{spec.format} groups of {g.size} do not divide K={k} of {len(members)} "
                              f"tensor(s): {_names(plan, members)}", smap.find(ref.path), path=ref.path,
                              hint="keep these tensors wide, or pick a group size that divides K")
                elif g.kind == "block" and (n % g.rows or k % g.cols):
                    rep.warning("PCC205", f"shape [{n}, {k}] is not a multiple of the {g.rows}x{g.cols} block; "
                                f"the edge blocks are padded in {len(members)} tensor(s): {_names(plan, members)}",
                                smap.find(ref.path), path=ref.path)
            if comp == "rollout" and g.kind == "block" and spec.format == "fp8_e4m3":
                _ceil_grid_consumers(plan, idx, g.rows, g.cols, smap.find(ref.path), ref.path, rep)


# Block-FP8 loaders of the rollout checkpoint and the scale grids they refuse (a grid is ceil(N/R) x ceil(K/C)).
# SGLang (srt/layers/quantization/fp8.py Fp8LinearMethod.validate_block_quant_shapes, Fp8MoEMethod.create_weights)
# and vLLM (quantization/utils/fp8_utils.py validate_fp8_block_shape, validate_fp8_block_shape_moe) fuse q/k/v into
# one QKV linear and gate/up into one merged linear, and need each fused part a multiple of block_n; a layer's
# routed experts are one fused MoE whose intermediate size per rank is a multiple of block_n (and of block_k at
# tp > 1); at tp > 1 a column-parallel part per rank is a multiple of block_n and a row-parallel input of block_k.
_QKV, _GATE_UP = "they fuse q/k/v into one QKV linear", "they fuse gate/up into one merged linear"
_QKV_PARTS, _GATE_UP_PARTS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"), ("gate_proj", "up_proj")
_FUSED_PARTS = dict.fromkeys(_QKV_PARTS, _QKV) | dict.fromkeys(_GATE_UP_PARTS, _GATE_UP)
_COLUMN = ("self_attn.q_b_proj", "self_attn.kv_b_proj")
_ROW = ("self_attn.o_proj", "down_proj")


def _engine_refusal(op, tp: int, ep: int, bn: int, bk: int, rows: dict[str, float]) -> str | None:
    """Why SGLang's and vLLM's block-FP8 loaders refuse the layer this weight loads into, or None. `rows`: every
    weight's rows per tensor-parallel rank by tensor name (a fused QKV layer is refused for any of its parts)."""
    n, k = op.shape
    module = op.tensor[: -len(".weight")]
    if op.family.startswith("experts."):
        moe_tp = max(1, tp // ep)
        inter = (n if op.family == "experts.gate_up" else k) / moe_tp
        if inter % bn or (moe_tp > 1 and inter % bk):
            return (f"they fuse a layer's routed experts into one MoE whose intermediate size per rank ({inter:g}) "
                    f"must be a multiple of {bn}" + (f" and {bk}" if moe_tp > 1 and bk != bn else ""))
        return None
    leaf = next((m for m in (*_FUSED_PARTS, *_COLUMN, *_ROW) if module.endswith("." + m)), None)
    if leaf in _FUSED_PARTS:
        prefix = module[: -len(leaf)]
        siblings = _QKV_PARTS if leaf in _QKV_PARTS else _GATE_UP_PARTS
        bad = [rows[t] for t in (f"{prefix}{m}.weight" for m in siblings) if t in rows and rows[t] % bn]
        if bad:
            return f"{_FUSED_PARTS[leaf]} whose parts need their rows per rank ({bad[0]:g}) a multiple of {bn}"
        return None
    if tp > 1 and leaf in _COLUMN and (n / tp) % bn:
        return f"a column-parallel linear at tp {tp} needs its rows per rank ({n / tp:g}) a multiple of {bn}"
    if tp > 1 and leaf in _ROW and (k / tp) % bk:
        return f"a row-parallel linear at tp {tp} needs its input per rank ({k / tp:g}) a multiple of {bk}"
    return None


def rank_rows(catalog, tp: int) -> dict[str, float]:
    """Each 2-D weight's rows on one tensor-parallel rank, as SGLang's and vLLM's QKVParallelLinear split them: k and
    v keep one whole KV head per rank when tp exceeds the KV heads (the heads are replicated)."""
    kv_heads = catalog.num_key_value_heads
    out = {}
    for op in catalog.operators:
        if len(op.shape) == 2:
            kv = op.tensor.endswith(("self_attn.k_proj.weight", "self_attn.v_proj.weight"))
            out[op.tensor] = op.shape[0] / (kv_heads if kv and tp >= kv_heads else tp)
    return out


def _grid_fit(dim: int, block: int) -> str:
    """How transformers' Fp8Dequantize reads a ceil(dim / block) scale grid along one dimension: it takes the block
    as dim / grid, so "ok" (a multiple, or one partial block), "refused" (grid does not divide dim) or "wrong"."""
    grid = -(-dim // block)
    if dim % block == 0 or grid == 1:
        return "ok"
    return "refused" if dim % grid else "wrong"


def _ceil_grid_consumers(plan: Plan, idx, bn: int, bk: int, span, path: str, rep: Reporter) -> None:
    """PCC205 (rollout block FP8): which consumers refuse the weights pcc writes, and why: SGLang and vLLM the fused
    parts their block checks refuse at the contract's tp / ep, transformers the ceil-sized (padded) scale grids its
    dequantization misreads."""
    ops = plan.catalog.operators
    par = plan.contract.rollout.parallel
    weights = [i for i in idx if len(ops[i].shape) == 2 and ops[i].family not in ("kv_cache", "embed", "norm")]
    grid = {i: [_grid_fit(d, b) for d, b in zip(ops[i].shape, (bn, bk))] for i in weights}
    refused = [i for i in weights if "refused" in grid[i]]
    wrong = [i for i in weights if "wrong" in grid[i] and i not in refused]
    why: dict[str, list[int]] = {}
    rows = rank_rows(plan.catalog, par.tp)
    for i in weights:
        reason = _engine_refusal(ops[i], par.tp, par.ep, bn, bk, rows)
        if reason:
            why.setdefault(reason, []).append(i)
    if not (refused or wrong or why):
        return
    parts = []
    if why:
        engines = "; ".join(f"{reason} ({_names(plan, members)})" for reason, members in why.items())
        parts.append(f"SGLang and vLLM refuse {sum(map(len, why.values()))}: {engines}")
    where = "where it dequantizes (no GPU, or one below compute capability 8.9)"
    if refused:
        parts.append(f"transformers' FP8 loader refuses {len(refused)} {where}: Fp8Dequantize reads the block as "
                     f"dimension / scales, and a dimension its ceil-sized scale grid does not divide is 'not "
                     f"divisible by scale grid' ({_names(plan, refused)})")
    if wrong:
        parts.append(f"transformers' FP8 loader dequantizes {len(wrong)} with the wrong blocks {where}: the ceil "
                     f"grid divides the dimension, so it reads blocks smaller than {bn}x{bk} ({_names(plan, wrong)})")
    rep.warning("PCC205", f"rollout block-FP8 weights that not every consumer loads: {'; '.join(parts)}", span,
                path=path, hint="keep these tensors wide, give them a block that divides them, or (SGLang, vLLM) "
                "a tp / ep whose per-rank parts the block divides")


@check
def sglang_mxfp4_scope(plan: Plan, smap: SourceMap, rep: Reporter) -> None:
    """PCC307: SGLang's MXFP4 path quantizes routed experts only."""
    ops = plan.catalog.operators
    for d, idx in plan.used("rollout"):
        ref, spec = d.rule, d.scheme
        if spec.format == "mxfp4":
            bad = [i for i in idx if not ops[i].family.startswith("experts.")]
            if bad:
                rep.error("PCC307", f"SGLang runs MXFP4 for routed experts only, not {_names(plan, bad)}",
                          smap.find(ref.path), path=ref.path, hint="restrict the rule to 'experts.*'")


@check
def trainer_engine(plan: Plan, smap: SourceMap, rep: Reporter) -> None:
    t = plan.contract.trainer
    real = trainer_fp_formats(plan)
    if t.engine == "megatron" and t.impl == "local":
        real |= {d.scheme.format for comp in ("fprop", "dgrad", "wgrad") for d, _ in plan.used(comp)
                 if d.scheme.format not in ("int4", "int8") and not d.scheme.wide}  # QDQ of these formats is TE's too
    if real and t.engine == "megatron" and t.impl == "local":  # the FSDP trainer's are torchao's (pcc.lower.fsdp)
        rep.error("PCC303", f"real {', '.join(sorted(real))} trainer GEMMs need Transformer Engine; 'impl local' has none",
                  smap.find("trainer"), path="trainer",
                  hint="use 'trainer megatron' with 'impl transformer_engine', or 'qdq' GEMMs")
    opt = t.optimizer
    if t.param_gather != "bf16" and not opt.distributed:
        rep.error("PCC304", f"'param_gather {t.param_gather}' needs the distributed optimizer",
                  smap.find("trainer.param_gather"), path="trainer.param_gather",
                  hint="write 'optimizer adam distributed'")
    for d, _ in plan.used("fprop"):
        ref = d.rule
        if t.engine == "megatron" and d.scheme.format == "fp8_e5m2" and d.gemm == "real":
            rep.error("PCC313", "Transformer Engine runs FProp in E4M3 ('hybrid' means E4M3 forward, E5M2 "
                      "backward); there is no E5M2 forward", smap.find(ref.path), path=ref.path,
                      hint="use fp8_e4m3 for FProp, and fp8_e5m2 for DGrad/WGrad if you want hybrid")
    recipe = plan.fp8_recipe
    if t.param_gather == "fp8" and opt.offload and recipe != "delayed":
        rep.error("PCC305", f"FP8 parameter all-gather with CPU optimizer offload needs delayed scaling, "
                  f"not '{recipe}'", smap.find("trainer.optimizer"), path="trainer.optimizer")
    if t.engine == "megatron" and opt.offload and not opt.precision_aware:  # FSDP2 offloads with CPUOffloadPolicy
        rep.error("PCC309", "CPU optimizer offload needs the precision-aware optimizer",
                  smap.find("trainer.optimizer"), path="trainer.optimizer", hint="add 'precision_aware'")
    if not opt.precision_aware and (t.master, t.moments) != ("fp32", "fp32"):
        rep.error("PCC308", "master weights and moments below fp32 need the precision-aware optimizer",
                  smap.find("trainer.moments") or smap.find("trainer.master"), path="trainer",
                  hint="add 'precision_aware' to the optimizer (Adam, distributed)")
    if opt.precision_aware and (opt.kind != "adam" or not opt.distributed):
        rep.error("PCC308", "the precision-aware optimizer is Adam-only and needs the distributed optimizer",
                  smap.find("trainer.optimizer"), path="trainer.optimizer")
    if t.grads not in ("fp32", "bf16"):
        rep.error("PCC308", f"main gradients are fp32 or bf16, not {t.grads}", smap.find("trainer.grads"),
                  path="trainer.grads")
    if t.params == "fp8" and t.param_gather != "fp8":
        rep.error("PCC304", "FP8 trainer parameters are Megatron's FP8 parameter all-gather",
                  smap.find("trainer.params"), path="trainer.params", hint="write 'param_gather fp8' as well")
    if t.master == "bf16":
        rep.error("PCC308", "master weights cannot be bf16 (fp32, or fp16 with the precision-aware optimizer)",
                  smap.find("trainer.master"), path="trainer.master")
    if recipe == "delayed" and _first_last_wide(plan):
        rep.error("PCC306", "delayed scaling does not support BF16 first/last layers",
                  smap.find("trainer"), path="trainer", hint="use current scaling (tensorwise) or blockwise")


@check
def megatron_wide_operators(plan: Plan, smap: SourceMap, rep: Reporter) -> None:
    """PCC310: Megatron keeps the embedding, the LM head and the router wide."""
    if plan.contract.trainer.engine != "megatron":
        return
    ops = plan.catalog.operators
    for comp in ("fprop", "dgrad", "wgrad"):
        for d, idx in plan.used(comp):
            ref, spec = d.rule, d.scheme
            bad = [i for i in idx if ops[i].family in ("embed", "lm_head", "router")]
            if bad and not spec.wide:
                rep.error("PCC310", f"Megatron runs embed, lm_head and router wide; {comp} cannot quantize "
                          f"{_names(plan, bad)}", smap.find(ref.path), path=ref.path,
                          hint="narrow the pattern (e.g. 'linear' instead of 'all'), or keep them bf16")


def _first_last_wide(plan: Plan) -> bool:
    """Whether the trainer keeps whole first or last layers wide while other layers run the FP8
    recipe: what Megatron expresses with --first-last-layers-bf16."""
    from pcc.plan.patterns import LINEAR

    quantized: dict[int, set[bool]] = {}
    for i, op in enumerate(plan.catalog.operators):
        if op.family in LINEAR and op.layer is not None:
            quantized.setdefault(op.layer, set()).add(not plan.scheme("fprop", i).wide)
    wide = {layer for layer, q in quantized.items() if q == {False}}
    n = plan.catalog.num_layers
    return bool(wide) and len(wide) < len(quantized) and (0 in wide or n - 1 in wide)


@check
def trainable_and_sync(plan: Plan, smap: SourceMap, rep: Reporter) -> None:
    c = plan.contract
    if c.trainable.kind == "lora" and c.sync.moves == "full_weights":
        rep.error("PCC401", "a LoRA trainable set with full-weight sync rebuilds the whole frozen base every update",
                  smap.find("sync.moves") or smap.find("sync"), path="sync.moves", hint="write 'sync adapter'")
    if c.trainable.kind != "lora" and c.sync.moves == "adapter":
        rep.error("PCC402", f"'sync adapter' but the trainable set is '{c.trainable.kind}': the base trains, "
                  "yet rollout keeps its frozen base", smap.find("sync.moves") or smap.find("sync"),
                  path="sync.moves", hint="train a LoRA adapter ('trainable lora ...') or sync full_weights")
    if c.sync.schedule == "async" and c.sync.max_staleness == 0:
        rep.error("PCC406", "an async schedule with max_staleness 0 is synchronous",
                  smap.find("sync.max_staleness") or smap.find("sync"), path="sync.max_staleness",
                  hint="bound the staleness (e.g. max_staleness 2), or use 'schedule colocated'")
    if c.sync.schedule == "colocated" and c.sync.max_staleness > 0:
        rep.warning("PCC411", "a colocated schedule alternates rollout and training; max_staleness is unused",
                    smap.find("sync.max_staleness"), path="sync.max_staleness")
    if c.sync.transfer in ("p2p", "disk") and (c.sync.schedule == "colocated" or c.trainable.kind == "lora"):
        rep.error("PCC412", f"'{c.sync.transfer}' transfer works neither colocated nor with LoRA",
                  smap.find("sync.transfer"), path="sync.transfer", hint="use 'transfer broadcast'")


@check
def sglang_state(plan: Plan, smap: SourceMap, rep: Reporter) -> None:
    """PCC311: SGLang has one KV cache dtype; PCC414: where SGLang can put LoRA on experts."""
    ops = plan.catalog.operators
    kv = plan.kv_cache_formats()
    if len(kv) > 1:
        ref = next(r for r in kv.values() if r is not None)
        rep.error("PCC311", f"SGLang keeps one KV cache dtype, but the plan asks for {', '.join(sorted(kv))}",
                  smap.find(ref.path), path=ref.path, hint="give every layer's kv_cache the same scheme")
    if plan.contract.trainable.kind != "lora" or plan.contract.rollout.engine != "sglang":
        return  # vLLM's MoE LoRA: pcc.lower.vllm (PCC624)
    fams = {ops[i].family for i in plan.trainable}
    experts = fams & {"experts.gate_up", "experts.down"}
    if not experts:
        return
    where = smap.find("trainable.targets[0]") or smap.find("trainable")
    if len(experts) == 1:
        rep.error("PCC414", f"LoRA on routed experts needs both experts.gate_up and experts.down (only "
                  f"{experts.pop()} is targeted); SGLang would not apply it", where, path="trainable.targets")
        return
    bad = {plan.scheme("rollout", i).format for i in plan.trainable if ops[i].family.startswith("experts.")}
    bad = {f for f in bad if f not in ("bf16", "nvfp4")}
    block_fp8 = all(plan.scheme("rollout", i).weights is not None and plan.scheme("rollout", i).weights.kind == "block"
                    for i in plan.trainable if ops[i].family.startswith("experts.")
                    and plan.scheme("rollout", i).format == "fp8_e4m3")
    if block_fp8:
        bad.discard("fp8_e4m3")
    if bad:
        rep.error("PCC414", f"SGLang serves LoRA on routed experts only over BF16, block-FP8 or NVFP4 expert "
                  f"weights, not {', '.join(sorted(bad))}", where, path="trainable.targets")


@check
def rollout_layout(plan: Plan, smap: SourceMap, rep: Reporter) -> None:
    """PCC312: the rollout checkpoint carries one quantization_config, so every quantized rollout
    weight shares one format, grouping, scale dtype, symmetry and scale rule; unless the rollout engine
    serves ModelOpt MIXED_PRECISION (pcc.plan.mixed), where PCC650/PCC651 say what that form cannot hold."""
    keys = quantized_keys(plan)
    if len(keys) < 2:
        return
    table = engine_mixed(plan.contract.rollout.engine)
    ops = plan.catalog.operators
    members = [d for d, idx in plan.used("rollout") if not d.scheme.wide and any(
        plan.layouts[i] is not None and plan.layouts[i].modelopt_algo for i in idx if ops[i].family != "kv_cache")]
    if table is None or not members:  # no engine serves the mix, or none of its schemes is a ModelOpt member
        first, ref = list(keys.values())[:2]
        served = [e for e in ("vllm", "sglang") if engine_mixed(e) is not None]
        where = "with these schemes" if table else f"with {' or '.join(served)}, which serves"
        rep.error("PCC312", f"rollout weights are quantized two ways ({first.scheme_name} at {first.path}, "
                  f"{ref.scheme_name} here); one {plan.contract.rollout.engine} checkpoint has one "
                  "quantization_config", smap.find(ref.path), path=ref.path,
                  hint=f"use one scheme for every quantized rollout weight, or roll out {where} ModelOpt "
                       "MIXED_PRECISION checkpoints, one scheme per module: FP8 per tensor with static activations "
                       "(fp8_tensor), NVFP4, W4A16 NVFP4 (nvfp4 weights group 16)")
        return
    _mixed_members(plan, smap, rep, table)


def _mixed_members(plan: Plan, smap: SourceMap, rep: Reporter, table: dict) -> None:
    """PCC650: a quantized rollout scheme with no MIXED_PRECISION member form the engine loads;
    PCC651: one engine module (fused projections, a layer's routed experts) in two forms."""
    ops, engine = plan.catalog.operators, plan.contract.rollout.engine
    for d, idx in plan.used("rollout"):
        weights = [i for i in idx if ops[i].family != "kv_cache"]
        if d.scheme.wide or not weights or plan.layouts[weights[0]] is None:
            continue
        layout = plan.layouts[weights[0]]
        if layout.modelopt_algo is None:
            why = table["refused"].get(layout.name, table["refused"]["other"])
            rep.error("PCC650", f"{engine} serves this rollout as a ModelOpt MIXED_PRECISION checkpoint, and "
                      f"'{d.scheme_name}' ({layout.name}) is no member it loads: {' '.join(why.split())}",
                      smap.find(d.path), path=d.path, hint="give these weights an FP8 per-tensor (fp8_tensor), "
                      "NVFP4 or W4A16 NVFP4 scheme, or keep them bf16")
    forms: dict[str, dict] = {}
    for i, op in enumerate(ops):
        if op.family != "kv_cache" and op.tensor.endswith(".weight"):
            x = plan.layouts[i]
            forms.setdefault(module_of(op.tensor), {}).setdefault(x.name if x else "wide", i)
    for module, seen in forms.items():
        if len(seen) > 1:
            i = list(seen.values())[-1]
            path = plan.decision("rollout", i).path
            rep.error("PCC651", f"{module}: {engine} loads {', '.join(ops[j].tensor for j in seen.values())} as one "
                      f"module, here in {' and '.join(seen)}; ModelOpt MIXED_PRECISION gives a module one quant_algo "
                      "(vLLM raises 'Mixed quant_algo within fused layer', and one layer's routed experts are one "
                      "FusedMoE)", smap.find(path), path=path, hint="give the module's members one scheme")
            return


@check
def qat_group(plan: Plan, smap: SourceMap, rep: Reporter) -> None:
    """PCC403: rollout INT4 group size differs from the trainer's QAT group size."""
    ops = plan.catalog.operators
    roll, fprop = plan.owner["rollout"], plan.owner["fprop"]
    seen: set[tuple[int, int]] = set()
    for i in range(len(ops)):
        r, f = roll[i], fprop[i]
        if r == DEFAULT or f == DEFAULT or (r, f) in seen:
            continue
        seen.add((r, f))
        rs, fs = plan.schemes[plan.rules[r].rule.scheme], plan.schemes[plan.rules[f].rule.scheme]
        if rs.format == fs.format == "int4" and rs.weights and fs.weights and rs.weights != fs.weights:
            rep.error("PCC403", f"rollout INT4 uses {rs.weights.text()} but trainer QAT uses {fs.weights.text()} "
                      f"(e.g. {ops[i].tensor})", smap.find(plan.rules[f].path), path=plan.rules[f].path,
                      hint="use one scheme on both sides")


@check
def corrections(plan: Plan, smap: SourceMap, rep: Reporter) -> None:
    c = plan.contract
    if c.correction.kind != "none" and "logprobs" not in c.rollout.record:
        rep.error("PCC404", f"'correction {c.correction.kind}' needs the rollout log-probs, which rollout does "
                  "not record", smap.find("rollout.record") or smap.find("correction"), path="rollout.record",
                  hint="add 'logprobs' to the rollout 'record' list")
    moe = plan.catalog.is_moe
    if "experts" in c.rollout.record and not moe:
        rep.error("PCC410", f"rollout records expert ids, but '{plan.catalog.name}' is a dense model",
                  smap.find("rollout.record"), path="rollout.record", hint="remove 'experts' from 'record'")
    if c.routing_replay != "none" and not moe:
        rep.error("PCC410", f"routing replay on '{plan.catalog.name}', a dense model", smap.find("routing_replay"),
                  path="routing_replay", hint="remove 'routing replay'")
    if moe and plan.quantized("rollout") and c.routing_replay == "none":
        rep.warning("PCC405", "MoE model with a quantized rollout and no routing replay: rounding can change "
                    "expert choices", smap.find("rollout"), path="rollout", hint="add 'routing replay rollout' (R3)")


def _rollout_formats(plan: Plan) -> set[str]:
    """Formats of rollout weights (the KV cache is request state, not a weight)."""
    ops = plan.catalog.operators
    return {d.scheme.format for d, idx in plan.used("rollout")
            if not d.scheme.wide and any(ops[i].family != "kv_cache" for i in idx)}


def _fprop_matches_rollout(plan: Plan) -> bool:
    return any(not d.scheme.wide for d, _ in plan.used("fprop"))


@check
def mismatch_regime(plan: Plan, smap: SourceMap, rep: Reporter) -> None:
    c = plan.contract
    fp8_roll = {f for f in _rollout_formats(plan) if f.startswith("fp8")}
    if fp8_roll and not _fprop_matches_rollout(plan) and (c.rollout.max_tokens or 0) >= LONG_ROLLOUT:
        rep.warning("PCC407", f"FP8 rollout with a BF16 trainer at {c.rollout.max_tokens} tokens: reported to "
                    "drift from 8K tokens and collapse at 16K", smap.find("rollout.max_tokens"),
                    path="rollout.max_tokens", hint="quantize trainer FProp to match rollout (Unified FP8), or "
                    "shorten rollouts")
    if c.sync.moves == "full_weights" and _rollout_formats(plan) and c.sync.interval == 1:
        params = plan.params
        if params < SMALL_MODEL_PARAMS:
            rep.warning("PCC409", f"full-weight requantization after every update on a {params / 1e9:.1f}B model: "
                        "the quantization cost can exceed what the low-precision rollout saves",
                        smap.find("sync"), path="sync", hint="measure the sync cost at these shapes, or sync less often (sync { interval N })")




@check
def placement(plan: Plan, smap: SourceMap, rep: Reporter) -> None:
    cat = plan.catalog
    for section in ("rollout", "trainer"):
        par = getattr(plan.contract, section).parallel
        heads = cat.num_attention_heads
        if heads and heads % par.tp:
            rep.error("PCC413", f"{section} tp {par.tp} does not divide the {heads} attention heads",
                      smap.find(f"{section}.parallel.tp"), path=f"{section}.parallel.tp")
        if par.ep > 1 and (not cat.is_moe or cat.num_experts % par.ep):
            what = f"the {cat.num_experts} routed experts" if cat.is_moe else "a dense model"
            rep.error("PCC413", f"{section} ep {par.ep} does not divide {what}",
                      smap.find(f"{section}.parallel.ep"), path=f"{section}.parallel.ep")


@check
def expectations(plan: Plan, smap: SourceMap, rep: Reporter) -> None:
    c = plan.contract
    for k, e in enumerate(c.expect):
        where = smap.find(f"expect[{k}]")
        if e.metric not in METRICS:
            rep.error("PCC501", f"unknown metric '{e.metric}'", where, path=f"expect[{k}]",
                      hint=did_you_mean(e.metric, METRICS) or "metrics: " + ", ".join(METRICS))
            continue
        if e.stat not in METRICS[e.metric]:
            stats = [s for s in METRICS[e.metric] if s]
            rep.error("PCC501", f"'{e.metric}' has no statistic '{e.stat}'", where, path=f"expect[{k}]",
                      hint=("statistics: " + ", ".join(stats)) if stats else "this metric takes no statistic")
            continue
        if e.metric == "route_agreement" and not plan.catalog.is_moe:
            rep.error("PCC504", "route agreement on a dense model", where, path=f"expect[{k}]")
        if e.metric == "version_age" and e.op in ("<=", "<") and c.sync.schedule == "async":
            limit = e.value if e.op == "<=" else e.value - 1
            if limit < c.sync.max_staleness:
                rep.error("PCC503", f"expects version age {e.op} {e.value:g} but the contract allows staleness "
                          f"{c.sync.max_staleness}", where, path=f"expect[{k}]")
        if e.metric == "same_version" and e.stat and e.stat.startswith("abs_dlogp p99") and e.op in ("<=", "<") \
                and not _fprop_matches_rollout(plan):
            floors = [MISMATCH_FLOOR[f] for f in _rollout_formats(plan) if f in MISMATCH_FLOOR]
            if floors and e.value < max(floors):
                rep.error("PCC502", f"same-version p99 bound {e.value:g} is the matched-FProp regime; a wide "
                          f"trainer FProp against a {', '.join(sorted(_rollout_formats(plan)))} rollout is not "
                          f"expected below {max(floors):g}", where, path=f"expect[{k}]",
                          hint="quantize trainer FProp like rollout (QDQ or real), or loosen the bound")


def run_checks(plan: Plan, smap: SourceMap, rep: Reporter) -> None:
    for fn in CHECKS:
        fn(plan, smap, rep)
