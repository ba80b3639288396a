"""Plan -> a NeMo RL job: a GRPO recipe (nemo_rl/config.yaml) over NeMo RL's own example recipe, and a launch.

NeMo RL (NVIDIA-NeMo/RL) is a framework, like Miles and verl: a contract names it (`framework nemo_rl`),
`targets_for` lowers it, `pcc check` reports what NeMo RL cannot run (PCC632-PCC636) and `pcc compile`
writes the job, which `pcc run BUNDLE --target nemo_rl` launches. Every setting is a Hydra-style key
(Setting kind "key", engine "nemo_rl"); the bundle writes them as one nested YAML recipe, which the
launch puts under `defaults: $NEMO_RL_DIR/examples/configs/<base>` (NeMo RL's load_config inheritance)
and hands to `examples/run_grpo.py --config`; the job's own overrides follow on the command line.
The tables (pinned NeMo RL version, sources) are targets/nemo_rl.yaml; targets/nemo_rl_keys.json lists
the keys the pinned recipes and config classes have.

NeMo RL's vLLM generation does not load pcc's converted checkpoint: it refits the policy's BF16 weights
and, with `vllm_cfg.precision: fp8`, quantizes them in vLLM to block FP8 128x128 (its own vLLM
patches), so a contract's rollout precision is honoured only where it is exactly that layout, with
the modules it keeps wide listed in `quantization_ignored_layer_kws`.
"""

from __future__ import annotations

import functools
import shlex

import yaml

from pcc.lower import JOB_FILE, Lowered, Unsupported, job_file_shell, lower, lower_each, module_leaf, target, unsupported
from pcc.lower.checkpoint_config import rollout_layout, rollout_scheme, skip_list
from pcc.lower.megatron import framework_args, lora_modules
from pcc.lower.server_script import kv_cache_rule, quantized_rule
from pcc.lower.settings import Setting, hydra_quotable
from pcc.plan import Plan
from pcc.plan.layouts import named
from pcc.resources import target_table

CONFIG_FILE = "nemo_rl/config.yaml"
LAUNCH = "nemo_rl/launch.sh"
POLICY = "policy"
MEGATRON = "policy.megatron_cfg"
DTENSOR = "policy.dtensor_cfg"
VLLM = "policy.generation.vllm_cfg"
LOSS = "loss_fn"
# The job file: the job's own Hydra overrides, one per line (as verl's). PCC_NEMO_RL_JOB names it; unset,
# launch.sh reads the file `job` beside the bundle; set and empty, none.
JOB_VARIABLE = "PCC_NEMO_RL_JOB"
# Key prefix -> the contract field that decides it, so a job that sets the key again is told what it leaves behind.
CONTRACT_FIELDS = (
    (f"{MEGATRON}.fp8_cfg.", "trainer.rules"),
    (f"{MEGATRON}.optimizer.", "trainer.optimizer"),
    (f"{MEGATRON}.peft.", "trainable"),
    (f"{MEGATRON}.env_vars.", "trainer"),
    (f"{MEGATRON}.moe_router_dtype", "trainer"),
    (f"{MEGATRON}.", "trainer.parallel"),
    (f"{DTENSOR}.lora_cfg.", "trainable"),
    (f"{DTENSOR}.", "trainer.parallel"),
    (f"{VLLM}.precision", "rollout.rules"),
    (f"{VLLM}.quantization_ignored_layer_kws", "rollout.rules"),
    (f"{VLLM}.pow2_", "rollout.rules"),
    (f"{VLLM}.kv_cache_dtype", "rollout.rules"),
    (f"{VLLM}.", "rollout.parallel"),
    ("policy.generation.max_new_tokens", "rollout.max_tokens"),
    ("policy.generation.colocated.", "sync"),
    ("policy.router_replay.", "routing_replay"),
    (f"{LOSS}.", "correction"),
    (f"{POLICY}.precision", "trainer"),
)


def contract_field(key: str) -> str | None:
    """The contract field behind a key pcc writes (None: a key pcc does not write)."""
    key = key.lstrip("+~")
    return next((field for prefix, field in CONTRACT_FIELDS if key.startswith(prefix)), None)


@functools.lru_cache(maxsize=1)
def tables() -> dict:
    return target_table("nemo_rl")


class _Keys:
    """NeMo RL's config keys as settings records, by key (a key set again keeps its place)."""

    def __init__(self) -> None:
        self.records: dict[str, Setting] = {}

    def set(self, key: str, value, path: str | None, note: str | None = None) -> None:
        value = tuple(value) if isinstance(value, list) else value
        if not hydra_quotable(value):
            unsupported("PCC632", f"value {value!r} cannot be written as a NeMo RL override", path)
        self.records[key] = Setting("nemo_rl", "key", key, value, path, note)


