"""Plan -> a verl job: Hydra overrides for `python -m verl.trainer.main_ppo` and a launch script.

verl is a framework, like Miles: a contract names it (`framework verl`), `targets_for` then lowers it
in place of Miles, so `pcc check` reports what verl cannot run and `pcc compile` writes the job, which
`pcc run BUNDLE --target verl` launches. The tables live in
targets/verl.yaml; tests/lower/test_lower_verl.py composes the overrides with verl's own Hydra
configs and builds verl's config classes from them. verl's rollout does not load pcc's
converted checkpoint: it syncs the actor's BF16 weights and quantizes them online with one fixed
FP8 config, so a contract's rollout precision is honoured only where it is exactly that.
"""

from __future__ import annotations

import functools
import shlex

from pcc.lower import JOB_FILE, Lowered, Unsupported, job_file_shell, lower, lower_each, module_leaf, target, unsupported
from pcc.lower.checkpoint_config import rollout_layout, rollout_scheme, skip_list
from pcc.lower.engine_table import table as engine_table
from pcc.lower.megatron import framework_args, lora_modules
from pcc.lower.server_script import kv_cache_rule, quantized_rule
from pcc.lower.settings import Setting, hydra_quotable
from pcc.plan import Plan
from pcc.plan.layouts import named
from pcc.resources import target_table

OVERRIDES_FILE = "verl/overrides.txt"
LAUNCH = "verl/launch.sh"
ACTOR = "actor_rollout_ref.actor"
ROLLOUT = "actor_rollout_ref.rollout"
# The job file: the job's own Hydra overrides, one per line. PCC_VERL_JOB names it; unset, launch.sh
# reads the file `job` in the directory that holds the bundle; set and empty, none (as Miles' launch).
JOB_VARIABLE = "PCC_VERL_JOB"
# Override key (less Hydra's +) -> the contract field that decides it (a Contract model path; docs/verl.md's
# table), so a job that sets the key again is told what it leaves behind. The first matching prefix wins.
CONTRACT_FIELDS = (
    (f"{ACTOR}.megatron.override_transformer_config.fp", "trainer.rules"),
    (f"{ACTOR}.megatron.override_transformer_config.", "trainer"),
    (f"{ACTOR}.megatron.router_replay.", "routing_replay"),
    (f"{ACTOR}.megatron.use_distributed_optimizer", "trainer.optimizer"),
    (f"{ACTOR}.megatron.", "trainer.parallel"),
    ("ray_kwargs.ray_init.runtime_env.env_vars.", "trainer"),
    (f"{ROLLOUT}.engine_kwargs.", "rollout.rules"),
    (f"{ROLLOUT}.quantization", "rollout.rules"),
    (f"{ROLLOUT}.enable_rollout_routing_replay", "routing_replay"),
    (f"{ROLLOUT}.calculate_log_probs", "rollout.record"),
    (f"{ROLLOUT}.full_determinism", "rollout.deterministic"),
    (f"{ROLLOUT}.response_length", "rollout.max_tokens"),
    (f"{ROLLOUT}.name", "rollout.engine"),
    (f"{ROLLOUT}.", "rollout.parallel"),
    ("algorithm.rollout_correction.", "correction"),
    ("actor_rollout_ref.model.", "trainable"),
)


def contract_field(key: str) -> str | None:
    """The contract field behind an override key pcc writes (None: a key pcc does not write)."""
    key = key.lstrip("+")
    return next((field for prefix, field in CONTRACT_FIELDS if key.startswith(prefix)), None)


@functools.lru_cache(maxsize=1)
def tables() -> dict:
    return target_table("verl")


class _Keys:
    """verl's Hydra keys as settings records, by key: a key set again keeps its place and takes the
    new value, as the override dictionary did."""

    def __init__(self) -> None:
        self.records: dict[str, Setting] = {}

    def set(self, key: str, value, path: str | None) -> None:
        value = tuple(value) if isinstance(value, list) else value
        if not hydra_quotable(value):
            unsupported("PCC625", f"value {value!r} cannot be written as a Hydra override", path)
        self.records[key] = Setting("verl", "key", key, value, path)


def _megatron(plan: Plan, over: "_Keys", notes: list[str]) -> None:
    """The megatron target's arguments, moved to where verl's Megatron engine takes them."""
    mega = lower(plan, "megatron")
    for where, value, path in framework_args(plan, tables()["megatron_args"], "PCC625", "verl's Megatron engine",
                                             "verl", "targets/verl.yaml",
                                             "run the contract on Miles ('pcc run --target miles')"):
        if "transformer" in where:
            over.set(f"+{ACTOR}.megatron.override_transformer_config.{where['transformer']}", value, path)
        elif "optimizer" in where:
            over.set(f"+{ACTOR}.optim.override_optimizer_config.{where['optimizer']}", value, path)
        else:
            over.set(f"{ACTOR}.megatron.{where['engine']}", value, path)
    key = f"{ACTOR}.megatron.use_distributed_optimizer"
    if mega.value("--use-distributed-optimizer") is None and engine_table("verl").default(
            key, tables()["config_name"]["megatron"]):
        over.set(key, False, "trainer.optimizer")  # verl's McoreEngineConfig turns it on unless told otherwise
    notes.append("trainer: the megatron target's arguments as verl's McoreEngineConfig keys and TransformerConfig "
                 "overrides (actor.megatron.override_transformer_config); its environment through Ray's runtime_env")