def _megatron(plan: Plan, keys: _Keys, notes: list[str]) -> None:
    """The megatron target's arguments as NeMo RL's policy.megatron_cfg keys (Megatron-Bridge builds the
    TransformerConfig and OptimizerConfig from them); its environment as megatron_cfg.env_vars."""
    tab = tables()
    mega, table = lower(plan, "megatron"), tab["megatron_args"]
    flags = {s.key for s in mega.of("flag")}
    keys.set(f"{MEGATRON}.enabled", True, "trainer")
    keys.set(f"{DTENSOR}.enabled", False, "trainer")
    for where, value, path in framework_args(plan, table, "PCC632", "NeMo RL's Megatron policy", "NeMo RL",
                                             "targets/nemo_rl.yaml", "run the contract on Miles ('framework miles')"):
        if where["key"].startswith("fp8_cfg."):
            keys.set(f"{MEGATRON}.fp8_cfg.enabled", True, path)
        keys.set(f"{MEGATRON}.{where['key']}", value, path)
    for flag, key in tab["megatron_defaults_on"].items():
        if flag not in flags:  # the base recipe turns it on
            keys.set(f"{MEGATRON}.{key}", False, "trainer.optimizer")
    for e in sorted(mega.of("env"), key=lambda e: e.key):
        keys.set(f"{MEGATRON}.env_vars.{e.key}", e.value, e.path)
    notes.append("trainer: the megatron target's arguments as NeMo RL's policy.megatron_cfg keys (fp8_cfg for "
                 "Transformer Engine's FP8, optimizer for Megatron's OptimizerConfig); its environment as "
                 "megatron_cfg.env_vars")


def _dtensor(plan: Plan, keys: _Keys, notes: list[str]) -> None:
    """NeMo RL's DTensor policy (FSDP2 with tensor and context parallelism) trains in BF16 with torch's AdamW."""
    for comp in ("fprop", "dgrad", "wgrad"):
        for d, _ in plan.used(comp):
            if not d.scheme.wide:
                unsupported("PCC632", f"NeMo RL's DTensor policy runs {comp} in BF16; the contract asks for "
                            f"{d.scheme.format}", d.path, hint="use 'trainer megatron' for FP8 training")
    t = plan.contract.trainer
    if t.optimizer.kind != "adam" or t.optimizer.precision_aware:
        unsupported("PCC632", "NeMo RL's DTensor policy runs torch's AdamW (policy.optimizer); the contract asks for "
                    f"{t.optimizer.kind}{' precision_aware' if t.optimizer.precision_aware else ''}",
                    "trainer.optimizer", hint="write 'optimizer adam', or use 'trainer megatron'")
    keys.set(f"{DTENSOR}.enabled", True, "trainer")
    keys.set(f"{MEGATRON}.enabled", False, "trainer")
    keys.set(f"{DTENSOR}.tensor_parallel_size", t.parallel.tp, "trainer.parallel.tp")
    keys.set(f"{DTENSOR}.context_parallel_size", t.parallel.cp, "trainer.parallel.cp")
    notes.append("trainer: NeMo RL's DTensor policy (FSDP2 over the data-parallel ranks, BF16, AdamW)")


def _generation(plan: Plan, keys: _Keys, notes: list[str]) -> None:
    c = plan.contract
    par = c.rollout.parallel
    if c.rollout.engine != "vllm":
        unsupported("PCC633", f"pcc lowers NeMo RL's vLLM generation only; the contract's rollout is "
                    f"{c.rollout.engine}", "rollout.engine", hint="write 'rollout vllm'")
    roll = lower(plan, "vllm")  # vLLM's own refusals (KV cache dtype, ep, LoRA) come first
    if par.dp > 1 and par.ep != par.tp * par.dp:
        unsupported("PCC633", "NeMo RL runs data parallelism inside vLLM only for expert parallelism (vllm_dp_size "
                    "= expert_parallel_size / tensor_parallel_size, nemo_rl/models/generation/vllm/vllm_generation.py; "
                    f"more engines come from the cluster); the contract's rollout dp {par.dp} without ep "
                    f"{par.tp * par.dp} has no key", "rollout.parallel.dp",
                    hint=f"drop 'dp' from rollout parallel, or write 'ep {par.tp * par.dp}'")
    if par.dp > 1:
        notes.append(f"rollout dp {par.dp}: NeMo RL derives vLLM's data-parallel size from "
                     f"expert_parallel_size / tensor_parallel_size = {par.ep} / {par.tp}")
    keys.set(f"{VLLM}.tensor_parallel_size", par.tp, "rollout.parallel.tp")
    keys.set(f"{VLLM}.pipeline_parallel_size", par.pp, "rollout.parallel.pp")
    keys.set(f"{VLLM}.expert_parallel_size", par.ep, "rollout.parallel.ep")
    precision = _fp8_generation(plan, keys, notes)
    keys.set(f"{VLLM}.precision", precision or "bfloat16", quantized_rule(plan))
    kv = roll.value("--kv-cache-dtype")
    if kv not in (None, "auto"):
        if kv not in ("fp8", "fp8_e4m3"):
            unsupported("PCC633", f"NeMo RL's vLLM generation takes kv_cache_dtype auto, fp8 or fp8_e4m3; the "
                        f"contract asks for {kv}", kv_cache_rule(plan))
        if precision is None:
            unsupported("PCC633", "NeMo RL runs an FP8 KV cache only with FP8 weights (init_fp8: kv_cache_dtype "
                        "fp8 requires precision fp8)", kv_cache_rule(plan),
                        hint="quantize the rollout's linear modules to fp8_block too, or keep the KV cache bf16")
        keys.set(f"{VLLM}.kv_cache_dtype", kv, kv_cache_rule(plan))
        notes.append(f"rollout kv_cache {kv}: NeMo RL's vllm_cfg.kv_cache_dtype (its FP8 refit recomputes KV scales)")
    if c.rollout.deterministic:
        unsupported("PCC633", "NeMo RL's vLLM generation has no deterministic (batch-invariant) setting",
                    "rollout.deterministic", hint="drop 'deterministic'")
    if c.rollout.max_tokens:
        keys.set("policy.generation.max_new_tokens", c.rollout.max_tokens, "rollout.max_tokens")


def _fp8_generation(plan: Plan, keys: _Keys, notes: list[str]) -> str | None:
    """vllm_cfg.precision fp8 where the contract's rollout is NeMo RL's block FP8, with the modules it keeps
    wide as `quantization_ignored_layer_kws` (None: a wide rollout; else PCC633)."""
    layout, fp8 = rollout_layout(plan), tables()["fp8_generation"]
    if not named(layout).quantized:
        return None
    path = next((d.path for d, idx in plan.used("rollout") if not d.scheme.wide), "rollout")
    spec = rollout_scheme(plan)
    act = spec.activations
    if (layout != "fp8_block" or [spec.weights.rows, spec.weights.cols] != fp8["block"]
            or (spec.scale or "fp32") != fp8["scale"]
            or (act is not None and [act.rows, act.cols] != fp8["activation_tile"])):
        unsupported("PCC633", f"NeMo RL's FP8 generation quantizes to block FP8 {fp8['block'][0]}x{fp8['block'][1]} "
                    f"weights, 1x128 dynamic activations and FP32 scales (vllm_cfg.precision fp8); the contract's "
                    f"rollout is {layout}" + (f" with {spec.scale} scales" if layout == "fp8_block" and spec.scale else ""),
                    path, hint="use fp8_e4m3 weights block 128x128 activations tile 1x128 for the rollout")
    ops = plan.catalog.operators
    linear = {op.tensor.removesuffix(".weight") for op in ops if op.family != "kv_cache"}
    wide = sorted(set(skip_list(plan)) - set(fp8["never_quantized"]))
    quantized = linear - set(wide) - set(fp8["never_quantized"])
    kws: list[str] = []
    by_suffix: dict[str, list[str]] = {}
    for name in wide:
        head, _, rest = name.partition(".layers.")
        suffix = rest.partition(".")[2] if rest else name
        by_suffix.setdefault(suffix, []).append(name)
    for suffix, names in by_suffix.items():
        kw = "." + suffix
        if len(names) > 1 and not any(kw in q for q in quantized):  # one keyword for the module in every layer
            kws.append(kw)
            continue
        for name in names:
            clash = sorted(q for q in quantized if name in q)
            if clash:
                unsupported("PCC633", f"NeMo RL keeps modules BF16 by substring (quantization_ignored_layer_kws): "
                            f"'{name}' also matches {clash[0]}, which the contract quantizes", path)
            kws.append(name)
    if kws:
        keys.set(f"{VLLM}.quantization_ignored_layer_kws", sorted(kws), path)
    notes.append(f"rollout: vllm_cfg.precision fp8 (NeMo RL quantizes the refit BF16 weights to block FP8 128x128 "
                 f"in vLLM){'; kept BF16: ' + ', '.join(sorted(kws)) if kws else ''}")
    return fp8["precision"]