def _fsdp(plan: Plan, notes: list[str], caveats: list[Unsupported]) -> None:
    """verl's FSDP actor trains in BF16 (a quantized trainer GEMM has no verl setting pcc knows) with torch's
    AdamW, its state sharded with the parameters (FSDP: `distributed` always holds; the precision-aware
    optimizer, which `offload` needs, is Megatron's). Its data-parallel size is the job's GPUs
    (trainer.n_gpus_per_node x trainer.nnodes, fsdp_size -1: all of them), which the bundle does not set:
    a contract's dp or gpus is PCC616."""
    for comp in ("fprop", "dgrad", "wgrad"):
        for d, _ in plan.used(comp):
            if not d.scheme.wide:
                unsupported("PCC625", f"verl's FSDP actor runs {comp} in BF16; the contract asks for "
                            f"{d.scheme.format}", d.path, hint="use 'trainer megatron' for a low-precision trainer")
    t = plan.contract.trainer
    if t.parallel.cp > 1:
        unsupported("PCC631", f"trainer cp {t.parallel.cp}: pcc lowers verl's FSDP actor without context (Ulysses "
                    "sequence) parallelism", "trainer.parallel.cp", hint="use 'trainer megatron' for cp")
    if t.optimizer.kind != "adam":
        unsupported("PCC625", f"verl's FSDP actor runs torch's AdamW (actor.optim.optimizer); the contract asks for "
                    f"{t.optimizer.kind}", "trainer.optimizer", hint="write 'optimizer adam'")
    if t.optimizer.precision_aware:
        unsupported("PCC625", "the precision-aware optimizer is Megatron's; verl's FSDP actor has none",
                    "trainer.optimizer", hint="drop 'precision_aware' (and 'offload'), or use 'trainer megatron'")
    notes.append("trainer.optimizer: verl's FSDP actor runs AdamW, its state sharded by FSDP over the data-parallel "
                 "ranks (what 'distributed' asks)")
    par = t.parallel
    if par.dp > 1 or par.gpus:
        n = par.gpus or par.dp
        caveats.append(Unsupported(
            f"verl's FSDP actor shards over every GPU the job gives it (trainer.n_gpus_per_node x trainer.nnodes, "
            f"fsdp_config.fsdp_size -1); the bundle sets neither, so the contract's {n} GPUs are not enforced",
            "PCC616", "trainer.parallel.gpus" if par.gpus else "trainer.parallel.dp",
            f"set trainer.n_gpus_per_node and trainer.nnodes in the job file to {n} GPUs in all"))


def _rollout(plan: Plan, over: "_Keys", notes: list[str]) -> None:
    c = plan.contract
    par = c.rollout.parallel
    if par.pp > 1:
        unsupported("PCC625", "verl's vLLM and SGLang rollouts have no pipeline parallelism "
                    "(RolloutConfig raises for pipeline_model_parallel_size > 1)", "rollout.parallel")
    roll = lower(plan, c.rollout.engine)  # the engine's own refusals (KV cache dtype, ep, LoRA) come first
    over.set(f"{ROLLOUT}.name", c.rollout.engine, "rollout.engine")
    over.set(f"{ROLLOUT}.tensor_model_parallel_size", par.tp, "rollout.parallel.tp")
    over.set(f"{ROLLOUT}.data_parallel_size", par.dp, "rollout.parallel.dp")
    over.set(f"{ROLLOUT}.expert_parallel_size", par.ep, "rollout.parallel.ep")
    over.set(f"{ROLLOUT}.quantization", _online_quantization(plan), quantized_rule(plan))
    kv = roll.value("--kv-cache-dtype")
    if kv != "auto":
        over.set(f"+{ROLLOUT}.engine_kwargs.{c.rollout.engine}.kv_cache_dtype", kv, kv_cache_rule(plan))
        notes.append(f"rollout.engine_kwargs.{c.rollout.engine}.kv_cache_dtype {kv}: verl passes engine_kwargs to "
                     "the rollout server; scales start at 1.0 (verl syncs no KV scales)")
    over.set(f"{ROLLOUT}.calculate_log_probs", "logprobs" in c.rollout.record, "rollout.record")
    if c.rollout.deterministic:
        over.set(f"{ROLLOUT}.full_determinism", True, "rollout.deterministic")
    if c.rollout.max_tokens:
        over.set(f"{ROLLOUT}.response_length", c.rollout.max_tokens, "rollout.max_tokens")