def _correction(plan: Plan, keys: _Keys, notes: list[str]) -> None:
    """loss_fn's importance-sampling correction: NeMo RL's TIS (clamp to [min, max]) and ICE-POP (zero the
    weights outside [min, max]), per token."""
    corr = plan.contract.correction
    if corr.kind == "none":
        return
    if corr.level != "token":
        unsupported("PCC635", "NeMo RL's sequence-level correction (seq-mask-tis) masks by the geometric-mean ratio, "
                    "not pcc's sequence weight; pcc lowers its token-level corrections only", "correction",
                    hint="write 'level token'")
    hi = corr.clip if corr.clip is not None else (corr.threshold or 2.0)
    lo = corr.low
    if corr.kind == "tis":
        kind = "tis"
    else:
        kind = "icepop"
        if corr.kind == "rejection":
            hi = corr.threshold or hi
            lo = 1.0 / hi
        if not lo:
            unsupported("PCC635", f"NeMo RL's ICE-POP needs a lower bound (truncated_importance_sampling_ratio_min); "
                        f"correction {corr.kind} without 'low' has none", "correction",
                        hint=f"write 'low' (e.g. low {1 / hi:g})")
    keys.set(f"{LOSS}.use_importance_sampling_correction", True, "correction")
    keys.set(f"{LOSS}.truncated_importance_sampling_type", kind, "correction")
    keys.set(f"{LOSS}.truncated_importance_sampling_ratio", float(hi), "correction")
    if lo is not None:
        keys.set(f"{LOSS}.truncated_importance_sampling_ratio_min", float(lo), "correction")
    notes.append(f"correction {corr.kind}: loss_fn truncated_importance_sampling_type {kind} "
                 f"[{lo if lo is not None else 0:g}, {hi:g}]")


def _lora(plan: Plan, keys: _Keys) -> None:
    c, tab, ops = plan.contract, tables(), plan.catalog.operators
    t = c.trainable
    if c.trainer.engine == "fsdp":
        keys.set(f"{DTENSOR}.lora_cfg.enabled", True, "trainable")
        keys.set(f"{DTENSOR}.lora_cfg.match_all_linear", False, "trainable.targets")
        keys.set(f"{DTENSOR}.lora_cfg.target_modules", sorted({module_leaf(ops[i].tensor) for i in plan.trainable}),
                 "trainable.targets")
        keys.set(f"{DTENSOR}.lora_cfg.dim", t.rank, "trainable.rank")
        keys.set(f"{DTENSOR}.lora_cfg.alpha", t.alpha, "trainable.alpha")
        return
    names = lora_modules(plan, tab["megatron_lora_modules"], tab["megatron_lora_fused"], "PCC636",
                         "NeMo RL's Megatron LoRA (megatron_cfg.peft)")
    keys.set(f"{MEGATRON}.peft.enabled", True, "trainable")
    keys.set(f"{MEGATRON}.peft.target_modules", names, "trainable.targets")
    keys.set(f"{MEGATRON}.peft.dim", t.rank, "trainable.rank")
    keys.set(f"{MEGATRON}.peft.alpha", t.alpha, "trainable.alpha")


@target("nemo_rl", honours=("framework", "trainer", "rollout.rules", "rollout.parallel", "rollout.max_tokens",
                             "correction", "routing_replay", "trainable", "sync"))