def _online_quantization(plan: Plan) -> str | None:
    """verl's `rollout.quantization`: None when rollout is wide, "fp8" when the contract's rollout is
    exactly verl's online block FP8, else PCC626."""
    layout, fp8 = rollout_layout(plan), tables()["online_fp8"]
    if not named(layout).quantized:
        return None
    path = next((d.path for d, idx in plan.used("rollout") if not d.scheme.wide), "rollout")
    spec = rollout_scheme(plan)
    if plan.contract.rollout.engine != "vllm":
        unsupported("PCC626", "verl quantizes an SGLang rollout with the exclusions of the model's own "
                    "quantization_config; pcc lowers verl's online FP8 for its vLLM rollout only", path,
                    hint="use 'rollout vllm', or a BF16 rollout")
    if layout != "fp8_block" or [spec.weights.rows, spec.weights.cols] != fp8["block"] or spec.scale != fp8["scale"]:
        unsupported("PCC626", f"verl's rollout quantizes online to block FP8 {fp8['block'][0]}x{fp8['block'][1]} "
                    f"with FP32 scales only (rollout.quantization fp8); the contract's rollout is {layout}"
                    + (f" with {spec.scale} scales" if spec is not None and layout == "fp8_block" else ""), path,
                    hint="use fp8_block (128x128, FP32 scales) for rollout weights, or run on Miles")
    routers = {op.tensor.removesuffix(".weight") for op in plan.catalog.operators if op.family == "router"}
    verl_skips = {r for r in routers if r.endswith("." + fp8["ignored_leaf"])}
    wide = set(skip_list(plan)) - set(fp8["never_quantized"])
    if wide != verl_skips:
        diff = sorted(wide ^ verl_skips)
        unsupported("PCC626", f"verl's online FP8 keeps exactly the routers (mlp.gate) BF16, but the contract's "
                    f"rollout differs on {len(diff)} module(s) ({', '.join(diff[:3])}...)", path,
                    hint="quantize every linear module but embed, lm_head and router")
    return fp8["value"]


def _correction(plan: Plan, over: "_Keys", notes: list[str]) -> None:
    """algorithm.rollout_correction: verl's TIS (truncate at the upper bound) and IcePop (zero the
    weights outside [lower, upper]), matching pcc's definitions (pcc/runtime/objective.py)."""
    corr, key = plan.contract.correction, "algorithm.rollout_correction"
    if corr.kind == "none":
        return
    hi = corr.clip if corr.clip is not None else (corr.threshold or 2.0)
    if corr.kind == "tis":
        if corr.low is not None:
            unsupported("PCC628", "verl's TIS truncates the importance weight from above only; 'low' has no "
                        "verl setting", "correction.low", hint="drop 'low', or use 'correction mis'")
        threshold = f"{hi:g}"
    else:
        lo = corr.low if corr.low is not None else 0.0
        if corr.kind == "rejection":
            hi = corr.threshold or hi
            lo = 1.0 / hi
        if lo <= 0:
            unsupported("PCC628", f"verl's IcePop keeps weights inside [lower, upper] with a positive lower bound; "
                        f"correction {corr.kind} without 'low' drops only weights above {hi:g}", "correction",
                        hint=f"write 'low' (e.g. low {1 / hi:g})")
        threshold = f"{lo:g}_{hi:g}"
    over.set(f"{key}.rollout_is", corr.level, "correction")
    over.set(f"{key}.rollout_is_threshold", threshold, "correction")
    notes.append(f"correction {corr.kind}: rollout_is {corr.level}, threshold {threshold} "
                 f"({'TIS' if corr.kind == 'tis' else 'IcePop: weights outside [lower, upper] are zeroed'})")


def _lora(plan: Plan, over: "_Keys") -> None:
    c, tab, ops = plan.contract, tables(), plan.catalog.operators
    t = c.trainable
    if c.trainer.engine == "fsdp":
        over.set("actor_rollout_ref.model.lora_rank", t.rank, "trainable.rank")
        over.set("actor_rollout_ref.model.lora_alpha", t.alpha, "trainable.alpha")
        over.set("actor_rollout_ref.model.target_modules", sorted({module_leaf(ops[i].tensor) for i in plan.trainable}), "trainable.targets")
        return
    names = lora_modules(plan, tab["megatron_lora_modules"], tab["megatron_lora_fused"], "PCC627",
                         "verl's Megatron LoRA")
    over.set("actor_rollout_ref.model.lora.rank", t.rank, "trainable.rank")
    over.set("actor_rollout_ref.model.lora.alpha", t.alpha, "trainable.alpha")
    over.set("actor_rollout_ref.model.lora.target_modules", names, "trainable.targets")


@target("verl", honours=("framework", "trainer", "rollout.rules", "rollout.parallel", "rollout.deterministic", "rollout.record",
                          "rollout.max_tokens", "correction", "routing_replay", "trainable", "sync"))
def lower_verl(plan: Plan) -> Lowered:
    c, tab = plan.contract, tables()
    if c.trainer.engine not in tab["config_name"]:
        unsupported("PCC625", f"verl has no '{c.trainer.engine}' actor strategy", "trainer")
    if c.sync.schedule != "colocated" or c.sync.bridge != "bf16":
        unsupported("PCC629", "verl's main_ppo runs the colocated schedule and syncs BF16 weights (its rollout "
                    f"quantizes them); the contract asks for schedule {c.sync.schedule}, bridge {c.sync.bridge}",
                    "sync", hint="write 'schedule colocated bridge bf16' (verl's fully-async trainer is another entry point)")
    over = _Keys()
    lower_each(plan, *("megatron",) * (c.trainer.engine == "megatron"), c.rollout.engine)  # all their refusals
    notes: list[str] = [f"--config-name {tab['config_name'][c.trainer.engine]}: verl's actor strategy "
                        f"{c.trainer.engine}"]
    caveats: list[Unsupported] = []
    if c.trainer.engine == "megatron":
        _megatron(plan, over, notes)
    else:
        _fsdp(plan, notes, caveats)
    _rollout(plan, over, notes)
    if c.routing_replay != "none":
        if c.trainer.engine != "megatron":
            unsupported("PCC625", "verl replays routes in its Megatron engine only (actor.megatron.router_replay)",
                        "routing_replay")
        over.set(f"{ACTOR}.megatron.router_replay.mode", c.routing_replay.upper(), "routing_replay")
        if c.routing_replay == "r3":
            over.set(f"{ROLLOUT}.enable_rollout_routing_replay", True, "routing_replay")
    _correction(plan, over, notes)
    if c.trainable.kind == "lora":
        _lora(plan, over)
    if c.trainer.engine == "megatron":  # the trainer's environment, through Ray's runtime_env: Hydra keys, last
        for e in sorted(lower(plan, "megatron").of("env"), key=lambda e: e.key):
            over.set(f"{tab['env_key']}.{e.key}", e.value, e.path)
    out = Lowered("verl", settings=list(over.records.values()), notes=notes, caveats=caveats)
    config = tab["config_name"][c.trainer.engine]
    out.files = {OVERRIDES_FILE: "".join(a + "\n" for a in out.args), LAUNCH: launch_script(config, out.args)}
    return out


def launch_script(config: str, args: list[str]) -> str:
    """`python -m verl.trainer.main_ppo --config-name CONFIG OVERRIDES JOB "$@"`: the job's data, model path
    and batch sizes come after the bundle's, from the job file and the arguments, as Hydra overrides (the
    later wins); PCC_DRY_RUN=1 prints the command instead."""
    q = shlex.quote
    body = " \\\n  ".join(q(a) for a in args)
    return ("#!/usr/bin/env bash\n"
            "# Generated by pcc: the verl job for this contract. verl gets, in this order, the contract's\n"
            "# Hydra overrides, the job file's, then the arguments (data.*, actor_rollout_ref.model.path,\n"
            "# batch sizes, trainer.*); where two set one key the later wins. The job file holds one\n"
            f"# override per line, '#' comments; ${JOB_VARIABLE} names it, else it is the file '{JOB_FILE}'\n"
            "# beside this bundle.\n"
            "set -euo pipefail\n"
            'here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"\n'
            'bundle="$(dirname "$here")"\n'
            + job_file_shell(JOB_VARIABLE) +
            "jobargs=()\n"
            'if [[ -n "$job" && -f "$job" ]]; then  # one override a line, blanks around it trimmed\n'
            '  while IFS= read -r line || [[ -n "$line" ]]; do\n'
            '    line="${line#"${line%%[![:space:]]*}"}"; line="${line%"${line##*[![:space:]]}"}"\n'
            '    if [[ -n "$line" && "$line" != \\#* ]]; then jobargs+=("$line"); fi\n'
            '  done <"$job"\n'
            "fi\n"
            f"cmd=(python3 -m {tables()['entry']} --config-name {q(config)} \\\n  {body} \\\n"
            '  ${jobargs[@]+"${jobargs[@]}"})\n'
            'if [ "${PCC_DRY_RUN:-0}" = 1 ]; then printf \'%q \' "${cmd[@]}" "$@"; echo; exit 0; fi\n'
            'exec "${cmd[@]}" "$@"\n')