def lower_nemo_rl(plan: Plan) -> Lowered:
    c, tab = plan.contract, tables()
    if c.trainer.engine not in tab["base_config"]:
        unsupported("PCC632", f"NeMo RL has no '{c.trainer.engine}' policy backend", "trainer")
    if c.sync.schedule != "colocated" or c.sync.bridge != "bf16":
        unsupported("PCC634", "pcc lowers NeMo RL's colocated GRPO, which refits BF16 weights (its vLLM quantizes "
                    f"them); the contract asks for schedule {c.sync.schedule}, bridge {c.sync.bridge}", "sync",
                    hint="write 'schedule colocated bridge bf16'")
    lower_each(plan, *("megatron",) * (c.trainer.engine == "megatron"), c.rollout.engine)  # all their refusals
    keys = _Keys()
    base = tab["base_config"][c.trainer.engine]
    notes: list[str] = [f"config.yaml inherits NeMo RL {tab['version']}'s examples/configs/{base} (defaults:)"]
    caveats: list[Unsupported] = []
    keys.set(f"{POLICY}.precision", "bfloat16", "trainer")
    if c.trainer.engine == "megatron":
        _megatron(plan, keys, notes)
    else:
        _dtensor(plan, keys, notes)
    _generation(plan, keys, notes)
    keys.set("policy.generation.colocated.enabled", True, "sync")
    if c.routing_replay != "none":
        if c.routing_replay != "r3" or c.trainer.engine != "megatron":
            unsupported("PCC632", "NeMo RL replays the rollout's routes in its Megatron policy only "
                        "(policy.router_replay: R3)", "routing_replay",
                        hint="write 'routing replay rollout' with 'trainer megatron'")
        keys.set("policy.router_replay.enabled", True, "routing_replay")
    _correction(plan, keys, notes)
    if c.trainable.kind == "lora":
        _lora(plan, keys)
    par = c.trainer.parallel
    if par.dp > 1 or par.gpus:
        caveats.append(Unsupported(
            "NeMo RL's data parallelism is the cluster's GPUs over the model-parallel size (cluster.gpus_per_node x "
            f"cluster.num_nodes); the bundle sets neither, so the contract's {par.gpus or par.dp} GPUs are not enforced",
            "PCC616", "trainer.parallel.gpus" if par.gpus else "trainer.parallel.dp",
            "set cluster.gpus_per_node and cluster.num_nodes in the job file"))
    out = Lowered("nemo_rl", settings=list(keys.records.values()), notes=notes, caveats=caveats)
    out.files = {CONFIG_FILE: recipe_yaml(out.settings, tab), LAUNCH: launch_script(base)}
    return out


def nested(settings) -> dict:
    """Dotted keys -> the nested mapping a recipe YAML holds (tuples as lists)."""
    root: dict = {}
    for s in settings:
        *parents, leaf = s.key.split(".")
        node = root
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = list(s.value) if isinstance(s.value, tuple) else s.value
    return root


def flatten(tree: dict, prefix: str = "") -> dict:
    """A nested mapping -> dotted key -> leaf value (the inverse of `nested`; lists stay leaves)."""
    out = {}
    for k, v in tree.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and v:
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out


def recipe_yaml(settings, tab: dict) -> str:
    return (f"# Generated by pcc: the contract's part of a NeMo RL {tab['version']} GRPO recipe. nemo_rl/launch.sh\n"
            "# puts it under `defaults: $NEMO_RL_DIR/examples/configs/<base>` and runs examples/run_grpo.py on it.\n"
            + yaml.safe_dump(nested(settings), sort_keys=False, default_flow_style=False))


def launch_script(base: str) -> str:
    """`uv run python examples/run_grpo.py --config RECIPE JOB "$@"` in $NEMO_RL_DIR, the recipe being
    config.yaml under `defaults:` the pinned example; PCC_DRY_RUN=1 prints the command instead."""
    tab = tables()
    q = shlex.quote
    return ("#!/usr/bin/env bash\n"
            f"# Generated by pcc: the NeMo RL {tab['version']} job for this contract. NeMo RL gets the recipe\n"
            f"# config.yaml over examples/configs/{base} of the checkout $NEMO_RL_DIR (tag v{tab['version']}), then\n"
            "# the job file's Hydra overrides, then the arguments (data.*, policy.model_name, grpo.*, cluster.*);\n"
            f"# the later wins. ${JOB_VARIABLE} names the job file, else it is the file '{JOB_FILE}' beside this bundle.\n"
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
            ': "${NEMO_RL_DIR:?set NEMO_RL_DIR to a NeMo RL checkout (tag v' + tab["version"] + ')}"\n'
            f'base="$NEMO_RL_DIR/examples/configs/{base}"\n'
            'recipe="$(mktemp "${TMPDIR:-/tmp}/pcc-nemo-rl.XXXXXX.yaml")"\n'
            "{ printf \"defaults: '%s'\\n\" \"${base//\\'/\\'\\'}\"; cat \"$here/config.yaml\"; } >\"$recipe\"\n"
            f"cmd=(uv run python {q(tab['entry'])} --config \"$recipe\" \\\n"
            '  ${jobargs[@]+"${jobargs[@]}"})\n'
            'if [ "${PCC_DRY_RUN:-0}" = 1 ]; then printf \'%q \' "${cmd[@]}" "$@"; echo; exit 0; fi\n'
            'cd "$NEMO_RL_DIR"\n'
            'exec "${cmd[@]}" "$@"\n')
